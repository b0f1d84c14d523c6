// Every backend reproduces transformers' experts module with hidden_act = gelu (exact erf) and
// relu, which no model fixture uses (tests/data/activation-experts, made by
// tools/make_activation_experts_cases.py: Qwen2MoeExperts with random weights, fp32, T = 1, 7, 64).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "moex/check.hpp"
#include "moex/experts.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

using namespace moex;

namespace {

struct ActivationFixture {
  ExpertsSpec spec;
  ExpertsWeights weights;
  std::shared_ptr<SafetensorsFile> cases;
};

ActivationFixture load(const std::string& act) {
  const std::string dir = test::data_path("activation-experts/" + act);
  std::ifstream meta_file(dir + "/meta.json");
  if (!meta_file) throw std::runtime_error("cannot open " + dir + "/meta.json");
  const auto meta = nlohmann::json::parse(meta_file);
  ActivationFixture fx;
  fx.cases = SafetensorsFile::open(dir + "/experts_cases.safetensors");
  fx.weights.gate_up = fx.cases->get("gate_up_proj");  // [E, 2I, H]: gate rows, then up rows
  fx.weights.down = fx.cases->get("down_proj");        // [E, H, I]
  ExpertsSpec& s = fx.spec;
  s.num_experts = fx.weights.gate_up.size(0);
  s.hidden = fx.weights.gate_up.size(2);
  s.intermediate = fx.weights.down.size(2);
  s.has_gate = true;
  s.is_concatenated = true;
  s.act = parse_activation(meta.at("hidden_act").get<std::string>());
  return fx;
}

class ActivationFixtures
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(ActivationFixtures, MatchesTransformers) {
  const auto& [act, backend, device_name] = GetParam();
  const Device dev = parse_device(device_name);
  if (dev.is_cuda() && test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  ActivationFixture fx = load(act);
  ASSERT_EQ(activation_name(fx.spec.act), act);
  const ExpertsWeights w = test::experts_weights_to(fx.weights, dev);
  for (int T : {1, 7, 64}) {
    const std::string p = "T" + std::to_string(T) + "_";
    const Tensor hidden = fx.cases->get(p + "hidden"), idx = fx.cases->get(p + "top_k_index");
    const Tensor tw = fx.cases->get(p + "top_k_weights"), expected = fx.cases->get(p + "out");
    const Tensor out = experts_forward(backend, fx.spec, w, hidden.to(dev), idx.to(dev), tw.to(dev));
    // transformers ran fp32 with its own summation order: float32 accuracy, not bit equality.
    EXPECT_LE(rel_l2_error(out.to(Device::cpu()), expected), 1e-5)
        << act << " " << backend << " T=" << T;
  }
}

// The float64 reference agrees with transformers, and the cases tell the activations apart: the
// same weights under any other activation miss transformers' output by more than five times the
// 1e-5 above (gelu_tanh against gelu is the closest pair: 1.5e-4 to 2.3e-4 on these cases).
TEST(ActivationFixturesReference, AgreesAndDiscriminates) {
  for (const std::string act : {"gelu", "relu"}) {
    ActivationFixture fx = load(act);
    for (int T : {1, 7, 64}) {
      const std::string p = "T" + std::to_string(T) + "_";
      const Tensor hidden = fx.cases->get(p + "hidden"), idx = fx.cases->get(p + "top_k_index");
      const Tensor tw = fx.cases->get(p + "top_k_weights"), expected = fx.cases->get(p + "out");
      EXPECT_LE(rel_l2_error(expected, experts_reference_f64(fx.spec, fx.weights, hidden, idx, tw)),
                1e-5)
          << act << " T=" << T;
      for (Activation other : {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh,
                               Activation::kRelu}) {
        if (other == fx.spec.act) continue;
        ExpertsSpec s = fx.spec;
        s.act = other;
        EXPECT_GT(rel_l2_error(expected, experts_reference_f64(s, fx.weights, hidden, idx, tw)), 5e-5)
            << act << " case matched by " << activation_name(other) << " at T=" << T;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    GeluRelu, ActivationFixtures,
    ::testing::Combine(::testing::Values("gelu", "relu"),
                       ::testing::Values("eager", "batched_mm", "grouped_mm"),
                       ::testing::Values("cpu", "cuda")),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
    });

}  // namespace
