// Every backend reproduces the experts module outputs that transformers recorded for the six
// architectures (experts_cases.safetensors: the first MoE layer's experts called alone, fp32),
// with the weights read from the fixture checkpoint exactly as the hub stores them.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "moex/check.hpp"
#include "moex/experts.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

using namespace moex;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

// Stacks per-expert [rows, cols] matrices (first the `first` names, then the `second` names per
// expert) into [E, rows_a + rows_b, cols], fp32.
Tensor stack_experts(const SafetensorsFile& f, const std::string& prefix, int64_t E,
                     const std::vector<std::string>& parts) {
  std::vector<float> all;
  Shape one;
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e)
    for (const auto& part : parts) {
      Tensor t = f.get(prefix + "." + std::to_string(e) + "." + part + ".weight");
      auto v = t.to_float_vector();
      all.insert(all.end(), v.begin(), v.end());
      if (e == 0) rows += t.size(0);
      one = t.shape();
    }
  return Tensor::from_floats(all, {E, rows, one[1]});
}

struct Fixture {
  ExpertsSpec spec;
  ExpertsWeights weights;
};

Fixture load_fixture(const std::string& model) {
  const std::string dir = test::data_path("hf-tiny/" + model);
  auto meta = read_json(dir + "/meta.json");
  auto config = read_json(dir + "/checkpoint_fp32/config.json");
  auto f = SafetensorsFile::open(dir + "/checkpoint_fp32/model.safetensors");
  std::string module = meta["experts_module"];
  auto flags = meta["experts_flags"];
  Fixture fx;
  ExpertsSpec& s = fx.spec;
  s.has_gate = flags["has_gate"];
  s.has_bias = flags["has_bias"];
  s.is_transposed = flags["is_transposed"];
  s.is_concatenated = flags["is_concatenated"];
  s.hidden = config["hidden_size"];
  if (model == "gpt_oss") {
    s.act = Activation::kSwigluOai;
    s.swiglu_limit = config.value("swiglu_limit", 7.0f);
    s.swiglu_alpha = 1.702f;
    fx.weights.gate_up = f->get(module + ".gate_up_proj");
    fx.weights.gate_up_bias = f->get(module + ".gate_up_proj_bias");
    fx.weights.down = f->get(module + ".down_proj");
    fx.weights.down_bias = f->get(module + ".down_proj_bias");
    s.num_experts = fx.weights.gate_up.size(0);
    s.intermediate = fx.weights.down.size(1);
    return fx;
  }
  s.act = parse_activation(config["hidden_act"].get<std::string>());
  // Mixtral's hub names: block_sparse_moe.experts.N.{w1 = gate, w3 = up, w2 = down}.
  std::string prefix = module;
  std::vector<std::string> gate_up = {"gate_proj", "up_proj"};
  std::string down = "down_proj";
  if (!f->contains(prefix + ".0.gate_proj.weight")) {
    prefix = module.substr(0, module.find(".mlp.")) + ".block_sparse_moe.experts";
    gate_up = {"w1", "w3"};
    down = "w2";
  }
  int64_t E = 0;
  while (f->contains(prefix + "." + std::to_string(E) + "." + down + ".weight")) ++E;
  s.num_experts = E;
  fx.weights.gate_up = stack_experts(*f, prefix, E, gate_up);
  fx.weights.down = stack_experts(*f, prefix, E, {down});
  s.intermediate = fx.weights.down.size(2);
  return fx;
}

class ExpertsFixtures
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(ExpertsFixtures, MatchesTransformers) {
  const auto& [model, backend] = GetParam();
  Fixture fx = load_fixture(model);
  auto cases = SafetensorsFile::open(test::data_path("hf-tiny/" + model + "/experts_cases.safetensors"));
  for (int T : {1, 7, 64}) {
    std::string p = "T" + std::to_string(T) + "_";
    Tensor hidden = cases->get(p + "hidden"), idx = cases->get(p + "top_k_index");
    Tensor w = cases->get(p + "top_k_weights"), expected = cases->get(p + "out");
    Tensor out = experts_forward(backend, fx.spec, fx.weights, hidden, idx, w);
    double err = rel_l2_error(out, expected);
    // transformers ran fp32 with its own summation order: float32 accuracy, not bit equality.
    EXPECT_LE(err, 1e-5) << model << " " << backend << " T=" << T << " spec " << fx.spec.str();
    // And the float64 reference agrees with transformers too (the fixture is what we think).
    Tensor ref = experts_reference_f64(fx.spec, fx.weights, hidden, idx, w);
    EXPECT_LE(rel_l2_error(expected, ref), 1e-5) << model << " T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(
    SixModels, ExpertsFixtures,
    ::testing::Combine(::testing::Values("qwen2_moe", "qwen3_moe", "mixtral", "olmoe",
                                         "deepseek_v3", "gpt_oss"),
                       ::testing::Values("eager", "batched_mm", "grouped_mm")),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
