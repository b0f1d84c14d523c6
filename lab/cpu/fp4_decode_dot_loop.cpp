// How fast one core decodes FP4 (e2m1) codes into bf16 and meets them in VDPBF16PS, with nothing
// else of the block-scaled kernel around it (no scales, no second row, no prefetch): 1 MB of codes
// resident in L2, against one 128-wide activation block. V0 decodes with VPERMW (the kernel's
// lookup), V1 with VPSHUFB on the high and low bytes of each bf16 plus byte interleaves, V2 skips
// the decode (the dot alone). Prints GB/s of FP4 bytes; compare with block_scaled_kernel_lab run
// with LAB_E=1 LAB_N=256 (the kernel from L2) to see what its per-block work costs.
//
//   g++ -O2 -std=c++20 lab/cpu/fp4_decode_dot_loop.cpp -o build/fp4_decode_dot_loop && build/fp4_decode_dot_loop
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,fma")))
alignas(64) static const uint16_t kTable[32] = {
      0x0000, 0x0300, 0x0380, 0x03C0, 0x0400, 0x0440, 0x0480, 0x04C0,
      0x8000, 0x8300, 0x8380, 0x83C0, 0x8400, 0x8440, 0x8480, 0x84C0,
      0x0000, 0x0300, 0x0380, 0x03C0, 0x0400, 0x0440, 0x0480, 0x04C0,
      0x8000, 0x8300, 0x8380, 0x83C0, 0x8400, 0x8440, 0x8480, 0x84C0};
template <int V> TGT float run(const uint8_t* w, size_t n, const uint16_t* x) {
  __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
  const __m512i t = _mm512_load_si512(kTable);
  __m512i thi, tlo; { alignas(64) uint8_t h[64], l[64]; for (int i=0;i<64;i++){ h[i]=kTable[i%16]>>8; l[i]=kTable[i%16]&0xff;} thi=_mm512_load_si512(h); tlo=_mm512_load_si512(l);}
  const __m512bh x0=(__m512bh)_mm512_loadu_si512(x), x1=(__m512bh)_mm512_loadu_si512(x+32), x2=(__m512bh)_mm512_loadu_si512(x+64), x3=(__m512bh)_mm512_loadu_si512(x+96);
  for (size_t i = 0; i < n; i += 64) {
    __m512i b = _mm512_loadu_si512(w + i);
    __m512bh v0, v1, v2, v3;
    if constexpr (V == 0) {  // VPERMW
      v0 = (__m512bh)_mm512_permutexvar_epi16(b, t);
      v1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 8), t);
      v2 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), t);
      v3 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 12), t);
    } else if constexpr (V == 1) {  // VPSHUFB hi/lo + unpack
      const __m512i m = _mm512_set1_epi8(0x0f);
      __m512i ln = _mm512_and_si512(b, m), hn = _mm512_and_si512(_mm512_srli_epi16(b, 4), m);
      __m512i lh = _mm512_shuffle_epi8(thi, ln), ll = _mm512_shuffle_epi8(tlo, ln);
      __m512i hh = _mm512_shuffle_epi8(thi, hn), hl = _mm512_shuffle_epi8(tlo, hn);
      v0 = (__m512bh)_mm512_unpacklo_epi8(ll, lh); v1 = (__m512bh)_mm512_unpackhi_epi8(ll, lh);
      v2 = (__m512bh)_mm512_unpacklo_epi8(hl, hh); v3 = (__m512bh)_mm512_unpackhi_epi8(hl, hh);
    } else {  // no decode: bound of the dot part
      v0 = (__m512bh)b; v1 = (__m512bh)_mm512_srli_epi16(b, 8); v2 = (__m512bh)b; v3 = (__m512bh)b;
    }
    __m512 d = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), v0, x0), v1, x1), v2, x2), v3, x3);
    acc = _mm512_fmadd_ps(d, _mm512_set1_ps(1.0001f), acc);
  }
  return _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(acc2);
}
int main() {
  const size_t n = 1 << 20;  // 1 MB in L2
  std::vector<uint8_t> w(n); std::mt19937 r(1); for (auto& c : w) c = r();
  std::vector<uint16_t> x(128, 0x3f80);
  float sink = 0;
  for (int V = 0; V < 3; ++V) {
    double best = 1e9;
    for (int rep = 0; rep < 200; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      sink += V == 0 ? run<0>(w.data(), n, x.data()) : V == 1 ? run<1>(w.data(), n, x.data()) : run<2>(w.data(), n, x.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    printf("V%d %s: %.1f GB/s of FP4 bytes\n", V, V==0?"vpermw":V==1?"vpshufb":"no decode", n / best / 1e9);
  }
  if (sink == 12345.f) printf("!\n");  // keeps the sums alive
}
