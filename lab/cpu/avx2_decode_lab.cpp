// FP8 / FP4 decode forms for AVX2 (no AVX-512), each decoding two weight rows and multiplying them
// into an activation row, from L2 (64 or 128 rows of K = 7168), one core; GB/s of codes. The
// AVX2 block-scaled kernel (src/cpu/kernels/gemm_block_scaled_avx2.cpp) took the fastest of each.
//   FP8 fp16: sign-extended byte << 7, masked, VCVTPH2PS (the AVX-512 kernel's route);
//   FP8 int:  sign-extended to 32 bits, << 20, masked: floats of value x 2^-120 (the kernel's);
//   FP8 int x 2^112: the same with one multiply per 8 codes (products never subnormal);
//   FP4 fp16: PSHUFB of each nibble's fp16 high byte, unpack with zero, VCVTPH2PS (the kernel's);
//   FP4 e4m3 int: PSHUFB to e4m3 codes, then FP8's integer route;
//   FP4 vpermps: VPERMPS on an 8-float table, the sign moved in by integer ops.
//
//   g++ -O3 -std=c++20 lab/cpu/avx2_decode_lab.cpp -o /tmp/avx2_decode_lab && /tmp/avx2_decode_lab
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

namespace {

constexpr int64_t K = 7168;

AVX2 float reduce(__m256 a, __m256 b, __m256 c, __m256 d) {
  float o[8];
  _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return o[0] + o[7];
}

AVX2 inline __m256 fp8_int(const uint8_t* p) {
  return _mm256_castsi256_ps(_mm256_and_si256(
      _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 20),
      _mm256_set1_epi32(int(0x87F00000u))));
}

AVX2 float fp8_fp16(const uint8_t* w, const float* x, int64_t rows) {
  __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
  for (int64_t r = 0; r < rows; r += 2) {
    const uint8_t* a = w + r * K;
    const uint8_t* b = a + K;
    for (int64_t k = 0; k < K; k += 16) {
      const __m256i m = _mm256_set1_epi16(int16_t(0xBF80));
      const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(a + k))), 7), m);
      const __m256i g = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + k))), 7), m);
      const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
      t0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), x0, t0);
      t1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), x1, t1);
      t2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(g)), x0, t2);
      t3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(g, 1)), x1, t3);
    }
  }
  return reduce(t0, t1, t2, t3);
}

template <bool kUp>
AVX2 float fp8_int_rows(const uint8_t* w, const float* x, int64_t rows) {
  __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
  const __m256 up = _mm256_set1_ps(0x1p112f);
  for (int64_t r = 0; r < rows; r += 2) {
    const uint8_t* a = w + r * K;
    const uint8_t* b = a + K;
    for (int64_t k = 0; k < K; k += 16) {
      __m256 a0 = fp8_int(a + k), a1 = fp8_int(a + k + 8), b0 = fp8_int(b + k), b1 = fp8_int(b + k + 8);
      if (kUp) a0 = _mm256_mul_ps(a0, up), a1 = _mm256_mul_ps(a1, up), b0 = _mm256_mul_ps(b0, up), b1 = _mm256_mul_ps(b1, up);
      const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
      t0 = _mm256_fmadd_ps(a0, x0, t0), t1 = _mm256_fmadd_ps(a1, x1, t1);
      t2 = _mm256_fmadd_ps(b0, x0, t2), t3 = _mm256_fmadd_ps(b1, x1, t3);
    }
  }
  return reduce(t0, t1, t2, t3);
}
AVX2 float fp8_int_plain(const uint8_t* w, const float* x, int64_t rows) { return fp8_int_rows<false>(w, x, rows); }
AVX2 float fp8_int_up(const uint8_t* w, const float* x, int64_t rows) { return fp8_int_rows<true>(w, x, rows); }

// FP4: 16 bytes = one 32 block of a row: low nibbles the 16 evens, high the 16 odds (x in that order).
AVX2 inline void nibbles(__m128i b, __m128i& lo, __m128i& hi) {
  const __m128i nib = _mm_set1_epi8(0x0f);
  lo = _mm_and_si128(b, nib);
  hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
}

AVX2 float fp4_fp16(const uint8_t* w, const float* x, int64_t rows) {
  __m256 t[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m128i table = _mm_setr_epi8(0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46, char(0x80), char(0xB8),
                                      char(0xBC), char(0xBE), char(0xC0), char(0xC2), char(0xC4), char(0xC6));
  const __m128i z = _mm_setzero_si128();
  for (int64_t r = 0; r < rows; r += 2)
    for (int64_t k = 0; k < K; k += 32)
      for (int rr = 0; rr < 2; ++rr) {
        __m128i lo, hi;
        nibbles(_mm_loadu_si128((const __m128i*)(w + (r + rr) * K / 2 + k / 2)), lo, hi);
        const __m128i e = _mm_shuffle_epi8(table, lo), o = _mm_shuffle_epi8(table, hi);
        __m256& A = t[2 * rr];
        __m256& B = t[2 * rr + 1];
        A = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(z, e)), _mm256_loadu_ps(x + k), A);
        B = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(z, e)), _mm256_loadu_ps(x + k + 8), B);
        A = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(z, o)), _mm256_loadu_ps(x + k + 16), A);
        B = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(z, o)), _mm256_loadu_ps(x + k + 24), B);
      }
  return reduce(t[0], t[1], t[2], t[3]);
}

AVX2 float fp4_e4m3_int(const uint8_t* w, const float* x, int64_t rows) {
  __m256 t[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m128i table = _mm_setr_epi8(0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C, char(0x80), char(0xB0),
                                      char(0xB8), char(0xBC), char(0xC0), char(0xC4), char(0xC8), char(0xCC));
  const __m256i m = _mm256_set1_epi32(int(0x87F00000u));
  auto f = [&](__m128i v) AVX2 {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(v), 20), m));
  };
  for (int64_t r = 0; r < rows; r += 2)
    for (int64_t k = 0; k < K; k += 32)
      for (int rr = 0; rr < 2; ++rr) {
        __m128i lo, hi;
        nibbles(_mm_loadu_si128((const __m128i*)(w + (r + rr) * K / 2 + k / 2)), lo, hi);
        const __m128i e = _mm_shuffle_epi8(table, lo), o = _mm_shuffle_epi8(table, hi);
        __m256& A = t[2 * rr];
        __m256& B = t[2 * rr + 1];
        A = _mm256_fmadd_ps(f(e), _mm256_loadu_ps(x + k), A);
        B = _mm256_fmadd_ps(f(_mm_unpackhi_epi64(e, e)), _mm256_loadu_ps(x + k + 8), B);
        A = _mm256_fmadd_ps(f(o), _mm256_loadu_ps(x + k + 16), A);
        B = _mm256_fmadd_ps(f(_mm_unpackhi_epi64(o, o)), _mm256_loadu_ps(x + k + 24), B);
      }
  return reduce(t[0], t[1], t[2], t[3]);
}

AVX2 float fp4_vpermps(const uint8_t* w, const float* x, int64_t rows) {
  __m256 t[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m256 lut = _mm256_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  const __m256i sign = _mm256_set1_epi32(int(0x80000000u));
  for (int64_t r = 0; r < rows; r += 2)
    for (int64_t k = 0; k < K; k += 32)
      for (int rr = 0; rr < 2; ++rr)
        for (int h = 0; h < 2; ++h) {  // 8 bytes: evens 8h.., odds 16 + 8h..
          const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(w + (r + rr) * K / 2 + k / 2 + 8 * h)));
          const __m256 e = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut, d),
                                         _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 28), sign)));
          const __m256 o = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut, _mm256_srli_epi32(d, 4)),
                                         _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 24), sign)));
          t[2 * rr] = _mm256_fmadd_ps(e, _mm256_loadu_ps(x + k + 8 * h), t[2 * rr]);
          t[2 * rr + 1] = _mm256_fmadd_ps(o, _mm256_loadu_ps(x + k + 16 + 8 * h), t[2 * rr + 1]);
        }
  return reduce(t[0], t[1], t[2], t[3]);
}

struct Form {
  const char* name;
  float (*fn)(const uint8_t*, const float*, int64_t);
  bool fp4;
};

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("needs AVX2 and FMA\n");
    return 1;
  }
  const int64_t rows8 = 64, rows4 = 128;  // 458 KB of codes each
  std::vector<uint8_t> w8(static_cast<size_t>(rows8 * K)), w4(static_cast<size_t>(rows4 * K / 2));
  std::vector<float> x(static_cast<size_t>(K));
  std::mt19937 g(1);
  for (auto& c : w8) {  // no NaN codes
    c = uint8_t(g());
    if ((c & 0x7f) == 0x7f) c ^= 1;
  }
  for (auto& c : w4) c = uint8_t(g());
  for (auto& v : x) v = float(g() % 100) * 0.37f;
  const Form forms[] = {{"FP8 fp16", fp8_fp16, false},         {"FP8 int", fp8_int_plain, false},
                        {"FP8 int x 2^112", fp8_int_up, false}, {"FP4 fp16", fp4_fp16, true},
                        {"FP4 e4m3 int", fp4_e4m3_int, true},   {"FP4 vpermps", fp4_vpermps, true}};
  for (int round = 0; round < 3; ++round)
    for (const Form& f : forms) {
      const std::vector<uint8_t>& w = f.fp4 ? w4 : w8;
      float s = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (int rep = 0; rep < 200; ++rep) s += f.fn(w.data(), x.data(), f.fp4 ? rows4 : rows8);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("round %d  %-16s %5.1f GB/s of codes  (sum %g)\n", round, f.name, 200.0 * double(w.size()) / dt / 1e9, s);
    }
}
