// Every backend reproduces the experts module outputs that transformers recorded for the six
// architectures (experts_cases.safetensors: the first MoE layer's experts called alone, fp32),
// with the weights read from the fixture checkpoint exactly as the hub stores them.
#include <gtest/gtest.h>

#include "moex/check.hpp"
#include "moex/experts.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

using namespace moex;

namespace {

class ExpertsFixtures
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(ExpertsFixtures, MatchesTransformers) {
  const auto& [model, backend, device_name] = GetParam();
  Device dev = parse_device(device_name);
  if (dev.is_cuda() && test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  test::ExpertsFixture fx = test::load_experts_fixture(model);
  auto on = [&](const Tensor& t) { return t.defined() ? t.to(dev) : t; };
  if (dev.is_cuda()) {
    ExpertsWeights& w = fx.weights;
    w.gate_up = on(w.gate_up), w.down = on(w.down);
    w.gate_up_bias = on(w.gate_up_bias), w.down_bias = on(w.down_bias);
  }
  auto cases = SafetensorsFile::open(test::data_path("hf-tiny/" + model + "/experts_cases.safetensors"));
  for (int T : {1, 7, 64}) {
    std::string p = "T" + std::to_string(T) + "_";
    Tensor hidden = cases->get(p + "hidden"), idx = cases->get(p + "top_k_index");
    Tensor w = cases->get(p + "top_k_weights"), expected = cases->get(p + "out");
    Tensor out = experts_forward(backend, fx.spec, fx.weights, on(hidden), on(idx), on(w));
    double err = rel_l2_error(out, expected);
    // transformers ran fp32 with its own summation order: float32 accuracy, not bit equality.
    EXPECT_LE(err, 1e-5) << model << " " << backend << " T=" << T << " spec " << fx.spec.str();
    // And the float64 reference agrees with transformers too (the fixture is what we think).
    Tensor ref = experts_reference_f64(fx.spec, fx.weights, on(hidden), on(idx), on(w));
    EXPECT_LE(rel_l2_error(expected, ref), 1e-5) << model << " T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(
    SixModels, ExpertsFixtures,
    ::testing::Combine(::testing::Values("qwen2_moe", "qwen3_moe", "mixtral", "olmoe",
                                         "deepseek_v3", "gpt_oss"),
                       ::testing::Values("eager", "batched_mm", "grouped_mm"),
                       ::testing::Values("cpu", "cuda")),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
    });

}  // namespace
