// The dense projection y = x W^T + b (see ops.hpp). Kept as the plain blocked loop on purpose:
// moving it onto the CPU matrix engine is separate work with its own measurements.
#include <algorithm>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops::cpu {

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act) {
  const int64_t rows = x.size(0), in = weight.size(1), out = weight.size(0);
  Tensor y = Tensor::empty({rows, out}, DType::kF32);
  const float* X = x.data<float>();
  float* Y = y.data<float>();
  const float* B = bias.defined() ? bias.data<float>() : nullptr;
  constexpr int64_t kBlock = 16;  // weight rows converted together, reused for every token
#pragma omp parallel if (rows * in * out >= kParallelWork)
  {
    std::vector<float> buf(weight.dtype() == DType::kF32 ? 0 : size_t(kBlock * in));
#pragma omp for schedule(static)
    for (int64_t j0 = 0; j0 < out; j0 += kBlock) {
      const int64_t nj = std::min(kBlock, out - j0);
      const float* W = float_row(weight, j0 * in, nj * in, buf.data());
      for (int64_t t = 0; t < rows; ++t) {
        const float* xr = X + t * in;
        float* yr = Y + t * out + j0;
        for (int64_t j = 0; j < nj; ++j) {
          float v = dot(xr, W + j * in, in);
          if (B) v += B[j0 + j];
          yr[j] = round_act(v, act);
        }
      }
    }
  }
  return y;
}

}  // namespace moex::ops::cpu
