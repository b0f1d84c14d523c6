// The model ops (src/model/ops.hpp) against float64 references on seeded random inputs:
// attention (GQA, k/v widths that differ, sliding window, sinks, incremental = full), RMSNorm
// (whole row and per head), rope (both layouts, yarn limits), linear with bf16 weights, the
// softmax router and the experts fusion at load.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/ops.hpp"
#include "moex/checkpoint.hpp"
#include "moex/error.hpp"
#include "support/test_support.hpp"

namespace moex::model {
namespace {

Tensor random_act(int64_t rows, int64_t dim, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(size_t(rows * dim));
  for (auto& x : v) x = u(rng);
  return Tensor::from_floats(v, {rows, dim});
}

Tensor f64(const std::vector<double>& v, Shape s) {
  Tensor t = Tensor::empty(s, DType::kF64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

// Causal attention of sequence-major rows in float64, every key of the sequence visible up to the
// query's own position (minus the window), sinks in the denominator.
Tensor attention_ref(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t T,
                     const AttentionSpec& s, const std::vector<float>* sinks) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t qd = s.heads * s.head_dim_k, kd = s.kv_heads * s.head_dim_k, vd = s.kv_heads * s.head_dim_v;
  const auto Q = q.to_float_vector(), K = k.to_float_vector(), V = v.to_float_vector();
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
        if (sinks) mx = std::max(mx, double((*sinks)[size_t(h)]));
        double den = sinks ? std::exp(double((*sinks)[size_t(h)]) - mx) : 0.0;
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
  int64_t window;
  bool sinks;
};

class Attention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Attention, FullAndIncrementalMatchFloat64) {
  const uint64_t seed = 1234 + uint64_t(GetParam().window) * 7 + GetParam().sinks;
  std::mt19937 rng{static_cast<unsigned>(seed)};
  const int64_t B = 2, T = 19;
  AttentionSpec s;
  s.heads = 6;
  s.kv_heads = 2;
  s.head_dim_k = 24;
  s.head_dim_v = 16;
  s.scale = 1.0f / std::sqrt(24.0f);
  s.sliding_window = GetParam().window;
  Tensor sink_t = random_act(1, s.heads, rng, 2.0f).view({s.heads});
  std::vector<float> sinks = sink_t.to_float_vector();
  if (GetParam().sinks) s.sinks = &sink_t;
  Tensor q = random_act(B * T, s.heads * s.head_dim_k, rng, 2.0f);
  Tensor k = random_act(B * T, s.kv_heads * s.head_dim_k, rng, 2.0f);
  Tensor v = random_act(B * T, s.kv_heads * s.head_dim_v, rng);
  Tensor ref = attention_ref(q, k, v, B, T, s, GetParam().sinks ? &sinks : nullptr);

  LayerKV kv;
  Tensor full = attention(q, k, v, kv, Step{B, T, 0}, s, DType::kF32);
  EXPECT_LE(test::rel_l2_error(full, ref), 1e-6) << "seed " << seed;
  EXPECT_EQ(kv.length(), T);

  // Prefill 5 tokens, then one token per step: rows must equal the full run's rows.
  LayerKV inc;
  auto rows = [&](const Tensor& x, int64_t t0, int64_t n) {
    const int64_t w = x.size(1);
    Tensor r = Tensor::empty({B * n, w}, DType::kF32);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(x.data<float>() + (b * T + t0) * w, n * w, r.data<float>() + b * n * w);
    return r;
  };
  std::vector<float> got(size_t(B * T * s.heads * s.head_dim_v));
  const int64_t od = s.heads * s.head_dim_v;
  for (int64_t t0 = 0; t0 < T;) {
    const int64_t n = t0 == 0 ? 5 : 1;
    Tensor o = attention(rows(q, t0, n), rows(k, t0, n), rows(v, t0, n), inc, Step{B, n, t0}, s, DType::kF32);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(o.data<float>() + b * n * od, n * od, got.data() + (b * T + t0) * od);
    t0 += n;
  }
  EXPECT_LE(test::rel_l2_error(Tensor::from_floats(got, {B * T, od}), ref), 1e-6) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Cases, Attention,
                         ::testing::Values(AttnCase{0, false}, AttnCase{4, false}, AttnCase{0, true},
                                           AttnCase{7, true}, AttnCase{1, false}));

TEST(RmsNorm, RowAndPerHeadMatchFloat64) {
  std::mt19937 rng(7);
  Tensor x = random_act(5, 96, rng, 3.0f);
  Tensor w96 = random_act(1, 96, rng).view({96});
  Tensor w32 = random_act(1, 32, rng).view({32});
  const auto X = x.to_float_vector(), W96 = w96.to_float_vector(), W32 = w32.to_float_vector();
  for (int64_t dim : {96, 32}) {
    std::vector<double> ref(X.size());
    for (size_t g = 0; g < X.size() / size_t(dim); ++g) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(X[g * dim + i]) * X[g * dim + i];
      const double r = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int64_t i = 0; i < dim; ++i)
        ref[g * dim + i] = X[g * dim + i] * r * (dim == 96 ? W96 : W32)[size_t(i)];
    }
    Tensor y = rms_norm(x, dim == 96 ? w96 : w32, 1e-6f, DType::kF32, dim == 96 ? 0 : 32);
    EXPECT_LE(test::rel_l2_error(y, f64(ref, {5, 96})), 1e-6) << "dim " << dim;
  }
}

TEST(Rope, HalfLayoutRotatesPairsAndInterleavedPermutesFirst) {
  nlohmann::json cfg = {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  Rope rope = make_rope(cfg, 16);
  std::mt19937 rng(3);
  const int64_t heads = 3, stride = 24, off = 8;  // rotate dims [8, 24) of each 24-wide head
  Tensor x = random_act(4, heads * stride, rng);
  const auto X = x.to_float_vector();
  Step step{2, 2, 5};  // positions 5, 6 for both sequences
  Tensor half = x.clone(), inter = x.clone();
  apply_rope(half, heads, stride, off, rope, RopeLayout::kHalf, step, DType::kF32);
  apply_rope(inter, heads, stride, off, rope, RopeLayout::kInterleaved, step, DType::kF32);
  const auto H = half.to_float_vector(), I = inter.to_float_vector();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const size_t base = size_t(r * heads * stride + h * stride);
      for (int64_t i = 0; i < off; ++i) EXPECT_EQ(H[base + i], X[base + i]);  // untouched part
      for (int64_t i = 0; i < 8; ++i) {
        const double ang = step.position(r) * std::pow(10000.0, -2.0 * i / 16);
        const double a = X[base + off + i], b = X[base + off + i + 8];
        EXPECT_NEAR(H[base + off + i], a * std::cos(ang) - b * std::sin(ang), 1e-5);
        EXPECT_NEAR(H[base + off + i + 8], b * std::cos(ang) + a * std::sin(ang), 1e-5);
        // Interleaved pairs (x[2i], x[2i+1]) land at slots i and i + 8, rotated.
        const double c = X[base + off + 2 * i], d = X[base + off + 2 * i + 1];
        EXPECT_NEAR(I[base + off + i], c * std::cos(ang) - d * std::sin(ang), 1e-5);
        EXPECT_NEAR(I[base + off + i + 8], d * std::cos(ang) + c * std::sin(ang), 1e-5);
      }
    }
}

TEST(Rope, YarnKeepsHighFrequenciesAndScalesLowOnes) {
  nlohmann::json cfg = {{"rope_parameters",
                         {{"rope_type", "yarn"}, {"rope_theta", 150000.0}, {"factor", 32.0},
                          {"original_max_position_embeddings", 4096}, {"beta_fast", 32.0},
                          {"beta_slow", 1.0}, {"truncate", false}}}};
  Rope r = make_rope(cfg, 64);
  ASSERT_EQ(r.inv_freq.size(), 32u);
  EXPECT_NEAR(r.inv_freq[0], 1.0, 1e-6);  // highest frequency: extrapolated (unchanged)
  EXPECT_NEAR(r.inv_freq[31], std::pow(150000.0, -62.0 / 64) / 32, 1e-9);  // lowest: divided by factor
  EXPECT_NEAR(r.attention_scaling, 0.1 * std::log(32.0) + 1.0, 1e-9);
  EXPECT_THROW(make_rope({{"rope_parameters", {{"rope_type", "longrope"}}}}, 64), Unsupported);
}

TEST(Linear, Bf16WeightsAccumulateInFloat32) {
  std::mt19937 rng(11);
  const int64_t rows = 7, in = 111, out = 37;
  Tensor x = random_act(rows, in, rng);
  Linear l;
  l.weight = random_act(out, in, rng, 0.2f).to(DType::kBF16);
  l.bias = random_act(1, out, rng).view({out});
  const auto X = x.to_float_vector(), W = l.weight.to(DType::kF32).to_float_vector(), Bv = l.bias.to_float_vector();
  std::vector<double> ref(size_t(rows * out));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < out; ++j) {
      double acc = Bv[size_t(j)];
      for (int64_t i = 0; i < in; ++i) acc += double(X[size_t(t * in + i)]) * W[size_t(j * in + i)];
      ref[size_t(t * out + j)] = acc;
    }
  EXPECT_LE(test::rel_l2_error(linear(x, l, DType::kF32), f64(ref, {rows, out})), 1e-6);
  // In a bf16 model the output is rounded once: within bf16's unit roundoff.
  EXPECT_LE(test::rel_l2_error(linear(x, l, DType::kBF16), f64(ref, {rows, out})), std::ldexp(1.0, -8));
}

TEST(Router, SoftmaxTopKOrderTiesAndRenormalisation) {
  Tensor logits = Tensor::from_floats({0.f, 2.f, 2.f, -1.f, /**/ 3.f, 1.f, 0.f, 1.f}, {2, 4});
  Routing r = softmax_topk(logits, 2, false, DType::kF32);
  EXPECT_EQ(r.top_k_index.to_int_vector(), (std::vector<int64_t>{1, 2, 0, 1}));  // as torch.topk
  const double z0 = 1 + 2 * std::exp(2.0) + std::exp(-1.0);
  EXPECT_NEAR(r.top_k_weights.item_double({0, 0}), std::exp(2.0) / z0, 1e-6);
  Routing n = softmax_topk(logits, 2, true, DType::kF32);
  EXPECT_NEAR(n.top_k_weights.item_double({0, 0}) + n.top_k_weights.item_double({0, 1}), 1.0, 1e-6);
  EXPECT_NEAR(n.top_k_weights.item_double({1, 0}), std::exp(3.0) / (std::exp(3.0) + std::exp(1.0)), 1e-6);
}

// The softmax routers pick ties as torch.topk on CPU does, not by lowest id: torch.topk(
// [1, 2, 2, .5, 2], 2).indices is [2, 4] (checked against torch 2.11 on the GPU host, see
// docs/arch_deepseek_v3_gpt_oss.md); a lowest-id rule gives [1, 2].
TEST(Router, TopkRowsTiesAsTorch) {
  const std::vector<float> v = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f};
  std::vector<int64_t> idx(2);
  std::vector<float> val(2);
  topk_rows(v.data(), 5, 2, idx.data(), val.data());
  EXPECT_EQ(idx, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(val, (std::vector<float>{2.0f, 2.0f}));
}

TEST(LoadExperts, FusesHubTensorsAsGateThenUp) {
  auto ckpt = Checkpoint::open(test::data_path("hf-tiny/mixtral/checkpoint_fp32"));
  ExpertsSpec spec;
  spec.num_experts = 8;
  spec.hidden = 128;
  spec.intermediate = 64;
  ExpertNames names;
  names.gate = "w1";
  names.up = "w3";
  names.down = "w2";
  const std::string p = "model.layers.1.block_sparse_moe.experts";
  Experts e = load_experts(*ckpt, p, spec, DType::kF32, names);
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
}  // namespace moex::model
