// DeepSeek MLA softmax scale (transformers 5.17 DeepseekV3Attention.scaling), testable alone.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace moex::model {

// qk_head_dim^-0.5, times mscale^2 when the rope is scaled (rope_type / type not "default") and
// `mscale_all_dim` is set: mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (1 when factor <= 1)
// (transformers' yarn_apply_mscale). Reads "rope_parameters" or the older "rope_scaling".
// Throws InvalidInput naming `where` when such a rope lacks a numeric "factor".
float mla_softmax_scale(const nlohmann::json& config, int64_t qk_head_dim, const std::string& where);

}  // namespace moex::model
