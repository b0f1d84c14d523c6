// DeepSeek-V3 specifics (the shared fixture checks are in test_model_fixtures.cpp): model info,
// bad configs, the router, the MLA softmax scale alone, and the compressed MLA cache: its size and
// cached steps of every kind (absorbed decode, expanded prompts and chunks) against full forwards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/deepseek_mla.hpp"
#include "model/layers.hpp"
#include "model/deepseek_router.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

const std::string kDir = "hf-tiny/deepseek_v3/";

std::unique_ptr<CausalLM> load(const std::string& checkpoint, DType dtype, const std::string& backend) {
  LoadOptions o;
  o.dtype = dtype;
  o.experts_implementation = {{"", backend}};
  return from_pretrained(test::data_path(kDir + checkpoint), o);
}

// Logits per backend, greedy, bf16, run-time switching and batched greedy are checked for every
// architecture by tests/test_model_fixtures.cpp; this file holds what is specific to DeepseekV3.

TEST(DeepseekV3, InfoDescribesTheModel) {
  auto lm = load("checkpoint_fp32", DType::kF32, "eager");
  const ModelInfo& i = lm->info();
  EXPECT_EQ(i.model_type, "deepseek_v3");
  EXPECT_EQ(i.moe_layers, std::vector<int64_t>{1});  // first_k_dense_replace = 1 of 2 layers
  EXPECT_EQ(i.num_experts, 16);
  EXPECT_EQ(i.experts_per_token, 4);
  EXPECT_EQ(i.vocab_size, 256);
}

// CausalLM::forward is protected (the public API is logits / generate); the tests below drive
// cached steps of chosen sizes through a derived class's pointer to it (never instantiated).
struct ForwardAccess : CausalLM {
  static Tensor run(CausalLM& lm, model::Step& step, model::KVCache& cache, bool last_only) {
    return (lm.*(&ForwardAccess::forward))(step, cache, last_only);
  }
};

// The cache holds [latent; rope key] per token and layer: kv_lora_rank 32 + qk_rope_head_dim 16
// = 48 values (the expanded form held heads 4 x (qk 48 + v 32) = 320), no value tensor.
TEST(DeepseekV3Mla, CacheHoldsLatentAndRopeKeyPerToken) {
  auto lm = load("checkpoint_fp32", DType::kF32, "eager");
  const int64_t layers = 2, width = 32 + 16, heads = 4;
  EXPECT_EQ(lm->info().kv_bytes_per_token, layers * width * 4);  // float32 on the host
  EXPECT_EQ(lm->info().attention_flops_per_pair, layers * 2 * heads * (width + 32));
  model::KVCache cache(2, layers);
  model::Step step(2, 3, 0);
  step.ids = {5, 6, 7, 8, 9, 10};
  (void)ForwardAccess::run(*lm, step, cache, true);
  model::Step next(2, 1, 3);
  next.ids = {11, 12};
  (void)ForwardAccess::run(*lm, next, cache, true);
  for (const auto& kv : cache.layers) {
    ASSERT_TRUE(kv.k.defined());
    EXPECT_EQ(kv.k.size(0), 2);
    EXPECT_EQ(kv.k.size(2), width);
    EXPECT_FALSE(kv.v.defined());
    EXPECT_EQ(kv.length(), 4);
  }
}

std::vector<Device> test_devices() {
  std::vector<Device> d = {Device::cpu()};
  if (test::cuda_devices() > 0) d.push_back(Device::cuda(0));
  return d;
}

// Cached steps of every kind agree with one full forward over the whole sequences (float32):
// a short prompt (expanded, past 0), single-token decode steps and a 4-token chunk (absorbed
// MQA over the compressed cache), a 20-token chunk (expanded from the cached latents), more
// decode steps. Two sequences, the second left-padded by 3 columns.
TEST(DeepseekV3Mla, CachedStepsOfEveryKindMatchFullForward) {
  const std::vector<int64_t> chunks = {3, 1, 1, 4, 20, 1, 1, 1};
  int64_t total = 0;
  for (int64_t c : chunks) total += c;
  std::mt19937_64 rng(11);
  std::vector<int64_t> ids(size_t(2 * total));
  for (auto& id : ids) id = int64_t(2 + rng() % 250);
  const int64_t pad = 3;
  Tensor mask = Tensor::zeros({2, total}, DType::kI64);
  {
    std::vector<int64_t> m(size_t(2 * total), 1);
    for (int64_t j = 0; j < pad; ++j) m[size_t(total + j)] = 0;
    mask = Tensor::from_ints(m, {2, total});
  }
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.str());
    LoadOptions o;
    o.dtype = DType::kF32;
    o.device = dev;
    o.experts_implementation = {{"", "eager"}};
    auto lm = from_pretrained(test::data_path(kDir + "checkpoint_fp32"), o);
    const Tensor full = lm->logits(Tensor::from_ints(ids, {2, total}), mask);  // [2, total, V]
    const int64_t V = full.size(2);
    const auto f = full.to_float_vector();
    model::KVCache cache(2, 2);
    int64_t past = 0;
    for (int64_t T : chunks) {
      model::Step step(2, T, past);
      step.pad = {0, pad};
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < T; ++t) step.ids.push_back(ids[size_t(b * total + past + t)]);
      const auto got = ForwardAccess::run(*lm, step, cache, false).to(Device::cpu()).to(DType::kF32).to_float_vector();
      ASSERT_EQ(int64_t(got.size()), 2 * T * V);
      double num = 0, den = 0;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < T; ++t) {
          if (b == 1 && past + t < pad) continue;  // padding rows carry no meaning
          for (int64_t v = 0; v < V; ++v) {
            const double w = f[size_t((b * total + past + t) * V + v)], d = got[size_t((b * T + t) * V + v)] - w;
            num += d * d;
            den += w * w;
          }
        }
      const double rel = std::sqrt(num / den);
      EXPECT_LE(rel, dev.is_cuda() ? 1e-4 : 1e-5) << "chunk of " << T << " at past " << past;
      std::printf("%s chunk %ld past %ld rel L2 %.3g\n", dev.str().c_str(), long(T), long(past), rel);
      past += T;
    }
  }
}

// A copy of the fp32 fixture whose config.json is edited by `edit` (weights symlinked).
std::string edited_checkpoint(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path src = test::data_path(kDir + "checkpoint_fp32");
  // The pid keeps concurrent runs (several build trees, ctest -j) apart.
  const fs::path dir =
      fs::temp_directory_path() / ("moex_test_deepseek_v3_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream in(src / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  fs::create_symlink(fs::absolute(src / "model.safetensors"), dir / "model.safetensors");
  return dir.string();
}

TEST(DeepseekV3, RejectsBadRouterConfig) {
  const std::string dir = edited_checkpoint("bad_group", [](nlohmann::json& c) { c["n_group"] = 3; });
  try {
    from_pretrained(dir);
    FAIL() << "expected InvalidInput";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("n_group"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Quantized checkpoints load (tests/test_model_quantized.cpp); a quantization method moex does not
// run is refused at once.
TEST(DeepseekV3, RejectsUnsupportedQuantizationMethod) {
  const std::string dir = edited_checkpoint("quantized", [](nlohmann::json& c) {
    c["quantization_config"] = {{"quant_method", "awq"}, {"weight_block_size", {128, 128}}};
  });
  EXPECT_THROW(from_pretrained(dir), Unsupported);
  std::filesystem::remove_all(dir);
}

// ---- the router alone ----

model::DeepseekRouterConfig router_config() {
  model::DeepseekRouterConfig c;
  c.num_experts = 8;  // 4 groups of 2
  c.top_k = 2;
  c.n_group = 4;
  c.topk_group = 2;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  return c;
}

float logit_of(double p) { return float(std::log(p / (1.0 - p))); }  // sigmoid^-1

TEST(DeepseekV3Router, GroupLimitBiasForChoiceOnlyAndScaling) {
  // Sigmoid scores per expert (groups {0,1} {2,3} {4,5} {6,7}):
  //   expert 0 has the single best score 0.95 but its group's pair sum is the lowest;
  //   groups {2,3} and {4,5} have the best pair sums; expert 5 is pushed over 4 by the bias only.
  const std::vector<double> p = {0.95, 0.01, 0.60, 0.50, 0.55, 0.52, 0.30, 0.30};
  const std::vector<float> bias = {0.f, 0.f, 0.f, 0.f, 0.f, 0.1f, 0.f, 0.f};
  std::vector<float> lg;
  for (double v : p) lg.push_back(logit_of(v));
  Tensor logits = Tensor::from_floats(lg, {1, 8});
  Tensor corr = Tensor::from_floats(bias, {8});
  ops::Routing r = ops::sigmoid_group_topk(logits, corr, router_config());
  // Choice scores: 0.60 (e2), 0.62 (e5 = 0.52 + 0.1): expert 0 is excluded by its group.
  // Slot order is torch's unsorted top-k order; compare the (id -> weight) pairs.
  const std::vector<int64_t> idx = r.top_k_index.to_int_vector();
  const std::vector<float> w = r.top_k_weights.to_float_vector();
  ASSERT_EQ(idx.size(), 2u);
  std::map<int64_t, float> got = {{idx[0], w[0]}, {idx[1], w[1]}};
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(got.count(5) && got.count(2)) << "chose " << idx[0] << ", " << idx[1];
  // Weights use the unbiased scores, renormalised, times 2.5.
  const double s5 = 1.0 / (1.0 + std::exp(-double(lg[5]))), s2 = 1.0 / (1.0 + std::exp(-double(lg[2])));
  EXPECT_NEAR(got[5], 2.5 * s5 / (s5 + s2), 1e-6);
  EXPECT_NEAR(got[2], 2.5 * s2 / (s5 + s2), 1e-6);
}

TEST(DeepseekV3Router, WithoutNormalisationWeightsAreScaledScores) {
  model::DeepseekRouterConfig c = router_config();
  c.norm_topk_prob = false;
  c.n_group = 1;
  c.topk_group = 1;
  const std::vector<double> p = {0.95, 0.01, 0.60, 0.50, 0.55, 0.52, 0.30, 0.30};
  std::vector<float> lg;
  for (double v : p) lg.push_back(logit_of(v));
  ops::Routing r = ops::sigmoid_group_topk(Tensor::from_floats(lg, {1, 8}), Tensor::zeros({8}, DType::kF32), c);
  const std::vector<int64_t> idx = r.top_k_index.to_int_vector();
  const std::vector<float> w = r.top_k_weights.to_float_vector();
  std::map<int64_t, float> got = {{idx[0], w[0]}, {idx[1], w[1]}};
  ASSERT_TRUE(got.count(0) && got.count(2)) << "chose " << idx[0] << ", " << idx[1];
  EXPECT_NEAR(got[0], 2.5 * 0.95, 1e-5);
  EXPECT_NEAR(got[2], 2.5 * 0.60, 1e-5);
}

TEST(DeepseekV3Router, RejectsInconsistentConfig) {
  model::DeepseekRouterConfig c = router_config();
  c.n_group = 3;  // does not divide 8
  EXPECT_THROW(model::validate_router_config(c, "cfg"), InvalidInput);
  c = router_config();
  c.topk_group = 5;
  EXPECT_THROW(model::validate_router_config(c, "cfg"), InvalidInput);
  c = router_config();
  c.top_k = 5;  // only 2 groups x 2 experts are kept
  EXPECT_THROW(model::validate_router_config(c, "cfg"), InvalidInput);
  for (float f : {0.0f, -1.0f, std::numeric_limits<float>::infinity()}) {
    c = router_config();
    c.routed_scaling_factor = f;
    EXPECT_THROW(model::validate_router_config(c, "cfg"), InvalidInput) << f;
  }
  EXPECT_NO_THROW(model::validate_router_config(router_config(), "cfg"));
}

// ---- MLA softmax scale ----

TEST(DeepseekV3Mla, SoftmaxScaleDefaultRope) {
  const auto cfg = nlohmann::json::parse(R"({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})");
  EXPECT_FLOAT_EQ(model::mla_softmax_scale(cfg, 48, "cfg"), float(1.0 / std::sqrt(48.0)));
  EXPECT_FLOAT_EQ(model::mla_softmax_scale(nlohmann::json::object(), 48, "cfg"), float(1.0 / std::sqrt(48.0)));
}

TEST(DeepseekV3Mla, SoftmaxScaleYarnMscaleAllDim) {
  // DeepSeek-V3's own config.json (legacy "rope_scaling" with "type"): qk_head_dim 192.
  const auto cfg = nlohmann::json::parse(R"({"rope_theta": 10000, "rope_scaling": {"beta_fast": 32,
      "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
      "original_max_position_embeddings": 4096, "type": "yarn"}})");
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_FLOAT_EQ(model::mla_softmax_scale(cfg, 192, "cfg"), float(m * m / std::sqrt(192.0)));
  // Without mscale_all_dim the scale stays qk_head_dim^-0.5.
  auto no_all = cfg;
  no_all["rope_scaling"].erase("mscale_all_dim");
  EXPECT_FLOAT_EQ(model::mla_softmax_scale(no_all, 192, "cfg"), float(1.0 / std::sqrt(192.0)));
  auto no_factor = cfg;
  no_factor["rope_scaling"].erase("factor");
  EXPECT_THROW(model::mla_softmax_scale(no_factor, 192, "cfg"), InvalidInput);
}

}  // namespace
}  // namespace moex
