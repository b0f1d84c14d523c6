// The block-scaled (FP8 / FP4) experts kernel for CPUs with AVX2, FMA and F16C but no AVX-512
// (most AMD Zen 1-3 and Intel client parts, many cloud VMs). Without it those machines ran the
// portable kernel, a table lookup and a scalar product per weight: FP8 decode of DeepSeek-V3-sized
// experts at ~1.4 GB/s, 4 % of a 2-core VM's DRAM floor. Contract: kernels.hpp, BlockScaledArgs.
//
// Decode (16 ymm registers, 8 float lanes):
//   FP8: 8 codes sign-extended to 32 bits, << 20 and masked: floats of the codes' values x 2^-120,
//        subnormals included (fp8x8). The block's sums get the 2^120 back (exact) before its scales.
//        Products of two small values can be float subnormals: exact enough for the float32 sums
//        (an absolute error of 2^-150 in those units), and rare (both factors under ~1/8 of a
//        block's largest of 448). A caller running with denormals flushed to zero (MXCSR's FTZ /
//        DAZ, as torch.set_flush_denormal(True) sets) would drop the e4m3 subnormal codes, so the
//        kernel runs with both off and puts the caller's mode back (IeeeDenormals).
//   FP4: PSHUFB looks the fp16 high byte of each nibble up, VCVTPH2PS makes floats (fp4x16). Low
//        nibbles are the even columns of a 32 block, high ones the odd columns (the float kernels'
//        activation order, evens then odds).
// Per output element (the same operations whatever the call's rows, columns or thread, so results
// never depend on how work is split):
//   FP8: per 128 block, two 8-lane chains over its 8-code chunks (even chunks, odd chunks), their
//        sum times 2^120, times (activation scale x block scale), added into an 8-lane total;
//   FP4: per 32 block, one 8-lane chain (evens, then odds) times (activation scale x the 32
//        block's UE8M0 scale) added into the total;
//   then one horizontal sum in a fixed order.
// Loops: one activation row (decode) takes four weight rows at a time (eight independent chains;
// with two, 13.7 against 15.7 GB/s per core from L2); more rows take passes of up to four
// activation rows sharing each decoded chunk.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/target.hpp"
#include "moex/quant.hpp"

MOEX_TARGET_BEGIN("avx2,fma,f16c")

namespace moex::cpu::kernels {
namespace {

constexpr int64_t kBlock = quant::kActBlock;  // 128
// Bytes ahead of the decode that each weight row's stream is prefetched (one line per 64 bytes
// decoded). lab/cpu's block_scaled_kernel_lab found 4 KB right for the AVX-512 bf16 kernel
// (512 B left one stream latency-bound); for this one 1-16 KB were level on Zen 3.
constexpr int64_t kAhead = 4096;

// The address kAhead bytes past byte `at` of a weight row's stream, when a step of the loop reads
// NR consecutive rows side by side and the next step the NR after them: past the row's end its
// stream goes on NR rows further, not in the next row, which another stream of this step has
// already read. Prefetching straight on (row + at + kAhead) fetched those read bytes, and left the
// next step's rows to start cold: on 2 Zen 3 cores (FP8, 7 KB rows, four per step) 20-22 GB/s
// from DRAM against 25-27.5 with this (docs/cpu.md).
inline const char* ahead_in_stream(const uint8_t* row, int64_t at, int64_t row_bytes, int nr) {
  const int64_t p = at + kAhead;
  return reinterpret_cast<const char*>(row) + p + (p / row_bytes) * (nr - 1) * row_bytes;
}

inline int64_t scale_row(const BlockScaledArgs& a, int64_t n) {
  return quant::fused_scale_row(n, a.fused_rows, a.bn) * a.scale_cols;
}

inline int64_t act_row(const BlockScaledArgs& a, int m) { return a.x_rows ? a.x_rows[m] : m; }

// 8 FP8 codes -> 8 floats holding value x 2^-120: the sign-extended byte << 20, masked to sign |
// code bits 0..6, puts the e4m3 exponent in the low 4 bits of the float's exponent field and its 3
// mantissa bits on top of the float's mantissa; exponent 0 (e4m3 subnormals) lands on float
// subnormals of the same ratio, so every code is exact. Three integer ops per 8 codes: the fp16
// route (VCVTPH2PS) ran at ~12.5 GB/s per core where this runs at ~17.5 (Zen 3, from L2), since
// the conversion shares the FP ports with the FMAs.
inline __m256 fp8x8(const uint8_t* p) {
  const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(w, 20), _mm256_set1_epi32(int(0x87F00000u))));
}

// 16 nibble indices (bytes 0..15) -> two vectors of 8 floats, the e2m1 values: e2m1 values are
// fp16 numbers whose low byte is zero, so PSHUFB looks the high byte up in a 16-byte table and an
// unpack with zero makes the fp16 words. (VPERMPS from an 8-float table with the sign moved on by
// integer ops, or PSHUFB to e4m3 codes and fp8x8's integer route, ran slower on Zen 3: 4.7-5.2
// against 6.4-6.9 GB/s of FP4 bytes per core from L2; lab/cpu/avx2_decode_lab.cpp.)
inline void fp4x16(__m128i idx, __m256& lo, __m256& hi) {
  const __m128i table = _mm_setr_epi8(0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46, char(0x80),
                                      char(0xB8), char(0xBC), char(0xBE), char(0xC0), char(0xC2),
                                      char(0xC4), char(0xC6));
  const __m128i hb = _mm_shuffle_epi8(table, idx);
  lo = _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), hb));
  hi = _mm256_cvtph_ps(_mm_unpackhi_epi8(_mm_setzero_si128(), hb));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

inline float ue8m0(uint8_t e) {  // 2^(e-127); code 0 is the float32 subnormal 2^-127
  const uint32_t bits = e ? uint32_t(e) << 23 : 0x00400000u;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The P activation rows of a pass from call row m0: values and block scales.
template <int P>
struct Rows {
  const float* x[P];
  const float* xs[P];
  Rows(const BlockScaledArgs& a, int m0) {
    for (int i = 0; i < P; ++i) {
      const int64_t ar = act_row(a, m0 + i);
      x[i] = a.xq + ar * a.x_ld;
      xs[i] = a.xs + ar * a.nb;
    }
  }
};

// The 8-lane totals of NR weight rows x P activation rows, stored as their horizontal sums.
template <int NR, int P>
struct Totals {
  __m256 v[NR][P];
  Totals() {
    for (auto& r : v)
      for (auto& t : r) t = _mm256_setzero_ps();
  }
  void store(const BlockScaledArgs& a, int64_t n, int m0) const {
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < P; ++i) a.y[(m0 + i) * a.ldy + n + r] = hsum(v[r][i]);
  }
};

// One 128-wide block of NR weight rows (codes at w[r], 128 bytes each) against P activation rows
// (x[i], 128 floats each), into the two chains per pair: 8-code chunks alternate between them.
template <int NR, int P>
inline void fp8_block(const uint8_t* const (&w)[NR], const float* const (&x)[P], __m256 (&c0)[NR][P],
                      __m256 (&c1)[NR][P]) {
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256 v = fp8x8(w[r] + 8 * c);
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i) {
        if (c % 2 == 0) c0[r][i] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x[i] + 8 * c), c0[r][i]);
        else c1[r][i] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x[i] + 8 * c), c1[r][i]);
      }
    }
  }
}

// NR consecutive weight rows from n against P activation rows from m0 (every pointer valid).
template <int NR, int P>
void fp8_rows(const BlockScaledArgs& a, int64_t n, int m0) {
  const uint8_t* row[NR];
  int64_t srow[NR];
  for (int r = 0; r < NR; ++r) row[r] = a.w + (n + r) * a.row_bytes, srow[r] = scale_row(a, n + r);
  const Rows<P> act(a, m0);
  const float* const(&x)[P] = act.x;
  const float* const(&xs)[P] = act.xs;
  Totals<NR, P> total;
  const __m256 up = _mm256_set1_ps(0x1p120f);  // exact: the codes' 2^-120 back, no overflow
  for (int64_t kb = 0; kb < a.nb; ++kb) {
    __m256 c0[NR][P], c1[NR][P];
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < P; ++i) c0[r][i] = c1[r][i] = _mm256_setzero_ps();
    const float* xb[P];
    for (int i = 0; i < P; ++i) xb[i] = x[i] + kb * kBlock;
    const int64_t valid = a.k - kb * kBlock;
    if (valid >= kBlock) {
      const uint8_t* wb[NR];
      for (int r = 0; r < NR; ++r) {
        wb[r] = row[r] + kb * kBlock;
        const char* pf = ahead_in_stream(row[r], kb * kBlock, a.row_bytes, NR);
        _mm_prefetch(pf, _MM_HINT_T0);
        _mm_prefetch(pf + 64, _MM_HINT_T0);
      }
      fp8_block<NR, P>(wb, xb, c0, c1);
    } else {  // the row's last, partial block (K % 128 != 0): copied so nothing past it is read
      alignas(32) uint8_t tail[NR][kBlock] = {};
      const uint8_t* wb[NR];
      for (int r = 0; r < NR; ++r) {
        std::memcpy(tail[r], row[r] + kb * kBlock, size_t(valid));
        wb[r] = tail[r];
      }
      fp8_block<NR, P>(wb, xb, c0, c1);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const float f = quant::scale_value(a.scale, a.scale_dtype, srow[r] + kb);
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i)
        total.v[r][i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_add_ps(c0[r][i], c1[r][i]), up),
                                      _mm256_set1_ps(xs[i][kb] * f), total.v[r][i]);
    }
  }
  total.store(a, n, m0);
}

// FP4: scales are UE8M0 bytes, one per 32 block. The experts' K is a multiple of 32; a dense
// linear's may end inside a 32 block, whose bytes are then copied (nothing past the row is read;
// the missing codes decode as zero, against the activation rows' zeros).
template <int NR, int P>
void fp4_rows(const BlockScaledArgs& a, int64_t n, int m0) {
  const uint8_t* row[NR];
  const uint8_t* sc[NR];
  for (int r = 0; r < NR; ++r) {
    row[r] = a.w + (n + r) * a.row_bytes;
    sc[r] = static_cast<const uint8_t*>(a.scale) + scale_row(a, n + r);
  }
  const Rows<P> act(a, m0);
  const float* const(&x)[P] = act.x;
  const float* const(&xs)[P] = act.xs;
  Totals<NR, P> total;
  const __m128i nib = _mm_set1_epi8(0x0f);
  for (int64_t s = 0; 32 * s < a.k; ++s) {
    const int64_t col = 32 * s, kb = col / kBlock;
    const int64_t bytes = std::min<int64_t>(16, (a.k - col) / 2);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      if (s % 4 == 0) _mm_prefetch(ahead_in_stream(row[r], col / 2, a.row_bytes, NR), _MM_HINT_T0);
      __m128i b;
      if (bytes == 16) {
        b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + col / 2));
      } else {
        alignas(16) uint8_t t[16] = {};
        std::memcpy(t, row[r] + col / 2, size_t(bytes));
        b = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
      }
      __m256 lo, hi;
      __m256 p[P];
      fp4x16(_mm_and_si128(b, nib), lo, hi);  // the evens
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i)
        p[i] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x[i] + col + 8), _mm256_mul_ps(lo, _mm256_loadu_ps(x[i] + col)));
      fp4x16(_mm_and_si128(_mm_srli_epi16(b, 4), nib), lo, hi);  // the odds
      const float f = ue8m0(sc[r][s]);
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i) {
        p[i] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x[i] + col + 16), p[i]);
        p[i] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x[i] + col + 24), p[i]);
        total.v[r][i] = _mm256_fmadd_ps(p[i], _mm256_set1_ps(xs[i][kb] * f), total.v[r][i]);
      }
    }
  }
  total.store(a, n, m0);
}

template <bool kFp4, int NR, int P>
void rows(const BlockScaledArgs& a, int64_t n, int m0) {
  if constexpr (kFp4) fp4_rows<NR, P>(a, n, m0);
  else fp8_rows<NR, P>(a, n, m0);
}

template <bool kFp4>
void block_scaled(const BlockScaledArgs& a) {
  if (a.m == 1) {  // decode: four weight rows per step for independent chains
    int64_t n = a.n0;
    for (; n + 4 <= a.n1; n += 4) rows<kFp4, 4, 1>(a, n, 0);
    for (; n + 2 <= a.n1; n += 2) rows<kFp4, 2, 1>(a, n, 0);
    if (n < a.n1) rows<kFp4, 1, 1>(a, n, 0);
    return;
  }
  for (int64_t n = a.n0; n < a.n1; ++n) {
    int m0 = 0;
    for (; m0 + 4 <= a.m; m0 += 4) rows<kFp4, 1, 4>(a, n, m0);
    switch (a.m - m0) {
      case 3: rows<kFp4, 1, 3>(a, n, m0); break;
      case 2: rows<kFp4, 1, 2>(a, n, m0); break;
      case 1: rows<kFp4, 1, 1>(a, n, m0); break;
      default: break;
    }
  }
}

}  // namespace

namespace {
// Gradual underflow for the call (MXCSR bit 15 FTZ, bit 6 DAZ cleared), the caller's mode after.
struct IeeeDenormals {
  unsigned saved = _mm_getcsr();
  IeeeDenormals() { _mm_setcsr(saved & ~0x8040u); }
  ~IeeeDenormals() { _mm_setcsr(saved); }
  IeeeDenormals(const IeeeDenormals&) = delete;
  IeeeDenormals& operator=(const IeeeDenormals&) = delete;
};
}  // namespace

void gemm_block_scaled_avx2(const BlockScaledArgs& a) {
  const IeeeDenormals ieee;
  if (a.fp4) block_scaled<true>(a);
  else block_scaled<false>(a);
}

}  // namespace moex::cpu::kernels

MOEX_TARGET_END
