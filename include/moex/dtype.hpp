// Element types and scalar conversions.
//
// Conversions follow torch/c10 so that a value rounded here is bit-identical to the same value
// rounded by transformers: float -> bf16 / f16 / f8e4m3fn round to nearest even; f8e4m3fn has no
// infinity and maps values past its range to NaN (as c10 does; quantizers clamp first);
// e8m0 (UE8M0) is a bare power of two 2^(e-127) with 0xFF = NaN.
// FP4 e2m1 is stored two per byte, low nibble = even column (the layout of the hub checkpoints).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moex {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kF8E4M3,   // float8_e4m3fn
  kF8E8M0,   // float8_e8m0fnu, power-of-two scales (UE8M0)
  kFP4x2,    // two e2m1 values per byte, low nibble first
  kI8,
  kU8,
  kI16,
  kI32,
  kI64,
  kBool,
};

// Bytes per stored element (kFP4x2: one byte holds two logical values).
size_t dtype_size(DType t);
// Name as transformers/torch spell it ("float32", "bfloat16", "float8_e4m3fn", ...).
std::string_view dtype_name(DType t);
// Parses the user-facing names ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16").
// Throws moex::Error listing valid names.
DType parse_dtype(std::string_view name);
bool is_floating(DType t);

// ---- scalar conversions (header-only: used in inner loops) ----

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}
// Rounds a float to the nearest bf16 value and returns it as a float.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);
inline float round_f16(float f) { return f16_to_float(float_to_f16(f)); }

float f8e4m3_to_float(uint8_t v);
uint8_t float_to_f8e4m3(float f);
inline float e8m0_to_float(uint8_t v) {
  if (v == 0xff) return bits_float(0x7fc00000u);
  if (v == 0) return bits_float(0x00400000u);  // 2^-127, a float32 subnormal
  return bits_float(uint32_t(v) << 23);
}
// The e8m0 code of 2^ceil(log2(f)) for f > 0 (the rounding the UE8M0 quantizers use).
uint8_t float_to_e8m0_ceil(float f);
// One e2m1 code (low 4 bits) to float: values {0, .5, 1, 1.5, 2, 3, 4, 6} with sign.
inline float fp4_e2m1_to_float(uint8_t code) {
  static constexpr float kLut[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                     -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return kLut[code & 0xf];
}
uint8_t float_to_fp4_e2m1(float f);  // round to nearest even, saturating at +-6

}  // namespace moex
