// The ops tier (src/ops/ops.hpp) against float64 references on seeded random inputs with ugly
// sizes (rows 1, 7, 19; widths that are not multiples of 8): attention over the cache (GQA, k/v
// widths that differ, sliding window, sinks, incremental = full, bf16 eager rounding), the KV
// cache (preallocated, grown), RMSNorm (both roundings, whole row and per head), rope (both
// layouts, yarn limits), linear with bf16 weights, element-wise ops and their bf16 rounding, the
// column shuffles of MLA, the routers (torch.topk ties), token choice, the device dispatch, and
// the experts fusion at load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "model/layers.hpp"
#include "moex/checkpoint.hpp"
#include "moex/error.hpp"
#include "ops/ops.hpp"
#include "support/test_support.hpp"

namespace moex::ops {
namespace {

Tensor random_act(int64_t rows, int64_t dim, std::mt19937& rng, float scale = 1.0f, DType round = DType::kF32) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(size_t(rows * dim));
  for (auto& x : v) x = round == DType::kBF16 ? round_bf16(u(rng)) : u(rng);
  return Tensor::from_floats(v, {rows, dim});
}

Tensor f64(const std::vector<double>& v, Shape s) {
  Tensor t = Tensor::empty(s, DType::kF64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

// Rows [t0, t0 + n) of each of the B sequences of x [B * T, w] (sequence-major).
Tensor seq_rows(const Tensor& x, int64_t B, int64_t T, int64_t t0, int64_t n) {
  return x.view({B, T, x.size(1)}).slice(1, t0, t0 + n).contiguous().view({B * n, x.size(1)});
}

// ---- attention ----

// Causal attention of sequence-major rows in float64, every key of the sequence visible up to the
// query's own position (minus the window), sinks in the denominator.
Tensor attention_ref(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t T,
                     const AttentionSpec& s) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t qd = s.heads * s.head_dim_k, kd = s.kv_heads * s.head_dim_k, vd = s.kv_heads * s.head_dim_v;
  const auto Q = q.to_float_vector(), K = k.to_float_vector(), V = v.to_float_vector();
  std::vector<float> sinks;
  if (s.sinks.defined()) sinks = s.sinks.to_float_vector();
  std::vector<double> out(size_t(B * T * s.heads * s.head_dim_v), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t hk = h / group;
        std::vector<double> sc;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= t; ++j) {
          if (s.sliding_window > 0 && t - j >= s.sliding_window) continue;
          double d = 0;
          for (int64_t i = 0; i < s.head_dim_k; ++i)
            d += double(Q[size_t((b * T + t) * qd + h * s.head_dim_k + i)]) *
                 K[size_t((b * T + j) * kd + hk * s.head_dim_k + i)];
          sc.push_back(d * s.scale);
          keys.push_back(j);
        }
        double mx = -INFINITY;
        for (double x : sc) mx = std::max(mx, x);
        if (!sinks.empty()) mx = std::max(mx, double(sinks[size_t(h)]));
        double den = sinks.empty() ? 0.0 : std::exp(double(sinks[size_t(h)]) - mx);
        for (double x : sc) den += std::exp(x - mx);
        for (size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(sc[n] - mx) / den;
          for (int64_t i = 0; i < s.head_dim_v; ++i)
            out[size_t((b * T + t) * s.heads * s.head_dim_v + h * s.head_dim_v + i)] +=
                w * V[size_t((b * T + keys[n]) * vd + hk * s.head_dim_v + i)];
        }
      }
  return f64(out, {B * T, s.heads * s.head_dim_v});
}

struct AttnCase {
  int64_t tokens = 0;  // T per sequence
  int64_t window = 0;
  bool sinks = false;
  int64_t prefill = 0;  // incremental run: prefill this many, then one token per step
};

std::string attn_case_str(const AttnCase& c) {
  return "T" + std::to_string(c.tokens) + "_window" + std::to_string(c.window) + (c.sinks ? "_sinks" : "") +
         "_prefill" + std::to_string(c.prefill);
}
std::string attn_case_name(const ::testing::TestParamInfo<AttnCase>& info) { return attn_case_str(info.param); }
// gtest prints a parameter into the test listing (and so into ctest's names); without this it
// dumps the struct's bytes, padding included, which are uninitialised.
void PrintTo(const AttnCase& c, std::ostream* os) { *os << attn_case_str(c); }

class Attention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Attention, FullAndIncrementalMatchFloat64) {
  const AttnCase c = GetParam();
  const uint64_t seed = 1234 + uint64_t(c.tokens) * 131 + uint64_t(c.window) * 7 + uint64_t(c.sinks);
  std::mt19937 rng{static_cast<unsigned>(seed)};
  const int64_t B = 2, T = c.tokens;
  AttentionSpec s;
  s.heads = 6;
  s.kv_heads = 2;
  s.head_dim_k = 13;  // widths that are not multiples of the 8-wide dot product
  s.head_dim_v = 11;
  s.scale = 1.0f / std::sqrt(13.0f);
  s.sliding_window = c.window;
  if (c.sinks) s.sinks = random_act(1, s.heads, rng, 2.0f).view({s.heads});
  Tensor q = random_act(B * T, s.heads * s.head_dim_k, rng, 2.0f);
  Tensor k = random_act(B * T, s.kv_heads * s.head_dim_k, rng, 2.0f);
  Tensor v = random_act(B * T, s.kv_heads * s.head_dim_v, rng);
  Tensor ref = attention_ref(q, k, v, B, T, s);

  LayerKV kv;
  kv_append(kv, k, v, Step{B, T, 0});
  Tensor full = attention(q, kv, Step{B, T, 0}, s, DType::kF32);
  EXPECT_LE(test::rel_l2_error(full, ref), 1e-6) << "seed " << seed;
  EXPECT_EQ(kv.length(), T);

  // Prefill, then one token per step into a cache sized up front: rows equal the full run's,
  // and the cache is never reallocated.
  LayerKV inc;
  inc.capacity_hint = T;
  const int64_t od = s.heads * s.head_dim_v;
  std::vector<float> got(size_t(B * T * od));
  const float* first_k = nullptr;
  for (int64_t t0 = 0; t0 < T;) {
    const int64_t n = t0 == 0 ? std::min(c.prefill, T) : 1;
    const Step step{B, n, t0};
    kv_append(inc, seq_rows(k, B, T, t0, n), seq_rows(v, B, T, t0, n), step);
    if (!first_k) first_k = inc.k.data<float>();
    EXPECT_EQ(inc.k.data<float>(), first_k) << "reallocated at position " << t0;
    Tensor o = attention(seq_rows(q, B, T, t0, n), inc, step, s, DType::kF32);
    const auto of = o.to_float_vector();
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(of.data() + b * n * od, n * od, got.data() + (b * T + t0) * od);
    t0 += n;
  }
  EXPECT_EQ(inc.capacity(), T);
  EXPECT_LE(test::rel_l2_error(Tensor::from_floats(got, {B * T, od}), ref), 1e-6) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Cases, Attention,
                         ::testing::Values(AttnCase{19, 0, false, 5}, AttnCase{19, 4, false, 5},
                                           AttnCase{19, 0, true, 5}, AttnCase{19, 7, true, 1},
                                           AttnCase{19, 1, false, 5}, AttnCase{1, 0, true, 1},
                                           AttnCase{7, 3, true, 7}, AttnCase{7, 0, false, 2}),
                         attn_case_name);

// transformers' eager bf16 attention rounds q.k, the scaled score, score - max, the sink and the
// normalised probabilities; torch's sdpa rounds only the unnormalised exp. One query, two keys,
// one head of width 1: every rounding point is visible in the result.
TEST(AttentionRounding, Bf16RoundsWhereEagerOrSdpaDoes) {
  AttentionSpec s;
  s.heads = s.kv_heads = 1;
  s.head_dim_k = s.head_dim_v = 1;
  s.scale = 0.3f;
  s.sinks = Tensor::from_floats({0.1234567f}, {1});
  const float qv = 1.01171875f;  // bf16 values
  const std::vector<float> kk = {1.3359375f, -0.70703125f}, vv = {1.0f, -2.0f};
  LayerKV kv;
  kv_append(kv, Tensor::from_floats(kk, {2, 1}), Tensor::from_floats(vv, {2, 1}), Step{1, 2, 0});
  Tensor q = Tensor::from_floats({qv, qv}, {2, 1});
  auto r = [](float x) { return round_bf16(x); };
  // Reference for the second query (sees both keys), written the way eager attention computes it.
  const float sink = r(0.1234567f);
  const float s0 = r(r(qv * kk[0]) * 0.3f), s1 = r(r(qv * kk[1]) * 0.3f);
  const float mx = std::max({s0, s1, sink});
  // Probabilities are float32 before the normalisation (the denominator is a double sum).
  const double e0 = float(std::exp(double(r(s0 - mx)))), e1 = float(std::exp(double(r(s1 - mx))));
  const double den = e0 + e1 + std::exp(double(r(sink - mx)));
  const float want = r(r(float(e0 / den)) * vv[0] + r(float(e1 / den)) * vv[1]);

  s.eager_rounding = true;
  EXPECT_EQ(attention(q, kv, Step{1, 2, 0}, s, DType::kBF16).to_float_vector()[1], want);
  // sdpa (torch's CPU flash kernel): float32 scores, the unnormalised exp rounded for the
  // product with v, the division by the float32 sum last.
  s.eager_rounding = false;
  const float t0 = qv * kk[0] * 0.3f, t1 = qv * kk[1] * 0.3f, tm = std::max({t0, t1, 0.1234567f});
  const float f0 = std::exp(t0 - tm), f1 = std::exp(t1 - tm);
  const double fden = double(f0) + double(f1) + std::exp(double(0.1234567f - tm));
  const float sdpa = r((r(f0) * vv[0] + r(f1) * vv[1]) / float(fden));
  ASSERT_NE(sdpa, want);
  EXPECT_EQ(attention(q, kv, Step{1, 2, 0}, s, DType::kBF16).to_float_vector()[1], sdpa);
  // float32 models: the flag changes nothing.
  s.eager_rounding = true;
  const auto a = attention(q, kv, Step{1, 2, 0}, s, DType::kF32).to_float_vector();
  s.eager_rounding = false;
  EXPECT_EQ(attention(q, kv, Step{1, 2, 0}, s, DType::kF32).to_float_vector(), a);
}

// Both bf16 paths against float32 attention on random bf16 data with GQA, sinks and a sliding
// window, prefill then decode steps through the cache.
TEST(AttentionRounding, Bf16TracksFloat32) {
  const uint64_t seed = 1234;
  std::mt19937 rng(seed);
  AttentionSpec spec;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim_k = spec.head_dim_v = 19;
  spec.scale = 0.25f;
  spec.sliding_window = 5;
  spec.sinks = Tensor::from_floats({0.5f, -1.f, 2.f, 0.f}, {4});
  LayerKV kv32, kv16;
  const int64_t B = 2;
  for (int64_t past = 0, tokens = 9; past < 13; past += tokens, tokens = 1) {
    Step step{B, tokens, past};
    Tensor q = random_act(step.rows(), 4 * 19, rng, 2.0f, DType::kBF16);
    Tensor k = random_act(step.rows(), 2 * 19, rng, 2.0f, DType::kBF16);
    Tensor v = random_act(step.rows(), 2 * 19, rng, 2.0f, DType::kBF16);
    kv_append(kv32, k, v, step);
    kv_append(kv16, k, v, step);
    for (bool eager : {true, false}) {
      spec.eager_rounding = eager;
      Tensor ref = attention(q, kv32, step, spec, DType::kF32);
      Tensor got = attention(q, kv16, step, spec, DType::kBF16);
      for (float x : got.to_float_vector()) ASSERT_EQ(x, round_bf16(x));
      EXPECT_LE(test::rel_l2_error(got, ref), 4.0 * std::ldexp(1.0, -8))
          << "seed " << seed << " past " << past << " eager " << eager;
    }
  }
}

// ---- KV cache ----

TEST(KvCache, GrowsByDoublingAndKeepsWhatIsCached) {
  std::mt19937 rng(5);
  const int64_t B = 3, kd = 5, vd = 7;
  LayerKV kv;  // no capacity hint: the first append sizes it exactly
  std::vector<Tensor> ks, vs;
  int64_t pos = 0;
  for (int64_t n : {3, 1, 1, 2, 1, 9}) {
    ks.push_back(random_act(B * n, kd, rng));
    vs.push_back(random_act(B * n, vd, rng));
    kv_append(kv, ks.back(), vs.back(), Step{B, n, pos});
    pos += n;
    EXPECT_EQ(kv.length(), pos);
    EXPECT_GE(kv.capacity(), pos);
  }
  EXPECT_EQ(kv.k.shape(), (Shape{B, kv.capacity(), kd}));
  EXPECT_EQ(kv.v.shape(), (Shape{B, kv.capacity(), vd}));
  EXPECT_EQ(kv.capacity(), 24);  // 3, then doubled at positions 4 (6), 7 (12) and 17 (24)
  // Every appended row sits at its sequence and position.
  pos = 0;
  for (size_t a = 0; a < ks.size(); ++a) {
    const int64_t n = ks[a].size(0) / B;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < kd; ++i)
          ASSERT_EQ(kv.k.item_double({b, pos + t, i}), ks[a].item_double({b * n + t, i}));
    pos += n;
  }
}

// ---- normalisation ----

TEST(RmsNorm, BothStylesRowAndPerHeadMatchFloat64) {
  for (int64_t rows : {1, 7, 19}) {
    std::mt19937 rng(7 + unsigned(rows));
    const int64_t width = 39, head = 13;
    Tensor x = random_act(rows, width, rng, 3.0f);
    Tensor w_row = random_act(1, width, rng).view({width});
    Tensor w_head = random_act(1, head, rng).view({head});
    const auto X = x.to_float_vector();
    for (int64_t group : {width, head}) {
      const auto W = (group == width ? w_row : w_head).to_float_vector();
      std::vector<double> ref(X.size());
      for (size_t g = 0; g < X.size() / size_t(group); ++g) {
        double ss = 0;
        for (int64_t i = 0; i < group; ++i) ss += double(X[g * group + i]) * X[g * group + i];
        const double r = 1.0 / std::sqrt(ss / double(group) + 1e-6);
        for (int64_t i = 0; i < group; ++i) ref[g * group + i] = X[g * group + i] * r * W[size_t(i)];
      }
      for (RmsNormStyle style : {RmsNormStyle::kLlama, RmsNormStyle::kGptOss}) {
        Tensor y = rms_norm(x, group == width ? w_row : w_head, 1e-6f, DType::kF32,
                            group == width ? 0 : head, style);
        EXPECT_LE(test::rel_l2_error(y, f64(ref, {rows, width})), 1e-6) << "rows " << rows << " group " << group;
      }
    }
  }
}

TEST(RmsNorm, Bf16RoundingPointsOfTheTwoStyles) {
  // One row, dim 2: x = (3, 4) -> y = x / sqrt(12.5). Weights chosen so that rounding y to bf16
  // before the product changes both outputs.
  Tensor x = Tensor::from_floats({3.f, 4.f}, {1, 2});
  Tensor w = Tensor::from_floats({0.73f, 1.08f}, {2});
  const float inv = 1.0f / std::sqrt(12.5f);
  const float y0 = 3.f * inv, y1 = 4.f * inv;
  ASSERT_NE(round_bf16(0.73f * y0), round_bf16(0.73f * round_bf16(y0)));
  ASSERT_NE(round_bf16(1.08f * y1), round_bf16(1.08f * round_bf16(y1)));
  const auto g = rms_norm(x, w, 0.f, DType::kBF16, 0, RmsNormStyle::kGptOss).to_float_vector();
  EXPECT_EQ(g, (std::vector<float>{round_bf16(0.73f * y0), round_bf16(1.08f * y1)}));
  const auto l = rms_norm(x, w, 0.f, DType::kBF16, 0, RmsNormStyle::kLlama).to_float_vector();
  EXPECT_EQ(l, (std::vector<float>{round_bf16(0.73f * round_bf16(y0)), round_bf16(1.08f * round_bf16(y1))}));
}

// ---- rope ----

TEST(Rope, HalfLayoutRotatesPairsAndInterleavedPermutesFirst) {
  nlohmann::json cfg = {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  Rope rope = model::make_rope(cfg, 10);
  std::mt19937 rng(3);
  const int64_t heads = 3, stride = 17, off = 7;  // rotate dims [7, 17) of each 17-wide head
  const Step step{1, 7, 5};                       // positions 5 .. 11
  Tensor x = random_act(step.rows(), heads * stride, rng);
  const auto X = x.to_float_vector();
  Tensor half = x.clone(), inter = x.clone();
  rope_(half, heads, stride, off, rope, RopeLayout::kHalf, step, DType::kF32);
  rope_(inter, heads, stride, off, rope, RopeLayout::kInterleaved, step, DType::kF32);
  const auto H = half.to_float_vector(), I = inter.to_float_vector();
  for (int64_t r = 0; r < step.rows(); ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const size_t base = size_t(r * heads * stride + h * stride);
      for (int64_t i = 0; i < off; ++i) EXPECT_EQ(H[base + i], X[base + i]);  // untouched part
      for (int64_t i = 0; i < 5; ++i) {
        const double ang = double(step.position(r)) * std::pow(10000.0, -2.0 * double(i) / 10);
        const double a = X[base + off + i], b = X[base + off + i + 5];
        EXPECT_NEAR(H[base + off + i], a * std::cos(ang) - b * std::sin(ang), 1e-5);
        EXPECT_NEAR(H[base + off + i + 5], b * std::cos(ang) + a * std::sin(ang), 1e-5);
        // Interleaved pairs (x[2i], x[2i+1]) land at slots i and i + 5, rotated.
        const double c = X[base + off + 2 * i], d = X[base + off + 2 * i + 1];
        EXPECT_NEAR(I[base + off + i], c * std::cos(ang) - d * std::sin(ang), 1e-5);
        EXPECT_NEAR(I[base + off + i + 5], d * std::cos(ang) + c * std::sin(ang), 1e-5);
      }
    }
  // bf16: every product and sum rounded, so the output holds bf16 values.
  Tensor b = random_act(step.rows(), heads * stride, rng, 1.0f, DType::kBF16);
  rope_(b, heads, stride, off, rope, RopeLayout::kHalf, step, DType::kBF16);
  for (float v : b.to_float_vector()) ASSERT_EQ(v, round_bf16(v));
}

TEST(Rope, YarnKeepsHighFrequenciesAndScalesLowOnes) {
  nlohmann::json cfg = {{"rope_parameters",
                         {{"rope_type", "yarn"}, {"rope_theta", 150000.0}, {"factor", 32.0},
                          {"original_max_position_embeddings", 4096}, {"beta_fast", 32.0},
                          {"beta_slow", 1.0}, {"truncate", false}}}};
  Rope r = model::make_rope(cfg, 64);
  ASSERT_EQ(r.inv_freq.size(), 32u);
  EXPECT_NEAR(r.inv_freq[0], 1.0, 1e-6);  // highest frequency: extrapolated (unchanged)
  EXPECT_NEAR(r.inv_freq[31], std::pow(150000.0, -62.0 / 64) / 32, 1e-9);  // lowest: divided by factor
  EXPECT_NEAR(r.attention_scaling, 0.1 * std::log(32.0) + 1.0, 1e-9);
  EXPECT_THROW(model::make_rope({{"rope_parameters", {{"rope_type", "longrope"}}}}, 64), Unsupported);
}

// ---- linear ----

TEST(Linear, Bf16WeightsAccumulateInFloat32) {
  for (int64_t rows : {1, 7, 19}) {
    std::mt19937 rng(11 + unsigned(rows));
    const int64_t in = 111, out = 37;
    Tensor x = random_act(rows, in, rng);
    Tensor w = random_act(out, in, rng, 0.2f).to(DType::kBF16);
    Tensor bias = random_act(1, out, rng).view({out});
    const auto X = x.to_float_vector(), W = w.to(DType::kF32).to_float_vector(), Bv = bias.to_float_vector();
    std::vector<double> ref(size_t(rows * out));
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < out; ++j) {
        double acc = Bv[size_t(j)];
        for (int64_t i = 0; i < in; ++i) acc += double(X[size_t(t * in + i)]) * W[size_t(j * in + i)];
        ref[size_t(t * out + j)] = acc;
      }
    EXPECT_LE(test::rel_l2_error(linear(x, w, bias, DType::kF32), f64(ref, {rows, out})), 1e-6) << rows;
    // In a bf16 model the output is rounded once: within bf16's unit roundoff.
    Tensor y16 = linear(x, w, bias, DType::kBF16);
    EXPECT_LE(test::rel_l2_error(y16, f64(ref, {rows, out})), std::ldexp(1.0, -8)) << rows;
    for (float v : y16.to_float_vector()) ASSERT_EQ(v, round_bf16(v));
  }
}

// ---- element-wise and reshuffles ----

TEST(Elementwise, ResidualClampGateAndEmbeddingRoundAsTorch) {
  std::mt19937 rng(21);
  Tensor a = random_act(7, 13, rng, 3.0f, DType::kBF16), b = random_act(7, 13, rng, 3.0f, DType::kBF16);
  const auto A = a.to_float_vector(), Bv = b.to_float_vector();
  add_(a, b, DType::kBF16);
  const auto S = a.to_float_vector();
  for (size_t i = 0; i < S.size(); ++i) ASSERT_EQ(S[i], round_bf16(A[i] + Bv[i]));

  Tensor c = Tensor::from_floats({-9.f, -1.5f, 0.f, 2.f, 8.5f}, {1, 5});
  clamp_(c, 2.0f);
  EXPECT_EQ(c.to_float_vector(), (std::vector<float>{-2.f, -1.5f, 0.f, 2.f, 2.f}));

  // gate = round(round(silu(g)) * u)
  Tensor g = Tensor::from_floats({0.7f, -1.3f, 2.5f}, {1, 3}), u = Tensor::from_floats({1.5f, 0.25f, -3.f}, {1, 3});
  const auto G = g.to_float_vector();
  gated_activation_(g, u, Activation::kSilu, DType::kBF16);
  for (int i = 0; i < 3; ++i) {
    const float silu = G[size_t(i)] / (1.0f + std::exp(-G[size_t(i)]));
    EXPECT_EQ(g.to_float_vector()[size_t(i)], round_bf16(round_bf16(silu) * u.to_float_vector()[size_t(i)]));
  }
  EXPECT_THROW(gated_activation_(g, u, Activation::kSwigluOai, DType::kF32), Unsupported);

  // y = round(y + round(round(sigmoid(gate)) * shared)), one gate per row.
  Tensor y = Tensor::from_floats({1.f, 2.f, -1.f, 0.5f}, {2, 2}), sh = Tensor::from_floats({0.3f, -0.7f, 1.1f, 2.f}, {2, 2});
  Tensor gl = Tensor::from_floats({0.4f, -2.f}, {2, 1});
  const auto Y = y.to_float_vector(), SH = sh.to_float_vector();
  add_gated_(y, sh, gl, DType::kBF16);
  for (int64_t r = 0; r < 2; ++r) {
    const float gate = round_bf16(1.0f / (1.0f + std::exp(-gl.to_float_vector()[size_t(r)])));
    for (int64_t i = 0; i < 2; ++i)
      EXPECT_EQ(y.item_double({r, i}), double(round_bf16(Y[size_t(r * 2 + i)] + round_bf16(gate * SH[size_t(r * 2 + i)]))));
  }

  Tensor table = random_act(11, 13, rng).to(DType::kBF16);
  Step es{1, 4, 0};
  es.ids = {10, 0, 10, 3};
  Tensor e = embedding(table, es, DType::kBF16);
  ASSERT_EQ(e.shape(), (Shape{4, 13}));
  for (int64_t i = 0; i < 13; ++i) {
    EXPECT_EQ(e.item_double({0, i}), table.item_double({10, i}));
    EXPECT_EQ(e.item_double({3, i}), table.item_double({3, i}));
  }
}

TEST(Reshuffle, SliceConcatAndLastRowsAreExactCopies) {
  std::mt19937 rng(9);
  const int64_t rows = 7, heads = 3, nope = 5, vdim = 3, rope = 3;
  Tensor kvb = random_act(rows, heads * (nope + vdim), rng);
  Tensor k_rot = random_act(rows, rope, rng);
  Tensor k = concat_columns(slice_columns(kvb, heads, 0, nope), k_rot, heads, /*b_shared=*/true);
  Tensor v = slice_columns(kvb, heads, nope, vdim);
  ASSERT_EQ(k.shape(), (Shape{rows, heads * (nope + rope)}));
  ASSERT_EQ(v.shape(), (Shape{rows, heads * vdim}));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < nope; ++i)
        ASSERT_EQ(k.item_double({r, h * (nope + rope) + i}), kvb.item_double({r, h * (nope + vdim) + i}));
      for (int64_t i = 0; i < rope; ++i)
        ASSERT_EQ(k.item_double({r, h * (nope + rope) + nope + i}), k_rot.item_double({r, i}));
      for (int64_t i = 0; i < vdim; ++i)
        ASSERT_EQ(v.item_double({r, h * vdim + i}), kvb.item_double({r, h * (nope + vdim) + nope + i}));
    }
  // Per-group b (not shared) and a plain column slice.
  Tensor a2 = random_act(rows, 4, rng), b2 = random_act(rows, 6, rng);
  Tensor c2 = concat_columns(a2, b2, 2);
  // Groups of 5 columns: [a2 (2), b2 (3)] twice.
  ASSERT_EQ(c2.shape(), (Shape{rows, 10}));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(c2.item_double({r, 1}), a2.item_double({r, 1}));
    EXPECT_EQ(c2.item_double({r, 2}), b2.item_double({r, 0}));
    EXPECT_EQ(c2.item_double({r, 5}), a2.item_double({r, 2}));
    EXPECT_EQ(c2.item_double({r, 7}), b2.item_double({r, 3}));
    EXPECT_EQ(c2.item_double({r, 9}), b2.item_double({r, 5}));
  }
  EXPECT_EQ(slice_columns(a2, 1, 1, 2).to_float_vector(), a2.slice(1, 1, 3).contiguous().to_float_vector());

  for (int64_t tokens : {1, 7}) {
    const Step step{3, tokens, 0};
    Tensor x = random_act(step.rows(), 13, rng);
    Tensor last = last_rows(x, step);
    ASSERT_EQ(last.shape(), (Shape{3, 13}));
    for (int64_t b = 0; b < 3; ++b)
      EXPECT_EQ(last.select(0, b).contiguous().to_float_vector(),
                x.select(0, (b + 1) * tokens - 1).contiguous().to_float_vector());
  }
}

// ---- routing ----

TEST(Router, SoftmaxTopKOrderTiesAndRenormalisation) {
  Tensor logits = Tensor::from_floats({0.f, 2.f, 2.f, -1.f, /**/ 3.f, 1.f, 0.f, 1.f}, {2, 4});
  Routing r = softmax_topk(logits, 2, false, DType::kF32);
  EXPECT_EQ(r.top_k_index.to_int_vector(), (std::vector<int64_t>{1, 2, 0, 1}));  // as torch.topk
  const double z0 = 1 + 2 * std::exp(2.0) + std::exp(-1.0);
  EXPECT_NEAR(r.top_k_weights.item_double({0, 0}), std::exp(2.0) / z0, 1e-6);
  Routing n = softmax_topk(logits, 2, true, DType::kF32);
  EXPECT_NEAR(n.top_k_weights.item_double({0, 0}) + n.top_k_weights.item_double({0, 1}), 1.0, 1e-6);
  EXPECT_NEAR(n.top_k_weights.item_double({1, 0}), std::exp(3.0) / (std::exp(3.0) + std::exp(1.0)), 1e-6);
  Routing b = softmax_topk(logits, 2, true, DType::kBF16);
  for (float w : b.top_k_weights.to_float_vector()) EXPECT_EQ(w, round_bf16(w));
}

// torch.topk(largest=True) ties, as recorded from torch 2.11 (docs/arch_deepseek_v3_gpt_oss.md):
// topk([1, 2, 2, .5, 2], 2).indices is [2, 4] (nth_element path; a lowest-id rule gives [1, 2]);
// when k * 64 <= n torch takes partial_sort, whose heap keeps the first k of equal values (a later
// tie never displaces them).
TEST(Router, TorchTopkTiesOnBothPaths) {
  const std::vector<float> v = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f};
  std::vector<int64_t> idx(2);
  std::vector<float> val(2);
  torch_topk(v.data(), 5, 2, /*sorted=*/true, idx.data(), val.data());
  EXPECT_EQ(idx, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(val, (std::vector<float>{2.0f, 2.0f}));
  std::vector<float> wide(130, 0.0f);
  wide[7] = wide[40] = wide[99] = 1.0f;
  std::vector<int64_t> i2(2);
  torch_topk(wide.data(), 130, 2, /*sorted=*/true, i2.data(), nullptr);
  std::sort(i2.begin(), i2.end());
  EXPECT_EQ(i2, (std::vector<int64_t>{7, 40}));
}

TEST(Router, TopkSoftmaxOverTheChosenLogits) {
  const std::vector<float> lg = {0.5f, 2.0f, -1.0f, 1.0f, 2.5f, 0.0f};
  Routing r = topk_softmax(Tensor::from_floats(lg, {1, 6}), 3, DType::kF32);
  EXPECT_EQ(r.top_k_index.to_int_vector(), (std::vector<int64_t>{4, 1, 3}));
  const double z = std::exp(2.5) + std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(r.top_k_weights.item_double({0, 0}), std::exp(2.5) / z, 1e-6);
  EXPECT_NEAR(r.top_k_weights.item_double({0, 2}), std::exp(1.0) / z, 1e-6);
}

// Group selection ties: two groups with equal pair sums compete for one slot, and torch's
// nth_element order (not the lowest id) decides; the expert choice inside the kept groups too.
TEST(Router, SigmoidGroupTopkTiesFollowTorchTopk) {
  GroupLimitedTopk c;
  c.num_experts = 12;
  c.top_k = 2;
  c.n_group = 4;  // groups of 3
  c.topk_group = 2;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 1.0f;
  // Pair sums of the choice scores: group 0 and 2 and 3 tie; group 1 is lower.
  const std::vector<float> lg = {1.f, 1.f, -3.f, 0.f, 0.f, -3.f, 1.f, 1.f, -3.f, 1.f, -3.f, 1.f};
  Routing r = sigmoid_group_topk(Tensor::from_floats(lg, {1, 12}), Tensor::zeros({12}, DType::kF32), c);
  // The same choice spelled with torch_topk's rules (sorted=False).
  const float s = 1.0f / (1.0f + std::exp(-1.0f));
  const std::vector<float> groups = {s + s, 1.0f, s + s, s + s};
  std::vector<int64_t> kept(2);
  torch_topk(groups.data(), 4, 2, /*sorted=*/false, kept.data(), nullptr);
  std::vector<float> choice(12, -INFINITY);
  for (int64_t g : kept)
    for (int64_t e = g * 3; e < g * 3 + 3; ++e) choice[size_t(e)] = 1.0f / (1.0f + std::exp(-lg[size_t(e)]));
  std::vector<int64_t> want(2);
  torch_topk(choice.data(), 12, 2, /*sorted=*/false, want.data(), nullptr);
  EXPECT_EQ(r.top_k_index.to_int_vector(), want);
  // Equal scores, renormalised: 0.5 each.
  EXPECT_NEAR(r.top_k_weights.item_double({0, 0}), 0.5, 1e-6);
}

// ---- token choice ----

TEST(TokenChoice, ArgmaxLowestIdOnTiesAndNarrowSamplingIsArgmax) {
  Tensor l = Tensor::from_floats({0.f, 3.f, 3.f, 1.f, /**/ 5.f, -1.f, 2.f, 5.f}, {2, 4});
  EXPECT_EQ(argmax_row(l, 0), 1);
  EXPECT_EQ(argmax_row(l, 1), 0);
  // Sampling: top_k = 1, or a tiny top_p, leaves only the most likely token.
  Tensor u = Tensor::from_floats({0.f, 3.f, 2.5f, 1.f, 2.9f, -4.f, 0.5f}, {1, 7});
  std::mt19937_64 rng(3);
  SamplingSpec s;
  s.top_k = 1;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sample_row(u, 0, s, rng), 1);
  s.top_k = 0;
  s.top_p = 0.01f;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sample_row(u, 0, s, rng), 1);
}

// ---- dispatch ----

// In a build without CUDA, a CUDA tensor reaching the one dispatch point gets a clear error
// naming the op. The storage is a null block labelled as CUDA: the op must not touch it.
TEST(Dispatch, CudaTensorsInACpuBuildGetUnsupportedNamingTheOp) {
#if MOEX_WITH_CUDA
  GTEST_SKIP() << "CUDA build: CUDA tensors run the CUDA ops (tests/test_cuda_ops.cpp)";
#endif
  auto storage = std::make_shared<Storage>(nullptr, 0, Device::cuda(0), [](void*) {});
  Tensor x(storage, 0, DType::kF32, {0, 4}, {4, 1});
  Tensor w = Tensor::zeros({4}, DType::kF32);
  try {
    rms_norm_(x, w, 1e-6f, DType::kF32);
    FAIL() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("op 'rms_norm' on a CUDA tensor in a build without CUDA"), std::string::npos) << e.what();
  }
  EXPECT_THROW(linear(x, Tensor::zeros({2, 4}, DType::kF32), Tensor(), DType::kF32), Unsupported);
  EXPECT_THROW(softmax_topk(x, 1, false, DType::kF32), Unsupported);
}

// ---- experts fusion at load ----

TEST(LoadExperts, FusesHubTensorsAsGateThenUp) {
  auto ckpt = Checkpoint::open(test::data_path("hf-tiny/mixtral/checkpoint_fp32"));
  const ExpertsSpec spec = model::gated_experts_spec(8, 128, 64, Activation::kSilu);
  model::ExpertNames names;
  names.gate = "w1";
  names.up = "w3";
  names.down = "w2";
  const std::string p = "model.layers.1.block_sparse_moe.experts";
  Experts e = model::load_experts(*ckpt, p, spec, DType::kF32, names);
  for (int64_t x : {0, 5, 7}) {
    Tensor gu = e.weights().gate_up.select(0, x);
    const std::string q = p + "." + std::to_string(x) + ".";
    EXPECT_EQ(gu.slice(0, 0, 64).contiguous().to_float_vector(), ckpt->get(q + "w1.weight").to_float_vector());
    EXPECT_EQ(gu.slice(0, 64, 128).contiguous().to_float_vector(), ckpt->get(q + "w3.weight").to_float_vector());
    EXPECT_EQ(e.weights().down.select(0, x).contiguous().to_float_vector(),
              ckpt->get(q + "w2.weight").to_float_vector());
  }
}

}  // namespace
}  // namespace moex::ops
