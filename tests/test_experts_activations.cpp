// Every activation and gate layout on a problem small enough to work out by hand: one expert,
// H = 1, I = 2, one token with x = 1 and routing weight 1, so that the gate_up product is the
// gate_up column itself and out = h0 + 10 h1 with down = [1, 10]. The expected values are the
// formulas below evaluated in double by hand (Python's math module), not by the project's code,
// so a bug in the activation code that the backends share (src/core/activation.hpp) or in the
// reference's own copy fails here even when the two agree with each other.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moex/experts.hpp"

namespace moex {
namespace {

// Values of the activations used below:
//   silu(2) = 2 / (1 + e^-2)                          =  1.7615941559557646
//   silu(-1) = -1 / (1 + e)                           = -0.2689414213699951
//   silu(-0.5)                                        = -0.1887703343990727
//   gelu(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2:  gelu(2) = 1.9544997361036416,
//     gelu(-1) = -0.15865525393145707, gelu(-0.5) = -0.15426876936299344
//   gelu_tanh(x) = x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2: gelu_tanh(2) =
//     1.954597694087775, gelu_tanh(-1) = -0.15880800939172324, gelu_tanh(-0.5) = -0.15428599017485606
//   relu(2) = 2, relu(-1) = relu(-0.5) = 0
// Gated cases: gate = (2, -1), up = (0.5, 3), so out = 0.5 act(2) + 30 act(-1).
// Ungated cases: gate_up = (2, -0.5), so out = act(2) + 10 act(-0.5).
struct ActCase {
  Activation act;
  double gated;    // 0.5 act(2) + 30 act(-1)
  double ungated;  // act(2) + 10 act(-0.5)
};
const ActCase kCases[] = {
    {Activation::kSilu, -7.187445563121972, -0.12610918803496252},
    {Activation::kGelu, -3.7824077498918913, 0.4118120424737073},
    {Activation::kGeluTanh, -3.786941434707809, 0.41173779233921426},
    {Activation::kRelu, 1.0, 2.0},
};

const std::vector<std::string> kBackends = {"eager", "batched_mm", "grouped_mm"};

ExpertsSpec tiny_spec(Activation act, bool gate, bool concat) {
  ExpertsSpec s;
  s.num_experts = 1;
  s.hidden = 1;
  s.intermediate = 2;
  s.has_gate = gate;
  s.is_concatenated = concat;
  s.act = act;
  return s;
}

// The reference and every CPU backend (float32) against the hand-computed value. The float32
// paths round the intermediate to float32, so 1e-6 relative is both safe and far below the
// differences between activations (gelu and gelu_tanh differ by 1e-3 here).
void expect_output(const ExpertsSpec& s, const std::vector<float>& gate_up, double expected,
                   const std::string& what) {
  ExpertsWeights w;
  w.gate_up = Tensor::from_floats(gate_up, s.gate_up_shape());
  w.down = Tensor::from_floats({1.0f, 10.0f}, s.down_shape());
  const Tensor x = Tensor::from_floats({1.0f}, {1, 1});
  const Tensor idx = Tensor::from_ints({0}, {1, 1});
  const Tensor wt = Tensor::from_floats({1.0f}, {1, 1});
  const double tol = 1e-6 * std::max(1.0, std::fabs(expected));
  const Tensor ref = experts_reference_f64(s, w, x, idx, wt);
  EXPECT_NEAR(ref.item_double({0, 0}), expected, tol) << "reference " << what << " " << s.str();
  for (const auto& b : kBackends) {
    const Tensor out = experts_forward(b, s, w, x, idx, wt);
    EXPECT_NEAR(out.item_double({0, 0}), expected, tol) << b << " " << what << " " << s.str();
  }
}

TEST(ExpertsActivations, GatedConcatenated) {
  // Stored rows: gate 0, gate 1, up 0, up 1.
  for (const auto& c : kCases)
    expect_output(tiny_spec(c.act, true, true), {2.0f, -1.0f, 0.5f, 3.0f}, c.gated, "concat");
}

TEST(ExpertsActivations, GatedInterleaved) {
  // The same gate and up values stored as gate 0, up 0, gate 1, up 1.
  for (const auto& c : kCases)
    expect_output(tiny_spec(c.act, true, false), {2.0f, 0.5f, -1.0f, 3.0f}, c.gated, "interleaved");
}

TEST(ExpertsActivations, Ungated) {
  for (const auto& c : kCases)
    expect_output(tiny_spec(c.act, false, true), {2.0f, -0.5f}, c.ungated, "ungated");
}

// gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit), h = (u + 1) g sigmoid(alpha g),
// with limit 1.5 and alpha = 1.702f (the float value, 1.70200002193...).
//   gate 0 = 2 -> 1.5, up 0 = -2.5 -> -1.5: h0 = -0.5 x 1.5 x sigmoid(2.553)  = -0.6958311008770671
//   gate 1 = -3 (no lower clamp), up 1 = 0.5: h1 = 1.5 x -3 x sigmoid(-5.106) = -0.027106962788689914
//   out = h0 + 10 h1 = -0.9669007287639663
TEST(ExpertsActivations, GptOssClampedSwiglu) {
  const double expected = -0.9669007287639663;
  for (bool concat : {true, false}) {
    ExpertsSpec s = tiny_spec(Activation::kSwigluOai, true, concat);
    s.swiglu_limit = 1.5f;
    s.swiglu_alpha = 1.702f;
    const std::vector<float> gu = concat ? std::vector<float>{2.0f, -3.0f, -2.5f, 0.5f}
                                         : std::vector<float>{2.0f, -2.5f, -3.0f, 0.5f};
    expect_output(s, gu, expected, concat ? "concat" : "interleaved");
  }
}

}  // namespace
}  // namespace moex
