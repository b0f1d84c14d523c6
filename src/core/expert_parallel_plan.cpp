// The index math of the all-to-all experts call: token slices, the dispatch plan and the combine
// positions (pure functions; moex/expert_parallel.hpp).
#include <algorithm>
#include <string>

#include "moex/error.hpp"
#include "moex/expert_parallel.hpp"

namespace moex {

TokenRange token_slice(int64_t tokens, int ranks, int rank) {
  if (tokens < 0 || ranks < 1 || rank < 0 || rank >= ranks)
    throw InvalidInput("token_slice of " + std::to_string(tokens) + " tokens for rank " +
                       std::to_string(rank) + " of " + std::to_string(ranks));
  const int64_t base = tokens / ranks, extra = tokens % ranks;
  TokenRange r;
  r.begin = rank * base + std::min<int64_t>(rank, extra);
  r.end = r.begin + base + (rank < extra ? 1 : 0);
  return r;
}

DispatchPlan plan_dispatch(const std::vector<int64_t>& ids, int64_t k, const ExpertShard& shard) {
  if (shard.size < 1 || shard.count < 1 || shard.num_experts != shard.count * shard.size)
    throw InvalidInput("plan_dispatch: an invalid shard (make it with make_expert_shard)");
  if (!ids.empty() && (k < 1 || int64_t(ids.size()) % k != 0))
    throw InvalidInput("plan_dispatch: " + std::to_string(ids.size()) + " ids are not [T, " +
                       std::to_string(k) + "]");
  DispatchPlan plan;
  plan.send_counts.assign(size_t(shard.size), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0)
      throw InvalidInput("top_k_index[" + std::to_string(int64_t(i) / k) + ", " +
                         std::to_string(int64_t(i) % k) + "] = " + std::to_string(ids[i]) +
                         " is negative");
    if (ids[i] < shard.num_experts) ++plan.send_counts[size_t(shard.owner(ids[i]))];
  }
  // A counting sort by destination keeps the (token, slot) order within each destination.
  std::vector<int64_t> next(size_t(shard.size), 0);
  for (int d = 1; d < shard.size; ++d)
    next[size_t(d)] = next[size_t(d - 1)] + plan.send_counts[size_t(d - 1)];
  const int64_t rows = next.back() + plan.send_counts.back();
  plan.flat.resize(size_t(rows));
  plan.local_ids.resize(size_t(rows));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= shard.num_experts) continue;
    const int d = shard.owner(ids[i]);
    const int64_t p = next[size_t(d)]++;
    plan.flat[size_t(p)] = int64_t(i);
    plan.local_ids[size_t(p)] = ids[i] - int64_t(d) * shard.count;
  }
  return plan;
}

std::vector<int64_t> combine_positions(const DispatchPlan& plan, int64_t tokens, int64_t k) {
  std::vector<int64_t> pos(size_t(tokens * k), -1);
  for (size_t p = 0; p < plan.flat.size(); ++p) {
    const int64_t f = plan.flat[p];
    if (f < 0 || f >= tokens * k || pos[size_t(f)] != -1)
      throw InvalidInput("combine_positions: the plan does not fit [" + std::to_string(tokens) +
                         ", " + std::to_string(k) + "] (flat index " + std::to_string(f) + ")");
    pos[size_t(f)] = int64_t(p);
  }
  return pos;
}

}  // namespace moex
