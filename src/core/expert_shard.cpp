// Contiguous expert shards, sentinel marking and zero-copy weight slices (moex/expert_shard.hpp).
#include "moex/expert_shard.hpp"

#include <algorithm>
#include <string>

#include "core/device_hooks.hpp"
#include "moex/error.hpp"

namespace moex {

ExpertShard make_expert_shard(int64_t num_experts, int ep_size, int rank) {
  const std::string what = "expert parallelism with ep_size " + std::to_string(ep_size) +
                           ", rank " + std::to_string(rank) + " and " +
                           std::to_string(num_experts) + " experts";
  if (ep_size < 1) throw InvalidInput(what + ": ep_size must be at least 1");
  if (rank < 0 || rank >= ep_size) throw InvalidInput(what + ": rank must be in [0, ep_size)");
  if (num_experts < 1) throw InvalidInput(what + ": a layer needs at least one expert");
  if (num_experts % ep_size != 0)
    throw InvalidInput(what + ": ep_size must divide the number of experts");
  ExpertShard s;
  s.rank = rank;
  s.size = ep_size;
  s.count = num_experts / ep_size;
  s.first = int64_t(rank) * s.count;
  s.num_experts = num_experts;
  return s;
}

template <class Id>
static void mark(const Id* in, Id* out, int64_t n, int64_t k, const ExpertShard& s) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = int64_t(in[i]);
    if (id < 0)
      throw InvalidInput("top_k_index[" + std::to_string(i / k) + ", " + std::to_string(i % k) +
                         "] = " + std::to_string(id) + " is negative");
    out[i] = Id(s.owns(id) ? id - s.first : s.count);
  }
}

Tensor mark_sentinels(const Tensor& top_k_index, const ExpertShard& shard) {
  if (top_k_index.dim() != 2)
    throw InvalidInput("top_k_index must be [T, k], got " + top_k_index.str());
  if (top_k_index.dtype() != DType::kI64 && top_k_index.dtype() != DType::kI32)
    throw InvalidInput("top_k_index must be int32 or int64, got " + top_k_index.str());
  if (!top_k_index.device().host_accessible()) {
    const Tensor in = top_k_index.contiguous();
    Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device());
    detail::mark_sentinels_on_device(in, out, shard.first, shard.count);
    return out;
  }
  const Tensor in = top_k_index.contiguous();
  Tensor out = Tensor::empty(in.shape(), in.dtype());
  const int64_t n = in.numel(), k = std::max<int64_t>(in.size(1), 1);
  if (in.dtype() == DType::kI64)
    mark(in.data<int64_t>(), out.data<int64_t>(), n, k, shard);
  else if (in.dtype() == DType::kI32)
    mark(in.data<int32_t>(), out.data<int32_t>(), n, k, shard);
  else
    throw InvalidInput("top_k_index must be int32 or int64, got " + in.str());
  return out;
}

ExpertsSpec shard_experts_spec(const ExpertsSpec& spec, const ExpertShard& shard) {
  if (spec.num_experts != shard.num_experts)
    throw InvalidInput("the experts spec has " + std::to_string(spec.num_experts) +
                       " experts but the shard was made for " + std::to_string(shard.num_experts));
  ExpertsSpec local = spec;
  local.num_experts = shard.count;
  return local;
}

ExpertsWeights shard_experts_weights(const ExpertsSpec& spec, const ExpertsWeights& w,
                                     const ExpertShard& shard) {
  validate_experts_weights(spec, w);
  (void)shard_experts_spec(spec, shard);  // same E
  const int64_t a = shard.first, b = shard.first + shard.count;
  auto rows = [&](const Tensor& t) { return t.defined() ? t.slice(0, a, b) : t; };
  ExpertsWeights out;
  out.gate_up = rows(w.gate_up);
  out.down = rows(w.down);
  out.gate_up_bias = rows(w.gate_up_bias);
  out.down_bias = rows(w.down_bias);
  out.gate_up_scale = rows(w.gate_up_scale);
  out.down_scale = rows(w.down_scale);
  if (w.per_expert) {
    auto pe = std::make_shared<PerExpertWeights>();
    auto take = [&](const std::vector<Tensor>& v) {
      return std::vector<Tensor>(v.begin() + a, v.begin() + b);
    };
    pe->gate = take(w.per_expert->gate);
    pe->up = take(w.per_expert->up);
    pe->down = take(w.per_expert->down);
    out.per_expert = std::move(pe);
  }
  return out;
}

}  // namespace moex
