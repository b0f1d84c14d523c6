// The activation quantizer and scale helpers of include/moex/quant.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moex/quant.hpp"

using namespace moex;

TEST(Quant, ActivationBlocksScaleByTheirOwnAmax) {
  // 300 columns: two full 128-blocks and a ragged 44-wide one, each with its own range.
  std::vector<float> x(300);
  for (int k = 0; k < 300; ++k) x[k] = (k < 128 ? 1.f : k < 256 ? 1000.f : 1e-3f) * std::sin(0.37f * k + 0.1f);
  std::vector<uint8_t> q(300);
  std::vector<float> s(3);
  quant::quantize_activation_row(x.data(), 300, q.data(), s.data());
  for (int b = 0; b < 3; ++b) {
    float amax = 0.f;
    for (int k = b * 128; k < std::min(300, (b + 1) * 128); ++k) amax = std::max(amax, std::fabs(x[k]));
    EXPECT_FLOAT_EQ(s[b], amax / 448.f) << "block " << b;
  }
  std::vector<float> fq(300);
  quant::fake_quantize_activation_row(x.data(), 300, fq.data());
  for (int k = 0; k < 300; ++k) {
    const float v = f8e4m3_to_float(q[k]) * s[k / 128];
    EXPECT_EQ(v, fq[k]) << k;
    // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values.
    EXPECT_LE(std::fabs(v - x[k]), std::fabs(x[k]) / 16 + s[k / 128] * 0x1p-9f) << k;
  }
  // The block maximum lands exactly on 448.
  int arg = 0;
  for (int k = 1; k < 128; ++k) if (std::fabs(x[k]) > std::fabs(x[arg])) arg = k;
  EXPECT_FLOAT_EQ(std::fabs(f8e4m3_to_float(q[arg])), 448.f);
}

TEST(Quant, ZeroBlockHasTheFloorScaleAndZeroCodes) {
  std::vector<float> x(130, 0.f);
  x[129] = 2.f;
  std::vector<uint8_t> q(130);
  std::vector<float> s(2);
  quant::quantize_activation_row(x.data(), 130, q.data(), s.data());
  EXPECT_EQ(s[0], quant::kMinActScale);
  for (int k = 0; k < 128; ++k) EXPECT_EQ(f8e4m3_to_float(q[k]), 0.f);
  EXPECT_FLOAT_EQ(f8e4m3_to_float(q[129]) * s[1], 2.f);
}

TEST(Quant, FusedScaleRowsKeepGateAndUpApart) {
  // I = 200, bn = 128: gate rows 0..199 use scale rows 0, 1; up rows use 2, 3.
  EXPECT_EQ(quant::fused_scale_row(0, 200, 128), 0);
  EXPECT_EQ(quant::fused_scale_row(199, 200, 128), 1);
  EXPECT_EQ(quant::fused_scale_row(200, 200, 128), 2);
  EXPECT_EQ(quant::fused_scale_row(399, 200, 128), 3);
  // I = 64 < bn: one scale row each.
  EXPECT_EQ(quant::fused_scale_row(63, 64, 128), 0);
  EXPECT_EQ(quant::fused_scale_row(64, 64, 128), 1);
  // FP4 (bn = 1): the scale row is the row.
  EXPECT_EQ(quant::fused_scale_row(77, 64, 1), 77);
}

TEST(Quant, ScaleValueReadsFloatAndUe8m0) {
  const float f[2] = {0.25f, 3.f};
  const uint8_t e[2] = {127, 130};
  EXPECT_EQ(quant::scale_value(f, DType::kF32, 1), 3.f);
  EXPECT_EQ(quant::scale_value(e, DType::kF8E8M0, 0), 1.f);
  EXPECT_EQ(quant::scale_value(e, DType::kF8E8M0, 1), 8.f);
}
