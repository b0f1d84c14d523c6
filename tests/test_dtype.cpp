// Scalar dtype conversions (include/moex/dtype.hpp) against bit patterns written out by hand:
// zeros of both signs, the smallest and largest subnormals, the smallest normal, the largest
// finite value and what lies past it, NaN, and rounding ties (nearest even). The expected values
// are literals or come from std::ldexp, never from the conversions under test, so a bug in one of
// them cannot hide behind itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "moex/dtype.hpp"
#include "moex/tensor.hpp"

namespace moex {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// 2^e as a float (exact for every e used here).
float p2(int e) { return std::ldexp(1.0f, e); }

// Exact equality that also tells +0 from -0.
void expect_same(float got, float want, const char* what, int code) {
  EXPECT_EQ(got, want) << what << " code 0x" << std::hex << code;
  EXPECT_EQ(std::signbit(got), std::signbit(want)) << what << " code 0x" << std::hex << code;
}

struct Decode {
  uint32_t code;
  float value;
};
struct Encode {
  float value;
  uint32_t code;
};

// ---------------------------------------------------------------- bfloat16

TEST(DTypeBf16, DecodeKnownPatterns) {
  const std::vector<Decode> table = {
      {0x0000, 0.0f},        {0x8000, -0.0f},
      {0x3f80, 1.0f},        {0xc000, -2.0f},
      {0x3f81, 1.0078125f},  // 1 + 2^-7
      {0x3dcd, 0.10009765625f},
      {0x0001, p2(-133)},    // smallest subnormal
      {0x007f, 127 * p2(-133)},  // largest subnormal
      {0x0080, p2(-126)},    // smallest normal
      {0x7f7f, 3.38953138925153547590470800371487866880e38f},  // largest finite
      {0x7f80, kInf},        {0xff80, -kInf},
  };
  for (const auto& d : table) expect_same(bf16_to_float(uint16_t(d.code)), d.value, "bf16", int(d.code));
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0xffc1)));
}

TEST(DTypeBf16, EncodeRoundsToNearestEven) {
  const std::vector<Encode> table = {
      {1.0f, 0x3f80},
      {-0.0f, 0x8000},
      {0.1f, 0x3dcd},
      {1.0f + p2(-8), 0x3f80},               // tie between 0x3f80 and 0x3f81: even
      {1.0f + 3 * p2(-8), 0x3f82},           // tie between 0x3f81 and 0x3f82: even
      {1.0f + p2(-8) + p2(-20), 0x3f81},     // just past the tie
      {1.0f + p2(-8) - p2(-20), 0x3f80},     // just below the tie
      {-(1.0f + 3 * p2(-8)), 0xbf82},
      {p2(-133), 0x0001},                    // float subnormals keep their top bits
      {std::numeric_limits<float>::max(), 0x7f80},  // rounds past 0x7f7f: inf (no saturation)
      {3.38953138925153547590470800371487866880e38f, 0x7f7f},
      {kInf, 0x7f80},
      {-kInf, 0xff80},
  };
  for (const auto& e : table)
    EXPECT_EQ(float_to_bf16(e.value), e.code) << "bf16 of " << e.value;
  const uint16_t n = float_to_bf16(kNaN);
  EXPECT_EQ(n & 0x7f80, 0x7f80);
  EXPECT_NE(n & 0x007f, 0) << "NaN must stay NaN, got 0x" << std::hex << n;
  // A signalling NaN whose payload lives only in the low 16 bits must not become infinity.
  const uint16_t s = float_to_bf16(bits_float(0x7f800001u));
  EXPECT_NE(s & 0x007f, 0) << "0x7f800001 became 0x" << std::hex << s;
}

// ---------------------------------------------------------------- float16

TEST(DTypeF16, DecodeKnownPatterns) {
  const std::vector<Decode> table = {
      {0x0000, 0.0f},          {0x8000, -0.0f},
      {0x3c00, 1.0f},          {0x3c01, 1.0009765625f},  // 1 + 2^-10
      {0xc000, -2.0f},         {0x3555, 0.333251953125f},
      {0x2e66, 0.0999755859375f},
      {0x0001, p2(-24)},       {0x8001, -p2(-24)},  // smallest subnormal
      {0x03ff, 1023 * p2(-24)},                     // largest subnormal
      {0x0400, p2(-14)},                            // smallest normal
      {0x7bff, 65504.0f},      {0xfbff, -65504.0f},  // largest finite
      {0x7c00, kInf},          {0xfc00, -kInf},
  };
  for (const auto& d : table) expect_same(f16_to_float(uint16_t(d.code)), d.value, "f16", int(d.code));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7c01)));
  EXPECT_TRUE(std::isnan(f16_to_float(0xfe00)));
}

TEST(DTypeF16, EncodeRoundsToNearestEven) {
  const std::vector<Encode> table = {
      {1.0f, 0x3c00},
      {-0.0f, 0x8000},
      {0.1f, 0x2e66},
      {1.0f / 3, 0x3555},
      {1.0f + p2(-11), 0x3c00},            // tie: even
      {1.0f + 3 * p2(-11), 0x3c02},        // tie: even
      {1.0f + p2(-11) + p2(-20), 0x3c01},  // past the tie
      {65504.0f, 0x7bff},
      {65519.0f, 0x7bff},                  // below the midpoint of 65504 and 65536
      {65520.0f, 0x7c00},                  // the midpoint: ties to even, which is infinity
      {1e10f, 0x7c00},
      {-1e10f, 0xfc00},
      {kInf, 0x7c00},
      {p2(-24), 0x0001},
      {p2(-25), 0x0000},                   // tie between 0 and the smallest subnormal: even
      {p2(-25) + p2(-35), 0x0001},
      {3 * p2(-25), 0x0002},               // tie between 1 and 2 x 2^-24: even
      {-3 * p2(-25), 0x8002},
      {1023 * p2(-24), 0x03ff},
      {1023.5f * p2(-24), 0x0400},         // tie between the largest subnormal and 2^-14
      {p2(-14), 0x0400},
      {p2(-30), 0x0000},                   // underflows to zero
      {-p2(-30), 0x8000},
  };
  for (const auto& e : table)
    EXPECT_EQ(float_to_f16(e.value), e.code) << "f16 of " << e.value << std::hex << " got 0x"
                                             << float_to_f16(e.value) << " want 0x" << e.code;
  const uint16_t n = float_to_f16(kNaN);
  EXPECT_EQ(n & 0x7c00, 0x7c00);
  EXPECT_NE(n & 0x03ff, 0) << "NaN must stay NaN, got 0x" << std::hex << n;
}

// Every f16 value converts to float and back to itself (a bijection on non-NaN codes).
TEST(DTypeF16, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const uint16_t h = uint16_t(c);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN
    ASSERT_EQ(float_to_f16(f16_to_float(h)), h) << std::hex << "0x" << c;
  }
}

// ---------------------------------------------------------------- float8_e4m3fn

TEST(DTypeF8E4M3, DecodeKnownPatterns) {
  // Layout s eeee mmm, bias 7, no infinity; S.1111.111 is NaN.
  const std::vector<Decode> table = {
      {0x00, 0.0f},       {0x80, -0.0f},
      {0x01, p2(-9)},     {0x81, -p2(-9)},  // smallest subnormal
      {0x07, 7 * p2(-9)},                   // largest subnormal
      {0x08, p2(-6)},                       // smallest normal
      {0x38, 1.0f},       {0x39, 1.125f},   {0xc0, -2.0f},
      {0x1d, 0.1015625f},
      {0x77, 240.0f},     {0x78, 256.0f},
      {0x7e, 448.0f},     {0xfe, -448.0f},  // largest finite
  };
  for (const auto& d : table) expect_same(f8e4m3_to_float(uint8_t(d.code)), d.value, "e4m3", int(d.code));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0xff)));
  // S.1111.mmm with mmm != 111 are ordinary numbers in the fn variant (not infinities).
  EXPECT_EQ(f8e4m3_to_float(0x78), 256.0f);
}

TEST(DTypeF8E4M3, EncodeRoundsToNearestEvenAndOverflowsToNaN) {
  const std::vector<Encode> table = {
      {1.0f, 0x38},
      {-0.0f, 0x80},
      {0.1f, 0x1d},
      {1.0625f, 0x38},               // 1 + 2^-4: tie between 1 and 1.125, even
      {1.1875f, 0x3a},               // 1 + 3 x 2^-4: tie between 1.125 and 1.25, even
      {1.0625f + p2(-12), 0x39},
      {448.0f, 0x7e},
      {464.0f, 0x7e},                // tie between 448 (even) and the NaN code: 448
      {-464.0f, 0xfe},
      {p2(-9), 0x01},
      {p2(-10), 0x00},               // tie between 0 and the smallest subnormal: even
      {3 * p2(-10), 0x02},           // tie between 1 and 2 x 2^-9: even
      {7.5f * p2(-9), 0x08},         // tie between the largest subnormal and 2^-6: even
      {p2(-6), 0x08},
      {p2(-12), 0x00},
  };
  for (const auto& e : table)
    EXPECT_EQ(float_to_f8e4m3(e.value), e.code) << "e4m3 of " << e.value;
  // Past the largest finite value after rounding, and infinities, become NaN (c10 does the same;
  // quantizers clamp first).
  for (float v : {465.0f, 480.0f, 1000.0f, 1e30f, kInf, kNaN})
    EXPECT_EQ(float_to_f8e4m3(v) & 0x7f, 0x7f) << "e4m3 of " << v;
  EXPECT_EQ(float_to_f8e4m3(-1000.0f), 0xff);
}

TEST(DTypeF8E4M3, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 0x100; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    ASSERT_EQ(float_to_f8e4m3(f8e4m3_to_float(uint8_t(c))), c) << std::hex << "0x" << c;
  }
}

// ---------------------------------------------------------------- float8_e8m0fnu (UE8M0)

TEST(DTypeE8M0, EveryCodeIsAPowerOfTwo) {
  for (int c = 0; c < 255; ++c) {
    const float want = std::ldexp(1.0f, c - 127);
    expect_same(e8m0_to_float(uint8_t(c)), want, "e8m0", c);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xff)));
}

// The same through the tensor conversion the loader uses (Checkpoint::get(name, shape, kF32)).
TEST(DTypeE8M0, TensorConversionToFloat) {
  Tensor codes = Tensor::empty({256}, DType::kU8);
  for (int c = 0; c < 256; ++c) codes.data<uint8_t>()[c] = uint8_t(c);
  const Tensor e8(codes.storage(), 0, DType::kF8E8M0, {256}, {1});
  const std::vector<float> v = e8.to(DType::kF32).to_float_vector();
  for (int c = 0; c < 255; ++c) expect_same(v[size_t(c)], std::ldexp(1.0f, c - 127), "e8m0 tensor", c);
  EXPECT_TRUE(std::isnan(v[255]));
}

TEST(DTypeE8M0, EncodeRoundsUpToAPowerOfTwo) {
  const std::vector<Encode> table = {
      {1.0f, 127},  {1.5f, 128},     {2.0f, 128},     {0.75f, 127},
      {0.5f, 126},  {0.5f + p2(-20), 127},
      {p2(-126), 1},                 // smallest normal float
      {1.5f * p2(-127), 1},          // a float subnormal above 2^-127 rounds up to 2^-126
      {p2(-127), 0},                 // a float subnormal, exactly code 0
      {p2(127), 254},                // largest code below NaN
  };
  for (const auto& e : table)
    EXPECT_EQ(float_to_e8m0_ceil(e.value), e.code) << "e8m0 of " << e.value;
}

// ---------------------------------------------------------------- fp4 e2m1

TEST(DTypeFp4E2M1, DecodeEveryCode) {
  // s ee m, bias 1: e = 0 is subnormal (m x 0.5), else 2^(e-1) x (1 + m/2).
  const float table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (int c = 0; c < 16; ++c) {
    expect_same(fp4_e2m1_to_float(uint8_t(c)), table[c], "e2m1", c);
    // Only the low nibble counts.
    expect_same(fp4_e2m1_to_float(uint8_t(c | 0xa0)), table[c], "e2m1 high nibble set", c);
  }
}

TEST(DTypeFp4E2M1, EncodeRoundsToNearestEvenAndSaturates) {
  const std::vector<Encode> table = {
      {0.0f, 0x0},  {-0.0f, 0x8},  {0.5f, 0x1},  {6.0f, 0x7},  {-6.0f, 0xf},
      {0.25f, 0x0},   // tie between 0 (code 0) and 0.5 (code 1): even code
      {0.75f, 0x2},   // tie between 0.5 (1) and 1 (2)
      {1.25f, 0x2},   // tie between 1 (2) and 1.5 (3)
      {1.75f, 0x4},   // tie between 1.5 (3) and 2 (4)
      {2.5f, 0x4},    // tie between 2 (4) and 3 (5)
      {3.5f, 0x6},    // tie between 3 (5) and 4 (6)
      {5.0f, 0x6},    // tie between 4 (6) and 6 (7)
      {-5.0f, 0xe},
      {0.26f, 0x1},   {0.74f, 0x1},  {5.01f, 0x7},  {-0.3f, 0x9},
      {7.0f, 0x7},    {100.0f, 0x7}, {kInf, 0x7},   {-1e9f, 0xf},  // saturate at +-6
  };
  for (const auto& e : table)
    EXPECT_EQ(float_to_fp4_e2m1(e.value), e.code) << "e2m1 of " << e.value;
}

}  // namespace
}  // namespace moex
