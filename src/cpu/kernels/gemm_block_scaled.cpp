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
//   FP8 on CPUs with AVX512-BF16 (gemm_block_scaled_avx512bf16): the codes become bf16 with two
//        shifts and a mask per 64 and meet bf16 copies of the activations in VDPBF16PS (two
//        products per lane per op); see decode64_fp8_bf16 for the bit layout and the subnormals.
// Per output element: for each 128-wide block, a float32 dot of 8 vectors, then one FMA of it
// times (activation scale x block factor) into a 16-lane total, reduced once at the end. Rows of
// activations are taken up to 8 at a time, so a decoded weight block is reused 8 times while it
// sits in registers (the decode, not the FMA, is the work per weight byte).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
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

// Activation row of slot i of the pass starting at call row m0 with mc rows; slots past mc
// repeat the last row, so every pointer a pass sets up is valid (the loops stop at mc).
inline int64_t pass_row(const BlockScaledArgs& a, int m0, int i, int mc) {
  const int m = m0 + std::min(i, mc - 1);
  return a.x_rows ? a.x_rows[m] : m;
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

void pack_activation_bf16(const float* q, int64_t n, uint16_t* out) {
  const float up = std::ldexp(1.f, kBf16ActShift);
  for (int64_t g = 0; g < n; g += 64)
    for (int i = 0; i < 64; ++i) {
      const float v = q[g + (i < 32 ? 2 * i : 2 * (i - 32) + 1)] * up;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      out[g + i] = uint16_t(bits >> 16);  // exact: the low 16 bits are zero
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
        const int64_t r = pass_row(a, m0, i, mc);
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

MOEX_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
namespace {

// 64 FP8 codes of one row (bytes at or past `valid` read as 0) as bf16 with the value x 2^-120:
// sign | code's low 7 bits << 4 puts the e4m3 exponent in the bf16 exponent field unchanged and
// its 3 mantissa bits on top of bf16's 7. Read as 32 words (code 2i + 1 in the high byte), an
// arithmetic shift by 4 places the high code's sign on bit 15 and its magnitude on bits 4..10,
// and one mask keeps exactly those: 5 ALU ops per 64 codes, against ~20 for the float decode.
// The even codes go to `even`, the odd ones to `odd` (pack_activation_bf16's column order).
// e4m3 subnormals (exponent 0, mantissa != 0) land on bf16 subnormals, which VDPBF16PS reads as
// zero; the returned mask names the codes of exponent 0 among the valid ones (subnormals and
// zeros: one test, where telling them apart took two) and the caller adds their products itself.
inline __mmask64 decode64_fp8_bf16(const uint8_t* p, int64_t valid, __m512bh& even, __m512bh& odd) {
  const __mmask64 in = valid >= 64 ? ~0ull : valid <= 0 ? 0ull : (1ull << valid) - 1;
  const __m512i w = valid >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(in, p);
  const __m512i keep = _mm512_set1_epi16(int16_t(0x87F0));
  odd = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(w, 4), keep);
  even = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 4), keep);
  return _mm512_mask_testn_epi8_mask(in, w, _mm512_set1_epi8(0x78));
}

// The products VDPBF16PS dropped: sum over the masked codes of a 128-wide block (exponent 0;
// zeros add nothing) of value x activation (natural column order), in the dot's 2^-8 units.
// Vector code without a loop over the mask bits, inlined: about 1 block in 70 of a checkpoint
// has such a code, and the scalar loop this replaces (a call that spilled the caller's vectors,
// branches per bit) held 2 Xeon vCPUs at 26 GB/s where the stream without it ran 29-31
// (docs/cpu.md). The codes are decoded as Fp8Decode does (exact for subnormals: fp16 subnormals).
__attribute__((always_inline)) inline float subnormal_products(const uint8_t* codes, __mmask64 lo, __mmask64 hi,
                                                               const float* x) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i keep = _mm512_set1_epi16(int16_t(0xBF80));
  for (int q = 0; q < 4; ++q) {
    const __mmask32 m = __mmask32((q < 2 ? lo : hi) >> (32 * (q & 1)));
    const __m256i b = _mm256_maskz_loadu_epi8(m, codes + 32 * q);  // only the masked codes
    const __m512i h16 = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(b), 7), keep);
    acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h16)), _mm512_loadu_ps(x + 32 * q), acc);
    acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h16, 1)), _mm512_loadu_ps(x + 32 * q + 16),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// 64 FP4 codes (32 bytes at p; bytes at or past valid_bytes read as 0) as bf16
// values x 2^-120 (the FP8 kernel's units, so both meet the same activation rows): bytes widened
// to words, VPERMW looks up the low nibble (its index is the word's low 5 bits: the table
// repeats every 16) and, after a shift, the high one. e2m1 x 2^-120 is a normal bf16 for every
// code: no subnormals to add back.
inline void decode64_fp4_bf16(const uint8_t* p, int64_t valid_bytes, __m512bh& even, __m512bh& odd) {
  const __m512i w = _mm512_cvtepu8_epi16(
      valid_bytes >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
      : valid_bytes <= 0 ? _mm256_setzero_si256()
                         : _mm256_maskz_loadu_epi8(__mmask32((1u << valid_bytes) - 1), p));
  // bf16 bits of 0, .5, 1, 1.5, 2, 3, 4, 6 (x 2^-120: exponent fields 6..9) and their negatives,
  // twice (VPERMW indexes 32 words).
  alignas(64) static constexpr uint16_t kTable[32] = {
      0x0000, 0x0300, 0x0380, 0x03C0, 0x0400, 0x0440, 0x0480, 0x04C0,
      0x8000, 0x8300, 0x8380, 0x83C0, 0x8400, 0x8440, 0x8480, 0x84C0,
      0x0000, 0x0300, 0x0380, 0x03C0, 0x0400, 0x0440, 0x0480, 0x04C0,
      0x8000, 0x8300, 0x8380, 0x83C0, 0x8400, 0x8440, 0x8480, 0x84C0};
  const __m512i t = _mm512_load_si512(kTable);
  even = (__m512bh)_mm512_permutexvar_epi16(w, t);
  odd = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), t);
}

// The four UE8M0 scales of one row's 128-wide FP4 block as two lane vectors, one per 64 codes:
// lanes 0-7 the first 32-block's scale, lanes 8-15 the second's (where VDPBF16PS sums them).
inline void fp4_block_scales(const uint8_t* sp, int64_t subs, __m512& s0, __m512& s1) {
  const __m512i codes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(__mmask16((1u << subs) - 1), sp));
  // 2^(e-127) is the float with exponent field e; code 0 (2^-127) is the subnormal 0x00400000.
  const __m512i bits = _mm512_mask_mov_epi32(_mm512_slli_epi32(codes, 23),
                                             _mm512_cmpeq_epi32_mask(codes, _mm512_setzero_si512()),
                                             _mm512_set1_epi32(0x00400000));
  const __m512 sc = _mm512_castsi512_ps(bits);
  s0 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), sc);
  s1 = _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), sc);
}

// NR weight rows n, n + stride, ... against every activation row, kRowsPerPass at a time. From
// 4 activation rows up, two weight rows share each activation load: with one, the activation
// rows (2 bytes per column, re-read from L2 for every weight row once several rows no longer fit
// L1) outweigh the codes (FP8, 4 / 8 rows: 22 / 15 GB/s with two, 17 / 10 with one). At 1 - 2
// rows it depends on the machine (BlockScaledArgs::pair_from_rows).
// Per 128-wide block and row: FP8, one float (block scale x activation scale) times the block's
// dot; FP4, the 1 x 32 scales per lane group first (fp4_block_scales), then the activation scale.
template <bool kFp4, int NR, int kPass>
void bf16_rows(const BlockScaledArgs& a, int64_t n, int64_t stride) {
  constexpr int64_t kCodeBytes = kFp4 ? kBlock / 2 : kBlock;  // bytes of one 128-wide block
  // How far ahead of the decode each row's codes are prefetched (bytes): each of the NR rows is
  // one sequential stream through consecutive rows (block_scaled_bf16), so this is 4 KB ahead in
  // that stream. lab/cpu's block_scaled_kernel_lab measured 1 - 8 KB (2 cores of a Zen 5 EPYC,
  // FP8, 1 activation row, one stream: 512 B left it latency-bound at ~22 GB/s, 4 KB reached 34 of
  // 44 GB/s) and 4 / 8 KB for two streams (Intel, below).
  constexpr int64_t kAhead = 4096;
  const uint8_t* row[NR];
  int64_t srow[NR];
  for (int r = 0; r < NR; ++r)
    row[r] = a.w + (n + r * stride) * a.row_bytes, srow[r] = scale_row_start(a, n + r * stride);
  for (int m0 = 0; m0 < a.m; m0 += kPass) {
    const int mc = std::min(kPass, a.m - m0);
    const uint16_t* xb[kPass];
    const float* xq[kPass];
    const float* xs[kPass];
    for (int i = 0; i < kPass; ++i) {
      const int64_t r = pass_row(a, m0, i, mc);
      xb[i] = a.xb + r * a.x_ld;
      xq[i] = a.xq + r * a.x_ld;
      xs[i] = a.xs + r * a.nb;
    }
    __m512 total[NR][kPass];
    for (auto& tr : total)
      for (auto& t : tr) t = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < a.nb; ++kb) {
      const int64_t valid = a.k - kb * kBlock;  // columns left in the row
      __m512bh e0[NR], o0[NR], e1[NR], o1[NR];
      __mmask64 sub0[NR] = {}, sub1[NR] = {};
      float factor[NR];
      __m512 s0[NR], s1[NR];
      bool any_sub = false;
#pragma GCC unroll 2
      for (int r = 0; r < NR; ++r) {
        const uint8_t* p = row[r] + kb * kCodeBytes;
        for (int64_t off = 0; off < kCodeBytes; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(p) + kAhead + off, _MM_HINT_T0);
        if constexpr (kFp4) {
          decode64_fp4_bf16(p, valid / 2, e0[r], o0[r]);
          decode64_fp4_bf16(p + 32, valid / 2 - 32, e1[r], o1[r]);
          fp4_block_scales(static_cast<const uint8_t*>(a.scale) + srow[r] + kb * 4,
                           std::min<int64_t>(4, (valid + 31) / 32), s0[r], s1[r]);
          factor[r] = 256.f;
        } else {
          sub0[r] = decode64_fp8_bf16(p, valid, e0[r], o0[r]);
          sub1[r] = decode64_fp8_bf16(p + 64, valid - 64, e1[r], o1[r]);
          any_sub |= (sub0[r] | sub1[r]) != 0;
          factor[r] = quant::scale_value(a.scale, a.scale_dtype, srow[r] + kb) * 256.f;
        }
        // Weights carry 2^-120 and activations 2^112 (kBf16ActShift): the dot is 2^-8 too small.
      }
#pragma GCC unroll 8
      for (int i = 0; i < kPass; ++i) {
        if (i >= mc) break;
        const uint16_t* xp = xb[i] + kb * kBlock;
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xp), x1 = (__m512bh)_mm512_loadu_si512(xp + 32);
        const __m512bh x2 = (__m512bh)_mm512_loadu_si512(xp + 64), x3 = (__m512bh)_mm512_loadu_si512(xp + 96);
#pragma GCC unroll 2
        for (int r = 0; r < NR; ++r) {
          __m512 blk;
          if constexpr (kFp4) {
            // Each 64 codes in one chain: its two 32-blocks sit in separate lanes, scaled apart.
            const __m512 d0 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), e0[r], x0), o0[r], x1);
            const __m512 d1 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), e1[r], x2), o1[r], x3);
            blk = _mm512_fmadd_ps(d0, s0[r], _mm512_mul_ps(d1, s1[r]));
          } else {
            __m512 acc0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), e0[r], x0);
            __m512 acc1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), o0[r], x1);
            acc0 = _mm512_dpbf16_ps(acc0, e1[r], x2);
            acc1 = _mm512_dpbf16_ps(acc1, o1[r], x3);
            blk = _mm512_add_ps(acc0, acc1);
            if (__builtin_expect(any_sub, 0) && (sub0[r] | sub1[r]))
              blk = _mm512_mask_add_ps(blk, 1, blk,
                                       _mm512_set1_ps(subnormal_products(row[r] + kb * kBlock, sub0[r],
                                                                         sub1[r], xq[i] + kb * kBlock)));
          }
          total[r][i] = _mm512_fmadd_ps(blk, _mm512_set1_ps(xs[i][kb] * factor[r]), total[r][i]);
        }
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < mc; ++i) a.y[(m0 + i) * a.ldy + n + r * stride] = _mm512_reduce_add_ps(total[r][i]);
  }
}

// Paired weight rows come from the two halves of the call's rows (n0 + i with n0 + half + i), not
// from neighbours: two neighbouring rows shorter than 4 KB share a page, and two streams
// interleaved in one page streamed at ~16 GB/s from DRAM where two streams in separate pages
// reached ~26 (2 Intel Xeon vCPUs, FP8, one activation row, 8 x 7168 x 2048 codes; docs/cpu.md).
// Each row's result does not depend on its partner: the order changes no bit.
template <bool kFp4, int kPass>
void block_scaled_bf16_pass(const BlockScaledArgs& a) {
  int64_t n = a.n0;
  if (a.m >= a.pair_from_rows) {
    const int64_t half = (a.n1 - a.n0) / 2;
    for (int64_t i = 0; i < half; ++i) bf16_rows<kFp4, 2, kPass>(a, a.n0 + i, half);
    n = a.n0 + 2 * half;
  }
  for (; n < a.n1; ++n) bf16_rows<kFp4, 1, kPass>(a, n, 1);
}

// One activation row (decode) gets a pass of one row: with the pass's eight accumulators per
// weight row and its row loop bounded at run time, GCC kept them on the stack.
template <bool kFp4>
void block_scaled_bf16(const BlockScaledArgs& a) {
  if (a.m == 1) block_scaled_bf16_pass<kFp4, 1>(a);
  else block_scaled_bf16_pass<kFp4, kRowsPerPass>(a);
}

}  // namespace

void gemm_block_scaled_avx512bf16(const BlockScaledArgs& a) {
  if (!a.xb) gemm_block_scaled_avx512(a);
  else if (a.fp4) block_scaled_bf16<true>(a);
  else block_scaled_bf16<false>(a);
}

MOEX_TARGET_END

}  // namespace moex::cpu::kernels
