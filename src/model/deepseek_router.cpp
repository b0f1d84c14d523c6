// See deepseek_router.hpp. Exact formulas: docs/arch_deepseek_v3_gpt_oss.md.
#include "model/deepseek_router.hpp"

#include <cmath>

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
  if (!(c.routed_scaling_factor > 0) || !std::isfinite(c.routed_scaling_factor))
    fail("routed_scaling_factor must be > 0, got " + std::to_string(c.routed_scaling_factor));
}

}  // namespace moex::model
