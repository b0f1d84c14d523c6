// The one register-blocked GEMM loop of the vector kernels (portable, AVX2, AVX-512, AVX512-BF16),
// written once over an instruction-set traits type. Each gemm_<isa>.cpp defines its traits (how
// to load, widen, multiply-add and store one vector) and instantiates the loop for them inside its
// own target region (target.hpp), so the library is still built without -march and picks a path at
// run time (engine.cpp).
//
// A traits type `Tr` describes one (instruction set, weight layout) pair:
//   Elem             float (fp32 panel layout) or uint16_t (bf16 pair layout), kernels.hpp
//   kKPerStep        K values one step consumes per column: 1 (fp32) or 2 (a bf16 pair)
//   Acc, kLanes      a vector of kLanes fp32 accumulators (zmm: 16, ymm: 8, scalar: 1)
//   kPassCols        columns one pass over K produces (16 or 32 of the 32-column block): MR rows x
//                    kPassCols / kLanes accumulators plus the B operands must fit the registers
//   kMaxRows         MR, rows of the register block
//   kPrefetchBytes   software prefetch distance on each panel stream, 0 for none: with few rows
//                    the multiply-adds cannot hide DRAM latency, so the weight streams are
//                    fetched ahead (measured in docs/cpu.md)
//   load_b(p)        kLanes columns of one packed panel row, as multiply operands
//   load_a(p)        one step of one A row, broadcast
//   madd(acc, a, b)  acc + a * b for one step; for bf16 pairs the even k first, then the odd k
//   zero(), store(float*, acc)
// and, for the register-resident peak loop of the ceilings (peak below), kFlopsPerMadd and
// splat(v) (every lane v).
// Every accumulator sees its products in k order whatever MR or the pass width (rows and column
// passes are independent), so a path's result does not depend on how its rows are chunked.
//
// Include order: the standard headers, <immintrin.h> and kernels.hpp first, then the target region,
// then this header, so that the templates below compile for that target and inline the traits'
// intrinsics. Traits types live in an anonymous namespace, so no instantiation compiled for one
// target is shared with another translation unit.
#pragma once

#include <cstdint>
#include <utility>

#include "cpu/kernels/kernels.hpp"

namespace moex::cpu::kernels::loop {

// MR rows x 32 columns: C[r][n] = sum_k A[r][k] B[k][n], the 32 columns taken as 32 / kPassCols
// passes over K. b[0], b[1]: the block's two panels.
template <class Tr, int MR>
inline void block_rows(const typename Tr::Elem* a, int64_t lda, const typename Tr::Elem* const b[2],
                       int64_t k, float* c, int64_t ldc) {
  using Elem = typename Tr::Elem;
  constexpr int kVecs = Tr::kPassCols / Tr::kLanes;
  constexpr int kRowElems = kPanelCols * Tr::kKPerStep;  // one step of one panel
  const int64_t steps = k / Tr::kKPerStep;
  #pragma GCC unroll 2
  for (int col0 = 0; col0 < kBlockCols; col0 += Tr::kPassCols) {
    const Elem* bv[kVecs];
    #pragma GCC unroll 32
    for (int j = 0; j < kVecs; ++j) {
      const int col = col0 + j * Tr::kLanes;
      bv[j] = b[col / kPanelCols] + (col % kPanelCols) * Tr::kKPerStep;
    }
    typename Tr::Acc acc[MR][kVecs];
    #pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 32
      for (int j = 0; j < kVecs; ++j) acc[r][j] = Tr::zero();
    for (int64_t s = 0; s < steps; ++s) {
      if constexpr (Tr::kPrefetchBytes > 0) {
        #pragma GCC unroll 32
        for (int j = 0; j < kVecs; ++j)  // one prefetch per panel stream
          if ((col0 + j * Tr::kLanes) % kPanelCols == 0)
            __builtin_prefetch(reinterpret_cast<const char*>(bv[j] + s * kRowElems) +
                               Tr::kPrefetchBytes, 0, 3);
      }
      typename Tr::B w[kVecs];
      #pragma GCC unroll 32
      for (int j = 0; j < kVecs; ++j) w[j] = Tr::load_b(bv[j] + s * kRowElems);
      #pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) {
        const typename Tr::A av = Tr::load_a(a + r * lda + s * Tr::kKPerStep);
        #pragma GCC unroll 32
        for (int j = 0; j < kVecs; ++j) acc[r][j] = Tr::madd(acc[r][j], av, w[j]);
      }
    }
    #pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 32
      for (int j = 0; j < kVecs; ++j) Tr::store(c + r * ldc + col0 + j * Tr::kLanes, acc[r][j]);
  }
}

// The GemmFn of a traits type: m rows in chunks of MR, then the remainder with the instantiation
// for exactly that many rows, so no row is computed twice and no masked tail is needed.
template <class Tr>
inline void gemm(const GemmArgs& g) {
  using Elem = typename Tr::Elem;
  constexpr int kMR = Tr::kMaxRows;
  const Elem* a = static_cast<const Elem*>(g.a);
  const Elem* const b[2] = {static_cast<const Elem*>(g.b),
                            static_cast<const Elem*>(g.b) + g.panel_stride};
  int r = 0;
  for (; r + kMR <= g.m; r += kMR)
    block_rows<Tr, kMR>(a + r * g.lda, g.lda, b, g.k, g.c + r * g.ldc, g.ldc);
  const int rest = g.m - r;
  if (rest == 0) return;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? block_rows<Tr, I + 1>(a + r * g.lda, g.lda, b, g.k, g.c + r * g.ldc, g.ldc)
                    : void()),
     ...);
  }(std::make_integer_sequence<int, kMR - 1>{});
}

// The register-resident peak of Tr::madd for the bench's ceilings: kChains independent
// accumulator chains (enough to cover the unit's latency x throughput), no memory traffic.
// Every chain starts from a different value (Tr::splat), or the compiler merges chains that
// compute the same values. Returns the flops done.
template <class Tr, int kChains>
inline double peak(int64_t iters, typename Tr::A a, typename Tr::B b) {
  typename Tr::Acc acc[kChains];
  #pragma GCC unroll 32
  for (int i = 0; i < kChains; ++i) acc[i] = Tr::splat(float(i) * 1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
    #pragma GCC unroll 32
    for (int i = 0; i < kChains; ++i) acc[i] = Tr::madd(acc[i], a, b);
    // Keeps the compiler from collapsing the iterations into a closed form.
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
  }
  float sink[kChains * Tr::kLanes];
  #pragma GCC unroll 32
  for (int i = 0; i < kChains; ++i) Tr::store(sink + i * Tr::kLanes, acc[i]);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return double(iters) * kChains * Tr::kFlopsPerMadd;
}

}  // namespace moex::cpu::kernels::loop
