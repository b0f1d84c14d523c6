// ops::linear on CUDA against a float64 reference: the decode GEMV (1..8 rows, 16-bit weights)
// and cuBLASLt (more rows, float32) on ugly shapes (K not a multiple of the GEMV's 256-element
// chunk, outputs not a multiple of its column blocks, one output column, a vocabulary-sized
// output), with and without bias.
//
// Bound: the result is the float32 sum of exact products, rounded once to act, so it lies within
// one ulp of act of the exact value plus the float32 summation error (a few K * 2^-24 of the sum
// of |x w|). A wrong column, a missing bias, a dropped tail or a row mix-up is far outside it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moex/dtype.hpp"
#include "moex/tensor.hpp"
#include "ops/ops.hpp"
#include "support/test_support.hpp"
#if MOEX_WITH_CUDA
#include "ops/cuda/cuda_ops.hpp"
#endif

namespace {

using moex::Device;
using moex::DType;
using moex::Tensor;

float ulp_of(double v, DType act) {
  const int e = v == 0 ? -126 : std::ilogb(v);
  return std::ldexp(1.0f, e - (act == DType::kBF16 ? 7 : act == DType::kF16 ? 10 : 23));
}

std::vector<float> random_values(size_t n, uint64_t seed, DType dt) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  // Values exactly representable in dt, so the reference sees what the device sees.
  return Tensor::from_floats(v, {int64_t(n)}).to(dt).to(DType::kF32).to_float_vector();
}

struct Case {
  int64_t rows, in, out;
  bool bias;
};

void check(const Case& c, DType dt, uint64_t seed) {
  const auto xv = random_values(size_t(c.rows * c.in), seed, dt);
  const auto wv = random_values(size_t(c.out * c.in), seed + 1, dt);
  const auto bv = random_values(size_t(c.out), seed + 2, dt);
  const Device gpu = Device::cuda(0);
  const Tensor x = Tensor::from_floats(xv, {c.rows, c.in}).to(dt).to(gpu);
  const Tensor w = Tensor::from_floats(wv, {c.out, c.in}).to(dt).to(gpu);
  const Tensor b = c.bias ? Tensor::from_floats(bv, {c.out}).to(dt).to(gpu) : Tensor();
#if MOEX_WITH_CUDA
  const bool small = w.nbytes() <= moex::ops::cuda::kGemvMaxWeightBytes;
  EXPECT_EQ(moex::ops::cuda::gemv_serves(x, w, b, dt), c.rows <= moex::ops::cuda::kGemvMaxRows && c.in % 8 == 0 && small)
      << "rows " << c.rows << " in " << c.in;
#endif
  const std::vector<float> y = moex::ops::linear(x, w, b, dt).to(Device::cpu()).to(DType::kF32).to_float_vector();
  ASSERT_EQ(y.size(), size_t(c.rows * c.out));
  int64_t bad = 0;
  std::string first;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t n = 0; n < c.out; ++n) {
      double ref = c.bias ? bv[size_t(n)] : 0.0, mag = std::fabs(ref);
      for (int64_t k = 0; k < c.in; ++k) {
        const double p = double(xv[size_t(r * c.in + k)]) * wv[size_t(n * c.in + k)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = y[size_t(r * c.out + n)];
      const double bound = ulp_of(ref, dt) + 4.0 * double(c.in) * 0x1p-24 * mag;
      if (std::fabs(got - ref) > bound && bad++ == 0)
        first = "row " + std::to_string(r) + " col " + std::to_string(n) + ": got " + std::to_string(got) +
                " want " + std::to_string(ref);
    }
  EXPECT_EQ(bad, 0) << "rows " << c.rows << " in " << c.in << " out " << c.out << " bias " << c.bias << " "
                    << moex::dtype_name(dt) << ": " << first;
}

TEST(CudaLinear, DecodeRowsAndPrefillRowsMatchFloat64) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Case cases[] = {
      {1, 2048, 2048, true}, {1, 2048, 1, false}, {1, 2048, 60, false}, {2, 5632, 2049, false},
      {3, 24, 3, true},      {4, 2056, 67, true}, {5, 8, 5, false},     {7, 1408, 130, true},
      {8, 2048, 4099, false}, {9, 2048, 33, true}, {33, 264, 70, false}, {1, 2048, 151936, false}, {1, 16384, 8200, false},
      {1, 5632, 2049, true}, {1, 1416, 7, false}, {1, 4104, 517, true},  // one row: steps of 2048 with a partial last
      {2, 36, 9, true},  // K not a multiple of 8: cuBLASLt
  };
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (DType dt : {DType::kBF16, DType::kF16}) check(c, dt, seed += 3);
}

// The same input row gives the same output whatever the other rows of the call: a decode batch's
// sequences do not influence each other's bits.
TEST(CudaLinear, DecodeRowsAreIndependent) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  const int64_t in = 2048, out = 515;
  const auto wv = random_values(size_t(out * in), 7, DType::kBF16);
  const auto xv = random_values(size_t(8 * in), 8, DType::kBF16);
  const Tensor w = Tensor::from_floats(wv, {out, in}).to(DType::kBF16).to(gpu);
  const Tensor x8 = Tensor::from_floats(xv, {8, in}).to(DType::kBF16).to(gpu);
  const Tensor x1 = Tensor::from_floats(std::vector<float>(xv.begin(), xv.begin() + in), {1, in}).to(DType::kBF16).to(gpu);
  const auto y8 = moex::ops::linear(x8, w, Tensor(), DType::kBF16).to(Device::cpu()).to(DType::kF32).to_float_vector();
  const auto y1 = moex::ops::linear(x1, w, Tensor(), DType::kBF16).to(Device::cpu()).to(DType::kF32).to_float_vector();
  for (int64_t n = 0; n < out; ++n) ASSERT_EQ(y8[size_t(n)], y1[size_t(n)]) << "column " << n;
}

// ops::linears: several projections of one x (q / k / v; router + shared expert gate / up +
// gating column) give exactly what one linear() each gives, in one launch when all qualify and
// one call each when they do not (here: more rows than the GEMV takes).
TEST(CudaLinear, LinearsEqualOneLinearEach) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  struct Shape {
    int64_t out, in;
    bool bias;
  };
  const std::vector<std::vector<Shape>> groups = {
      {{2048, 2048, true}, {256, 2048, true}, {256, 2048, true}},              // q / k / v with bias
      {{60, 2048, false}, {1408, 2048, false}, {1408, 2048, false}, {1, 2048, false}},  // router + shared
      {{5, 24, false}, {0, 24, false}, {3, 24, true}},                         // an empty output between
  };
  uint64_t seed = 50;
  for (int64_t rows : {1, 3, 8, 17})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (const auto& g : groups) {
        const int64_t in0 = g[0].in;
        const Tensor x = Tensor::from_floats(random_values(size_t(rows * in0), ++seed, dt), {rows, in0}).to(dt).to(gpu);
        std::vector<moex::ops::LinearWeight> ws;
        std::vector<Tensor> bs;
        for (const Shape& s : g) {
          ws.push_back(moex::ops::prepare_linear(
              Tensor::from_floats(random_values(size_t(s.out * s.in), ++seed, dt), {s.out, s.in}).to(dt).to(gpu)));
          bs.push_back(s.bias ? Tensor::from_floats(random_values(size_t(s.out), ++seed, dt), {s.out}).to(dt).to(gpu)
                              : Tensor());
        }
        std::vector<moex::ops::LinearOf> of;
        for (size_t i = 0; i < g.size(); ++i) of.push_back({&ws[i], bs[i].defined() ? &bs[i] : nullptr});
        const std::vector<Tensor> ys = moex::ops::linears(x, of, dt);
        ASSERT_EQ(ys.size(), g.size());
        for (size_t i = 0; i < g.size(); ++i) {
          const auto want = moex::ops::linear(x, ws[i], bs[i], dt).to(Device::cpu()).to(DType::kF32).to_float_vector();
          const auto got = ys[i].to(Device::cpu()).to(DType::kF32).to_float_vector();
          ASSERT_EQ(ys[i].size(0), rows);
          ASSERT_EQ(ys[i].size(1), g[i].out);
          for (size_t j = 0; j < want.size(); ++j)
            ASSERT_EQ(moex::float_bits(want[j]), moex::float_bits(got[j]))
                << "rows " << rows << " " << moex::dtype_name(dt) << " linear " << i << " element " << j;
        }
      }
}

// norm_linears against the ops one after another: rms_norm (or add_rms_norm) then linears. The
// one-launch form (decode rows: the GEMV blocks form the norm) must give the same bits for the
// linears, for x and for the updated residual; 17 rows take the ops in turn. Both roundings of
// the norm, groups with an empty output and biases, h wider than one 256-element chunk per warp.
TEST(CudaLinear, NormLinearsEqualNormThenLinears) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda(0);
  struct Shape {
    int64_t out;
    bool bias;
  };
  const std::vector<std::pair<int64_t, std::vector<Shape>>> groups = {
      {2048, {{2048, false}, {256, true}, {256, false}}},
      {2048, {{60, false}, {1408, false}, {1408, false}, {1, false}}},
      {2880, {{32, false}}},
      {24, {{5, false}, {0, false}, {3, true}}},
  };
  auto bits = [](const Tensor& t) {
    std::vector<uint32_t> b;
    for (float v : t.to(Device::cpu()).to(DType::kF32).to_float_vector()) b.push_back(moex::float_bits(v));
    return b;
  };
  uint64_t seed = 900;
  for (int64_t rows : {1, 3, 8, 17})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (auto style : {moex::ops::RmsNormStyle::kLlama, moex::ops::RmsNormStyle::kGptOss})
        for (bool with_delta : {false, true})
          for (const auto& [in, g] : groups) {
            auto make = [&](int64_t r, int64_t c, float scale) {
              auto v = random_values(size_t(r * c), ++seed, dt);
              for (auto& e : v) e *= scale;
              return Tensor::from_floats(v, {r, c}).to(dt).to(gpu);
            };
            const Tensor h0 = make(rows, in, 3.0f), delta = make(rows, in, 1.0f);
            const Tensor norm_w = make(1, in, 2.0f).view({in});
            std::vector<moex::ops::LinearWeight> ws;
            std::vector<Tensor> bs;
            for (const Shape& s : g) {
              ws.push_back(moex::ops::prepare_linear(make(s.out, in, 1.0f)));
              bs.push_back(s.bias ? make(1, s.out, 1.0f).view({s.out}) : Tensor());
            }
            std::vector<moex::ops::LinearOf> of;
            for (size_t i = 0; i < g.size(); ++i) of.push_back({&ws[i], bs[i].defined() ? &bs[i] : nullptr});
            const std::string what = "rows " + std::to_string(rows) + " in " + std::to_string(in) + " " +
                                     std::string(moex::dtype_name(dt)) + (with_delta ? " with delta" : "") +
                                     (style == moex::ops::RmsNormStyle::kLlama ? " llama" : " gpt-oss");
            Tensor h_want = h0.clone();
            const Tensor x_want = with_delta ? moex::ops::add_rms_norm(h_want, delta, norm_w, 1e-6f, dt, style)
                                             : moex::ops::rms_norm(h_want, norm_w, 1e-6f, dt, 0, style);
            const std::vector<Tensor> y_want = moex::ops::linears(x_want, of, dt);
            Tensor h = h0.clone(), x;
            const std::vector<Tensor> y =
                moex::ops::norm_linears(h, with_delta ? &delta : nullptr, {&norm_w, 1e-6f, style}, of, dt, &x);
            ASSERT_EQ(y.size(), g.size()) << what;
            EXPECT_EQ(bits(x), bits(x_want)) << what;
            EXPECT_EQ(bits(h), bits(h_want)) << what;
            for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(bits(y[i]), bits(y_want[i])) << what << " linear " << i;
#if MOEX_WITH_CUDA
            EXPECT_EQ(moex::ops::cuda::norm_gemv_serves(h0, with_delta ? &delta : nullptr, norm_w, dt),
                      rows <= moex::ops::cuda::kNormGemvMaxRows)
                << what;
#endif
          }
}

}  // namespace
