// Every registered CPU backend against the float64 reference, on fresh seeded random inputs:
// all layout flags, every activation, T = 0/1/7/64/1000, every routing case, [T,k] and [T,E]
// weights, int32/int64 ids, bf16/f16/f32, ugly sizes. The seed is in every failure message.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <functional>

#include <tuple>

#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "support/test_support.hpp"

using namespace moex;
using namespace moex::test;

namespace {


void check_case(const std::string& backend, const ExpertsSpec& s, DType dt, int64_t T, int64_t k,
                RoutingCase rc, uint64_t seed, bool per_expert = false,
                DType idx_dt = DType::kI64) {
  check_experts_case(Device::cpu(), backend, s, dt, T, k, rc, seed, per_expert, idx_dt);
}

class Consistency : public ::testing::TestWithParam<std::string> {};

TEST_P(Consistency, AllLayoutsAllTokenCounts) {
  uint64_t seed = 1000;
  for (const ExpertsLayout& l : all_experts_layouts())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int64_t T : {0, 1, 7, 64, 1000}) {
        ExpertsSpec s = make_experts_spec(l, 9, T == 1000 ? 19 : 111, 13, Activation::kSilu);
        check_case(GetParam(), s, dt, T, 3, RoutingCase::kRandom, ++seed);
      }
}

TEST_P(Consistency, RoutingCases) {
  uint64_t seed = 2000;
  for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kEveryExpert,
                         RoutingCase::kEmptyExperts, RoutingCase::kDuplicates,
                         RoutingCase::kSentinels})
    for (int64_t T : {1, 7, 64}) {
      ExpertsSpec s = make_experts_spec({true, false, false, true}, 11, 111, 13, Activation::kSilu);
      check_case(GetParam(), s, DType::kF32, T, 4, rc, ++seed);
      check_case(GetParam(), s, DType::kBF16, T, 4, rc, ++seed, /*per_expert=*/true);
      check_case(GetParam(), s, DType::kF32, T, 4, rc, ++seed, false, DType::kI32);
    }
}

TEST_P(Consistency, Activations) {
  uint64_t seed = 3000;
  for (Activation a : {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh,
                       Activation::kRelu, Activation::kSwigluOai})
    for (const ExpertsLayout& l : all_experts_layouts()) {
      if (a == Activation::kSwigluOai && !l.gate) continue;
      ExpertsSpec s = make_experts_spec(l, 5, 19, 13, a);
      check_case(GetParam(), s, DType::kF32, 7, 2, RoutingCase::kRandom, ++seed);
      check_case(GetParam(), s, DType::kF16, 7, 2, RoutingCase::kRandom, ++seed);
    }
}

TEST_P(Consistency, SingleExpertTopOne) {
  ExpertsSpec s = make_experts_spec({true, true, true, false}, 1, 19, 13, Activation::kSwigluOai);
  check_case(GetParam(), s, DType::kF32, 64, 1, RoutingCase::kRandom, 4001);
}

// A wrong kernel must fail the same check: perturb one weight of the backend's input only.
TEST_P(Consistency, HarnessDetectsAPerturbedWeight) {
  ExpertsSpec s = make_experts_spec({true, false, false, true}, 4, 19, 13, Activation::kSilu);
  ExpertsWeights w = random_experts_weights(s, DType::kF32, 5001);
  Routing r = random_routing(s, 16, 2, DType::kF32, 5001, RoutingCase::kEveryExpert);
  Tensor ref = experts_reference_f64(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  ExpertsWeights bad = w;
  bad.down = w.down.clone();
  bad.down.data<float>()[7] += 0.05f;
  Tensor out = experts_forward(GetParam(), s, bad, r.hidden, r.top_k_index, r.top_k_weights);
  EXPECT_GT(rel_l2_error(out, ref), experts_tolerance(DType::kF32, 19));
}

// The same at 16 bits, through the check every suite runs: one weight of down, or of gate_up,
// moved by the largest weight magnitude of that tensor (a change no larger than one weight) must
// fail the bf16 and f16 tolerances too. Exactly one failure is expected, the tolerance check's.
TEST_P(Consistency, HarnessDetectsAPerturbedWeightAt16Bits) {
  const ExpertsSpec s = make_experts_spec({true, false, false, true}, 4, 19, 13, Activation::kSilu);
  const WeightsPerturbation down = [](ExpertsWeights& w) { w.down = add_largest_magnitude(w.down, 7); };
  const WeightsPerturbation gate_up = [](ExpertsWeights& w) {
    w.gate_up = add_largest_magnitude(w.gate_up, 30);
  };
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    EXPECT_NONFATAL_FAILURE(check_experts_case_perturbed(Device::cpu(), GetParam(), s, dt, 16, 2,
                                                         RoutingCase::kEveryExpert, 5001, down),
                            "(weights perturbed)");
    EXPECT_NONFATAL_FAILURE(check_experts_case_perturbed(Device::cpu(), GetParam(), s, dt, 16, 2,
                                                         RoutingCase::kEveryExpert, 5002, gate_up),
                            "(weights perturbed)");
    // And unperturbed, the same cases pass: the failures above come from the perturbation.
    check_case(GetParam(), s, dt, 16, 2, RoutingCase::kEveryExpert, 5001);
    check_case(GetParam(), s, dt, 16, 2, RoutingCase::kEveryExpert, 5002);
  }
}

// The float64 references check the call's inputs as the backends do: a hidden width other than H,
// fewer index rows than tokens, weights neither [T, k] nor [T, E] are refused, never read out of
// range.
TEST(ReferenceInputs, MisShapedInputsAreRefused) {
  ExpertsSpec s = make_experts_spec({true, false, false, true}, 4, 19, 13, Activation::kSilu);
  ExpertsWeights w = random_experts_weights(s, DType::kF32, 6001);
  Routing r = random_routing(s, 5, 2, DType::kF32, 6001, RoutingCase::kRandom);
  EXPECT_NO_THROW(experts_reference_f64(s, w, r.hidden, r.top_k_index, r.top_k_weights));
  const Tensor wide = Tensor::zeros({5, 20}, DType::kF32);
  const Tensor short_idx = r.top_k_index.slice(0, 0, 3).contiguous();
  const Tensor odd_weights = Tensor::zeros({5, 3}, DType::kF32);
  for (auto call : {std::function<void()>([&] { experts_reference_f64(s, w, wide, r.top_k_index, r.top_k_weights); }),
                    std::function<void()>([&] { experts_reference_f64(s, w, r.hidden, short_idx, r.top_k_weights); }),
                    std::function<void()>([&] { experts_reference_f64(s, w, r.hidden, r.top_k_index, odd_weights); }),
                    std::function<void()>(
                        [&] { experts_reference_f64_bounded(s, w, wide, r.top_k_index, r.top_k_weights, 0); })})
    EXPECT_THROW(call(), InvalidInput);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Consistency,
                         ::testing::Values("eager", "batched_mm", "grouped_mm", "auto"),
                         [](const auto& info) { return info.param; });

}  // namespace
