// DeepSeek-V3's router (transformers 5.17 DeepseekV3TopkRouter), as a pure function so that it
// can be tested alone:
//
//   s = sigmoid(logits)                                  [rows, E], float32
//   c = s + e_score_correction_bias                      (used to CHOOSE experts only)
//   group score g = sum of the two largest c in each of n_group contiguous groups of E / n_group
//   keep the topk_group best groups; c = -inf elsewhere; idx = top_k of c
//   (both top-k picks as torch.topk(sorted=False) on CPU does, see torch_topk: the slot order is
//   torch's, not sorted)
//   w = s[idx]; if norm_topk_prob: w /= (sum w + 1e-20); w *= routed_scaling_factor
//
// Weights stay float32 (transformers hands float32 weights to the experts even in bf16 models).
#pragma once

#include <cstdint>
#include <string>

#include "model/ops.hpp"
#include "moex/tensor.hpp"

namespace moex::model {

struct DeepseekRouterConfig {
  int64_t num_experts = 0;  // E (n_routed_experts)
  int64_t top_k = 1;        // num_experts_per_tok
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// Throws InvalidInput (naming `where`) unless 1 <= top_k <= experts in the kept groups,
// n_group divides E, 1 <= topk_group <= n_group.
void validate_router_config(const DeepseekRouterConfig& c, const std::string& where);

// logits: float32 [rows, E]; correction: float32 [E]. Returns int64 [rows, k] ids and float32
// [rows, k] weights.
Routing deepseek_route(const Tensor& logits, const Tensor& correction, const DeepseekRouterConfig& c);

}  // namespace moex::model
