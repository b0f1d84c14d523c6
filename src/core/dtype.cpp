#include "moex/dtype.hpp"

#include <cmath>
#include <string>

#include "moex/error.hpp"

namespace moex {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kFP4x2:
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF64: return "float64";
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kF8E8M0: return "float8_e8m0fnu";
    case DType::kFP4x2: return "float4_e2m1fn_x2";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI16: return "int16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "float32" || n == "fp32" || n == "f32") return DType::kF32;
  if (n == "bfloat16" || n == "bf16") return DType::kBF16;
  if (n == "float16" || n == "fp16" || n == "f16" || n == "half") return DType::kF16;
  throw InvalidInput("unknown dtype '" + std::string(n) + "'; valid: float32, bfloat16, float16");
}

bool is_floating(DType t) {
  switch (t) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF64:
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kFP4x2: return true;
    default: return false;
  }
}

float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    return (sign ? -1.f : 1.f) * std::ldexp(float(man), -24);  // subnormal
  }
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504 -> inf
  if (a < 0x38800000u) {                                     // subnormal or zero in f16
    // value / 2^-24, rounded to nearest even integer
    float v = bits_float(a) * 16777216.0f;
    return uint16_t(sign | uint16_t(std::nearbyint(v)));
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return uint16_t(sign | uint16_t(r >> 13));
}

float f8e4m3_to_float(uint8_t v) {
  uint32_t sign = uint32_t(v & 0x80u) << 24;
  uint32_t exp = (v >> 3) & 0xf, man = v & 7u;
  if (exp == 0xf && man == 7) return bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    float m = std::ldexp(float(man), -9);
    return sign ? -m : m;
  }
  return bits_float(sign | ((exp + 120) << 23) | (man << 20));
}

uint8_t float_to_f8e4m3(float f) {
  uint32_t u = float_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7f);
  // Past the largest finite value (448) after rounding: NaN, as c10 does.
  if (a > 0x43e80000u) return uint8_t(sign | 0x7f);  // past 464, the midpoint of 448 and 480
  if (a < 0x3c800000u) {  // below 2^-6: subnormal range, step 2^-9
    float v = bits_float(a) * 512.0f;
    return uint8_t(sign | uint8_t(std::nearbyint(v)));
  }
  uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u) - (120u << 23);
  return uint8_t(sign | uint8_t(r >> 20));
}

uint8_t float_to_e8m0_ceil(float f) {
  if (!(f > 0.f) || std::isinf(f)) return f == 0.f ? 0 : 0xff;
  uint32_t u = float_bits(f);
  uint32_t exp = u >> 23, man = u & 0x7fffffu;
  // Float subnormals: code 0 is 2^-127 (mantissa 0x400000); anything above it rounds up to 2^-126,
  // anything below saturates at the smallest code.
  if (exp == 0) return man > 0x400000u ? 1 : 0;
  if (man != 0) exp += 1;
  return exp >= 0xff ? uint8_t(0xfe) : uint8_t(exp);
}

uint8_t float_to_fp4_e2m1(float f) {
  static constexpr float kVals[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  if (std::isnan(a)) return 0;  // e2m1 has no NaN; quantizers never produce one
  if (a >= 6.f) return uint8_t(sign | 7);
  uint8_t best = 0;
  for (uint8_t i = 1; i < 8; ++i) {
    float lo = kVals[i - 1], hi = kVals[i];
    if (a > hi) continue;
    float mid = 0.5f * (lo + hi);
    if (a < mid) best = i - 1;
    else if (a > mid) best = i;
    else best = ((i - 1) % 2 == 0) ? i - 1 : i;  // tie: even mantissa code
    break;
  }
  return uint8_t(sign | best);
}

}  // namespace moex
