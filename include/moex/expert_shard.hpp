// Expert sharding for expert parallelism: which experts a rank holds, the router's ids as that
// rank sees them, and the rank's slice of a layer's experts weights.
//
// Experts are split contiguously by rank, as transformers' DistributedConfig(ep_size=N) does:
// with E experts and N ranks, rank r holds experts [r E/N, (r+1) E/N). A rank runs the ordinary
// experts call (moex/experts.hpp) on its E/N experts; ids of experts held elsewhere become
// sentinels (ids >= E/N), which that call skips.
#pragma once

#include <cstdint>

#include "moex/experts.hpp"
#include "moex/tensor.hpp"

namespace moex {

struct ExpertShard {
  int rank = 0;     // this rank, in [0, size)
  int size = 1;     // ranks in the expert-parallel group (ep_size)
  int64_t first = 0;  // first global expert id held here
  int64_t count = 0;  // experts held here (E / size)
  int64_t num_experts = 0;  // E, of the whole layer

  bool owns(int64_t global_id) const { return global_id >= first && global_id < first + count; }
  // The rank holding a global id < E.
  int owner(int64_t global_id) const { return int(global_id / count); }
};

// Throws InvalidInput when ep_size < 1, rank is outside [0, ep_size), num_experts < 1, or
// ep_size does not divide num_experts (naming all three).
ExpertShard make_expert_shard(int64_t num_experts, int ep_size, int rank);

// The router's ids [T, k] (int32 or int64) as the shard's local experts call reads them: a new
// tensor of the same shape, dtype and device holding id - first for ids the shard holds and the
// sentinel `shard.count` for every other id, including ids >= E that were sentinels already.
// Throws InvalidInput for a negative host id (naming its position) or a non-integer dtype. Ids on
// a GPU are marked there by one kernel on the current stream (no host synchronisation; a negative
// id becomes a sentinel there, undiagnosed).
Tensor mark_sentinels(const Tensor& top_k_index, const ExpertShard& shard);

// The spec of the shard's local experts: `spec` with num_experts = shard.count. Throws
// InvalidInput when spec.num_experts != shard.num_experts.
ExpertsSpec shard_experts_spec(const ExpertsSpec& spec, const ExpertShard& shard);

// The shard's experts of a layer's weights, without copying: every [E, ...] tensor (gate_up,
// down, biases, block scales) becomes its view [count, ...] (a slice of the leading dimension of a
// contiguous tensor stays contiguous); per-expert weights keep the shard's tensors (handles to
// the same memory). Validates `w` against `spec` first (validate_experts_weights).
ExpertsWeights shard_experts_weights(const ExpertsSpec& spec, const ExpertsWeights& w,
                                     const ExpertShard& shard);

}  // namespace moex
