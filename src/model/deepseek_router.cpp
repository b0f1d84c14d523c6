// See deepseek_router.hpp. Exact formulas: docs/arch_deepseek_v3_gpt_oss.md.
#include "model/deepseek_router.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "model/gpt_oss_layers.hpp"
#include "moex/error.hpp"

namespace moex::model {

void validate_router_config(const DeepseekRouterConfig& c, const std::string& where) {
  auto fail = [&](const std::string& what) { throw InvalidInput(where + ": " + what); };
  if (c.num_experts < 1) fail("n_routed_experts must be >= 1");
  if (c.n_group < 1 || c.num_experts % c.n_group != 0)
    fail("n_group (" + std::to_string(c.n_group) + ") must divide n_routed_experts (" +
         std::to_string(c.num_experts) + ")");
  if (c.topk_group < 1 || c.topk_group > c.n_group)
    fail("topk_group (" + std::to_string(c.topk_group) + ") must be in [1, n_group = " +
         std::to_string(c.n_group) + "]");
  const int64_t kept = c.topk_group * (c.num_experts / c.n_group);
  if (c.top_k < 1 || c.top_k > kept)
    fail("num_experts_per_tok (" + std::to_string(c.top_k) + ") must be in [1, " + std::to_string(kept) +
         "] (the experts of topk_group groups)");
}

Routing deepseek_route(const Tensor& logits, const Tensor& correction, const DeepseekRouterConfig& c) {
  const int64_t rows = logits.size(0), E = c.num_experts, k = c.top_k;
  const int64_t G = c.n_group, per_group = E / G;
  Routing r;
  r.top_k_index = Tensor::empty({rows, k}, DType::kI64);
  r.top_k_weights = Tensor::empty({rows, k}, DType::kF32);
  const float* lg = logits.data<float>();
  const float* bias = correction.data<float>();
  int64_t* idx = r.top_k_index.data<int64_t>();
  float* w = r.top_k_weights.data<float>();

  std::vector<float> scores(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<float> group_score(static_cast<size_t>(G));
  std::vector<int64_t> groups(static_cast<size_t>(c.topk_group));
  std::vector<float> dummy(static_cast<size_t>(std::max(k, c.topk_group)));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      scores[size_t(e)] = sigmoid(lg[t * E + e]);
      choice[size_t(e)] = scores[size_t(e)] + bias[e];
    }
    // Group score: the two largest choice scores of the group (one when a group has one expert).
    for (int64_t g = 0; g < G; ++g) {
      float best = -std::numeric_limits<float>::infinity(), second = best;
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
        const float v = choice[size_t(e)];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_score[size_t(g)] = per_group >= 2 ? best + second : best;
    }
    torch_topk(group_score.data(), G, c.topk_group, /*sorted=*/false, groups.data(), dummy.data());
    std::vector<bool> kept(size_t(G), false);
    for (int64_t g : groups) kept[size_t(g)] = true;
    for (int64_t e = 0; e < E; ++e)
      if (!kept[size_t(e / per_group)]) choice[size_t(e)] = -std::numeric_limits<float>::infinity();
    torch_topk(choice.data(), E, k, /*sorted=*/false, idx + t * k, dummy.data());

    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      w[t * k + j] = scores[size_t(idx[t * k + j])];
      sum += w[t * k + j];
    }
    const float denom = c.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int64_t j = 0; j < k; ++j) {
      float v = w[t * k + j];
      if (c.norm_topk_prob) v /= denom;
      w[t * k + j] = v * c.routed_scaling_factor;
    }
  }
  return r;
}

}  // namespace moex::model
