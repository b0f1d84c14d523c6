// gpt-oss specifics (the shared fixture checks are in test_model_fixtures.cpp): model info,
// router ties and rope defaults (the shared ops are tested in test_model_ops.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gpt_oss_layers.hpp"
#include "ops/ops.hpp"
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

// ---- pieces alone (the generic ops: tests/test_model_ops.cpp) ----

// Ties are resolved as torch.topk on CPU resolves them (answers recorded from torch 2.11):
// the bf16 router logits of the fixture's layer 0, token 6 tie between experts 4 and 6 and torch
// picks 6; a lowest-id rule would pick 4 and change the token's output by ~17%.
TEST(GptOssRouter, TiesResolvedAsTorchTopk) {
  const std::vector<float> row = {0.2197265625f, -0.259765625f, -0.59765625f, 1.96875f,
                                  1.109375f,     0.1806640625f, 1.109375f,    0.1435546875f};
  model::Routing r = ops::topk_softmax(Tensor::from_floats(row, {1, 8}), 2, DType::kBF16);
  EXPECT_EQ(r.top_k_index.to_int_vector(), (std::vector<int64_t>{3, 6}));
  for (float v : r.top_k_weights.to_float_vector()) EXPECT_EQ(v, round_bf16(v));
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

// The GPU layout of gpt-oss's experts (model/gpt_oss_layers.hpp): the same function as the stored
// transposed, interleaved layout, checked on the float64 reference of both (ugly sizes, float32
// and bfloat16 values), and the spec says what changed.
TEST(GptOss, RowMajorExpertsComputeTheSameFunction) {
  const test::ExpertsLayout l{/*gate=*/true, /*bias=*/true, /*transposed=*/true, /*concat=*/false};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    ExpertsSpec s = test::make_experts_spec(l, 5, 37, 21, Activation::kSwigluOai);
    const Experts stored(s, test::random_experts_weights(s, dt, 71));
    const Experts row_major = model::gpt_oss_experts_row_major(stored);
    EXPECT_FALSE(row_major.spec().is_transposed);
    EXPECT_TRUE(row_major.spec().is_concatenated);
    EXPECT_EQ(row_major.weights().gate_up.shape(), (Shape{5, 42, 37}));
    EXPECT_EQ(row_major.weights().down.shape(), (Shape{5, 37, 21}));
    const auto r = test::random_routing(s, 9, 2, dt, 72, test::RoutingCase::kRandom);
    const Tensor a = stored.forward("eager", r.hidden, r.top_k_index, r.top_k_weights);
    const Tensor b = row_major.forward("eager", r.hidden, r.top_k_index, r.top_k_weights);
    const auto x = a.to_float_vector(), y = b.to_float_vector();
    ASSERT_EQ(x.size(), y.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      den += double(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(num / den), dt == DType::kF32 ? 1e-6 : 1e-2) << dtype_name(dt);
  }
  ExpertsSpec plain;
  plain.num_experts = 2;
  plain.hidden = 8;
  plain.intermediate = 4;
  EXPECT_THROW(model::gpt_oss_experts_row_major(Experts(plain, test::random_experts_weights(plain, DType::kF32, 1))),
               InvalidInput);
}

}  // namespace
}  // namespace moex
