// The experts call across the ranks of an expert-parallel group (experts sharded by
// moex/expert_shard.hpp, ranks joined by a moex/comm.hpp Communicator).
//
// Two ways to run one MoE layer, both computing the formula of moex/experts.hpp for all T tokens:
//  - kReplicated (transformers' ep_size=N): every rank has all T tokens, marks the ids of other
//    ranks' experts as sentinels, runs the experts call on its own experts, and the partial
//    outputs are summed over ranks (all_reduce_sum: rank order, float32, one rounding).
//  - kAllToAll (serving engines' dispatch / combine): rank r owns the tokens of token_slice(T, N,
//    r); each (token, slot) row of those whose expert is held elsewhere goes to its owner with its
//    routing weight and local expert id (all_to_all_v); the owner runs its experts on the rows it
//    received as a [rows, 1] top-k problem (output = weight x expert(row)); the rows come back in
//    the order they were sent, are added per token in slot order j = 0..k-1 in float32 and
//    rounded once; the token slices are then gathered so every rank returns [T, H].
// Both are deterministic: neither thread timing nor the number of threads changes a bit.
// Numerics against the single-device call: in float32 the difference is rounding only (~1e-7
// relative); in 16-bit dtypes each rank's (kReplicated) or each slot's (kAllToAll) contribution
// is rounded once more than on one device, which the experts tolerance covers.
//
// The index math of kAllToAll is in pure functions below (plan_dispatch, combine_positions,
// token_slice), tested on their own.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "moex/comm.hpp"
#include "moex/expert_shard.hpp"
#include "moex/experts.hpp"

namespace moex {

enum class ExpertParallelMode : unsigned char { kReplicated, kAllToAll };

// ---- index math (pure) ----

// Rank r's tokens in kAllToAll: contiguous, the first T mod N ranks one token more
// (torch.tensor_split's rule). Ranks past T get empty slices.
struct TokenRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
TokenRange token_slice(int64_t tokens, int ranks, int rank);

// Where one rank sends its (token, slot) rows. `ids` are the global ids of its tokens, row-major
// [T, k]; ids >= num_experts (sentinels already) go nowhere. Rows are ordered by destination rank,
// then by token, then by slot, so the order is a pure function of the ids.
struct DispatchPlan {
  std::vector<int64_t> send_counts;  // [N]: rows to each rank
  std::vector<int64_t> flat;         // per sent row: its flat index t * k + j in `ids`
  std::vector<int64_t> local_ids;    // per sent row: the expert id on the destination rank
};
// Throws InvalidInput for a negative id, k < 1 with ids, or a shard that is not valid.
DispatchPlan plan_dispatch(const std::vector<int64_t>& ids, int64_t k, const ExpertShard& shard);

// The inverse of plan.flat for the combine: for each flat index t * k + j (tokens * k entries),
// the sent row holding it, or -1 when the slot went nowhere.
std::vector<int64_t> combine_positions(const DispatchPlan& plan, int64_t tokens, int64_t k);

// ---- the call ----

// Runs one MoE layer's experts across the ranks of `comm` and returns the full [T, H] output (of
// hidden's dtype) on every rank. Every rank passes the same hidden [T, H], top_k_index [T, k]
// (global ids: int32 / int64; ids >= E are sentinels) and top_k_weights ([T, k], or on the host
// [T, E] read by id as in experts.hpp), and its own shard's experts (`local`: spec with
// num_experts = shard.count, weights from shard_experts_weights).
// Where: host tensors (any communicator), or tensors on comm.device() (the NCCL communicator's
// GPU). On a GPU kReplicated marks the sentinels by a kernel and sums with all_reduce_sum_enqueue,
// so the call is stream work with no host synchronisation (a decode step's CUDA graph captures
// it) when check_ranks is false; kAllToAll plans the dispatch from the ids read back to the host
// (one synchronisation per call, refused under graph capture) and moves the rows on the device,
// with the host version's order and rounding.
// check_ranks: one all_gather first checks that every rank has the same T, k, H, dtype, E and
// mode (a host synchronisation); a caller whose ranks run the same step by construction (a model)
// may skip it.
// Throws InvalidInput (shapes, dtypes, negative host ids; tensors on different devices or on a
// device that is not the communicator's; a shard that does not match the communicator or the
// local experts; with check_ranks, ranks whose T, k, H or dtype differ, named per rank),
// Unsupported (backend; [T, E] weights on a GPU; kAllToAll inside a graph capture), CommError (a
// peer failed or timed out).
Tensor expert_parallel_forward(Communicator& comm, const Experts& local, std::string_view backend,
                               const ExpertShard& shard, const Tensor& hidden,
                               const Tensor& top_k_index, const Tensor& top_k_weights,
                               ExpertParallelMode mode, bool check_ranks = true);

}  // namespace moex
