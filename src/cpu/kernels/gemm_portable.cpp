// Portable C++ kernels over the packed layouts (kernels.hpp): the fallback for any CPU and the
// reading of the layouts that the vector kernels must agree with.
#include <cstring>

#include "cpu/kernels/kernels.hpp"
#include "moex/dtype.hpp"

namespace moex::cpu::kernels {

void gemm_bf16_portable(const GemmArgs& g) {
  const auto* a = static_cast<const uint16_t*>(g.a);
  const auto* b = static_cast<const uint16_t*>(g.b);
  for (int r = 0; r < g.m; ++r) {
    float acc[kBlockCols] = {};
    const uint16_t* ar = a + r * g.lda;
    for (int64_t p = 0; p < g.k / 2; ++p) {
      const float a0 = bf16_to_float(ar[2 * p]);
      const float a1 = bf16_to_float(ar[2 * p + 1]);
      for (int panel = 0; panel < 2; ++panel) {
        const uint16_t* row = b + panel * g.panel_stride + p * 2 * kPanelCols;
        float* c = acc + panel * kPanelCols;
        for (int n = 0; n < kPanelCols; ++n) {
          c[n] += a0 * bf16_to_float(row[2 * n]);
          c[n] += a1 * bf16_to_float(row[2 * n + 1]);
        }
      }
    }
    std::memcpy(g.c + r * g.ldc, acc, sizeof acc);
  }
}

void gemm_f32_portable(const GemmArgs& g) {
  const auto* a = static_cast<const float*>(g.a);
  const auto* b = static_cast<const float*>(g.b);
  for (int r = 0; r < g.m; ++r) {
    float acc[kBlockCols] = {};
    const float* ar = a + r * g.lda;
    for (int64_t k = 0; k < g.k; ++k) {
      const float av = ar[k];
      for (int panel = 0; panel < 2; ++panel) {
        const float* row = b + panel * g.panel_stride + k * kPanelCols;
        float* c = acc + panel * kPanelCols;
        for (int n = 0; n < kPanelCols; ++n) c[n] += av * row[n];
      }
    }
    std::memcpy(g.c + r * g.ldc, acc, sizeof acc);
  }
}

}  // namespace moex::cpu::kernels
