// The CUDA implementations of the small ops (src/ops/cuda) against the host ones, both reached
// through the public dispatch (ops/ops.hpp): the same values in float32 host tensors and in
// act-dtype CUDA tensors, ugly sizes, left padding in the steps.
//
// Tolerances. Element-wise copies and arithmetic, embedding, slices, routing choices and argmax
// must match bit for bit. RMSNorm and rope perform the host's float32 / act roundings one for one;
// they can differ from the host only where a differently ordered double sum (norm) or CUDA's
// double sin / cos (rope) lands within ~1e-16 of a float32 rounding boundary, which is about one
// value in 10^8: the checks allow one ulp of act in at most 1 + n / 10^4 elements, a bound that
// still catches any systematic error (a missed rounding point changes a large share of elements).
// Activations with erf / tanh / exp: glibc's float functions are not all correctly rounded and
// CUDA's are not glibc's, so float32 results may differ by a few ulps; in bf16 that shows only when
// a value sits at a bf16 rounding boundary (< 1% of elements, one ulp).
// The tests also compile in a CPU-only build, where every one of them is skipped, except the
// replay of libstdc++'s selection (host code shared with the device routers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moex/dtype.hpp"
#include "moex/error.hpp"
#include "moex/tensor.hpp"
#include "ops/cuda/torch_topk.cuh"
#include "ops/ops.hpp"
#include "support/test_support.hpp"

namespace {

using moex::Device;
using moex::DType;
using moex::Shape;
using moex::Tensor;
namespace ops = moex::ops;

float round_act(float v, DType act) { return act == DType::kBF16 ? moex::round_bf16(v) : v; }
std::string name(DType t) { return std::string(moex::dtype_name(t)); }

std::vector<float> random_values(size_t n, uint64_t seed, DType act, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = round_act(u(rng), act);
  return v;
}
// Values from a few discrete levels (exact in bf16): ties everywhere.
std::vector<float> tie_values(size_t n, uint64_t seed, int levels, float step) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(int(rng() % uint64_t(levels)) - levels / 2) * step;
  return v;
}

Tensor host(const std::vector<float>& v, Shape s) { return Tensor::from_floats(v, std::move(s)); }
// The same values on the device, stored in `dtype`.
Tensor device(const Tensor& h, DType dtype) { return h.to(dtype).to(Device::cuda(0)); }
std::vector<float> values(const Tensor& t) { return t.to(Device::cpu()).to(DType::kF32).to_float_vector(); }

// Distance in units in the last place of `act` between two act values.
int64_t ulps(float a, float b, DType act) {
  auto ordered = [&](float f) {
    uint32_t u = moex::float_bits(f);
    if (act == DType::kBF16) u >>= 16;
    const uint32_t sign = act == DType::kBF16 ? 0x8000u : 0x80000000u;
    return (u & sign) ? -int64_t(u & (sign - 1)) : int64_t(u);
  };
  return std::llabs(ordered(a) - ordered(b));
}

struct Diff {
  int64_t n = 0, mismatches = 0, max_ulps = 0, first = -1;
};
Diff compare(const std::vector<float>& want, const std::vector<float>& got, DType act) {
  Diff d;
  d.n = int64_t(want.size());
  EXPECT_EQ(want.size(), got.size());
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    if (moex::float_bits(want[i]) == moex::float_bits(got[i])) continue;
    if (d.first < 0) d.first = int64_t(i);
    ++d.mismatches;
    d.max_ulps = std::max(d.max_ulps, (std::isnan(want[i]) || std::isnan(got[i])) ? int64_t(1) << 40 : ulps(want[i], got[i], act));
  }
  return d;
}
std::string describe(const Diff& d, const std::vector<float>& want, const std::vector<float>& got) {
  std::string s = std::to_string(d.mismatches) + " of " + std::to_string(d.n) + " differ, max " +
                  std::to_string(d.max_ulps) + " ulps";
  if (d.first >= 0)
    s += ", first at " + std::to_string(d.first) + ": host " + std::to_string(want[size_t(d.first)]) +
         " device " + std::to_string(got[size_t(d.first)]);
  return s;
}
void expect_exact(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  const Diff d = compare(want, got, DType::kF32);
  EXPECT_EQ(d.mismatches, 0) << what << ": " << describe(d, want, got);
}
// The norm / rope rule (file note): one ulp of act in at most 1 + n / 10^4 elements.
void expect_rounding_close(const std::vector<float>& want, const std::vector<float>& got, DType act,
                           const std::string& what) {
  const Diff d = compare(want, got, act);
  EXPECT_LE(d.max_ulps, 1) << what << ": " << describe(d, want, got);
  EXPECT_LE(d.mismatches, 1 + d.n / 10000) << what << ": " << describe(d, want, got);
}

const DType kActs[] = {DType::kBF16, DType::kF32};
struct Size {
  int64_t rows, width;
};
const Size kSizes[] = {{1, 1}, {3, 17}, {67, 129}, {1000, 2880}, {3, 5120}, {1, 5120}};

// A step with left padding: B sequences of T tokens after `past` cached columns.
ops::Step padded_step(int64_t B, int64_t T, int64_t past, uint64_t seed) {
  ops::Step s(B, T, past);
  std::mt19937_64 rng(seed);
  s.pad.resize(size_t(B));
  for (auto& p : s.pad) p = int64_t(rng() % uint64_t(past + T + 1));
  s.pad[0] = 0;
  return s;
}

// ---------------------------------------------------------------- step mirror

TEST(CudaOps, DeviceStepMirror) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  ops::Step s = padded_step(3, 5, 7, 1);
  s.pad = {0, 9, 12};
  for (int64_t r = 0; r < s.rows(); ++r) s.ids.push_back(1000 + r);
  ops::make_device_step(s, Device::cuda(0));
  ASSERT_TRUE(s.device.defined());
  ASSERT_EQ(s.device.dtype(), DType::kI32);
  std::vector<int64_t> want = {s.past};
  for (int64_t b = 0; b < s.batch; ++b) want.push_back(s.pad_of(b));
  for (int64_t r = 0; r < s.rows(); ++r) want.push_back(s.position(r));
  for (int64_t r = 0; r < s.rows(); ++r) want.push_back(s.ids[size_t(r)]);
  EXPECT_EQ(s.device.to(Device::cpu()).to_int_vector(), want);
  EXPECT_EQ(s.position(5), 1);  // column 7 < pad 9: a padding row
}

// ---------------------------------------------------------------- element-wise

TEST(CudaOps, RoundAddClampExact) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 10;
  for (DType act : kActs)
    for (Size sz : kSizes) {
      const std::string what = name(act) + " " + std::to_string(sz.rows) + "x" + std::to_string(sz.width);
      const size_t n = size_t(sz.rows * sz.width);
      // round_: float32 storage holding unrounded values.
      Tensor x = host(random_values(n, ++seed, DType::kF32), {sz.rows, sz.width});
      Tensor xd = x.to(Device::cuda(0));
      ops::round_(x, act);
      ops::round_(xd, act);
      expect_exact(x.to_float_vector(), values(xd), "round " + what);

      Tensor a = host(random_values(n, ++seed, act), {sz.rows, sz.width});
      Tensor b = host(random_values(n, ++seed, act), {sz.rows, sz.width});
      Tensor ad = device(a, act), bd = device(b, act);
      ops::add_(a, b, act);
      ops::add_(ad, bd, act);
      expect_exact(a.to_float_vector(), values(ad), "add " + what);

      ops::clamp_(a, 0.75f);
      ops::clamp_(ad, 0.75f);
      expect_exact(a.to_float_vector(), values(ad), "clamp " + what);
    }
}

TEST(CudaOps, GatedActivation) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const moex::Activation fns[] = {moex::Activation::kSilu, moex::Activation::kGelu, moex::Activation::kGeluTanh,
                                  moex::Activation::kRelu};
  uint64_t seed = 100;
  for (DType act : kActs)
    for (moex::Activation fn : fns)
      for (Size sz : {Size{1, 17}, Size{67, 129}, Size{1000, 2880}}) {
        const std::string what = name(act) + " " + std::string(moex::activation_name(fn)) + " " +
                                 std::to_string(sz.rows) + "x" + std::to_string(sz.width);
        const size_t n = size_t(sz.rows * sz.width);
        Tensor g = host(random_values(n, ++seed, act, -6.0f, 6.0f), {sz.rows, sz.width});
        Tensor u = host(random_values(n, ++seed, act), {sz.rows, sz.width});
        Tensor gd = device(g, act), ud = device(u, act);
        ops::gated_activation_(g, u, fn, act);
        ops::gated_activation_(gd, ud, fn, act);
        const std::vector<float> want = g.to_float_vector(), got = values(gd);
        const Diff d = compare(want, got, act);
        if (fn == moex::Activation::kRelu) {
          EXPECT_EQ(d.mismatches, 0) << what << ": " << describe(d, want, got);
        } else if (act == DType::kBF16) {
          EXPECT_LE(d.max_ulps, 1) << what << ": " << describe(d, want, got);
          EXPECT_LE(d.mismatches, 1 + d.n / 100) << what << ": " << describe(d, want, got);
        } else if (fn == moex::Activation::kSilu) {
          EXPECT_LE(d.max_ulps, 4) << what << ": " << describe(d, want, got);
        } else {
          // gelu / gelu_tanh in float32: the host forms 1 + erf (or tanh) in float, which cancels
          // for x << 0 (the relative error of the result there is up to 2^-24 / |1 + erf|), the
          // device in double; so the bound is absolute: a few float32 roundings of |0.5 x up|.
          const std::vector<float> uv = u.to_float_vector();
          double worst = 0;
          const auto gin = random_values(n, seed - 1, act, -6.0f, 6.0f);
          for (size_t i = 0; i < n; ++i) {
            const double scale = 0.5 * std::fabs(double(gin[i]) * double(uv[i])) * std::ldexp(1.0, -24);
            const double err = std::fabs(double(want[i]) - double(got[i]));
            worst = std::max(worst, err - 4 * (scale + std::ldexp(std::fabs(double(want[i])), -24)));
          }
          EXPECT_LE(worst, 0.0) << what << ": " << describe(d, want, got);
        }
      }
  Tensor g = device(host({1.0f, 2.0f}, {1, 2}), DType::kBF16);
  EXPECT_THROW(ops::gated_activation_(g, g, moex::Activation::kSwigluOai, DType::kBF16), moex::Unsupported);
}

TEST(CudaOps, AddGatedSharedExpert) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 200;
  for (DType act : kActs)
    for (Size sz : {Size{1, 1}, Size{3, 17}, Size{67, 2880}, Size{1000, 129}}) {
      const std::string what = name(act) + " " + std::to_string(sz.rows) + "x" + std::to_string(sz.width);
      const size_t n = size_t(sz.rows * sz.width);
      Tensor y = host(random_values(n, ++seed, act), {sz.rows, sz.width});
      Tensor sh = host(random_values(n, ++seed, act), {sz.rows, sz.width});
      Tensor gl = host(random_values(size_t(sz.rows), ++seed, act, -8.0f, 8.0f), {sz.rows, 1});
      Tensor yd = device(y, act);
      ops::add_gated_(y, sh, gl, act);
      ops::add_gated_(yd, device(sh, act), device(gl, act), act);
      const std::vector<float> want = y.to_float_vector(), got = values(yd);
      const Diff d = compare(want, got, act);
      EXPECT_LE(d.max_ulps, act == DType::kBF16 ? 1 : 4) << what << ": " << describe(d, want, got);
      if (act == DType::kBF16) {
        EXPECT_LE(d.mismatches, 1 + d.n / 100) << what << ": " << describe(d, want, got);
      }
    }
}

// The MoE block's output joining the residual stream in the same launch: exactly add_gated_ then
// add_ on the device (y and the residual bit for bit).
TEST(CudaOps, AddGatedResidualIsAddGatedThenAdd) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 260;
  for (DType act : kActs)
    for (Size sz : {Size{1, 1}, Size{1, 2048}, Size{3, 17}, Size{67, 2880}}) {
      const std::string what = name(act) + " " + std::to_string(sz.rows) + "x" + std::to_string(sz.width);
      const size_t n = size_t(sz.rows * sz.width);
      Tensor y = device(host(random_values(n, ++seed, act), {sz.rows, sz.width}), act);
      Tensor h = device(host(random_values(n, ++seed, act), {sz.rows, sz.width}), act);
      Tensor sh = device(host(random_values(n, ++seed, act), {sz.rows, sz.width}), act);
      Tensor gl = device(host(random_values(size_t(sz.rows), ++seed, act, -8.0f, 8.0f), {sz.rows, 1}), act);
      Tensor y2 = y.clone(), h2 = h.clone();
      ops::add_gated_residual_(h, y, sh, gl, act);
      ops::add_gated_(y2, sh, gl, act);
      ops::add_(h2, y2, act);
      expect_exact(values(y2), values(y), "add_gated_residual y " + what);
      expect_exact(values(h2), values(h), "add_gated_residual residual " + what);
    }
}

TEST(CudaOps, EmbeddingReadsTheStepIds) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 300;
  const int64_t V = 1000;
  for (DType act : kActs)
    for (DType table_dtype : {DType::kF32, DType::kBF16})
      for (int64_t H : {1, 17, 2880}) {
        ops::Step s = padded_step(4, 17, 3, ++seed);
        std::mt19937_64 rng(seed);
        for (int64_t r = 0; r < s.rows(); ++r) s.ids.push_back(int64_t(rng() % uint64_t(V)));
        s.ids.back() = V - 1;
        // Table values in its own dtype (the host reads the same values as float32).
        Tensor table = host(random_values(size_t(V * H), ++seed, table_dtype), {V, H});
        Tensor table_d = device(table, table_dtype);
        ops::make_device_step(s, Device::cuda(0));
        Tensor want = ops::embedding(table, s, act);
        Tensor got = ops::embedding(table_d, s, act);
        EXPECT_EQ(got.dtype(), act);
        EXPECT_EQ(got.shape(), (Shape{s.rows(), H}));
        expect_exact(want.to_float_vector(), values(got),
                     "embedding " + name(act) + " table " + name(table_dtype) + " H " + std::to_string(H));
      }
}

TEST(CudaOps, SliceConcatLastRowsExact) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 400;
  for (DType act : kActs)
    for (int64_t rows : {1, 3, 67, 1000}) {
      const std::string what = name(act) + " rows " + std::to_string(rows);
      // MLA-like: 16 heads of 192 = 128 nope + 64 rope; a plain slice of a 5120 row.
      Tensor x = host(random_values(size_t(rows * 16 * 192), ++seed, act), {rows, 16 * 192});
      Tensor xd = device(x, act);
      for (auto [groups, begin, width] : {std::tuple{16L, 0L, 128L}, {16L, 128L, 64L}, {1L, 5L, 17L}, {48L, 63L, 1L}}) {
        Tensor want = ops::slice_columns(x, groups, begin, width);
        Tensor got = ops::slice_columns(xd, groups, begin, width);
        EXPECT_EQ(got.dtype(), act);
        expect_exact(want.to_float_vector(), values(got),
                     "slice " + what + " g" + std::to_string(groups) + " b" + std::to_string(begin) + " w" + std::to_string(width));
      }
      Tensor a = host(random_values(size_t(rows * 16 * 128), ++seed, act), {rows, 16 * 128});
      Tensor b = host(random_values(size_t(rows * 16 * 64), ++seed, act), {rows, 16 * 64});
      Tensor b1 = host(random_values(size_t(rows * 64), ++seed, act), {rows, 64});
      expect_exact(ops::concat_columns(a, b, 16, false).to_float_vector(),
                   values(ops::concat_columns(device(a, act), device(b, act), 16, false)), "concat " + what);
      expect_exact(ops::concat_columns(a, b1, 16, true).to_float_vector(),
                   values(ops::concat_columns(device(a, act), device(b1, act), 16, true)), "concat shared " + what);
      // b in float32 storage next to an act `a`: converted into a's dtype.
      expect_exact(ops::concat_columns(a, b1, 16, true).to_float_vector(),
                   values(ops::concat_columns(device(a, act), device(b1, DType::kF32), 16, true)),
                   "concat mixed " + what);
    }
  for (auto [B, T] : {std::pair{1L, 1L}, {3L, 5L}, {64L, 1L}, {8L, 125L}}) {
    ops::Step s(B, T, 4);
    for (int64_t W : {1L, 17L, 5120L}) {
      Tensor x = host(random_values(size_t(B * T * W), ++seed, DType::kBF16), {B * T, W});
      expect_exact(ops::last_rows(x, s).to_float_vector(), values(ops::last_rows(device(x, DType::kBF16), s)),
                   "last_rows B" + std::to_string(B) + " T" + std::to_string(T) + " W" + std::to_string(W));
    }
  }
}

TEST(CudaOps, ZeroRowsAreNoOps) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  Tensor x = Tensor::empty({0, 17}, DType::kBF16, Device::cuda(0));
  Tensor w = device(host(std::vector<float>(17, 1.0f), {17}), DType::kF32);
  EXPECT_NO_THROW(ops::round_(x, DType::kBF16));
  EXPECT_NO_THROW(ops::add_(x, x, DType::kBF16));
  EXPECT_NO_THROW(ops::clamp_(x, 1.0f));
  EXPECT_NO_THROW(ops::rms_norm_(x, w, 1e-6f, DType::kBF16));
  EXPECT_EQ(ops::rms_norm(x, w, 1e-6f, DType::kBF16).size(0), 0);
  EXPECT_EQ(ops::slice_columns(x, 1, 0, 5).size(0), 0);
  Tensor logits = Tensor::empty({0, 64}, DType::kF32, Device::cuda(0));
  EXPECT_EQ(ops::softmax_topk(logits, 2, true, DType::kBF16).top_k_index.size(0), 0);
  std::mt19937_64 rng(1);
  EXPECT_TRUE(ops::choose_tokens(logits, nullptr, rng).empty());
}

// ---------------------------------------------------------------- normalisation

TEST(CudaOps, RmsNormBothStylesAndGroups) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 500;
  struct Case {
    int64_t rows, width, group;
  };
  // 1100 x 2880: a prompt's rows, one warp per wide row (1000 x 5120 stays on block teams).
  const Case cases[] = {{1, 17, 0}, {3, 129, 0}, {67, 2880, 0}, {1000, 5120, 0}, {3, 5120, 0},
                        {67, 1024, 64}, {1000, 512, 128}, {3, 2880, 64}, {1, 4096, 2048}, {1100, 2880, 0}};
  for (DType act : kActs)
    for (Case c : cases)
      for (auto style : {ops::RmsNormStyle::kLlama, ops::RmsNormStyle::kGptOss})
        for (DType wdt : {DType::kF32, DType::kBF16}) {
          const int64_t g = c.group ? c.group : c.width;
          const std::string what = name(act) + " " + std::to_string(c.rows) + "x" + std::to_string(c.width) +
                                   " group " + std::to_string(c.group) + (style == ops::RmsNormStyle::kLlama ? " llama" : " gpt-oss") +
                                   " w " + name(wdt);
          Tensor x = host(random_values(size_t(c.rows * c.width), ++seed, act, -3.0f, 3.0f), {c.rows, c.width});
          Tensor w = host(random_values(size_t(g), ++seed, wdt, 0.5f, 1.5f), {g});
          Tensor xd = device(x, act), wd = device(w, wdt);
          Tensor want = ops::rms_norm(x, w, 1e-6f, act, c.group, style);
          Tensor got = ops::rms_norm(xd, wd, 1e-6f, act, c.group, style);
          EXPECT_EQ(got.dtype(), act);
          expect_rounding_close(want.to_float_vector(), values(got), act, "rms_norm " + what);
          ops::rms_norm_(xd, wd, 1e-6f, act, c.group, style);
          expect_rounding_close(want.to_float_vector(), values(xd), act, "rms_norm_ " + what);
        }
}

// The fused residual step is exactly add_ then rms_norm on the device (h and the output bit for
// bit), and matches the host's two ops like rms_norm does.
TEST(CudaOps, AddRmsNormIsAddThenNorm) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 560;
  for (DType act : kActs)
    for (int64_t rows : {1, 3, 67, 1100})
      for (int64_t width : {17, 1000, 2048, 2880})
        for (auto style : {ops::RmsNormStyle::kLlama, ops::RmsNormStyle::kGptOss}) {
          const std::string what = name(act) + " " + std::to_string(rows) + "x" + std::to_string(width);
          Tensor h = host(random_values(size_t(rows * width), ++seed, act, -3.0f, 3.0f), {rows, width});
          Tensor d = host(random_values(size_t(rows * width), ++seed, act, -3.0f, 3.0f), {rows, width});
          Tensor w = host(random_values(size_t(width), ++seed, act, 0.5f, 1.5f), {width});
          Tensor h1 = device(h, act), h2 = device(h, act), dd = device(d, act), wd = device(w, act);
          Tensor fused = ops::add_rms_norm(h1, dd, wd, 1e-6f, act, style);
          ops::add_(h2, dd, act);
          Tensor apart = ops::rms_norm(h2, wd, 1e-6f, act, 0, style);
          expect_exact(values(h2), values(h1), "add_rms_norm residual " + what);
          expect_exact(values(apart), values(fused), "add_rms_norm output " + what);
          Tensor hh = h.clone();
          Tensor want = ops::add_rms_norm(hh, d, w, 1e-6f, act, style);
          expect_rounding_close(want.to_float_vector(), values(fused), act, "add_rms_norm host " + what);
        }
}

// ---------------------------------------------------------------- rope

ops::Rope make_rope(int64_t dim, double base, double scaling) {
  ops::Rope r;
  r.rotary_dim = dim;
  for (int64_t i = 0; i < dim / 2; ++i) r.inv_freq.push_back(double(float(1.0 / std::pow(base, double(2 * i) / double(dim)))));
  r.attention_scaling = scaling;
  return r;
}

TEST(CudaOps, RopeBothLayoutsWithPadding) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 600;
  struct Case {
    int64_t heads, head_stride, offset, dim;
    ops::RopeLayout layout;
    double scaling;
  };
  const Case cases[] = {
      {4, 64, 0, 64, ops::RopeLayout::kHalf, 1.0},            // Llama-like
      {3, 192, 128, 64, ops::RopeLayout::kInterleaved, 1.2},  // MLA q: rope part after nope, yarn scale
      {1, 64, 0, 64, ops::RopeLayout::kInterleaved, 1.0},     // MLA's one rope key
      {5, 80, 16, 32, ops::RopeLayout::kHalf, 1.0},           // partial rotary
      {2, 512, 0, 512, ops::RopeLayout::kHalf, 1.0},          // the largest rotary_dim
      {64, 128, 0, 128, ops::RopeLayout::kHalf, 1.0},         // many heads
  };
  const std::tuple<int64_t, int64_t, int64_t> steps[] = {{3, 5, 7}, {67, 1, 4000}, {8, 125, 0}, {1, 1, 0}};
  for (DType act : kActs)
    for (Case c : cases)
      for (auto [B, T, past] : steps) {
        ops::Step s = padded_step(B, T, past, ++seed);
        ops::make_device_step(s, Device::cuda(0));
        const ops::Rope rope = make_rope(c.dim, 10000.0, c.scaling);
        const int64_t rows = B * T, width = c.heads * c.head_stride;
        Tensor x = host(random_values(size_t(rows * width), ++seed, act), {rows, width});
        Tensor xd = device(x, act);
        ops::rope_(x, c.heads, c.head_stride, c.offset, rope, c.layout, s, act);
        ops::rope_(xd, c.heads, c.head_stride, c.offset, rope, c.layout, s, act);
        expect_rounding_close(x.to_float_vector(), values(xd), act,
                              "rope " + name(act) + " heads " + std::to_string(c.heads) + " dim " + std::to_string(c.dim) +
                                  (c.layout == ops::RopeLayout::kHalf ? " half" : " interleaved") + " B" +
                                  std::to_string(B) + " T" + std::to_string(T) + " past " + std::to_string(past));
      }
}

// q and k in one launch (rope2_): exactly two rope_ calls, with more heads in either tensor.
TEST(CudaOps, RopeTwoTensorsIsTwoRopes) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 650;
  const std::tuple<int64_t, int64_t, int64_t> heads_dim[] = {{16, 16, 128}, {32, 8, 128}, {4, 9, 64}, {64, 8, 64}};
  for (DType act : kActs)
    for (auto [hq, hk, dim] : heads_dim)
      for (auto [B, T, past] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 19}, {3, 5, 7}, {8, 1, 300}}) {
        ops::Step s = padded_step(B, T, past, ++seed);
        ops::make_device_step(s, Device::cuda(0));
        const ops::Rope rope = make_rope(dim, 1e6, 1.0);
        const int64_t rows = B * T;
        Tensor q = device(host(random_values(size_t(rows * hq * dim), ++seed, act), {rows, hq * dim}), act);
        Tensor k = device(host(random_values(size_t(rows * hk * dim), ++seed, act), {rows, hk * dim}), act);
        Tensor q1 = q.clone(), k1 = k.clone();
        ops::rope2_(q, hq, k, hk, dim, 0, rope, ops::RopeLayout::kHalf, s, act);
        ops::rope_(q1, hq, dim, 0, rope, ops::RopeLayout::kHalf, s, act);
        ops::rope_(k1, hk, dim, 0, rope, ops::RopeLayout::kHalf, s, act);
        const std::string what = name(act) + " heads " + std::to_string(hq) + "/" + std::to_string(hk);
        expect_exact(values(q1), values(q), "rope2 q " + what);
        expect_exact(values(k1), values(k), "rope2 k " + what);
      }
}

// rope_kv_append_ against rope2_ then kv_append: q, k and both caches bit for bit, at a first
// append (the cache allocated) and at a later one into a cache that must grow, padded batches.
TEST(CudaOps, RopeKvAppendIsRopeThenAppend) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 4650;
  const std::tuple<int64_t, int64_t, int64_t> heads_dim[] = {{16, 16, 128}, {4, 9, 64}, {6, 2, 32}};
  for (DType act : kActs)
    for (auto [hq, hk, dim] : heads_dim)
      for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}}) {
        const ops::Rope rope = make_rope(dim, 1e6, 1.0);
        ops::LayerKV want_kv, got_kv;
        want_kv.capacity_hint = got_kv.capacity_hint = 6;
        int64_t past = 0;
        for (int step_i = 0; step_i < 3; ++step_i) {
          ops::Step s = padded_step(B, T, past, ++seed);
          ops::make_device_step(s, Device::cuda(0));
          const int64_t rows = B * T;
          Tensor q = device(host(random_values(size_t(rows * hq * dim), ++seed, act), {rows, hq * dim}), act);
          Tensor k = device(host(random_values(size_t(rows * hk * dim), ++seed, act), {rows, hk * dim}), act);
          const Tensor v = device(host(random_values(size_t(rows * hk * dim), ++seed, act), {rows, hk * dim}), act);
          Tensor q1 = q.clone(), k1 = k.clone();
          ops::rope2_(q1, hq, k1, hk, dim, 0, rope, ops::RopeLayout::kHalf, s, act);
          ops::kv_append(want_kv, k1, v, s);
          ops::rope_kv_append_(q, hq, k, hk, v, got_kv, dim, rope, ops::RopeLayout::kHalf, s, act);
          const std::string what = name(act) + " heads " + std::to_string(hq) + "/" + std::to_string(hk) +
                                   " B " + std::to_string(B) + " T " + std::to_string(T) + " step " +
                                   std::to_string(step_i);
          expect_exact(values(q1), values(q), "q " + what);
          expect_exact(values(k1), values(k), "k " + what);
          ASSERT_EQ(got_kv.filled, want_kv.filled) << what;
          ASSERT_EQ(got_kv.capacity(), want_kv.capacity()) << what;
          // Columns past `filled` are unwritten in both: compare the written ones.
          expect_exact(values(ops::kv_columns(want_kv.k, want_kv.filled)), values(ops::kv_columns(got_kv.k, got_kv.filled)),
                       "k cache " + what);
          expect_exact(values(ops::kv_columns(want_kv.v, want_kv.filled)), values(ops::kv_columns(got_kv.v, got_kv.filled)),
                       "v cache " + what);
          past += T;
        }
      }
}

// ---------------------------------------------------------------- routing

// The host's slot lists and weights against the device's; choices exact, weights to the rounding
// of one float32 exp (bf16: one ulp, float32: a few).
void expect_same_routing(const ops::Routing& want, const ops::Routing& got, DType weights_act, const std::string& what) {
  ASSERT_EQ(got.top_k_index.dtype(), DType::kI64) << what;
  ASSERT_EQ(got.top_k_weights.dtype(), DType::kF32) << what;
  const std::vector<int64_t> wi = want.top_k_index.to_int_vector(), gi = got.top_k_index.to_int_vector();
  ASSERT_EQ(wi.size(), gi.size()) << what;
  size_t first = wi.size();
  int64_t bad = 0;
  for (size_t i = 0; i < wi.size(); ++i)
    if (wi[i] != gi[i]) {
      ++bad;
      first = std::min(first, i);
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " slots differ, first " << first << " (host "
                    << (first < wi.size() ? wi[first] : -1) << ", device " << (first < gi.size() ? gi[first] : -1) << ")";
  const std::vector<float> ww = want.top_k_weights.to_float_vector(), gw = values(got.top_k_weights);
  const Diff d = compare(ww, gw, weights_act);
  EXPECT_LE(d.max_ulps, weights_act == DType::kBF16 ? 1 : 8) << what << ": weights " << describe(d, ww, gw);
}

TEST(CudaOps, SoftmaxTopkTieOrder) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 700;
  for (int64_t E : {8, 60, 64, 128, 256})
    for (int64_t k : {1, 2, 4, 8})
      for (int64_t rows : {1, 67, 1000})
        for (DType stored : {DType::kBF16, DType::kF32}) {
          if (k > E) continue;
          const int levels = 2 + int(seed % 5);
          Tensor logits = host(tie_values(size_t(rows * E), ++seed, levels, 0.25f), {rows, E});
          Tensor ld = device(logits, stored);
          for (bool normalize : {true, false})
            for (DType wdt : kActs) {
              const std::string what = "softmax_topk E" + std::to_string(E) + " k" + std::to_string(k) + " rows " +
                                       std::to_string(rows) + " logits " + name(stored) + (normalize ? " norm" : "") +
                                       " w " + name(wdt);
              expect_same_routing(ops::softmax_topk(logits, k, normalize, wdt), ops::softmax_topk(ld, k, normalize, wdt),
                                  wdt, what);
            }
        }
  // Mostly distinct float32 logits, 1000 rows.
  Tensor logits = host(random_values(size_t(1000 * 128), 77, DType::kF32, -4.0f, 4.0f), {1000, 128});
  expect_same_routing(ops::softmax_topk(logits, 8, true, DType::kF32),
                      ops::softmax_topk(device(logits, DType::kF32), 8, true, DType::kF32), DType::kF32, "softmax_topk f32");
}

// Rows the warp-parallel selection takes (no tie among the chosen) beside rows that need the
// replay (a tie among them, +0 against -0) and widths past the parallel budget (E > 256),
// mixed in one call: every row must match the host.
TEST(CudaOps, SoftmaxTopkParallelAndReplayRowsMixed) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 900;
  for (int64_t E : {60, 64, 256, 257, 300})
    for (int64_t k : {1, 4, 8}) {
      const int64_t rows = 500;
      std::vector<float> v = random_values(size_t(rows * E), ++seed, DType::kBF16, -3.0f, 3.0f);
      for (int64_t e = 0; e < E; ++e) v[size_t(5 * E + e)] = -1.0f;  // row 5: zeros of both signs on top
      v[size_t(5 * E + 2)] = 0.0f;
      v[size_t(5 * E + 7)] = -0.0f;
      Tensor logits = host(v, {rows, E});
      for (DType stored : {DType::kBF16, DType::kF32})
        for (bool normalize : {true, false}) {
          const std::string what = "softmax_topk mixed E" + std::to_string(E) + " k" + std::to_string(k) + " " +
                                   name(stored) + (normalize ? " norm" : "");
          expect_same_routing(ops::softmax_topk(logits, k, normalize, DType::kF32),
                              ops::softmax_topk(device(logits, stored), k, normalize, DType::kF32), DType::kF32, what);
        }
      expect_same_routing(ops::topk_softmax(logits, k, DType::kBF16),
                          ops::topk_softmax(device(logits, DType::kBF16), k, DType::kBF16), DType::kBF16,
                          "topk_softmax mixed E" + std::to_string(E) + " k" + std::to_string(k));
    }
}

TEST(CudaOps, TopkSoftmaxTieOrder) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 800;
  for (int64_t E : {8, 60, 64, 128, 256})
    for (int64_t k : {1, 2, 4, 8})
      for (DType act : kActs) {
        if (k > E) continue;
        const int64_t rows = 67;
        ++seed;
        Tensor logits = host(tie_values(size_t(rows * E), seed, 3 + int(seed % 4), 0.125f), {rows, E});
        expect_same_routing(ops::topk_softmax(logits, k, act), ops::topk_softmax(device(logits, act), k, act), act,
                            "topk_softmax E" + std::to_string(E) + " k" + std::to_string(k) + " " + name(act));
      }
}

TEST(CudaOps, SigmoidGroupTopkTieOrder) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 900;
  struct Case {
    int64_t E, n_group, topk_group;
  };
  const Case cases[] = {{256, 8, 4}, {64, 8, 3}, {128, 1, 1}, {60, 4, 2}, {8, 8, 4}, {8, 1, 1}};
  for (Case c : cases)
    for (int64_t k : {1, 2, 4, 8})
      for (bool norm : {true, false}) {
        if (k > c.E) continue;
        ops::GroupLimitedTopk spec;
        spec.num_experts = c.E;
        spec.top_k = k;
        spec.n_group = c.n_group;
        spec.topk_group = c.topk_group;
        spec.norm_topk_prob = norm;
        spec.routed_scaling_factor = 2.5f;
        for (int64_t rows : {1, 67, 1000}) {
          Tensor logits = host(tie_values(size_t(rows * c.E), ++seed, 4, 0.5f), {rows, c.E});
          Tensor corr = host(tie_values(size_t(c.E), ++seed, 3, 0.0625f), {c.E});
          const std::string what = "sigmoid_group_topk E" + std::to_string(c.E) + " groups " + std::to_string(c.n_group) +
                                   "/" + std::to_string(c.topk_group) + " k" + std::to_string(k) + " rows " +
                                   std::to_string(rows) + (norm ? " norm" : "");
          expect_same_routing(ops::sigmoid_group_topk(logits, corr, spec),
                              ops::sigmoid_group_topk(device(logits, DType::kF32), device(corr, DType::kF32), spec),
                              DType::kF32, what);
        }
      }
}

// The replay behind the device routers against libstdc++ itself (host code: runs on every build).
TEST(CudaOps, TorchTopkReplayMatchesLibstdcxx) {
  namespace rp = moex::ops::cuda::topk_replay;
  std::mt19937_64 rng(42);
  unsigned long long stack[rp::kStack];
  int64_t bad = 0, cases = 0;
  for (int it = 0; it < 20000; ++it) {
    const int n = 1 + int(rng() % (it % 10 == 0 ? 3000 : 300));
    const int k = 1 + int(rng() % uint64_t(std::min(n, it % 3 == 0 ? n : 20)));
    const bool sorted = rng() & 1;
    std::vector<float> v(static_cast<size_t>(n));
    const int levels = 1 + int(rng() % 6);
    for (auto& x : v) {
      x = float(int(rng() % uint64_t(levels))) * 0.25f;
      if (rng() % 500 == 0) x = NAN;
      if (rng() % 300 == 0) x = -INFINITY;
    }
    if (it % 7 == 0)
      for (auto& x : v) x = float(rng() % 100000) / 7.0f;
    if (it % 13 == 0)
      for (int i = 0; i < n; ++i) v[size_t(i)] = float(n - i);
    std::vector<int64_t> idx(static_cast<size_t>(k));
    ops::torch_topk(v.data(), n, k, sorted, idx.data(), nullptr);
    std::vector<rp::Elem> a(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) a[size_t(i)] = {v[size_t(i)], i};
    rp::torch_topk(a.data(), n, k, sorted, stack);
    ++cases;
    for (int j = 0; j < k; ++j)
      if (a[size_t(j)].i != idx[size_t(j)]) {
        ++bad;
        ADD_FAILURE() << "n " << n << " k " << k << " sorted " << sorted << " slot " << j << ": replay "
                      << a[size_t(j)].i << ", libstdc++ " << idx[size_t(j)];
        break;
      }
    if (bad > 3) break;
  }
  EXPECT_EQ(bad, 0) << "of " << cases << " cases";
}

// ---------------------------------------------------------------- token choice

TEST(CudaOps, GreedyMatchesHostArgmax) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1000;
  std::mt19937_64 rng(1);
  for (auto [B, V] : {std::pair{1L, 1L}, {3L, 17L}, {64L, 1000L}, {2L, 262144L}, {64L, 32000L}})
    for (DType stored : kActs) {
      // Few levels: the maximum ties in most rows, the lowest id must win.
      Tensor logits = host(tie_values(size_t(B * V), ++seed, 7, 0.5f), {B, V});
      const std::vector<int64_t> want = ops::choose_tokens(logits, nullptr, rng);
      const std::vector<int64_t> got = ops::choose_tokens(device(logits, stored), nullptr, rng);
      EXPECT_EQ(want, got) << "B " << B << " V " << V << " " << name(stored);
    }
}

// The non-finite counts come back with the ids, equal to the host's, greedy and sampled.
TEST(CudaOps, ChooseTokensCountsNonFiniteLogits) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 4, V = 1000;
  std::vector<float> v = random_values(size_t(B * V), 77, DType::kF32, -3.0f, 3.0f);
  v[size_t(1 * V + 5)] = std::numeric_limits<float>::quiet_NaN();
  v[size_t(1 * V + 999)] = std::numeric_limits<float>::infinity();
  v[size_t(3 * V + 0)] = -std::numeric_limits<float>::infinity();
  v[size_t(2 * V + 0)] = std::numeric_limits<float>::quiet_NaN();  // the host's argmax is then 0
  const Tensor logits = host(v, {B, V});
  std::mt19937_64 rng(1);
  std::vector<int64_t> want, got;
  const std::vector<int64_t> want_ids = ops::choose_tokens(logits, nullptr, rng, &want);
  EXPECT_EQ(want, (std::vector<int64_t>{0, 2, 1, 1}));
  EXPECT_EQ(want_ids[2], 0);
  ops::SamplingSpec spec;
  spec.temperature = 0.7f;
  const ops::SamplingSpec* specs[] = {nullptr, &spec};
  for (const ops::SamplingSpec* s : specs)
    for (DType stored : kActs) {
      const std::vector<int64_t> ids = ops::choose_tokens(device(logits, stored), s, rng, &got);
      EXPECT_EQ(got, want) << name(stored) << (s ? " sampled" : " greedy");
      if (!s && stored == DType::kF32) EXPECT_EQ(ids, want_ids);
    }
}

// Logits [B, V] with one clear maximum per row (so that top_k = 1 keeps one token).
Tensor peaked_logits(int64_t B, int64_t V, uint64_t seed, std::vector<int64_t>* argmax) {
  std::vector<float> v = random_values(size_t(B * V), seed, DType::kBF16, -3.0f, 3.0f);
  std::mt19937_64 rng(seed);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = int64_t(rng() % uint64_t(V));
    v[size_t(b * V + i)] = 8.0f;
    if (argmax) argmax->push_back(i);
  }
  return host(v, {B, V});
}

TEST(CudaOps, SamplingTopK1AndSmallTopPAreGreedy) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(5);
  for (auto [B, V] : {std::pair{1L, 17L}, {64L, 1000L}, {3L, 262144L}}) {
    std::vector<int64_t> argmax;
    Tensor logits = device(peaked_logits(B, V, uint64_t(B * V), &argmax), DType::kBF16);
    ops::SamplingSpec top1;
    top1.temperature = 0.7f;
    top1.top_k = 1;
    EXPECT_EQ(ops::choose_tokens(logits, &top1, rng), argmax) << "top_k 1, B " << B << " V " << V;
    ops::SamplingSpec small_p;
    small_p.top_p = 1e-3f;
    EXPECT_EQ(ops::choose_tokens(logits, &small_p, rng), argmax) << "top_p 1e-3, B " << B << " V " << V;
  }
}

TEST(CudaOps, SamplingSeedReproducible) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 64, V = 1000;
  Tensor logits = device(host(random_values(size_t(B * V), 9, DType::kBF16, -1.0f, 1.0f), {B, V}), DType::kBF16);
  ops::SamplingSpec spec;
  spec.temperature = 1.3f;
  spec.top_k = 200;
  spec.top_p = 0.95f;
  std::mt19937_64 r1(123), r2(123), r3(124);
  const std::vector<int64_t> a = ops::choose_tokens(logits, &spec, r1), b = ops::choose_tokens(logits, &spec, r2);
  const std::vector<int64_t> c = ops::choose_tokens(logits, &spec, r3);
  EXPECT_EQ(a, b);
  // 64 near-uniform draws over ~190 tokens: all equal by chance with probability < 190^-60.
  EXPECT_NE(a, c);
  // The next call draws a new seed from the same generator.
  EXPECT_NE(ops::choose_tokens(logits, &spec, r1), a);
}

// The choice inside a captured decode step: the same ids as choose_tokens (greedy, and sampled
// with the feed's seeds in the order the generator gave them), the stop rule of generate's loop,
// and the step's mirror moved one column on (past, left-padded positions, ids), twice in a row.
TEST(CudaOps, ChooseAndFeedMovesTheStepOnAsTheHostLoopWould) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  const int64_t B = 3, V = 1000;
  Tensor logits = device(host(random_values(size_t(B * V), 31, DType::kBF16, -2.0f, 2.0f), {B, V}), DType::kBF16);
  std::mt19937_64 unused(0);
  const std::vector<int64_t> argmax = ops::choose_tokens(logits, nullptr, unused);
  ops::SamplingSpec spec;
  spec.temperature = 1.5f;
  spec.top_k = 100;
  for (bool sample : {false, true}) {
    ops::Step step(B, 1, 4);
    step.pad = {0, 2, 5};
    step.ids = {1, 2, 3};
    ops::make_device_step(step, dev);
    // Row 1 stopped before (token 77); greedy, row 2's choice is a stop token (a draw need not
    // hit it, so the sampled case has none it could choose).
    const std::vector<int64_t> stop = {-1, 77, -1};
    const std::vector<int64_t> eos = sample ? std::vector<int64_t>{999999} : std::vector<int64_t>{argmax[2], 999999};
    std::mt19937_64 rng(42), ahead = rng;
    const std::vector<uint64_t> seeds = {ahead(), ahead()};
    ops::DeviceFeed feed;
    ops::make_device_feed(feed, stop, eos, sample ? seeds : std::vector<uint64_t>{}, dev);
    const ops::SamplingSpec* s = sample ? &spec : nullptr;
    for (int call = 0; call < 2; ++call) {
      std::vector<int64_t> want = sample ? ops::choose_tokens(logits, s, rng) : argmax;
      want[1] = 77;
      ops::choose_and_feed(logits, s, step, feed);
      const std::vector<int64_t> out = feed.out.to(Device::cpu()).to_int_vector();
      const std::string what = std::string(sample ? "sampled" : "greedy") + " call " + std::to_string(call);
      EXPECT_EQ(std::vector<int64_t>(out.begin(), out.begin() + B), want) << what;
      EXPECT_EQ(std::vector<int64_t>(out.begin() + B, out.end()), std::vector<int64_t>(size_t(B), 0)) << what;
      const int64_t past = 5 + call;
      const std::vector<int64_t> mirror = step.device.to(Device::cpu()).to_int_vector();
      const std::vector<int64_t> positions = {past, past - 2, past < 5 ? 1 : past - 5};
      std::vector<int64_t> expect_mirror = {past, 0, 2, 5};
      expect_mirror.insert(expect_mirror.end(), positions.begin(), positions.end());
      expect_mirror.insert(expect_mirror.end(), want.begin(), want.end());
      EXPECT_EQ(mirror, expect_mirror) << what;
      const std::vector<int64_t> state = feed.state.to(Device::cpu()).to_int_vector();
      EXPECT_EQ(state[0], call + 1) << what;  // draws made
      EXPECT_EQ(state[1], 0) << what;         // the ticket is ready for the next step
      EXPECT_EQ(state[3], 77) << what;
      if (!sample) EXPECT_EQ(state[4], argmax[2]) << what;
    }
  }
  ops::Step two(B, 2, 0);
  ops::make_device_step(two, dev);
  ops::DeviceFeed feed;
  ops::make_device_feed(feed, {-1, -1, -1}, {}, {}, dev);
  EXPECT_THROW(ops::choose_and_feed(logits, nullptr, two, feed), moex::InvalidInput);
  ops::Step one(B, 1, 0);
  EXPECT_THROW(ops::choose_and_feed(logits, nullptr, one, feed), moex::InvalidInput);  // no mirror
  ops::make_device_step(one, dev);
  EXPECT_THROW(ops::choose_and_feed(logits, &spec, one, feed), moex::InvalidInput);  // no seeds
  EXPECT_THROW(ops::make_device_feed(feed, {}, {}, {}, dev), moex::InvalidInput);
}

// The host's warpers in double on one row: the distribution the device must draw from.
std::vector<double> warped_distribution(const std::vector<float>& x, const ops::SamplingSpec& s) {
  const size_t n = x.size();
  std::vector<double> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = double(x[i]) / double(s.temperature);
  if (s.top_k > 0 && size_t(s.top_k) < n) {
    std::vector<double> sorted = l;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const double kth = sorted[size_t(s.top_k - 1)];
    for (auto& v : l)
      if (v < kth) v = -INFINITY;
  }
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (p[i] = std::exp(l[i] - mx));
  for (auto& v : p) v /= sum;
  if (s.top_p < 1.0f) {
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
    double cum = 0;
    for (size_t j = 0; j + 1 < n; ++j) {
      cum += p[order[j]];
      if (cum <= 1.0 - double(s.top_p)) p[order[j]] = 0;
    }
    sum = 0;
    for (double v : p) sum += v;
    for (auto& v : p) v /= sum;
  }
  return p;
}

// Draw frequencies on a tiny vocabulary against the warped softmax: Pearson's chi-square over the
// tokens of nonzero probability (df = their count - 1), and no draw at all of a removed token.
// The generator's seed is fixed, so the check is deterministic: the bound is the 99.99th
// percentile of the chi-square distribution (a correct sampler fails it for 1 seed in 10^4;
// this one was chosen once, not searched for), and a sampler off by a few percent on any token
// exceeds it by far at 20480 draws.
TEST(CudaOps, SamplingFrequenciesFollowTheWarpedSoftmax) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  // chi-square 99.99th percentiles for df = 1..7.
  const double kBound[] = {0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88};
  struct Case {
    std::vector<float> logits;
    ops::SamplingSpec spec;
    const char* what;
  };
  auto spec = [](float t, int64_t k, float p) {
    ops::SamplingSpec s;
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    return s;
  };
  const std::vector<float> eight = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 1.5f, 0.25f};
  // Ties: the top-p cut falls between the two tokens of value 0 (ids 3 and 4): id 3 goes, id 4
  // stays, as the host's stable ascending sort orders them.
  const std::vector<float> ties = {1.0f, 1.0f, 0.5f, 0.0f, 0.0f, -1.0f};
  const Case cases[] = {
      {eight, spec(1.0f, 0, 1.0f), "plain"},
      {eight, spec(0.6f, 0, 1.0f), "temperature 0.6"},
      {eight, spec(1.0f, 3, 1.0f), "top_k 3"},
      {eight, spec(1.0f, 0, 0.8f), "top_p 0.8"},
      {eight, spec(1.5f, 5, 0.9f), "all three"},
      {ties, spec(1.0f, 0, 0.8f), "top_p cut inside a tie"},
      {ties, spec(1.0f, 4, 1.0f), "top_k 4 keeps both tied tokens"},
  };
  const int64_t B = 64, calls = 320;
  for (const Case& c : cases) {
    const int64_t V = int64_t(c.logits.size());
    std::vector<float> rows;
    for (int64_t b = 0; b < B; ++b) rows.insert(rows.end(), c.logits.begin(), c.logits.end());
    for (DType stored : kActs) {
      Tensor logits = device(host(rows, {B, V}), stored);
      std::mt19937_64 rng(2024);
      std::vector<int64_t> count(size_t(V), 0);
      for (int64_t call = 0; call < calls; ++call)
        for (int64_t id : ops::choose_tokens(logits, &c.spec, rng)) {
          ASSERT_TRUE(id >= 0 && id < V) << c.what;
          ++count[size_t(id)];
        }
      const std::vector<double> p = warped_distribution(c.logits, c.spec);
      const double N = double(B * calls);
      double chi2 = 0;
      int df = -1;
      for (int64_t i = 0; i < V; ++i) {
        if (p[size_t(i)] <= 0) {
          EXPECT_EQ(count[size_t(i)], 0) << c.what << ": token " << i << " was removed by the warpers";
          continue;
        }
        const double e = N * p[size_t(i)];
        chi2 += (double(count[size_t(i)]) - e) * (double(count[size_t(i)]) - e) / e;
        ++df;
      }
      ASSERT_GE(df, 1) << c.what;
      EXPECT_LE(chi2, kBound[df]) << c.what << " (" << name(stored) << "): chi-square " << chi2 << " with " << df
                                  << " degrees of freedom";
    }
  }
}

// Large vocabulary: every draw lies in the support the host's warpers leave.
TEST(CudaOps, SamplingLargeVocabularyStaysInTheSupport) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 4, V = 262144;
  Tensor h = host(tie_values(size_t(B * V), 31, 64, 0.125f), {B, V});
  Tensor d = device(h, DType::kBF16);
  const std::vector<float> all = h.to_float_vector();
  std::mt19937_64 rng(3);
  for (auto [k, p] : {std::pair{50L, 0.9f}, {0L, 0.5f}, {1000L, 1.0f}}) {
    ops::SamplingSpec spec;
    spec.top_k = k;
    spec.top_p = p;
    std::vector<std::vector<double>> dist;
    for (int64_t b = 0; b < B; ++b)
      dist.push_back(warped_distribution(std::vector<float>(all.begin() + b * V, all.begin() + (b + 1) * V), spec));
    for (int rep = 0; rep < 8; ++rep) {
      const std::vector<int64_t> ids = ops::choose_tokens(d, &spec, rng);
      for (int64_t b = 0; b < B; ++b) {
        ASSERT_TRUE(ids[size_t(b)] >= 0 && ids[size_t(b)] < V);
        EXPECT_GT(dist[size_t(b)][size_t(ids[size_t(b)])], 0.0)
            << "top_k " << k << " top_p " << p << " row " << b << " id " << ids[size_t(b)];
      }
    }
  }
}

}  // namespace
