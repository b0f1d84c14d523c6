// DeepSeek-V3's router configuration (transformers 5.17 DeepseekV3TopkRouter), read from the
// config and checked at load; the routing itself is ops::sigmoid_group_topk (src/ops/ops.hpp).
#pragma once

#include <string>

#include "ops/ops.hpp"

namespace moex::model {

using DeepseekRouterConfig = ops::GroupLimitedTopk;

// Throws InvalidInput (naming `where`) unless 1 <= top_k <= experts in the kept groups,
// n_group divides E, 1 <= topk_group <= n_group.
void validate_router_config(const DeepseekRouterConfig& c, const std::string& where);

}  // namespace moex::model
