// Shared driver of the register-blocked vector kernels: a kernel instantiated for MR rows
// (Rows<MR>::run) covers m rows in chunks of kMR, then the remainder with the instantiation for
// exactly that many rows, so no row is computed twice and no masked tail is needed.
#pragma once

#include <utility>

#include "cpu/kernels/kernels.hpp"

namespace moex::cpu::kernels {

template <int kMR, class T, template <int> class Rows>
inline void run_row_chunks(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b0 = static_cast<const T*>(g.b);
  const T* b1 = b0 + g.panel_stride;
  int r = 0;
  for (; r + kMR <= g.m; r += kMR) {
    Rows<kMR>::run(a + r * g.lda, g.lda, b0, b1, g.k, g.c + r * g.ldc, g.ldc);
  }
  const int rest = g.m - r;
  if (rest == 0) return;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? Rows<I + 1>::run(a + r * g.lda, g.lda, b0, b1, g.k, g.c + r * g.ldc, g.ldc)
                    : void()),
     ...);
  }(std::make_integer_sequence<int, kMR - 1>{});
}

}  // namespace moex::cpu::kernels
