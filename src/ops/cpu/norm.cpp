// RMSNorm, both roundings (see ops.hpp).
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops::cpu {

void rms_norm_(Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style) {
  if (group <= 0) group = x.size(1);
  const int64_t groups = x.numel() / group;
  std::vector<float> wbuf(static_cast<size_t>(group));
  const float* w = float_row(weight, 0, group, wbuf.data());
  // Llama casts x * r to the input dtype before the weight product; gpt-oss multiplies in
  // float32 and casts once.
  const DType inner = style == RmsNormStyle::kLlama ? act : DType::kF32;
  float* p = x.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelWork)
  for (int64_t g = 0; g < groups; ++g) {
    float* v = p + g * group;
    double ss = 0;
    for (int64_t i = 0; i < group; ++i) ss += double(v[i]) * v[i];
    const float r = float(1.0 / std::sqrt(float(ss / double(group)) + eps));
    for (int64_t i = 0; i < group; ++i) v[i] = round_act(w[i] * round_act(v[i] * r, inner), act);
  }
}

}  // namespace moex::ops::cpu
