// The inner pieces of the quantized linears (quant_linear.cpp), one set per instruction set.
#pragma once

#include <cstdint>

namespace moex::cpu::quant_kernels {

struct QuantKernels {
  void (*decode_fp8)(const uint8_t* codes, int64_t n, float* out);    // n e4m3 codes -> floats
  void (*decode_fp4)(const uint8_t* packed, int64_t n, float* out);   // n (even) e2m1 values
  float (*dot)(const float* a, const float* b, int64_t n);            // float32 sum of a[k] b[k]
  // The same straight from the codes (decode-sized calls: no scratch round trip): sum of
  // x[k] * value(code k), k < n; FP4 codes start at an even k (byte boundary), n even.
  float (*dot_fp8)(const float* x, const uint8_t* codes, int64_t n);
  float (*dot_fp4)(const float* x, const uint8_t* packed, int64_t n);
};

void decode_fp8_portable(const uint8_t* codes, int64_t n, float* out);
void decode_fp4_portable(const uint8_t* packed, int64_t n, float* out);
float dot_portable(const float* a, const float* b, int64_t n);
float dot_fp8_portable(const float* x, const uint8_t* codes, int64_t n);
float dot_fp4_portable(const float* x, const uint8_t* packed, int64_t n);

// AVX-512F/BW kernels (quant_linear_avx512.cpp); call only where cpuid reported AVX-512.
const QuantKernels& avx512_kernels();

}  // namespace moex::cpu::quant_kernels
