// The block-scaled (FP8 / FP4) experts kernel: weights decoded from their stored bytes into
// registers, 128 columns at a time, never into a second full-precision copy (kernels.hpp,
// BlockScaledArgs, for the contract; moex/quant.hpp for the math).
//
// One loop structure serves both formats; only the decode of a 128-wide block differs:
//   FP8: e4m3 -> fp16 bits is a shift and a mask of the sign-extended byte (exponent bias 7 vs
//        15, the same 3 mantissa bits, subnormals included), then VCVTPH2PS; the values come
//        out 2^-8 too small, which the block factor (scale x 256, exact) puts back.
//   FP4: one byte holds columns 2j and 2j+1; VPERMPS looks the nibbles up in a 16-entry table
//        already multiplied by the 1 x 32 block's UE8M0 scale (exact: a power of two), the low
//        nibbles giving the even columns and the high ones the odd columns, which is why FP4
//        activations are stored evens-then-odds per 32 block.
// Per output element: for each 128-wide block, a float32 dot of 8 vectors, then one FMA of it
// times (activation scale x block factor) into a 16-lane total, reduced once at the end. Rows of
// activations are taken up to 8 at a time, so a decoded weight block is reused 8 times while it
// sits in registers (the decode, not the FMA, is the work per weight byte).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/target.hpp"
#include "moex/quant.hpp"

// GCC 12's avx512fintrin.h: '__Y may be used uninitialized' for masked builtins with an
// _mm512_undefined pass-through (as in activation_avx512.cpp); a false positive of the header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace moex::cpu::kernels {
namespace {

constexpr int64_t kBlock = quant::kActBlock;  // 128: activation block = FP8 weight block along K
constexpr int kRowsPerPass = 8;               // activation rows sharing one decoded block

inline int64_t scale_row_start(const BlockScaledArgs& a, int64_t n) {
  return quant::fused_scale_row(n, a.fused_rows, a.bn) * a.scale_cols;
}

}  // namespace

// Portable: decode one weight row into float (in the kernel column order, per-32 FP4 scales
// folded in), then the same per-block sums as the vector kernel.
void gemm_block_scaled_portable(const BlockScaledArgs& a) {
  static const std::array<float, 256> e4m3 = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[size_t(i)] = f8e4m3_to_float(uint8_t(i));
    return t;
  }();
  const int64_t nb = a.nb;
  float wrow[kBlock];
  for (int64_t n = a.n0; n < a.n1; ++n) {
    const uint8_t* w = a.w + n * a.row_bytes;
    const int64_t srow = scale_row_start(a, n);
    float total[kRowsPerPass];
    for (int m0 = 0; m0 < a.m; m0 += kRowsPerPass) {
      const int mc = std::min(kRowsPerPass, a.m - m0);
      std::fill(total, total + kRowsPerPass, 0.f);
      for (int64_t kb = 0; kb < nb; ++kb) {
        float factor = 1.f;
        const int64_t c_end = std::min(kBlock, a.k - kb * kBlock);
        std::fill(wrow, wrow + kBlock, 0.f);
        if (a.fp4) {
          for (int64_t sub = 0; sub < c_end / 32; ++sub) {
            const int64_t c0 = kb * kBlock + sub * 32;
            const float sc = quant::scale_value(a.scale, a.scale_dtype, srow + c0 / 32);
            const uint8_t* b = w + c0 / 2;
            for (int j = 0; j < 16; ++j) {  // evens, then odds (the kernel column order)
              wrow[sub * 32 + j] = fp4_e2m1_to_float(uint8_t(b[j] & 0xf)) * sc;
              wrow[sub * 32 + 16 + j] = fp4_e2m1_to_float(uint8_t(b[j] >> 4)) * sc;
            }
          }
        } else {
          for (int64_t p = 0; p < c_end; ++p) wrow[p] = e4m3[w[kb * kBlock + p]];
        }
        if (!a.fp4) factor = quant::scale_value(a.scale, a.scale_dtype, srow + kb);
        for (int i = 0; i < mc; ++i) {
          const int64_t r = a.x_rows ? a.x_rows[m0 + i] : m0 + i;
          const float* x = a.xq + r * a.x_ld + kb * kBlock;
          float acc = 0.f;
          for (int p = 0; p < kBlock; ++p) acc += wrow[p] * x[p];
          total[i] += acc * (a.xs[r * a.nb + kb] * factor);
        }
      }
      for (int i = 0; i < mc; ++i) a.y[(m0 + i) * a.ldy + n] = total[i];
    }
  }
}

MOEX_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")
namespace {

// 128 FP8 weights (bytes p[0 .. valid)) as 8 vectors of fp32, 2^-8 x their e4m3 values; bytes
// at or past `valid` read as 0 (masked loads: never past the row).
struct Fp8Decode {
  static constexpr int64_t kBytes = 128;
  static inline void block(const BlockScaledArgs& a, const uint8_t* row, int64_t srow, int64_t kb,
                           __m512 (&v)[8], float& factor) {
    const uint8_t* p = row + kb * kBlock;
    const int64_t valid = a.k - kb * kBlock;
    const __m512i mask = _mm512_set1_epi16(int16_t(0xBF80));
    for (int h = 0; h < 4; ++h) {
      const int64_t left = valid - 32 * h;
      __m256i bytes;
      if (left >= 32) bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
      else if (left <= 0) bytes = _mm256_setzero_si256();
      else bytes = _mm256_maskz_loadu_epi8(__mmask32((1ull << left) - 1), p + 32 * h);
      // Sign-extended byte << 7: bits 7..13 = exponent and mantissa, bit 15 = sign; bit 14 (the
      // sign's copy) is masked off.
      const __m512i h16 = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(bytes), 7), mask);
      v[2 * h] = _mm512_cvtph_ps(_mm512_castsi512_si256(h16));
      v[2 * h + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h16, 1));
    }
    factor = quant::scale_value(a.scale, a.scale_dtype, srow + kb) * 256.f;
  }
};

// 128 FP4 weights (64 bytes; K is a multiple of 32, so a 32-wide sub-block is whole or absent):
// per sub-block, evens from the low nibbles, odds from the high ones, scale folded into the table.
// FP4 scales are UE8M0 only (the contract), read as bytes.
struct Fp4Decode {
  static constexpr int64_t kBytes = 64;
  static inline void block(const BlockScaledArgs& a, const uint8_t* row, int64_t srow, int64_t kb,
                           __m512 (&v)[8], float& factor) {
    const __m512 lut = _mm512_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f,
                                      -1.5f, -2.f, -3.f, -4.f, -6.f);
    const int64_t c0 = kb * kBlock;
    // The block's four UE8M0 scales at once: 2^(e-127) is the float with exponent field e (code
    // 0, 2^-127, is the float32 subnormal 0x00400000).
    const uint8_t* sp = static_cast<const uint8_t*>(a.scale) + srow + c0 / 32;
    const int64_t subs = std::min<int64_t>(4, (a.k - c0) / 32);
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(__mmask16((1u << subs) - 1), sp));
    const __m512i bits = _mm512_mask_mov_epi32(_mm512_slli_epi32(codes, 23),
                                               _mm512_cmpeq_epi32_mask(codes, _mm512_setzero_si512()),
                                               _mm512_set1_epi32(0x00400000));
    const __m512 scales = _mm512_castsi512_ps(bits);
    for (int h = 0; h < 4; ++h) {
      const int64_t c = c0 + 32 * h;
      if (h >= subs) {
        v[2 * h] = v[2 * h + 1] = _mm512_setzero_ps();
        continue;
      }
      const __m512i d = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
      const __m512 t = _mm512_mul_ps(lut, _mm512_permutexvar_ps(_mm512_set1_epi32(h), scales));
      v[2 * h] = _mm512_permutexvar_ps(d, t);  // VPERMPS reads the index's low 4 bits
      v[2 * h + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), t);
    }
    factor = 1.f;
  }
};

// Bytes of one 128-wide weight block, and how many blocks ahead the stream is prefetched.
template <class Decode>
constexpr int64_t kBlockBytes = Decode::kBytes;
constexpr int64_t kPrefetchBlocks = 4;

template <class Decode>
void block_scaled_rows(const BlockScaledArgs& a) {
  for (int64_t n = a.n0; n < a.n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    const int64_t srow = scale_row_start(a, n);
    for (int m0 = 0; m0 < a.m; m0 += kRowsPerPass) {
      const int mc = std::min(kRowsPerPass, a.m - m0);
      const float* x[kRowsPerPass];
      const float* xs[kRowsPerPass];
      for (int i = 0; i < kRowsPerPass; ++i) {
        const int64_t r = a.x_rows ? a.x_rows[m0 + std::min(i, mc - 1)] : m0 + std::min(i, mc - 1);
        x[i] = a.xq + r * a.x_ld;
        xs[i] = a.xs + r * a.nb;
      }
      __m512 total[kRowsPerPass];
      for (auto& t : total) t = _mm512_setzero_ps();
      for (int64_t kb = 0; kb < a.nb; ++kb) {
        __m512 v[8];
        float factor;
        // The weight stream runs ahead of the decode (rows are consecutive in memory, so this
        // also reaches into the next row); the hardware prefetcher alone left single-core reads
        // from L3 / DRAM latency-bound (one core, FP8, T = 1: ~7 GB/s without, ~8-9 GB/s with;
        // noisy, shared machine). Past the last row it only touches a cache line, never faults.
        _mm_prefetch(reinterpret_cast<const char*>(row) + (kb + kPrefetchBlocks) * kBlockBytes<Decode>,
                     _MM_HINT_T0);
        Decode::block(a, row, srow, kb, v, factor);
#pragma GCC unroll 8
        for (int i = 0; i < kRowsPerPass; ++i) {
          if (i >= mc) break;
          const float* xp = x[i] + kb * kBlock;
          __m512 acc0 = _mm512_mul_ps(v[0], _mm512_loadu_ps(xp));
          __m512 acc1 = _mm512_mul_ps(v[1], _mm512_loadu_ps(xp + 16));
          acc0 = _mm512_fmadd_ps(v[2], _mm512_loadu_ps(xp + 32), acc0);
          acc1 = _mm512_fmadd_ps(v[3], _mm512_loadu_ps(xp + 48), acc1);
          acc0 = _mm512_fmadd_ps(v[4], _mm512_loadu_ps(xp + 64), acc0);
          acc1 = _mm512_fmadd_ps(v[5], _mm512_loadu_ps(xp + 80), acc1);
          acc0 = _mm512_fmadd_ps(v[6], _mm512_loadu_ps(xp + 96), acc0);
          acc1 = _mm512_fmadd_ps(v[7], _mm512_loadu_ps(xp + 112), acc1);
          total[i] = _mm512_fmadd_ps(_mm512_add_ps(acc0, acc1),
                                     _mm512_set1_ps(xs[i][kb] * factor), total[i]);
        }
      }
      for (int i = 0; i < mc; ++i) a.y[(m0 + i) * a.ldy + n] = _mm512_reduce_add_ps(total[i]);
    }
  }
}

}  // namespace

void gemm_block_scaled_avx512(const BlockScaledArgs& a) {
  if (a.fp4) block_scaled_rows<Fp4Decode>(a);
  else block_scaled_rows<Fp8Decode>(a);
}

MOEX_TARGET_END

}  // namespace moex::cpu::kernels
