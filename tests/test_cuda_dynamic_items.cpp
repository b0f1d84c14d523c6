// The wgmma kernels' dynamic schedule (ExpertsPlan::dynamic_items: each CTA claims its next work
// item from a counter instead of a fixed round-robin share). Every item is computed the same way
// whichever CTA takes it, so the outputs must equal the static schedule's bit for bit: grouped_mm
// (bf16), sonicmoe (hidden rows read in place) and deepgemm (FP8), on shapes with several waves
// of items, every routing case, repeated calls (the counters are left at zero by each launch)
// and a captured graph replayed with new routing. The plan checks run without a GPU; the GPU
// tests skip cleanly without a Hopper GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "support/test_support.hpp"

#ifndef MOEX_WITH_CUDA

TEST(CudaDynamicItems, SkippedInCpuOnlyBuild) {
  GTEST_SKIP() << "built without CUDA (MOEX_CUDA=OFF)";
}

#else

#include "cuda/experts_backend.hpp"
#include "cuda/experts_ops.hpp"
#include "cuda/runtime.hpp"
#include "support/cuda_experts_checks.hpp"

using namespace moex;
using namespace moex::test;
namespace mc = moex::cuda;

namespace {

// The library's backend `base` with the schedule forced (dynamic or static) on its plan.
class Schedule final : public mc::CudaExpertsBackend {
 public:
  enum class Base { kGroupedMm, kSonicMoe, kDeepGemm };
  Schedule(Base b, bool dynamic) : base_(b), dynamic_(dynamic) {}

 protected:
  std::string description() const override { return "work items' schedule forced (tests)"; }
  mc::ExpertsPlan plan(const mc::ExpertsArgs& a, const mc::DeviceTraits& d) const override {
    const mc::ExpertsShape s = mc::shape_of(a);
    mc::ExpertsPlan p = base_ == Base::kSonicMoe   ? mc::plan_sonicmoe(s, d)
                        : base_ == Base::kDeepGemm ? mc::plan_deepgemm(s, d)
                                                   : mc::plan_grouped_mm(s, d);
    const bool wgmma = p.gemm == mc::GemmPath::kWgmma || p.gemm == mc::GemmPath::kWgmmaFp8;
    EXPECT_TRUE(wgmma) << "the test's shapes must run the wgmma kernels: " << p.describe();
    p.dynamic_items = wgmma && dynamic_;
    mc::check_plan(p, s, d);
    return p;
  }
  size_t workspace_bytes(const mc::ExpertsArgs& a, const mc::ExpertsPlan& p) const override {
    return base_ == Base::kSonicMoe ? mc::sonicmoe_workspace_bytes(a, p)
                                    : mc::grouped_mm_workspace_bytes(a, p);
  }
  void run(const mc::ExpertsArgs& a, const mc::ExpertsPlan& p, void* ws,
           cudaStream_t st) const override {
    if (base_ == Base::kSonicMoe) mc::sonicmoe_experts(a, p, ws, st);
    else mc::grouped_mm_experts(a, p, ws, st);
  }

 private:
  Base base_;
  bool dynamic_;
};

const bool registered = [] {
  using B = Schedule::Base;
  for (auto [name, base] : {std::pair{"grouped_mm", B::kGroupedMm}, {"sonicmoe", B::kSonicMoe},
                            {"deepgemm", B::kDeepGemm}}) {
    register_experts_backend(std::string(name) + "_dynamic_items",
                             std::make_shared<Schedule>(base, true));
    register_experts_backend(std::string(name) + "_static_items",
                             std::make_shared<Schedule>(base, false));
  }
  return true;
}();

ExpertsSpec gated(int64_t E, int64_t H, int64_t I) {
  return make_experts_spec(ExpertsLayout{true, false, false, true}, E, H, I, Activation::kSilu);
}

// `<base>_dynamic_items` and `<base>_static_items` on the same routing, three calls of the
// dynamic one in a row: all equal.
void expect_same_as_static(const std::string& base,
                           const ExpertsSpec& s, const ExpertsWeights& w, int64_t T, int64_t k,
                           RoutingCase rc, uint64_t seed) {
  const std::string dynamic = base + "_dynamic_items";
  SCOPED_TRACE(dynamic + " T=" + std::to_string(T) + " " + routing_case_name(rc));
  const ExpertsWeights wg = experts_weights_to(w, Device::cuda());
  const Routing r = random_routing(s, T, k, DType::kBF16, seed, rc);
  const Tensor x = on_gpu(r.hidden), idx = on_gpu(r.top_k_index), tw = on_gpu(r.top_k_weights);
  const Tensor want = experts_forward(base + "_static_items", s, wg, x, idx, tw).to(Device::cpu());
  for (int call = 0; call < 3; ++call) {
    const Tensor got = experts_forward(dynamic, s, wg, x, idx, tw).to(Device::cpu());
    ASSERT_EQ(got.nbytes(), want.nbytes());
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << "call " << call;
  }
}

}  // namespace

// Only the wgmma paths claim items; the plan says so in its description. sonicmoe's plan claims
// them (its gate_up reads the hidden rows in place), grouped_mm's and deepgemm's do not.
TEST(CudaDynamicItemsPlan, WgmmaPathsOnly) {
  const mc::DeviceTraits h100{9, 0, 132};
  mc::ExpertsPlan p = mc::plan_grouped_mm(experts_shape(false, 4096, 8, 64, 2048, 1408), h100);
  ASSERT_EQ(p.gemm, mc::GemmPath::kWgmma);
  EXPECT_FALSE(p.dynamic_items);
  p.dynamic_items = true;
  EXPECT_NO_THROW(mc::check_plan(p, experts_shape(false, 4096, 8, 64, 2048, 1408), h100));
  EXPECT_NE(p.describe().find("claimed at run time"), std::string::npos) << p.describe();
  mc::ExpertsPlan gemv = mc::plan_grouped_mm(experts_shape(false, 1, 8, 64, 2048, 1408), h100);
  ASSERT_NE(gemv.gemm, mc::GemmPath::kWgmma);
  gemv.dynamic_items = true;
  EXPECT_THROW(mc::check_plan(gemv, experts_shape(false, 1, 8, 64, 2048, 1408), h100), InvalidInput);
  EXPECT_TRUE(mc::plan_sonicmoe(experts_shape(false, 4096, 8, 64, 2048, 1408), h100).dynamic_items);
  EXPECT_FALSE(mc::plan_deepgemm(experts_shape(true, 4096, 8, 64, 2048, 1408), h100).dynamic_items);
}

TEST(CudaDynamicItems, Bf16EqualsStaticSchedule) {
  SKIP_WITHOUT_HOPPER();
  // gate_up: 16 column blocks x ~20 tiles at T = 1000 (more items than SMs); K, N tails.
  const ExpertsSpec big = gated(8, 512, 2048), tails = gated(9, 264, 200);
  const ExpertsWeights wb = random_experts_weights(big, DType::kBF16, 9801);
  const ExpertsWeights wt = random_experts_weights(tails, DType::kBF16, 9802);
  uint64_t seed = 9810;
  for (int64_t T : {300, 1000, 2000})
    for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kEmptyExperts,
                           RoutingCase::kDuplicates, RoutingCase::kSentinels}) {
      expect_same_as_static("grouped_mm", big, wb, T, 2, rc, ++seed);
      expect_same_as_static("sonicmoe", big, wb, T, 2, rc, ++seed);
      expect_same_as_static("deepgemm", tails, wt, T, 3, rc, ++seed);
    }
  check_experts_case(Device::cuda(), "sonicmoe_dynamic_items", big, DType::kBF16, 1000, 2,
                     RoutingCase::kRandom, ++seed);
}

TEST(CudaDynamicItems, Fp8EqualsStaticSchedule) {
  SKIP_WITHOUT_HOPPER();
  const ExpertsSpec q = quantized_spec(QuantScheme::Kind::kFp8E4M3, DType::kF32, 8, 512, 2048);
  const ExpertsWeights w = random_quantized_experts_weights(q, 9901);
  uint64_t seed = 9910;
  for (int64_t T : {300, 1000})
    for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kSentinels}) {
      expect_same_as_static("deepgemm", q, w, T, 3, rc, ++seed);
      expect_same_as_static("grouped_mm", q, w, T, 3, rc, ++seed);
    }
}

TEST(CudaDynamicItems, GraphReplayEqualsDirectLaunches) {
  SKIP_WITHOUT_HOPPER();
  const ExpertsSpec s = gated(8, 512, 2048);
  const ExpertsWeights w = random_experts_weights(s, DType::kBF16, 9951);
  for (const char* b : {"grouped_mm_dynamic_items", "sonicmoe_dynamic_items"})
    expect_graph_replay_equals_direct(b, s, w, 1000, 9952);
  const ExpertsSpec q = quantized_spec(QuantScheme::Kind::kFp8E4M3, DType::kF32, 8, 512, 2048);
  expect_graph_replay_equals_direct("deepgemm_dynamic_items", q,
                                    random_quantized_experts_weights(q, 9953), 1000, 9954);
}

#endif
