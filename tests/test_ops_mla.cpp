// The ops DeepSeek MLA's compressed cache adds (ops.hpp): linear_per_group against a float64
// reference on the host and against the host op on CUDA, kv_columns, kv_append without values
// and the host attention with values read from the keys (AttentionSpec::v_from_k) against the
// same attention over an explicit copy of those values. (The CUDA attention with v_from_k is
// checked in test_cuda_attention.cpp.) GPU tests skip without a device.
//
// Tolerance of linear_per_group, per element: |got - ref| <= 2 * u_act * |ref| + 4 * k * 2^-24 *
// sum_k |x_k w_k| (one rounding to act, float32 accumulation of k products in some order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moex/dtype.hpp"
#include "moex/tensor.hpp"
#include "ops/ops.hpp"
#include "support/test_support.hpp"

namespace moex::ops {
namespace {

std::vector<float> random_values(int64_t n, DType dtype, std::mt19937_64& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return Tensor::from_floats(v, {n}, dtype).to_float_vector();
}

struct GroupCase {
  int64_t rows = 7, groups = 3, in = 37, block_rows = 11, group_rows = 24, offset = 13;
  bool transpose = false;
  DType weight_dtype = DType::kF32, act = DType::kF32;
  uint64_t seed = 1;
  std::string str() const {
    std::ostringstream s;
    s << "rows " << rows << " groups " << groups << " in " << in << " block " << block_rows << "/" << group_rows
      << "+" << offset << (transpose ? " transposed" : "") << " weight " << dtype_name(weight_dtype) << " act "
      << dtype_name(act) << " seed " << seed;
    return s.str();
  }
  int64_t a() const { return transpose ? block_rows : in; }  // x's group width
  int64_t b() const { return transpose ? in : block_rows; }  // y's group width
};

struct GroupInputs {
  std::vector<float> x, w;
  GroupedWeight host;
};

GroupInputs make_inputs(const GroupCase& c) {
  std::mt19937_64 rng(c.seed);
  GroupInputs g;
  g.x = random_values(c.rows * c.groups * c.a(), c.act, rng, 2.0f);
  g.w = random_values(c.groups * c.group_rows * c.in, c.weight_dtype, rng);
  g.host = {Tensor::from_floats(g.w, {c.groups * c.group_rows, c.in}, c.weight_dtype), c.groups, c.group_rows,
            c.offset, c.block_rows};
  return g;
}

// Float64 y and the per-element bound of the header.
void reference(const GroupCase& c, const GroupInputs& g, std::vector<double>& y, std::vector<double>& bound) {
  const int64_t a = c.a(), b = c.b();
  y.assign(size_t(c.rows * c.groups * b), 0.0);
  bound.assign(y.size(), 0.0);
  const double u = c.act == DType::kBF16 ? 1.0 / 256 : 1.0 / (1 << 24);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t gi = 0; gi < c.groups; ++gi)
      for (int64_t o = 0; o < b; ++o) {
        double s = 0, m = 0;
        for (int64_t k = 0; k < a; ++k) {
          // W_g[j, i] = w[(g * group_rows + offset + j) * in + i]
          const int64_t j = c.transpose ? k : o, i = c.transpose ? o : k;
          const double p = double(g.x[size_t(r * c.groups * a + gi * a + k)]) *
                           double(g.w[size_t((gi * c.group_rows + c.offset + j) * c.in + i)]);
          s += p;
          m += std::fabs(p);
        }
        const size_t idx = size_t(r * c.groups * b + gi * b + o);
        y[idx] = s;
        bound[idx] = 2 * u * std::fabs(s) + 4.0 * double(a) * std::ldexp(1.0, -24) * m;
      }
}

void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= bound[i])) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": first at " << first << ": got " << (first >= 0 ? got[size_t(first)] : 0.f)
                    << " want " << (first >= 0 ? want[size_t(first)] : 0.0);
}

std::vector<GroupCase> group_cases() {
  std::vector<GroupCase> cases;
  uint64_t seed = 10;
  for (bool transpose : {false, true})
    for (DType wt : {DType::kF32, DType::kBF16})
      for (DType act : {DType::kF32, DType::kBF16})
        for (int64_t rows : {1, 7, 19}) {
          GroupCase c;
          c.transpose = transpose;
          c.weight_dtype = wt;
          c.act = act;
          c.rows = rows;
          c.seed = ++seed;
          cases.push_back(c);
        }
  // DeepSeek-V3-like blocks (W_UK / W_UV of 16 heads), a single group, an empty step.
  for (bool transpose : {false, true}) {
    GroupCase c;
    c.rows = 4;
    c.groups = 16;
    c.in = 512;
    c.block_rows = transpose ? 128 : 128;
    c.group_rows = 256;
    c.offset = transpose ? 0 : 128;
    c.transpose = transpose;
    c.weight_dtype = c.act = DType::kBF16;
    c.seed = ++seed;
    cases.push_back(c);
  }
  GroupCase one;
  one.groups = 1;
  one.group_rows = one.block_rows = 11;
  one.offset = 0;
  one.seed = ++seed;
  cases.push_back(one);
  GroupCase empty;
  empty.rows = 0;
  cases.push_back(empty);
  return cases;
}

TEST(LinearPerGroup, HostMatchesFloat64Reference) {
  for (const GroupCase& c : group_cases()) {
    SCOPED_TRACE(c.str());
    const GroupInputs g = make_inputs(c);
    Tensor y = linear_per_group(Tensor::from_floats(g.x, {c.rows, c.groups * c.a()}), g.host, c.transpose, c.act);
    ASSERT_EQ(y.shape(), (Shape{c.rows, c.groups * c.b()}));
    std::vector<double> want, bound;
    reference(c, g, want, bound);
    expect_within(y.to_float_vector(), want, bound, c.str());
    // Results are values of act.
    for (float v : y.to_float_vector()) ASSERT_EQ(v, Tensor::from_floats({v}, {1}, c.act).to_float_vector()[0]);
  }
}

TEST(LinearPerGroup, CudaMatchesHost) {
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  for (const GroupCase& c : group_cases()) {
    SCOPED_TRACE(c.str());
    const GroupInputs g = make_inputs(c);
    GroupedWeight dw = g.host;
    dw.weight = g.host.weight.to(dev);
    Tensor dx = Tensor::from_floats(g.x, {c.rows, c.groups * c.a()}, c.act).to(dev);
    Tensor y = linear_per_group(dx, dw, c.transpose, c.act);
    ASSERT_EQ(y.dtype(), c.act);
    ASSERT_EQ(y.shape(), (Shape{c.rows, c.groups * c.b()}));
    std::vector<double> want, bound;
    reference(c, g, want, bound);
    // The device accumulates in another order: both sides are within the float64 bound.
    expect_within(y.to(Device::cpu()).to_float_vector(), want, bound, c.str() + " (CUDA)");
  }
}

// A step whose device mirror exists when `dev` is a GPU.
Step make_step(int64_t batch, int64_t tokens, int64_t past, Device dev) {
  Step s(batch, tokens, past);
  s.ids.assign(size_t(batch * tokens), 0);
  make_device_step(s, dev);
  return s;
}

// kv_append without values, kv_columns of the grown cache, on the host and (when present) CUDA.
TEST(KvCache, KeysOnlyAppendAndColumns) {
  std::vector<Device> devices = {Device::cpu()};
  if (moex::test::cuda_devices() > 0) devices.push_back(Device::cuda(0));
  for (Device dev : devices) {
    SCOPED_TRACE(dev.str());
    std::mt19937_64 rng(3);
    const int64_t B = 2, W = 24;
    LayerKV kv;
    kv.capacity_hint = 4;
    std::vector<std::vector<float>> cols(static_cast<size_t>(B));  // per sequence, appended rows
    int64_t past = 0;
    for (int64_t T : {3, 1, 5}) {  // the third append grows the capacity
      const auto k = random_values(B * T * W, DType::kBF16, rng);
      Step s = make_step(B, T, past, dev);
      const DType st = dev.is_cuda() ? DType::kBF16 : DType::kF32;
      kv_append(kv, Tensor::from_floats(k, {B * T, W}, st).to(dev), Tensor(), s);
      for (int64_t b = 0; b < B; ++b)
        cols[size_t(b)].insert(cols[size_t(b)].end(), k.begin() + b * T * W, k.begin() + (b + 1) * T * W);
      past += T;
    }
    EXPECT_FALSE(kv.v.defined());
    EXPECT_EQ(kv.length(), 9);
    EXPECT_GE(kv.capacity(), 9);
    for (int64_t n : {1, 9}) {
      const auto got = kv_columns(kv.k, n).to(Device::cpu()).to_float_vector();
      ASSERT_EQ(int64_t(got.size()), B * n * W);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < n * W; ++i)
          ASSERT_EQ(got[size_t(b * n * W + i)], cols[size_t(b)][size_t(i)]) << "sequence " << b << " n " << n;
    }
  }
}

// v_from_k on the host is the attention over an explicit V holding the first dv columns of each kv
// head's key: the same arithmetic, so bit for bit equal.
TEST(AttentionValuesFromKeys, HostEqualsExplicitValues) {
  std::mt19937_64 rng(5);
  for (bool eager : {false, true})
    for (int64_t kv_heads : {1, 2}) {
      const int64_t heads = 4, dk = 40, dv = 24, B = 2;
      AttentionSpec spec;
      spec.heads = heads;
      spec.kv_heads = kv_heads;
      spec.head_dim_k = dk;
      spec.head_dim_v = dv;
      spec.scale = 0.2f;
      spec.eager_rounding = eager;
      LayerKV from_k, explicit_v;
      int64_t past = 0;
      for (int64_t T : {6, 1, 2}) {
        Step s(B, T, past);
        s.pad = {0, 2};
        const auto k = random_values(B * T * kv_heads * dk, DType::kBF16, rng);
        Tensor kt = Tensor::from_floats(k, {B * T, kv_heads * dk});
        kv_append(from_k, kt, Tensor(), s);
        kv_append(explicit_v, kt, slice_columns(kt, kv_heads, 0, dv), s);
        Tensor q = Tensor::from_floats(random_values(B * T * heads * dk, DType::kBF16, rng, 2.0f), {B * T, heads * dk});
        AttentionSpec vk = spec;
        vk.v_from_k = true;
        const auto got = attention(q, from_k, s, vk, DType::kBF16).to_float_vector();
        const auto want = attention(q, explicit_v, s, spec, DType::kBF16).to_float_vector();
        EXPECT_EQ(got, want) << "eager " << eager << " kv_heads " << kv_heads << " past " << past;
        past += T;
      }
    }
}

}  // namespace
}  // namespace moex::ops
