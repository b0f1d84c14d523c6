// Quantized dense linears on the host (ops::linear over a quantized LinearWeight,
// src/cpu/quant_linear.hpp) against a float64 computation of include/moex/quant.hpp's math:
// FP8 weights with float32 and UE8M0 block scales, FP4 weights with UE8M0 1x32 scales, on ugly
// shapes (N, K not multiples of 128, rows 1, 7, 64), with and without bias; the path this CPU
// picks (AVX-512, AVX2 or portable) and the portable one, each against the reference; the bytes a
// quantized weight holds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/quant_linear.hpp"
#include "moex/dtype.hpp"
#include "moex/quant.hpp"
#include "moex/safetensors.hpp"
#include "ops/ops.hpp"
#include "test_safetensors_util.hpp"

#ifdef MOEX_WITH_CUDA
#include "cuda/experts_ops.hpp"
#include "cuda/runtime.hpp"
#include "ops/cuda/cuda_ops.hpp"
#endif

namespace moex {
namespace {

struct Case {
  QuantScheme::Kind kind;
  DType scale_dtype;
  int64_t rows, n, k;
  bool bias;
};

struct Made {
  Tensor codes, scale, x, bias;
  QuantScheme scheme;
};

Made make(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Made m;
  const bool fp4 = c.kind == QuantScheme::Kind::kFp4E2M1;
  m.scheme.kind = c.kind;
  m.scheme.scale_dtype = c.scale_dtype;
  m.scheme.block_n = fp4 ? 1 : quant::kFp8Block;
  m.scheme.block_k = fp4 ? quant::kFp4BlockK : quant::kFp8Block;
  const int64_t sr = quant::ceil_div(c.n, m.scheme.block_n), sc = quant::ceil_div(c.k, m.scheme.block_k);
  if (fp4) {
    m.codes = Tensor::empty({c.n, c.k / 2}, DType::kI8);
    uint8_t* p = static_cast<uint8_t*>(m.codes.raw());
    for (int64_t i = 0; i < c.n * c.k / 2; ++i) p[i] = uint8_t(rng() & 0xff);
  } else {
    m.codes = Tensor::empty({c.n, c.k}, DType::kF8E4M3);
    uint8_t* p = static_cast<uint8_t*>(m.codes.raw());
    for (int64_t i = 0; i < c.n * c.k; ++i) p[i] = float_to_f8e4m3(300.f * u(rng));
  }
  m.scale = Tensor::empty({sr, sc}, c.scale_dtype);
  for (int64_t i = 0; i < sr * sc; ++i) {
    if (c.scale_dtype == DType::kF8E8M0) static_cast<uint8_t*>(m.scale.raw())[i] = uint8_t(118 + rng() % 6);
    else static_cast<float*>(m.scale.raw())[i] = 1e-3f * (1.5f + u(rng));
  }
  std::vector<float> xv(size_t(c.rows * c.k));
  for (auto& v : xv) v = 4.f * u(rng);
  // A row with one large value: its block's activation scale differs from the others'.
  if (c.rows > 1) xv[size_t(c.k + c.k / 2)] = 300.f;
  m.x = Tensor::from_floats(xv, {c.rows, c.k});
  if (c.bias) {
    std::vector<float> bv(size_t(c.n));
    for (auto& v : bv) v = u(rng);
    m.bias = Tensor::from_floats(bv, {c.n});
  }
  return m;
}

// quant.hpp in float64: y[n] = sum_b s_b sum_{k in b} q[k] * W_real[n][k] (+ bias).
std::vector<double> reference(const Case& c, const Made& m) {
  const bool fp4 = c.kind == QuantScheme::Kind::kFp4E2M1;
  const uint8_t* w = static_cast<const uint8_t*>(m.codes.raw());
  const int64_t sc = quant::ceil_div(c.k, m.scheme.block_k);
  const int64_t nab = quant::ceil_div(c.k, quant::kActBlock);
  std::vector<double> y(size_t(c.rows * c.n));
  std::vector<uint8_t> q(size_t(c.k));
  std::vector<float> s(static_cast<size_t>(nab));
  for (int64_t t = 0; t < c.rows; ++t) {
    quant::quantize_activation_row(m.x.data<float>() + t * c.k, c.k, q.data(), s.data());
    for (int64_t n = 0; n < c.n; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < c.k; ++k) {
        const double wv = fp4 ? fp4_e2m1_to_float(uint8_t(w[n * (c.k / 2) + k / 2] >> (4 * (k & 1))))
                              : f8e4m3_to_float(w[n * c.k + k]);
        const double sw = quant::scale_value(m.scale.raw(), m.scale.dtype(),
                                             (n / m.scheme.block_n) * sc + k / m.scheme.block_k);
        acc += double(s[size_t(k / quant::kActBlock)]) * f8e4m3_to_float(q[size_t(k)]) * wv * sw;
      }
      if (c.bias) acc += m.bias.data<float>()[n];
      y[size_t(t * c.n + n)] = acc;
    }
  }
  return y;
}

double rel_l2(const Tensor& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  const float* g = got.data<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    num += (g[i] - want[i]) * (g[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::string name_of(const Case& c) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%s/%s rows %ld N %ld K %ld%s",
                c.kind == QuantScheme::Kind::kFp4E2M1 ? "fp4" : "fp8", std::string(dtype_name(c.scale_dtype)).c_str(),
                long(c.rows), long(c.n), long(c.k), c.bias ? " bias" : "");
  return buf;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto kind : {QuantScheme::Kind::kFp8E4M3, QuantScheme::Kind::kFp4E2M1})
    for (DType sd : {DType::kF32, DType::kF8E8M0}) {
      if (kind == QuantScheme::Kind::kFp4E2M1 && sd == DType::kF32) continue;  // FP4 scales are UE8M0
      for (int64_t rows : {1, 7, 64})
        for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 2}, {19, 222}, {130, 300}, {257, 128}, {33, 1000}})
          out.push_back({kind, sd, rows, n, k, n == 19});
    }
  return out;
}

TEST(QuantLinear, MatchesFloat64ReferenceOnUglyShapes) {
  uint64_t seed = 1234;
  for (const Case& c : cases()) {
    const Made m = make(c, ++seed);
    const ops::LinearWeight w = ops::prepare_quantized_linear(m.codes, m.scale, m.scheme, c.n, c.k);
    ASSERT_TRUE(w.quantized());
    const Tensor y = ops::linear(m.x, w, m.bias, DType::kF32);
    ASSERT_EQ(y.shape(), (Shape{c.rows, c.n}));
    const std::vector<double> want = reference(c, m);
    // float32 sums of exact products over K <= 1000: a few float32 ulps relative.
    const double err = rel_l2(y, want);
    EXPECT_LE(err, 1e-6) << name_of(c) << " seed " << seed;
    const Tensor p = cpu::quant_linear_portable(m.x, m.codes, m.scale, m.scheme, c.n, c.k, m.bias, DType::kF32);
    EXPECT_LE(rel_l2(p, want), 1e-6) << name_of(c) << " (portable) seed " << seed;
  }
}

// One row alone (the direct decode path) gives the bits it gets among 7 or 64 (the tiled path).
TEST(QuantLinear, RowsAreIndependentAndBf16RoundsOnce) {
  for (const Case& c : {Case{QuantScheme::Kind::kFp8E4M3, DType::kF32, 7, 130, 300, true},
                        Case{QuantScheme::Kind::kFp8E4M3, DType::kF8E8M0, 64, 19, 1000, false},
                        Case{QuantScheme::Kind::kFp4E2M1, DType::kF8E8M0, 7, 33, 222, true}}) {
    const Made m = make(c, 77);
    const ops::LinearWeight w = ops::prepare_quantized_linear(m.codes, m.scale, m.scheme, c.n, c.k);
    const Tensor all = ops::linear(m.x, w, m.bias, DType::kF32);
    const Tensor bf = ops::linear(m.x, w, m.bias, DType::kBF16);
    for (int64_t t = 0; t < c.rows; ++t) {
      const Tensor one = ops::linear(m.x.slice(0, t, t + 1).contiguous(), w, m.bias, DType::kF32);
      for (int64_t n = 0; n < c.n; ++n) {
        ASSERT_EQ(one.data<float>()[n], all.data<float>()[t * c.n + n]) << "row " << t;
        ASSERT_EQ(bf.data<float>()[t * c.n + n], round_bf16(all.data<float>()[t * c.n + n]));
      }
    }
  }
}

#ifdef MOEX_WITH_CUDA
// The same math on the GPU (src/cuda/quant_gemv.cuh up to 16 rows with K a multiple of 16 / 32,
// the tile kernel beyond): float32 sums in another order than the host's.
TEST(QuantLinear, CudaMatchesFloat64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 4321;
  for (auto kind : {QuantScheme::Kind::kFp8E4M3, QuantScheme::Kind::kFp4E2M1})
    for (DType sd : {DType::kF32, DType::kF8E8M0}) {
      if (kind == QuantScheme::Kind::kFp4E2M1 && sd == DType::kF32) continue;
      for (int64_t rows : {1, 3, 8, 16, 17})
        for (auto [n, k] : {std::pair<int64_t, int64_t>{19, 224}, {130, 1056}, {33, 1000}, {257, 128}}) {
          if (kind == QuantScheme::Kind::kFp4E2M1 && k % 32) continue;
          const Case c{kind, sd, rows, n, k, n == 19};
          const Made m = make(c, ++seed);
          const Device gpu = Device::cuda();
          const ops::LinearWeight w =
              ops::prepare_quantized_linear(m.codes.to(gpu), m.scale.to(gpu), m.scheme, c.n, c.k);
          const Tensor y = ops::linear(m.x.to(gpu), w, c.bias ? m.bias.to(gpu) : m.bias, DType::kF32)
                               .to(Device::cpu());
          ASSERT_EQ(y.shape(), (Shape{c.rows, c.n}));
          EXPECT_LE(rel_l2(y, reference(c, m)), 4e-6) << name_of(c) << " seed " << seed;
        }
    }
}

// bf16 activations on the GPU: beyond 16 rows the FP8 weights run on Hopper's tensor cores (the
// experts' FP8 wgmma kernel, the weight as one expert; the test checks that path is the one
// taken), elsewhere on the tile kernel. The reference gets x and the bias rounded to bf16 as the
// call does; the bound covers the bf16 output rounding (about 2^-9 relative per element) and the
// tensor cores' coarser FP8 block sums. Shapes: N not a multiple of 8 (stores from the
// accumulators), of 128 and of 256 (partial column blocks), K tails, 17 to 300 rows (partial and
// several 128-row tiles), with and without bias.
TEST(QuantLinear, CudaBf16MatchesFloat64Reference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const bool hopper = cuda::traits_of(cuda::current_device()).hopper();
  uint64_t seed = 9876;
  for (DType sd : {DType::kF32, DType::kF8E8M0})
    for (int64_t rows : {17, 64, 129, 300})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{19, 224}, {130, 1056}, {264, 2048},
                          {257, 128}, {33, 1000}}) {
        const Case c{QuantScheme::Kind::kFp8E4M3, sd, rows, n, k, n != 257};
        Made m = make(c, ++seed);
        m.x = m.x.to(DType::kBF16).to(DType::kF32);
        if (c.bias) m.bias = m.bias.to(DType::kBF16).to(DType::kF32);
        const Device gpu = Device::cuda();
        const ops::LinearWeight w =
            ops::prepare_quantized_linear(m.codes.to(gpu), m.scale.to(gpu), m.scheme, c.n, c.k);
        if (hopper)
          EXPECT_EQ(ops::cuda::linear_quantized_on_tensor_cores(rows, w, DType::kBF16, gpu.index),
                    k % 16 == 0)
              << name_of(c);
        const Tensor x = m.x.to(DType::kBF16).to(gpu);
        const Tensor b = c.bias ? m.bias.to(DType::kBF16).to(gpu) : Tensor();
        const Tensor y = ops::linear(x, w, b, DType::kBF16).to(Device::cpu()).to(DType::kF32);
        ASSERT_EQ(y.shape(), (Shape{c.rows, c.n}));
        EXPECT_LE(rel_l2(y, reference(c, m)), 4e-3) << name_of(c) << " seed " << seed;
      }
}
#endif

TEST(QuantLinear, HoldsTheStoredBytesOnly) {
  const Case c{QuantScheme::Kind::kFp8E4M3, DType::kF8E8M0, 1, 257, 300, false};
  const Made m = make(c, 5);
  const ops::LinearWeight w = ops::prepare_quantized_linear(m.codes, m.scale, m.scheme, c.n, c.k);
  EXPECT_EQ(w.nbytes(), 257 * 300 + 3 * 3);  // one byte per weight + one per 128x128 block
  EXPECT_FALSE(w.packed);
  const Case f{QuantScheme::Kind::kFp4E2M1, DType::kF8E8M0, 1, 33, 1000, false};
  const Made m4 = make(f, 6);
  const ops::LinearWeight w4 = ops::prepare_quantized_linear(m4.codes, m4.scale, m4.scheme, f.n, f.k);
  EXPECT_EQ(w4.nbytes(), 33 * 500 + 33 * 32);
}

// Host codes of 2 MiB or more leave the checkpoint's file mapping when prepared (they are copied
// into anonymous memory that can be put on huge pages, and the mapping's pages are given back):
// the prepared weight holds the stored bytes, no more, and computes what the mapped codes do, bit
// for bit, and what the float64 reference does. Anonymous codes are kept as they are.
TEST(QuantLinear, LargeHostCodesLeaveTheFileMapping) {
  for (auto kind : {QuantScheme::Kind::kFp8E4M3, QuantScheme::Kind::kFp4E2M1}) {
    const bool fp4 = kind == QuantScheme::Kind::kFp4E2M1;
    const Case c{kind, DType::kF8E8M0, 7, 1100, fp4 ? 4160 : 2050, false};  // 2.2 MB of codes
    const Made m = make(c, 21);
    ASSERT_GE(m.codes.nbytes(), size_t(2) << 20);
    test::TempDir dir;
    const std::string path = dir.file("w.safetensors");
    save_safetensors(path, {{"codes", m.codes}, {"scale", m.scale}});
    const auto file = SafetensorsFile::open(path);
    const Tensor mapped = file->get("codes");
    ASSERT_TRUE(mapped.storage() && mapped.storage()->file_mapped());
    const ops::LinearWeight w = ops::prepare_quantized_linear(mapped, file->get("scale"), m.scheme, c.n, c.k);
    ASSERT_TRUE(w.tensor.storage());
    EXPECT_FALSE(w.tensor.storage()->file_mapped()) << name_of(c);
    // Copied to a 2 MiB boundary, so its first 2 MiB are one huge page (a plain allocation of
    // 2.2 MB holds a whole aligned 2 MiB only by luck).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w.tensor.raw()) % (uintptr_t(2) << 20), 0u) << name_of(c);
    EXPECT_EQ(w.nbytes(), int64_t(m.codes.nbytes() + m.scale.nbytes())) << name_of(c);
    ASSERT_EQ(w.tensor.nbytes(), m.codes.nbytes());
    EXPECT_EQ(std::memcmp(w.tensor.raw(), m.codes.raw(), m.codes.nbytes()), 0) << name_of(c);
    // The same product as the codes read in place (a weight assembled around the mapping).
    ops::LinearWeight in_place = w;
    in_place.tensor = mapped;
    const Tensor y = ops::linear(m.x, w, Tensor(), DType::kF32);
    const Tensor y_mapped = ops::linear(m.x, in_place, Tensor(), DType::kF32);
    ASSERT_EQ(y.nbytes(), y_mapped.nbytes());
    EXPECT_EQ(std::memcmp(y.raw(), y_mapped.raw(), y.nbytes()), 0) << name_of(c);
    EXPECT_LT(rel_l2(y, reference(c, m)), 1e-5) << name_of(c);
    // Anonymous codes: the same tensor, kept in place.
    const ops::LinearWeight anon = ops::prepare_quantized_linear(m.codes, m.scale, m.scheme, c.n, c.k);
    EXPECT_EQ(anon.tensor.raw(), m.codes.raw()) << name_of(c);
  }
}

TEST(QuantLinear, ZeroRows) {
  const Case c{QuantScheme::Kind::kFp8E4M3, DType::kF32, 1, 19, 222, false};
  const Made m = make(c, 9);
  const ops::LinearWeight w = ops::prepare_quantized_linear(m.codes, m.scale, m.scheme, c.n, c.k);
  const Tensor y = ops::linear(Tensor::empty({0, c.k}, DType::kF32), w, Tensor(), DType::kF32);
  EXPECT_EQ(y.shape(), (Shape{0, 19}));
}

}  // namespace
}  // namespace moex
