// Dense linears on the CPU engine (src/cpu/dense_linear.hpp) against a float64 reference: ugly
// shapes (in, out not multiples of 16 or 32), row counts from decode to several row panels,
// bf16 / fp16 / fp32 weights, with and without bias, on every kernel path (a path this CPU
// cannot run is reported as skipped with the reason). Plus: results independent of the thread
// count and of the other rows of a call, the path choice, and what prepare_linear keeps.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/dense_linear.hpp"
#include "moex/error.hpp"
#include "ops/ops.hpp"

using namespace moex;
using moex::cpu::KernelPath;

namespace moex {
void PrintTo(CpuKernelPath p, std::ostream* os) { *os << cpu_kernel_path_name(p); }
}  // namespace moex

namespace {

constexpr int64_t kIns[] = {67, 1408, 2048};
constexpr int64_t kOuts[] = {1, 31, 33, 151};
constexpr int64_t kRows[] = {1, 2, 3, 5, 17, 33, 300};

// Values of `dtype` (stored as float32 for activations), uniform in [-1, 1).
Tensor random_tensor(Shape shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (float& x : v) x = u(rng);
  return Tensor::from_floats(v, shape, dtype);
}
Tensor act_values(Shape shape, DType act, uint64_t seed) {
  return random_tensor(shape, act, seed).to(DType::kF32);
}

// Checks y against sum_k x w + b in double: |y - ref| <= the rounding to act + float32
// accumulation over K terms of magnitude sum |x w|.
void expect_close(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, DType act,
                  uint64_t seed) {
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  ASSERT_EQ(y.size(0), rows);
  ASSERT_EQ(y.size(1), out);
  const std::vector<float> X = x.to_float_vector(), W = w.to_float_vector(), Y = y.to_float_vector();
  const std::vector<float> B = b.defined() ? b.to_float_vector() : std::vector<float>();
  const double rel_act = act == DType::kBF16 ? std::ldexp(1.0, -8) : 0.0;
  const double acc_eps = double(in + 2) * std::ldexp(1.0, -23);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < out; ++n) {
      double ref = B.empty() ? 0.0 : B[size_t(n)], mag = std::abs(ref);
      for (int64_t k = 0; k < in; ++k) {
        const double p = double(X[size_t(r * in + k)]) * double(W[size_t(n * in + k)]);
        ref += p;
        mag += std::abs(p);
      }
      const double got = Y[size_t(r * out + n)];
      ASSERT_LE(std::abs(got - ref), rel_act * std::abs(ref) + acc_eps * mag + 1e-30)
          << "row " << r << " col " << n << " of [" << rows << ", " << in << "] x [" << out
          << ", " << in << "]^T, seed " << seed;
    }
}

class DenseLinearPath : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    const KernelPath p = GetParam();
    if (p == KernelPath::kAmx)
      GTEST_SKIP() << "dense linears never run AMX tiles (plan_dense_kernels maps amx to "
                      "avx512bf16, so that a row's result does not depend on the row count)";
    if (!cpu::kernel_path_supported(p))
      GTEST_SKIP() << "this CPU cannot run the " << cpu::kernel_path_name(p)
                   << " kernel path (it runs " << cpu::kernel_path_name(cpu::best_kernel_path())
                   << " and below)";
  }
};

// weight dtype, act dtype: bf16 weights with bf16 activations (the bf16 kernels), fp32 with fp32.
void check_all_shapes(KernelPath path, DType wdt, DType act) {
  uint64_t seed = 1000 + uint64_t(path) * 100 + uint64_t(wdt);
  for (int64_t in : kIns)
    for (int64_t out : kOuts) {
      const Tensor w = random_tensor({out, in}, wdt, ++seed);
      const auto packed = cpu::DenseLinear::pack(w, path);
      const Tensor b = random_tensor({out}, act, ++seed).to(DType::kF32);
      for (int64_t rows : kRows) {
        const Tensor x = act_values({rows, in}, act, ++seed);
        for (bool bias : {false, true}) {
          SCOPED_TRACE(testing::Message() << "rows " << rows << " in " << in << " out " << out
                                          << (bias ? " bias" : ""));
          expect_close(packed->run(x, bias ? b : Tensor(), act), x, w, bias ? b : Tensor(), act, seed);
        }
      }
    }
}

TEST_P(DenseLinearPath, Bf16WeightsMatchFloat64) { check_all_shapes(GetParam(), DType::kBF16, DType::kBF16); }
TEST_P(DenseLinearPath, F32WeightsMatchFloat64) { check_all_shapes(GetParam(), DType::kF32, DType::kF32); }

// Bit-identical with 1 and 2 threads, and each row alone gives the bits it gets in the batch.
TEST_P(DenseLinearPath, IndependentOfThreadsAndOtherRows) {
  for (DType wdt : {DType::kBF16, DType::kF32}) {
    const int64_t in = 1408, out = 151, rows = 300;
    const Tensor w = random_tensor({out, in}, wdt, 7);
    const auto packed = cpu::DenseLinear::pack(w, GetParam());
    const Tensor x = act_values({rows, in}, wdt, 8);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const std::vector<float> one = packed->run(x, Tensor(), wdt).to_float_vector();
    omp_set_num_threads(2);
    const std::vector<float> two = packed->run(x, Tensor(), wdt).to_float_vector();
    omp_set_num_threads(threads);
    ASSERT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)))
        << "1 vs 2 threads, " << dtype_name(wdt);
    for (int64_t r : {int64_t(0), int64_t(5), int64_t(257), rows - 1}) {
      const Tensor xr = x.slice(0, r, r + 1).contiguous();
      const std::vector<float> alone = packed->run(xr, Tensor(), wdt).to_float_vector();
      ASSERT_EQ(0, std::memcmp(alone.data(), one.data() + r * out, size_t(out) * sizeof(float)))
          << "row " << r << " alone differs from the same row in a " << rows << "-row call, "
          << dtype_name(wdt);
    }
  }
}

// bf16 weights give the bits of ops::linear's plain loop (the summation order the fixtures were
// validated with; dense_linear.hpp), bias included, on every path. float32 results (act f32 with
// bf16-valued activations) so that a different order shows, values of mixed magnitudes so that
// the float32 sums round.
TEST_P(DenseLinearPath, Bf16WeightsGiveThePlainLoopsBits) {
  uint64_t seed = 500;
  for (int64_t in : {int64_t(1), int64_t(7), int64_t(67), int64_t(1408)})
    for (int64_t rows : {int64_t(1), int64_t(33)}) {
      const Tensor w = random_tensor({151, in}, DType::kBF16, ++seed);
      const Tensor b = random_tensor({151}, DType::kBF16, ++seed).to(DType::kF32);
      std::vector<float> xv = act_values({rows, in}, DType::kBF16, ++seed).to_float_vector();
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::ldexp(xv[i], int(i * 7 % 13) - 6);
      const Tensor x = Tensor::from_floats(xv, {rows, in});
      const std::vector<float> got =
          cpu::DenseLinear::pack(w, GetParam())->run(x, b, DType::kF32).to_float_vector();
      const std::vector<float> want = ops::linear(x, w, b, DType::kF32).to_float_vector();
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << "in " << in << " rows " << rows << ", seed " << seed;
    }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, DenseLinearPath, ::testing::ValuesIn(cpu::kAllKernelPaths),
                         [](const auto& info) { return std::string(cpu::kernel_path_name(info.param)); });

// fp16 weights are widened to fp32 panels; bf16 weights with float32 activations take the scalar
// loop (the activations are not bf16 values).
TEST(DenseLinear, F16WeightsAndBf16WeightsWithF32Activations) {
  for (auto [wdt, act] : {std::pair{DType::kF16, DType::kF32}, std::pair{DType::kBF16, DType::kF32}}) {
    const Tensor w = random_tensor({33, 67}, wdt, 21);
    const Tensor b = random_tensor({33}, DType::kF32, 22);
    const Tensor x = act_values({17, 67}, act, 23);
    expect_close(ops::linear(x, ops::prepare_linear(w), b, act), x, w, b, act, 23);
  }
}

TEST(DenseLinear, ZeroRows) {
  const auto packed = cpu::DenseLinear::pack(random_tensor({31, 67}, DType::kBF16, 3));
  const Tensor y = packed->run(Tensor::empty({0, 67}, DType::kF32), Tensor(), DType::kBF16);
  EXPECT_EQ(y.size(0), 0);
  EXPECT_EQ(y.size(1), 31);
}

TEST(DenseLinear, PlanNeverUsesAmx) {
  const cpu::CpuFeatures all{true, true, true, true};
  EXPECT_EQ(cpu::plan_dense_kernels(DType::kBF16, all).path, KernelPath::kAvx512Bf16);
  EXPECT_EQ(cpu::plan_dense_kernels(DType::kF32, all).name, "avx512");
  const cpu::CpuFeatures avx2{true, false, false, false};
  EXPECT_EQ(cpu::plan_dense_kernels(DType::kBF16, avx2).path, KernelPath::kAvx2);
  EXPECT_THROW(cpu::plan_dense_kernels(DType::kBF16, avx2, KernelPath::kAvx512), Unsupported);
  EXPECT_THROW(cpu::DenseLinear::pack(random_tensor({4, 4}, DType::kF8E4M3, 1)), Unsupported);
}

// An owned host copy is dropped after packing unless asked for; the result is the same.
TEST(DenseLinear, PrepareKeepsTensorOnlyWhenAsked) {
  const Tensor w = random_tensor({31, 67}, DType::kBF16, 5);
  const ops::LinearWeight dropped = ops::prepare_linear(w);
  const ops::LinearWeight kept = ops::prepare_linear(w, /*keep_tensor=*/true);
  EXPECT_FALSE(dropped.tensor.defined());
  EXPECT_TRUE(kept.tensor.defined());
  EXPECT_EQ(dropped.out_features(), 31);
  EXPECT_EQ(dropped.in_features(), 67);
  const Tensor x = act_values({3, 67}, DType::kBF16, 6);
  expect_close(ops::linear(x, dropped, Tensor(), DType::kBF16), x, w, Tensor(), DType::kBF16, 6);
}

}  // namespace
