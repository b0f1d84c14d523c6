// The host activation quantizer of include/moex/quant.hpp (CPU backends and the float64
// reference use it; CUDA kernels mirror it in device code).
#include "moex/quant.hpp"

#include <algorithm>
#include <cmath>

namespace moex::quant {

void quantize_activation_row(const float* x, int64_t K, uint8_t* q, float* scales) {
  for (int64_t b0 = 0, b = 0; b0 < K; b0 += kActBlock, ++b) {
    const int64_t b1 = std::min(K, b0 + kActBlock);
    float amax = 0.f;
    for (int64_t k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float s = std::max(amax / kE4M3Max, kMinActScale);
    scales[b] = s;
    for (int64_t k = b0; k < b1; ++k) q[k] = float_to_f8e4m3(x[k] / s);
  }
}

void fake_quantize_activation_row(const float* x, int64_t K, float* out) {
  for (int64_t b0 = 0; b0 < K; b0 += kActBlock) {
    const int64_t b1 = std::min(K, b0 + kActBlock);
    float amax = 0.f;
    for (int64_t k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float s = std::max(amax / kE4M3Max, kMinActScale);
    for (int64_t k = b0; k < b1; ++k) out[k] = f8e4m3_to_float(float_to_f8e4m3(x[k] / s)) * s;
  }
}

}  // namespace moex::quant
