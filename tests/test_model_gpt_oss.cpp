// gpt-oss specifics (the shared fixture checks are in test_model_fixtures.cpp): model info,
// router, norm, rope defaults and bf16 attention alone.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gpt_oss_layers.hpp"
#include "model/ops.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

const std::string kDir = "hf-tiny/gpt_oss/";

std::unique_ptr<CausalLM> load(const std::string& checkpoint, DType dtype, const std::string& backend) {
  LoadOptions o;
  o.dtype = dtype;
  o.experts_implementation = {{"", backend}};
  return from_pretrained(test::data_path(kDir + checkpoint), o);
}

// Logits per backend, greedy, bf16, run-time switching and batched greedy are checked for every
// architecture by tests/test_model_fixtures.cpp; this file holds what is specific to GptOss.

TEST(GptOss, InfoDescribesTheModel) {
  auto lm = load("checkpoint_fp32", DType::kF32, "eager");
  const ModelInfo& i = lm->info();
  EXPECT_EQ(i.model_type, "gpt_oss");
  EXPECT_EQ(i.moe_layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(i.num_experts, 8);
  EXPECT_EQ(i.experts_per_token, 2);
  EXPECT_EQ(i.vocab_size, 256);
}

// ---- pieces alone ----

TEST(GptOssRouter, TopKOfLogitsThenSoftmaxOverTheK) {
  const std::vector<float> lg = {0.5f, 2.0f, -1.0f, 1.0f, 2.5f, 0.0f};
  model::Routing r = model::gpt_oss_route(Tensor::from_floats(lg, {1, 6}), 3, DType::kF32);
  EXPECT_EQ(r.top_k_index.to_int_vector(), (std::vector<int64_t>{4, 1, 3}));  // largest first
  const double z = std::exp(2.5) + std::exp(2.0) + std::exp(1.0);
  const std::vector<float> w = r.top_k_weights.to_float_vector();
  EXPECT_NEAR(w[0], std::exp(2.5) / z, 1e-6);
  EXPECT_NEAR(w[1], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(1.0) / z, 1e-6);
}

// Ties are resolved as torch.topk on CPU resolves them (answers recorded from torch 2.11):
// the bf16 router logits of the fixture's layer 0, token 6 tie between experts 4 and 6 and torch
// picks 6; a lowest-id rule would pick 4 and change the token's output by ~17%.
TEST(GptOssRouter, TiesResolvedAsTorchTopk) {
  const std::vector<float> row = {0.2197265625f, -0.259765625f, -0.59765625f, 1.96875f,
                                  1.109375f,     0.1806640625f, 1.109375f,    0.1435546875f};
  model::Routing r = model::gpt_oss_route(Tensor::from_floats(row, {1, 8}), 2, DType::kBF16);
  EXPECT_EQ(r.top_k_index.to_int_vector(), (std::vector<int64_t>{3, 6}));
  std::vector<int64_t> idx(2);
  const std::vector<float> v = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f};
  model::torch_topk(v.data(), 5, 2, /*sorted=*/true, idx.data(), nullptr);
  EXPECT_EQ(idx, (std::vector<int64_t>{2, 4}));  // torch.topk([1, 2, 2, .5, 2], 2).indices
}

TEST(GptOssRouter, Bf16WeightsAreRounded) {
  const std::vector<float> lg = {0.3f, 0.1f, 0.7f};
  model::Routing r = model::gpt_oss_route(Tensor::from_floats(lg, {1, 3}), 2, DType::kBF16);
  for (float v : r.top_k_weights.to_float_vector()) EXPECT_EQ(v, round_bf16(v));
}

TEST(GptOssNorm, WeightProductRoundedOnce) {
  // One row, dim 2: x = (3, 4) -> rms = sqrt(12.5); y = x / rms; out = round_bf16(w * y).
  Tensor x = Tensor::from_floats({3.f, 4.f}, {1, 2});
  // Weights chosen so that rounding y to bf16 before the product would change both outputs.
  Tensor w = Tensor::from_floats({0.73f, 1.08f}, {2});
  Tensor out = model::gpt_oss_rms_norm(x, w, 0.f, DType::kBF16);
  const std::vector<float> o = out.to_float_vector();
  const float inv = 1.0f / std::sqrt(12.5f);
  const float y0 = 3.f * inv, y1 = 4.f * inv;
  ASSERT_NE(round_bf16(0.73f * y0), round_bf16(0.73f * round_bf16(y0)));
  ASSERT_NE(round_bf16(1.08f * y1), round_bf16(1.08f * round_bf16(y1)));
  EXPECT_EQ(o[0], round_bf16(0.73f * y0));
  EXPECT_EQ(o[1], round_bf16(1.08f * y1));
}

TEST(GptOssRope, DefaultsToYarnWhenConfigHasNone) {
  model::Rope r = model::make_rope(model::gpt_oss_rope_config(nlohmann::json::object()), 64);
  EXPECT_NEAR(r.attention_scaling, 0.1 * std::log(32.0) + 1.0, 1e-12);
  EXPECT_NEAR(r.inv_freq[0], 1.0, 1e-6);  // extrapolated (high-frequency) end: 150000^0
  // Low-frequency end interpolated by the factor: 1 / (32 * 150000^(62/64)).
  EXPECT_NEAR(r.inv_freq[31], 1.0 / (32.0 * std::pow(150000.0, 62.0 / 64.0)), 1e-9);
  // An explicit rope is kept; a missing theta becomes 150000.
  const auto cfg = nlohmann::json::parse(R"({"rope_scaling": {"rope_type": "default"}})");
  model::Rope d = model::make_rope(model::gpt_oss_rope_config(cfg), 64);
  EXPECT_EQ(d.attention_scaling, 1.0);
  EXPECT_NEAR(d.inv_freq[1], 1.0 / std::pow(150000.0, 2.0 / 64.0), 1e-7);
}

// The bf16 eager-attention path against the float32 one (ops.hpp attention) on random data with
// GQA, sinks and a sliding window, prefill then decode steps through the cache.
TEST(GptOssAttention, Bf16PathTracksFloat32Attention) {
  const uint64_t seed = 1234;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  model::AttentionSpec spec;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim_k = spec.head_dim_v = 16;
  spec.scale = 0.25f;
  spec.sliding_window = 5;
  Tensor sinks = Tensor::from_floats({0.5f, -1.f, 2.f, 0.f}, {4});
  spec.sinks = &sinks;
  auto rand_bf16 = [&](int64_t rows, int64_t dim) {
    std::vector<float> v(size_t(rows * dim));
    for (auto& x : v) x = round_bf16(2.f * u(rng));
    return Tensor::from_floats(v, {rows, dim});
  };
  model::LayerKV kv32, kv16;
  const int64_t B = 2;
  for (int64_t past = 0, tokens = 9; past < 13; past += tokens, tokens = 1) {
    model::Step step{B, tokens, past};
    Tensor q = rand_bf16(step.rows(), 64), k = rand_bf16(step.rows(), 32), v = rand_bf16(step.rows(), 32);
    Tensor ref = model::attention(q, k, v, kv32, step, spec, DType::kF32);
    Tensor got = model::gpt_oss_attention(q, k, v, kv16, step, spec, DType::kBF16);
    EXPECT_LE(test::rel_l2_error(got, ref), 4.0 * std::ldexp(1.0, -8)) << "seed " << seed << " past " << past;
  }
}

}  // namespace
}  // namespace moex
