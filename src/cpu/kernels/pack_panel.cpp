// Weight packing at prepare time (see kernels.hpp, pack_panel): one panel of 16 output columns
// from 16 source rows. Both packed layouts are a transpose of 32-bit units: a bf16 pair row holds,
// per lane, the two bf16 values of source dword p of that lane's row; an fp32 panel row holds
// source dword k. So the AVX-512 kernel reads 64 bytes of each of the 16 rows (one zmm each,
// contiguous reads along every row), transposes the 16 x 16 dwords in registers and writes 16
// whole 64-byte packed rows with non-temporal stores: each destination line is written once and
// never read for ownership. The element-by-element loop it replaced wrote each 64-byte packed row
// lane by lane, 16 times, after a separate zeroing pass (docs/cpu.md, packing).
#include <immintrin.h>

#include <cstring>

#include "cpu/kernels/kernels.hpp"

// GCC 12 reports '__Y may be used uninitialized' inside its own avx512fintrin.h for the shuffles
// inlined here (a pass-through operand of _mm512_undefined_epi32()); a known false positive of the
// header, as in activation_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define MOEX_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace moex::cpu::kernels {
namespace {

constexpr int64_t kRowBytes = 64;  // one packed row: 16 lanes x 32 bits

// Bytes of the source row a packed-row block at byte offset `at` may read: the rest is zero.
inline int64_t valid_bytes(int64_t row_bytes, int64_t at) {
  const int64_t v = row_bytes - at;
  return v <= 0 ? 0 : (v >= kRowBytes ? kRowBytes : v);
}

// r[i] = 16 dwords of row i -> r[j] = dword j of rows 0..15 (unpack 32, unpack 64, then a 4 x 4
// transpose of 128-bit lanes).
MOEX_TARGET_AVX512 inline void transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3.
  __m512i u[16];
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

}  // namespace

void pack_panel_portable(const void* const* rows, int64_t k, int64_t k_pad, int elem, void* dst) {
  const int64_t row_bytes = k * elem, out_rows = k_pad * elem / 4;
  uint32_t* d = static_cast<uint32_t*>(dst);
  for (int64_t p = 0; p < out_rows; ++p)
    for (int lane = 0; lane < kPanelCols; ++lane) {
      uint32_t v = 0;  // bytes past the row (K tail, padding, missing rows) stay zero
      const int64_t n = rows[lane] ? valid_bytes(row_bytes, 4 * p) : 0;
      if (n > 0) std::memcpy(&v, static_cast<const char*>(rows[lane]) + 4 * p, size_t(n < 4 ? n : 4));
      d[p * kPanelCols + lane] = v;
    }
}

MOEX_TARGET_AVX512 void pack_panel_avx512(const void* const* rows, int64_t k, int64_t k_pad,
                                          int elem, void* dst) {
  const int64_t row_bytes = k * elem, out_bytes = k_pad * elem;
  const char* src[kPanelCols];
  bool any_missing = false;
  for (int lane = 0; lane < kPanelCols; ++lane) {
    src[lane] = static_cast<const char*>(rows[lane]);
    any_missing |= src[lane] == nullptr;
  }
  char* d = static_cast<char*>(dst);
  __m512i r[16];
  int64_t at = 0;
  // Whole 64-byte blocks of every row: plain loads (missing rows, the panel past N, are zero).
  for (; at + kRowBytes <= row_bytes; at += kRowBytes) {
    if (!any_missing) {
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src[i] + at);
    } else {
      for (int i = 0; i < 16; ++i)
        r[i] = src[i] ? _mm512_loadu_si512(src[i] + at) : _mm512_setzero_si512();
    }
    transpose16x16_epi32(r);
    for (int i = 0; i < 16; ++i) _mm512_stream_si512(reinterpret_cast<__m512i*>(d + at * 16 + i * kRowBytes), r[i]);
  }
  // The tail of K and the zero padding up to k_pad: byte-masked loads; fp32 panels (k_pad = K)
  // may end inside a block, so only the packed rows that exist are stored.
  for (; at < out_bytes; at += kRowBytes) {
    const int64_t v = valid_bytes(row_bytes, at);
    const __mmask64 m = v >= 64 ? ~__mmask64(0) : ((__mmask64(1) << v) - 1);
    for (int i = 0; i < 16; ++i)
      r[i] = src[i] ? _mm512_maskz_loadu_epi8(m, src[i] + at) : _mm512_setzero_si512();
    transpose16x16_epi32(r);
    const int64_t n = (out_bytes - at) / 4 < 16 ? (out_bytes - at) / 4 : 16;
    for (int i = 0; i < n; ++i) _mm512_stream_si512(reinterpret_cast<__m512i*>(d + at * 16 + i * kRowBytes), r[i]);
  }
  // The non-temporal stores are weakly ordered: make them visible before the packed weights are
  // read by other threads.
  _mm_sfence();
}

}  // namespace moex::cpu::kernels
