// A CUDA-only backend written outside the library (examples/cuda_naive_backend_plugin.cu: one
// class, one registration line) joins the registry when its shared library is loaded, serves
// CUDA tensors through the same calls as the built-in backends, and is refused, with the reason,
// on the CPU. On a GPU it must pass the same float64-reference harness as every backend.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "support/test_support.hpp"

#ifndef MOEX_CUDA_PLUGIN_PATH

TEST(CudaPlugin, SkippedInCpuOnlyBuild) { GTEST_SKIP() << "built without CUDA (MOEX_CUDA=OFF)"; }

#else

#include "cuda/runtime.hpp"

using namespace moex;
using namespace moex::test;

namespace {

void load_plugin() {
  static void* handle = dlopen(MOEX_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
}

TEST(CudaPlugin, RegistersACudaOnlyBackend) {
  load_plugin();
  ASSERT_TRUE(has_experts_backend("cuda_naive"));
  const auto impls = experts_backend_implementations("cuda_naive");
  ASSERT_EQ(impls.size(), 1u);
  EXPECT_EQ(impls[0]->caps().devices, std::vector<DeviceKind>{DeviceKind::kCUDA});
  EXPECT_TRUE(impls[0]->caps().graph_capturable);
  // The built-in names are untouched by it.
  EXPECT_EQ(experts_backend_implementations("grouped_mm").size(), 2u);
}

TEST(CudaPlugin, RefusesHostTensorsWithTheReason) {
  load_plugin();
  const ExpertsSpec s = make_experts_spec({true, false, false, true}, 4, 16, 8, Activation::kSilu);
  const ExpertsWeights w = random_experts_weights(s, DType::kF32, 3);
  const Routing r = random_routing(s, 3, 2, DType::kF32, 4, RoutingCase::kRandom);
  try {
    experts_forward("cuda_naive", s, w, r.hidden, r.top_k_index, r.top_k_weights);
    FAIL() << "a CUDA-only backend ran on host tensors";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("runs on cuda:0, not on cpu"), std::string::npos) << e.what();
  }
}

TEST(CudaPlugin, RefusesLayoutsItDoesNotServe) {
  load_plugin();
  const ExpertsSpec s = make_experts_spec({true, true, false, true}, 4, 16, 8, Activation::kSilu);
  const std::string why =
      get_experts_backend("cuda_naive")->unsupported_reason(s, DType::kBF16, Device::cuda());
  EXPECT_NE(why.find("without biases"), std::string::npos) << why;
}

TEST(CudaPlugin, MatchesTheReferenceOnTheGpu) {
  load_plugin();
  if (moex::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 31000;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t T : {0, 1, 7, 64})
      for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kDuplicates, RoutingCase::kSentinels}) {
        const ExpertsSpec s = make_experts_spec({true, false, false, true}, 5, 37, 19, Activation::kSilu);
        check_experts_case(Device::cuda(), "cuda_naive", s, dt, T, 3, rc, ++seed);
      }
}

}  // namespace

#endif
