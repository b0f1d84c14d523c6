// The CUDA KV cache and attention (src/ops/cuda/attention*.{cu,cuh,hpp}, kv_cache.cu) against the
// host op (unpadded batches) and against a float64 reference computed here (left-padded batches;
// the host op's padding semantics are not assumed). Every case runs a prompt and then several
// decode steps over one growing cache, and, in CUDA builds, both kernels on the same inputs: the
// plan's choice, the split-KV SIMT kernel and (where it applies) the tensor-core flash kernel.
// Cases with values read from the keys (AttentionSpec::v_from_k) append no V.
//
// Tolerances, per element |got - ref| <= r * |ref| + a and over the whole output rel_l2 <= e:
// - float32: r = 1e-5, a = 2e-6, e = 1e-5 (float32 accumulation in another order, expf).
// - bf16 (unit roundoff u = 2^-8): r = 2u, one output ulp (the two sides may round a value near a
//   tie to neighbouring bf16 numbers); a = u: the unnormalised (sdpa) or normalised (eager) p is
//   rounded to bf16 by both sides, relative to different maxima (running vs final), so each p
//   differs by at most u * p, and sum_j u * p_j |v_j| / l <= u * max|v| with |v| <= 1; e = u.
//   A single key wrongly masked or unmasked in a 1000-column row moves the output by ~1/sqrt(n)
//   relative, far beyond e.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "moex/dtype.hpp"
#include "moex/error.hpp"
#include "moex/tensor.hpp"
#include "ops/ops.hpp"
#include "support/test_support.hpp"
#if MOEX_WITH_CUDA
#include "ops/cuda/attention_cudnn.hpp"
#include "ops/cuda/attention_plan.hpp"
#endif

namespace moex::ops {
namespace {

// kFlash: the flash kernel with every block shape that fits the head dims (run_device's `block`);
// kSplit / kVec: the SIMT / vector split kernels, on prompts too (with several splits).
enum class Kernel { kPlanned, kSplit, kVec, kFlash, kCudnn };
const char* kernel_name(Kernel k) {
  return k == Kernel::kPlanned ? "planned" : k == Kernel::kSplit ? "split" : k == Kernel::kVec ? "vector split"
         : k == Kernel::kFlash ? "flash" : "cuDNN";
}

struct Case {
  DType dtype = DType::kBF16;
  int64_t dk = 64, dv = 64, heads = 4, kv_heads = 2, batch = 1;
  std::vector<int64_t> steps = {17, 1, 1, 5};  // tokens per forward: the prompt, then decode steps
  int64_t capacity_hint = 0;
  int64_t window = 0;
  bool sinks = false, eager = false;
  bool v_from_k = false;  // no V cache: values are the first dv columns of each kv head's key
  std::vector<int64_t> pad;  // left padding per sequence (compared with the float64 reference)
  uint64_t seed = 1;
  std::string str() const {
    std::ostringstream s;
    s << dtype_name(dtype) << " dk " << dk << " dv " << dv << " heads " << heads << "/" << kv_heads << " batch "
      << batch << " window " << window << (sinks ? " sinks" : "") << (eager ? " eager" : "") << (v_from_k ? " v_from_k" : "") << " seed " << seed
      << " steps";
    for (int64_t t : steps) s << " " << t;
    if (!pad.empty()) {
      s << " pad";
      for (int64_t p : pad) s << " " << p;
    }
    return s.str();
  }
};

// n values ~ U(-scale, scale) rounded to dtype (held as float).
std::vector<float> random_values(int64_t n, float scale, DType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return Tensor::from_floats(v, {n}, dtype).to_float_vector();
}

Tensor host_tensor(const std::vector<float>& v, Shape s) { return Tensor::from_floats(v, std::move(s)); }
Tensor device_tensor(const std::vector<float>& v, Shape s, DType dtype) {
  return Tensor::from_floats(v, std::move(s), dtype).to(Device::cuda(0));
}

// Float64 attention over the host cache with the padding semantics of ops.hpp: query row
// b * T + t at column c = past + t sees keys pad[b] <= j <= c (and c - j < window); none -> 0.
std::vector<double> reference_f64(const std::vector<float>& q, const LayerKV& kv, const Step& step,
                                  const AttentionSpec& spec, const std::vector<float>& sinks) {
  const int64_t cap = kv.capacity(), kd = kv.k.size(2), group = spec.heads / spec.kv_heads;
  const int64_t vd = spec.v_from_k ? kd : kv.v.size(2), vh = spec.v_from_k ? spec.head_dim_k : spec.head_dim_v;
  const float* K = kv.k.data<float>();
  const float* V = spec.v_from_k ? K : kv.v.data<float>();
  std::vector<double> out(size_t(step.rows() * spec.heads * spec.head_dim_v), 0.0);
  for (int64_t r = 0; r < step.rows(); ++r)
    for (int64_t h = 0; h < spec.heads; ++h) {
      const int64_t b = r / step.tokens, c = step.column(r), g = h / group;
      int64_t lo = step.pad_of(b);
      if (spec.sliding_window > 0) lo = std::max(lo, c - spec.sliding_window + 1);
      if (lo > c) continue;
      std::vector<double> s(size_t(c + 1 - lo));
      double mx = sinks.empty() ? -INFINITY : double(sinks[size_t(h)]);
      for (int64_t j = lo; j <= c; ++j) {
        double d = 0;
        for (int64_t i = 0; i < spec.head_dim_k; ++i)
          d += double(q[size_t((r * spec.heads + h) * spec.head_dim_k + i)]) *
               double(K[(b * cap + j) * kd + g * spec.head_dim_k + i]);
        s[size_t(j - lo)] = d * double(spec.scale);
        mx = std::max(mx, s[size_t(j - lo)]);
      }
      double denom = sinks.empty() ? 0.0 : std::exp(double(sinks[size_t(h)]) - mx);
      for (auto& x : s) denom += (x = std::exp(x - mx));
      for (int64_t i = 0; i < spec.head_dim_v; ++i) {
        double a = 0;
        for (int64_t j = lo; j <= c; ++j) a += s[size_t(j - lo)] * double(V[(b * cap + j) * vd + g * vh + i]);
        out[size_t((r * spec.heads + h) * spec.head_dim_v + i)] = a / denom;
      }
    }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, DType dtype, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const bool f32 = dtype == DType::kF32;
  const double u = dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
  const double r = f32 ? 1e-5 : 2 * u, a = f32 ? 2e-6 : u, e = f32 ? 1e-5 : u;
  double num = 0, den = 0;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    if (!(std::fabs(d) <= r * std::fabs(ref[i]) + a)) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of tolerance; first at " << first << ": got "
                    << (first >= 0 ? got[size_t(first)] : 0.f) << " want " << (first >= 0 ? ref[size_t(first)] : 0.0);
  EXPECT_LE(rel, e) << what << ": rel_l2 " << rel;
}

// A step and its device mirror (ids are not read by these ops; zeros fill the mirror's id part).
Step make_step(int64_t batch, int64_t tokens, int64_t past, const std::vector<int64_t>& pad = {}) {
  Step s(batch, tokens, past);
  s.pad = pad;
  s.ids.assign(size_t(batch * tokens), 0);
  return s;
}

// The op on the device with the plan's kernel, or with one forced (CUDA builds); empty when the
// forced kernel does not apply.
bool run_device(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act,
                Kernel kernel, int block, Tensor& out) {
#if MOEX_WITH_CUDA
  if (kernel != Kernel::kPlanned) {
    const cuda::AttentionShape shape = cuda::attention_shape_of(q, kv, step, spec, act);
    cuda::AttentionPlan plan = cuda::plan_attention(shape);
    if (kernel == Kernel::kCudnn) {
      if (!cuda::cudnn_applies(shape)) return false;
      plan.kernel = cuda::AttentionKernel::kCudnn;
    } else if (kernel == Kernel::kFlash) {
      const cuda::FlashBlock b = cuda::kFlashBlocks[block];
      if (!cuda::flash_mma_applies(shape) || !cuda::flash_block_fits(b, shape.head_dim_k, shape.head_dim_v))
        return false;
      plan.kernel = cuda::AttentionKernel::kFlashMma;
      plan.flash_block = b;
    } else {
      const auto want = kernel == Kernel::kVec ? cuda::AttentionKernel::kSplitVec : cuda::AttentionKernel::kSplitSimt;
      if (want == cuda::AttentionKernel::kSplitVec && !cuda::split_vec_applies(shape)) return false;
      // Prefill on a split kernel: several splits, one of them often empty.
      if (plan.kernel == cuda::AttentionKernel::kFlashMma) plan.splits = 3;
      plan.kernel = want;
    }
    out = cuda::attention_planned(q, kv, step, spec, act, plan);
    return true;
  }
#else
  (void)block;
  if (kernel != Kernel::kPlanned) return false;
#endif
  out = attention(q, kv, step, spec, act);
  return true;
}

// Prompt and decode steps on the host op (or the float64 reference when padded) and on the
// device, all kernels, compared after every step.
void check_case(const Case& c) {
  SCOPED_TRACE(c.str());
  std::mt19937_64 rng(c.seed);
  const DType act = c.dtype;
  AttentionSpec hspec;
  hspec.heads = c.heads;
  hspec.kv_heads = c.kv_heads;
  hspec.head_dim_k = c.dk;
  hspec.head_dim_v = c.dv;
  hspec.scale = float(1.0 / std::sqrt(double(c.dk)));
  hspec.sliding_window = c.window;
  hspec.eager_rounding = c.eager;
  hspec.v_from_k = c.v_from_k;
  std::vector<float> sinks;
  if (c.sinks) sinks = random_values(c.heads, 2.0f, DType::kF32, rng);
  AttentionSpec dspec = hspec;
  if (c.sinks) {
    hspec.sinks = host_tensor(sinks, {c.heads});
    dspec.sinks = hspec.sinks.to(Device::cuda(0));
  }
  LayerKV hkv, dkv;
  hkv.capacity_hint = dkv.capacity_hint = c.capacity_hint;
  int64_t past = 0;
  for (size_t si = 0; si < c.steps.size(); ++si) {
    const int64_t T = c.steps[si], rows = c.batch * T;
    const Step hs = make_step(c.batch, T, past, c.pad);
    Step ds = hs;
    make_device_step(ds, Device::cuda(0));
    // q ~ U(-2, 2) so that softmax rows are not nearly uniform (masks matter).
    const auto q = random_values(rows * c.heads * c.dk, 2.0f, c.dtype, rng);
    const auto k = random_values(rows * c.kv_heads * c.dk, 1.0f, c.dtype, rng);
    if (c.v_from_k) {
      kv_append(hkv, host_tensor(k, {rows, c.kv_heads * c.dk}), Tensor(), hs);
      kv_append(dkv, device_tensor(k, {rows, c.kv_heads * c.dk}, c.dtype), Tensor(), ds);
      ASSERT_FALSE(hkv.v.defined());
      ASSERT_FALSE(dkv.v.defined());
    } else {
      const auto v = random_values(rows * c.kv_heads * c.dv, 1.0f, c.dtype, rng);
      kv_append(hkv, host_tensor(k, {rows, c.kv_heads * c.dk}), host_tensor(v, {rows, c.kv_heads * c.dv}), hs);
      kv_append(dkv, device_tensor(k, {rows, c.kv_heads * c.dk}, c.dtype),
                device_tensor(v, {rows, c.kv_heads * c.dv}, c.dtype), ds);
    }
    ASSERT_EQ(dkv.length(), past + T);
    std::vector<double> ref;
    if (c.pad.empty()) {
      const auto h = attention(host_tensor(q, {rows, c.heads * c.dk}), hkv, hs, hspec, act).to_float_vector();
      ref.assign(h.begin(), h.end());
    } else {
      ref = reference_f64(q, hkv, hs, hspec, sinks);
    }
    const Tensor dq = device_tensor(q, {rows, c.heads * c.dk}, c.dtype);
#if MOEX_WITH_CUDA
    const int blocks = int(std::size(cuda::kFlashBlocks));
#else
    const int blocks = 1;
#endif
    for (Kernel kernel : {Kernel::kPlanned, Kernel::kSplit, Kernel::kVec, Kernel::kFlash, Kernel::kCudnn})
     for (int block = 0; block < (kernel == Kernel::kFlash ? blocks : 1); ++block) {
      Tensor out;
      if (!run_device(dq, dkv, ds, dspec, act, kernel, block, out)) continue;
      ASSERT_EQ(out.dtype(), act);
      ASSERT_EQ(out.size(0), rows);
      ASSERT_EQ(out.size(1), c.heads * c.dv);
      expect_close(out.to_float_vector(), ref, c.dtype,
                   std::string("step ") + std::to_string(si) + " (T " + std::to_string(T) + ", past " +
                       std::to_string(past) + "), kernel " + kernel_name(kernel) + " " + std::to_string(block));
    }
    past += T;
  }
}

#define MOEX_REQUIRE_CUDA() \
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device"

TEST(CudaAttention, MatchesHostAcrossHeadDimsAndGqa) {
  MOEX_REQUIRE_CUDA();
  const int64_t dims[][2] = {{32, 32}, {48, 32}, {64, 64}, {128, 128}, {192, 128}};
  const int64_t ratios[] = {1, 2, 4, 8};  // queries per vector-split block 1, 2, 4, 8 (and 2 blocks)
  uint64_t seed = 100;
  for (DType dt : {DType::kBF16, DType::kF32})
    for (int i = 0; i < 5; ++i)
      for (int64_t ratio : ratios) {
        Case c;
        c.dtype = dt;
        c.dk = dims[i][0];
        c.dv = dims[i][1];
        c.heads = 8;
        c.kv_heads = 8 / ratio;
        c.batch = 2;
        c.steps = {17, 1, 1, 5, 1};  // no capacity hint: the cache grows during decode
        c.seed = ++seed;
        check_case(c);
      }
}

#if MOEX_WITH_CUDA
// cuDNN's fused attention (where libcudnn loads): every case above also runs it forced (built on
// the builder thread: the first calls of a shape run the flash kernel); here with graphs built at
// the first call, so that every forced call must run on cuDNN: a prompt it plans, a prompt after a
// cache (bottom-right causal), a decode step, GQA, both half dtypes, head dims 64, 128 and 192 / 128, counted
// so that a silent fallback to the own kernel fails.
TEST(CudaAttention, CudnnPromptsRunOnCudnn) {
  MOEX_REQUIRE_CUDA();
  if (!cuda::cudnn_attention_available()) GTEST_SKIP() << cuda::cudnn_attention_status();
  cuda::cudnn_attention_synchronous_builds(true);
  uint64_t seed = 900;
  const int64_t dims[][2] = {{64, 64}, {128, 128}, {192, 128}};  // the last: DeepSeek's expanded MLA prompt
  for (DType dt : {DType::kBF16, DType::kF16})
    for (const auto& dd : dims) {
      Case c;
      c.dtype = dt;
      c.dk = dd[0];
      c.dv = dd[1];
      c.heads = 8;
      c.kv_heads = 2;
      c.batch = 2;
      c.steps = {cuda::kCudnnMinTokens + 3, 40, 1};
      c.seed = ++seed;
      const int64_t before = cuda::cudnn_attention_calls();
      check_case(c);
      // Planned for the first prompt, forced on all three steps.
      EXPECT_EQ(cuda::cudnn_attention_calls() - before, 4) << dtype_name(dt) << " dk " << c.dk << " dv " << c.dv;
    }
  cuda::cudnn_attention_synchronous_builds(false);
}

// The builder thread: a new shape's first call runs the flash kernel (same result), and once its
// graph is built the same call runs on cuDNN.
TEST(CudaAttention, CudnnGraphBuiltBesideTheCalls) {
  MOEX_REQUIRE_CUDA();
  if (!cuda::cudnn_attention_available()) GTEST_SKIP() << cuda::cudnn_attention_status();
  std::mt19937_64 rng(77);
  const int64_t T = cuda::kCudnnMinTokens + 11, H = 4, D = 64;
  AttentionSpec spec;
  spec.heads = spec.kv_heads = H;
  spec.head_dim_k = spec.head_dim_v = D;
  spec.scale = 0.125f;
  LayerKV kv;
  Step step = make_step(1, T, 0);
  make_device_step(step, Device::cuda(0));
  kv_append(kv, device_tensor(random_values(T * H * D, 1.0f, DType::kBF16, rng), {T, H * D}, DType::kBF16),
            device_tensor(random_values(T * H * D, 1.0f, DType::kBF16, rng), {T, H * D}, DType::kBF16), step);
  const Tensor q = device_tensor(random_values(T * H * D, 2.0f, DType::kBF16, rng), {T, H * D}, DType::kBF16);
  ASSERT_EQ(cuda::plan_attention(cuda::attention_shape_of(q, kv, step, spec, DType::kBF16)).kernel,
            cuda::AttentionKernel::kCudnn);
  const int64_t before = cuda::cudnn_attention_calls();
  const auto first = attention(q, kv, step, spec, DType::kBF16).to_float_vector();
  EXPECT_EQ(cuda::cudnn_attention_calls(), before) << "a new shape's first call waited for its graph";
  std::vector<float> later;
  for (int i = 0; i < 2000 && cuda::cudnn_attention_calls() == before; ++i) {
    later = attention(q, kv, step, spec, DType::kBF16).to_float_vector();
    if (cuda::cudnn_attention_calls() == before) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(cuda::cudnn_attention_calls(), before + 1) << "the graph was not built within 10 s";
  std::vector<double> ref(first.begin(), first.end());
  expect_close(later, ref, DType::kBF16, "cuDNN against the flash kernel");
}
#endif

TEST(CudaAttention, PromptLengths) {
  MOEX_REQUIRE_CUDA();
  uint64_t seed = 200;
  for (DType dt : {DType::kBF16, DType::kF32})
    for (int64_t T : {1, 3, 17, 300}) {
      Case c;
      c.dtype = dt;
      c.heads = 4;
      c.kv_heads = 2;
      c.steps = {T, 1, 1, 3, 1};
      c.capacity_hint = T + 16;
      c.seed = ++seed;
      check_case(c);
    }
}

TEST(CudaAttention, LongPromptThenDecodeOverSeveralSplits) {
  MOEX_REQUIRE_CUDA();
  uint64_t seed = 300;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    Case c;
    c.dtype = dt;
    c.dk = c.dv = 128;
    c.heads = 8;
    c.kv_heads = 1;
    c.steps = {1100, 1, 1, 16, 1};
    c.capacity_hint = 4096;
    c.seed = ++seed;
    check_case(c);
  }
#if MOEX_WITH_CUDA
  cuda::AttentionShape s;
  s.cache = s.act = DType::kBF16;
  s.heads = 8;
  s.kv_heads = 1;
  s.head_dim_k = s.head_dim_v = 128;
  s.tokens = 1;
  s.capacity = 4096;
  EXPECT_GT(cuda::plan_attention(s).splits, 1);
#endif
}

TEST(CudaAttention, SlidingWindow) {
  MOEX_REQUIRE_CUDA();
  uint64_t seed = 400;
  for (DType dt : {DType::kBF16, DType::kF32})
    for (int64_t w : {1, 7, 128}) {
      Case c;
      c.dtype = dt;
      c.heads = 8;
      c.kv_heads = 1;
      c.window = w;
      c.steps = {300, 1, 1, 4, 1};
      c.seed = ++seed;
      check_case(c);
    }
}

TEST(CudaAttention, SinksAndEagerRounding) {
  MOEX_REQUIRE_CUDA();
  uint64_t seed = 500;
  struct Mode {
    bool sinks, eager;
    int64_t window;
  };
  for (DType dt : {DType::kBF16, DType::kF32})
    for (Mode m : {Mode{true, true, 0}, Mode{true, false, 0}, Mode{false, true, 0}, Mode{true, true, 128}})
      for (int64_t T : {17, 300}) {
        Case c;
        c.dtype = dt;
        c.heads = 8;
        c.kv_heads = 1;
        c.sinks = m.sinks;
        c.eager = m.eager;
        c.window = m.window;
        c.steps = {T, 1, 1, 3};
        c.capacity_hint = 1024;
        c.seed = ++seed;
        check_case(c);
      }
}

// Values read from the cached keys (AttentionSpec::v_from_k, no V cache). DeepSeek-V3's absorbed
// MLA: one kv head of [latent 512; rope 64] for 16 query heads, the split kernel's largest shared
// memory use; then GQA shapes where the flash kernel also runs, eager rounding, left padding.
TEST(CudaAttention, ValuesFromKeysIncludingMlaAbsorbedShape) {
  MOEX_REQUIRE_CUDA();
  uint64_t seed = 900;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    Case c;
    c.dtype = dt;
    c.dk = 576;
    c.dv = 512;
    c.heads = 16;
    c.kv_heads = 1;
    c.batch = 2;
    c.v_from_k = true;
    c.steps = {300, 1, 1, 4, 1};  // no capacity hint: the cache (k only) grows during decode
    c.seed = ++seed;
    check_case(c);
    c.pad = {0, 37};
    c.steps = {45, 1, 16};
    c.seed = ++seed;
    check_case(c);
  }
  for (DType dt : {DType::kBF16, DType::kF32})
    for (bool eager : {false, true}) {
      Case c;
      c.dtype = dt;
      c.dk = 192;
      c.dv = 128;
      c.heads = 8;
      c.kv_heads = 2;
      c.batch = 2;
      c.v_from_k = true;
      c.eager = eager;
      c.steps = {40, 1, 3};
      c.seed = ++seed;
      check_case(c);
    }
}

TEST(CudaAttention, PaddedBatchMatchesFloat64Reference) {
  MOEX_REQUIRE_CUDA();
  uint64_t seed = 600;
  struct Mode {
    int64_t dk, dv, window;
    bool sinks;
  };
  for (DType dt : {DType::kBF16, DType::kF32})
    for (Mode m : {Mode{64, 64, 0, false}, Mode{48, 32, 0, false}, Mode{64, 64, 16, false}, Mode{64, 64, 0, true}}) {
      Case c;
      c.dtype = dt;
      c.dk = m.dk;
      c.dv = m.dv;
      c.heads = 4;
      c.kv_heads = 2;
      c.batch = 3;
      c.pad = {0, 17, 40};  // the last sequence's prompt is all padding: its rows output zeros
      c.window = m.window;
      c.sinks = m.sinks;
      c.steps = {40, 1, 1, 4, 1};
      c.seed = ++seed;
      check_case(c);
    }
}

TEST(CudaAttention, KvAppendGrowthKeepsValues) {
  MOEX_REQUIRE_CUDA();
  for (DType dt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::mt19937_64 rng(700);
    const int64_t B = 2, kd = 24, vd = 10;  // v rows of 20 / 40 bytes: the element-wise copy
    LayerKV kv;
    kv.capacity_hint = 4;
    std::vector<std::vector<float>> kcols(B), vcols(B);  // per sequence, column-major appends
    int64_t past = 0;
    for (int64_t T : {3, 3, 5, 1, 9}) {
      Step s = make_step(B, T, past);
      make_device_step(s, Device::cuda(0));
      const auto k = random_values(B * T * kd, 1.0f, dt, rng), v = random_values(B * T * vd, 1.0f, dt, rng);
      kv_append(kv, device_tensor(k, {B * T, kd}, dt), device_tensor(v, {B * T, vd}, dt), s);
      for (int64_t b = 0; b < B; ++b) {
        kcols[size_t(b)].insert(kcols[size_t(b)].end(), k.begin() + b * T * kd, k.begin() + (b + 1) * T * kd);
        vcols[size_t(b)].insert(vcols[size_t(b)].end(), v.begin() + b * T * vd, v.begin() + (b + 1) * T * vd);
      }
      past += T;
      ASSERT_EQ(kv.length(), past);
      ASSERT_GE(kv.capacity(), past);
      ASSERT_EQ(kv.k.dtype(), dt);
      ASSERT_TRUE(kv.k.device().is_cuda());
      const auto K = kv.k.to_float_vector(), V = kv.v.to_float_vector();
      const int64_t cap = kv.capacity();
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < past * kd; ++i)
          ASSERT_EQ(K[size_t(b * cap * kd + i)], kcols[size_t(b)][size_t(i)]) << "k b " << b << " i " << i;
        for (int64_t i = 0; i < past * vd; ++i)
          ASSERT_EQ(V[size_t(b * cap * vd + i)], vcols[size_t(b)][size_t(i)]) << "v b " << b << " i " << i;
      }
    }
    EXPECT_EQ(kv.capacity(), 32);  // 4 -> 8 -> 16 -> 32 (21 columns)
  }
}

TEST(CudaAttention, ZeroTokenStep) {
  MOEX_REQUIRE_CUDA();
  Case c;
  LayerKV kv;
  std::mt19937_64 rng(800);
  Step s = make_step(1, 5, 0);
  make_device_step(s, Device::cuda(0));
  kv_append(kv, device_tensor(random_values(5 * 128, 1.f, c.dtype, rng), {5, 128}, c.dtype),
            device_tensor(random_values(5 * 128, 1.f, c.dtype, rng), {5, 128}, c.dtype), s);
  Step z = make_step(1, 0, 5);
  make_device_step(z, Device::cuda(0));
  kv_append(kv, Tensor::empty({0, 128}, c.dtype, Device::cuda(0)), Tensor::empty({0, 128}, c.dtype, Device::cuda(0)), z);
  EXPECT_EQ(kv.length(), 5);
  AttentionSpec spec;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim_k = spec.head_dim_v = 64;
  spec.scale = 0.125f;
  const Tensor out = attention(Tensor::empty({0, 256}, c.dtype, Device::cuda(0)), kv, z, spec, c.dtype);
  EXPECT_EQ(out.size(0), 0);
  EXPECT_EQ(out.size(1), 256);
}

#if MOEX_WITH_CUDA
// The plan rules: pure functions of the shapes, no GPU needed.
TEST(CudaAttentionPlan, Rules) {
  cuda::AttentionShape s;
  s.cache = s.act = DType::kBF16;
  s.heads = 32;
  s.kv_heads = 4;
  s.head_dim_k = s.head_dim_v = 128;
  s.tokens = 512;
  s.capacity = 4096;
  EXPECT_EQ(cuda::plan_attention(s).kernel, cuda::AttentionKernel::kFlashMma);
  // MLA and the tiny models' dims.
  s.head_dim_k = 192;
  EXPECT_EQ(cuda::plan_attention(s).kernel, cuda::AttentionKernel::kFlashMma);
  s.head_dim_k = 48;
  s.head_dim_v = 32;
  EXPECT_EQ(cuda::plan_attention(s).kernel, cuda::AttentionKernel::kFlashMma);
  // Not on the tensor cores: float32, eager rounding, dims not multiples of 16, above 256, act != cache.
  for (auto mutate : {+[](cuda::AttentionShape& x) { x.cache = x.act = DType::kF32; },
                      +[](cuda::AttentionShape& x) { x.eager = true; },
                      +[](cuda::AttentionShape& x) { x.head_dim_k = 40; },
                      +[](cuda::AttentionShape& x) { x.head_dim_v = 320; },
                      +[](cuda::AttentionShape& x) { x.act = DType::kF32; },
                      +[](cuda::AttentionShape& x) { x.aligned16 = false; }}) {
    cuda::AttentionShape x = s;
    mutate(x);
    EXPECT_EQ(cuda::plan_attention(x).kernel, cuda::AttentionKernel::kSplitSimt);
    EXPECT_THROW(cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kFlashMma, 1}, x), InvalidInput);
  }
  // Decode: split kernel, splits from the capacity (never the length) and the grid's size.
  s.head_dim_k = s.head_dim_v = 128;
  s.tokens = 1;
  s.batch = 1;
  EXPECT_EQ(cuda::plan_attention(s).kernel, cuda::AttentionKernel::kSplitVec);
  // The vector kernel: bf16 / f16 sdpa, separate K and V, head dims both 64 or both 128.
  for (auto mutate : {+[](cuda::AttentionShape& x) { x.cache = x.act = DType::kF32; },
                      +[](cuda::AttentionShape& x) { x.eager = true; },
                      +[](cuda::AttentionShape& x) { x.v_from_k = true; },
                      +[](cuda::AttentionShape& x) { x.head_dim_v = 64; },
                      +[](cuda::AttentionShape& x) { x.head_dim_k = x.head_dim_v = 96; },
                      +[](cuda::AttentionShape& x) { x.head_dim_k = x.head_dim_v = 256; },
                      +[](cuda::AttentionShape& x) { x.act = DType::kF32; },
                      +[](cuda::AttentionShape& x) { x.aligned16 = false; }}) {
    cuda::AttentionShape x = s;
    mutate(x);
    EXPECT_EQ(cuda::plan_attention(x).kernel, cuda::AttentionKernel::kSplitSimt);
    EXPECT_THROW(cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kSplitVec, 4}, x), InvalidInput);
  }
  EXPECT_EQ(cuda::split_vec_queries(1), 1);
  EXPECT_EQ(cuda::split_vec_queries(3), 4);
  EXPECT_EQ(cuda::split_vec_queries(8), 8);
  EXPECT_EQ(cuda::split_vec_queries(128), 8);
  EXPECT_EQ(cuda::plan_attention(s).splits, 64);  // 2 x 132 SMs / 4 blocks = 66, capped at 64
  s.capacity = 100000;
  EXPECT_EQ(cuda::plan_attention(s).splits, 64);
  s.capacity = 1000;
  EXPECT_EQ(cuda::plan_attention(s).splits, 32);  // 1000 / 32 columns
  s.capacity = 100;
  EXPECT_EQ(cuda::plan_attention(s).splits, 4);
  s.capacity = 20;
  EXPECT_EQ(cuda::plan_attention(s).splits, 1);
  s.capacity = 4096;
  s.batch = 64;  // 256 blocks already fill the device
  EXPECT_EQ(cuda::plan_attention(s).splits, 2);
  s.tokens = 16;
  EXPECT_EQ(cuda::plan_attention(s).kernel, cuda::AttentionKernel::kSplitVec);
  s.tokens = 17;
  EXPECT_EQ(cuda::plan_attention(s).kernel, cuda::AttentionKernel::kFlashMma);
  EXPECT_EQ(cuda::plan_attention(s).flash_block, cuda::FlashBlock::k4x32n64);  // head dims 128
  cuda::AttentionShape narrow = s;
  narrow.head_dim_k = narrow.head_dim_v = 64;
  EXPECT_EQ(cuda::plan_attention(narrow).flash_block, cuda::FlashBlock::k8x16n64);
  EXPECT_EQ((cuda::AttentionPlan{cuda::AttentionKernel::kSplitSimt, 8}.describe()), "split-KV SIMT, 8 splits");
  EXPECT_EQ((cuda::AttentionPlan{cuda::AttentionKernel::kSplitVec, 1}.describe()), "split-KV vector, 1 split");
  EXPECT_EQ((cuda::AttentionPlan{cuda::AttentionKernel::kFlashMma, 1, cuda::FlashBlock::k4x32n64}.describe()),
            "flash mma.sync, 4 warps x 32 rows, 64-column tiles");
  // Blocks of 128 rows only where Q and two K / V stages fit: head dims up to 128.
  cuda::AttentionShape wide = s;
  wide.head_dim_k = 192;
  EXPECT_EQ(cuda::plan_attention(wide).flash_block, cuda::FlashBlock::k4x16n64);
  for (cuda::FlashBlock b : cuda::kFlashBlocks) {
    EXPECT_NO_THROW(cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kFlashMma, 1, b}, s));
    if (b != cuda::FlashBlock::k4x16n64)
      EXPECT_THROW(cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kFlashMma, 1, b}, wide),
                   InvalidInput);
  }
  EXPECT_THROW(
      cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kFlashMma, 1, cuda::FlashBlock(9)}, s),
      InvalidInput);
  EXPECT_THROW(cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kSplitSimt, 0}, s), InvalidInput);
}

TEST(CudaAttentionPlan, CudnnRules) {
  cuda::AttentionShape s;
  s.cache = s.act = DType::kBF16;
  s.heads = 32;
  s.kv_heads = 8;
  s.head_dim_k = s.head_dim_v = 128;
  s.tokens = cuda::kCudnnMinTokens;
  s.capacity = 8192;
  s.cudnn = true;
  EXPECT_EQ(cuda::plan_attention(s).kernel, cuda::AttentionKernel::kCudnn);
  EXPECT_EQ(cuda::plan_attention(s).describe(), "cuDNN flash");
  EXPECT_NO_THROW(cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kCudnn}, s));
  cuda::AttentionShape shorter = s;
  shorter.tokens = cuda::kCudnnMinTokens - 1;
  EXPECT_EQ(cuda::plan_attention(shorter).kernel, cuda::AttentionKernel::kFlashMma);
  cuda::AttentionShape mla = s;  // DeepSeek's expanded prompt heads
  mla.head_dim_k = 192;
  EXPECT_EQ(cuda::plan_attention(mla).kernel, cuda::AttentionKernel::kCudnn);
  // What cuDNN does not take: no library (or capturing), float32, eager rounding, sinks / windows /
  // left padding, values from keys, head dims above 256 or not multiples of 8, act != cache,
  // misalignment.
  for (auto mutate : {+[](cuda::AttentionShape& x) { x.cudnn = false; },
                      +[](cuda::AttentionShape& x) { x.cache = x.act = DType::kF32; },
                      +[](cuda::AttentionShape& x) { x.eager = true; },
                      +[](cuda::AttentionShape& x) { x.plain_causal = false; },
                      +[](cuda::AttentionShape& x) { x.v_from_k = true; },
                      +[](cuda::AttentionShape& x) { x.head_dim_k = 320; },
                      +[](cuda::AttentionShape& x) { x.head_dim_v = 36; },
                      +[](cuda::AttentionShape& x) { x.act = DType::kF32; },
                      +[](cuda::AttentionShape& x) { x.aligned16 = false; }}) {
    cuda::AttentionShape x = s;
    mutate(x);
    EXPECT_NE(cuda::plan_attention(x).kernel, cuda::AttentionKernel::kCudnn);
    EXPECT_THROW(cuda::check_attention_plan(cuda::AttentionPlan{cuda::AttentionKernel::kCudnn}, x), InvalidInput);
  }
}
#endif

}  // namespace
}  // namespace moex::ops
