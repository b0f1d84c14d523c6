// The host attention of AttentionSpec::eager_rounding (attention_eager.cpp); attention.cpp calls it.
#pragma once

#include "ops/ops.hpp"

namespace moex::ops::cpu {

Tensor attention_eager(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec,
                       DType act);

}  // namespace moex::ops::cpu
