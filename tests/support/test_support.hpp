// The one consistency harness every backend is checked with: seeded random experts and routing,
// a float64 reference, a normalised error computed in double and a tolerance derived from the
// dtype and the reduction length (ggml test-backend-ops, DeepGEMM calc_diff).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "moex/check.hpp"
#include "moex/experts.hpp"
#include "moex/tensor.hpp"

namespace moex::test {

// Weights ~ U(-a, a) with a = 1/sqrt(fan_in) (so activations stay O(1)), biases ~ U(-0.5, 0.5),
// rounded to `dtype`, stored in the layout the spec describes.
ExpertsWeights random_experts_weights(const ExpertsSpec& spec, DType dtype, uint64_t seed);

// The layout flags of an experts spec; all_experts_layouts() lists the 12 combinations
// (gated concatenated / gated interleaved / ungated) x bias x transposed.
struct ExpertsLayout {
  bool gate, bias, transposed, concat;
};
std::vector<ExpertsLayout> all_experts_layouts();
std::string experts_layout_name(const ExpertsLayout& l);
// swiglu_limit is 1.5, small enough that the clamps are exercised with O(1) activations.
ExpertsSpec make_experts_spec(const ExpertsLayout& l, int64_t E, int64_t H, int64_t I,
                              Activation act);

enum class RoutingCase {
  kRandom,        // k distinct experts per token, uniformly drawn
  kEveryExpert,   // token t starts at expert (t*k) mod E, so every expert is hit when T*k >= E
  kEmptyExperts,  // only experts in the lower third are used; the rest receive no token
  kDuplicates,    // each token lists one expert twice
  kSentinels,     // about a quarter of the slots hold ids >= E (expert-parallel sentinels)
};
std::string routing_case_name(RoutingCase c);

struct Routing {
  Tensor hidden;         // [T, H] of the activation dtype, ~ U(-1, 1)
  Tensor top_k_index;    // [T, k] int64 (or int32)
  Tensor top_k_weights;  // [T, k] (or [T, E] when per_expert_weights) float32, softmax-like positive
};
Routing random_routing(const ExpertsSpec& spec, int64_t tokens, int64_t top_k, DType dtype,
                       uint64_t seed, RoutingCase c, bool per_expert_weights = false,
                       DType index_dtype = DType::kI64);

// The shared metric and tolerance rule (include/moex/check.hpp).
using moex::experts_tolerance;
using moex::rel_l2_error;

// The weights (and biases) copied to `device`.
ExpertsWeights experts_weights_to(const ExpertsWeights& w, Device device);
// A block-quantized spec (FP8: 128 x 128 weight blocks with `scale_dtype` scales; FP4: 1 x 32
// blocks, UE8M0 scales whatever `scale_dtype` says).
ExpertsSpec quantized_spec(QuantScheme::Kind kind, DType scale_dtype, int64_t E, int64_t H,
                           int64_t I, bool gated = true, Activation act = Activation::kSilu);
// ||out - ref|| with ref a float64 tensor (a reference's output), summed in double; and ||ref||.
double l2_diff(const Tensor& out, const Tensor& ref);
double l2_f64(const Tensor& ref);

// One consistency case, the check every backend suite runs: seeded weights and routing, the
// backend's output on `device` against experts_reference_f64 at experts_tolerance (gtest
// assertions; the message names the case and its seed).
void check_experts_case(Device device, const std::string& backend, const ExpertsSpec& spec,
                        DType dtype, int64_t tokens, int64_t top_k, RoutingCase routing,
                        uint64_t seed, bool per_expert_weights = false,
                        DType index_dtype = DType::kI64);

// The same case with `perturb` applied to the backend's copy of the (host) weights only, the
// reference keeping the originals: the harness's self-test, which must fail (wrap it in
// EXPECT_NONFATAL_FAILURE).
using WeightsPerturbation = std::function<void(ExpertsWeights&)>;
void check_experts_case_perturbed(Device device, const std::string& backend,
                                  const ExpertsSpec& spec, DType dtype, int64_t tokens,
                                  int64_t top_k, RoutingCase routing, uint64_t seed,
                                  const WeightsPerturbation& perturb);

// Adds to element `index` of `t` (any float dtype, host) the largest magnitude found in `t`, and
// rounds the result back to t's dtype: a change no larger than the largest weight.
Tensor add_largest_magnitude(const Tensor& t, int64_t index);

// The first MoE layer's experts of a fixture checkpoint (tests/data/hf-tiny/<model>), read as the
// hub stores them (per-expert tensors stacked; gpt_oss fused), fp32, with the spec from meta.json.
struct ExpertsFixture {
  ExpertsSpec spec;
  ExpertsWeights weights;
};
ExpertsFixture load_experts_fixture(const std::string& model);

// Path of a file in tests/data (the fixtures copied into the project).
std::string data_path(const std::string& relative);

// CUDA devices visible to this process (0 in a CPU-only build or without a GPU).
int cuda_devices();

// run_ranks' result (moex/comm.hpp): one test failure per rank that threw, with its message.
void expect_no_rank_errors(const std::vector<std::exception_ptr>& errors);

// ---- the CLI as a user runs it ----
struct CliResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out, err;
};
// Runs `MOEX_CLI_PATH ARGS` (ARGS already shell-quoted) through the shell, stdout and stderr
// captured separately in files of their own under `tmp_dir` (safe to share between tests).
CliResult run_cli(const std::string& args, const std::string& tmp_dir);
std::string read_file(const std::string& path);

}  // namespace moex::test
