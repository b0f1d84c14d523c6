// The "deepgemm" experts backend on a GPU: bf16 experts against the float64 reference and FP8
// experts against the bounded quantized reference (float and UE8M0 scales), over every routing
// case, T from 1 to 1000, ungated and biased specs and K / N tails; a captured CUDA graph
// replayed with new routing, bit for bit equal to direct launches; the requirement errors a user
// meets on a Hopper GPU; and the transformers fixtures (bf16 models, FP8 checkpoints) run through
// it. The plan (always the Hopper tensor-core kernels, never another path) is checked without a
// GPU. GPU tests skip cleanly where no GPU exists; on a GPU other than Hopper they check the
// refusal instead.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

#ifndef MOEX_WITH_CUDA

TEST(CudaDeepGemm, SkippedInCpuOnlyBuild) { GTEST_SKIP() << "built without CUDA (MOEX_CUDA=OFF)"; }

#else

#include "cuda/experts_backend.hpp"
#include "cuda/experts_ops.hpp"
#include "cuda/launchers.hpp"
#include "cuda/runtime.hpp"
#include "support/cuda_experts_checks.hpp"

using namespace moex;
using namespace moex::test;
namespace mc = moex::cuda;

namespace {

// Hopper's FP8 tensor cores keep about 14 bits in their block sums (see test_cuda_quant.cpp).
constexpr double kFp8TensorCoreUnitRoundoff = 1.0 / 8192;

ExpertsSpec bf16_spec(int64_t E, int64_t H, int64_t I, bool gated = true, bool bias = false,
                      Activation act = Activation::kSilu) {
  return make_experts_spec(ExpertsLayout{gated, bias, /*transposed=*/false, /*concat=*/true}, E, H, I, act);
}

// The plan is the Hopper kernels at every size (no GEMV, no mma.sync, no SIMT under this name):
// bf16 on 64-row tiles while experts average at most 48 rows, FP8 on 128-row tiles, the
// contiguous layout at every size (the masked one is set by tests, see DeepGemmMaskedLayout).
TEST(CudaDeepGemmPlan, HopperKernelsAtEverySize) {
  const mc::DeviceTraits h100{9, 0, 132};
  for (int64_t T : {1, 4, 16, 17, 64, 65, 256, 8192}) {
    const int64_t rows_per_expert = T * 8 / std::min<int64_t>(256, T * 8);
    const mc::ExpertsPlan bf16 = mc::plan_deepgemm(experts_shape(false, T, 8, 256, 7168, 2048), h100);
    EXPECT_EQ(bf16.gemm, mc::GemmPath::kWgmma) << T;
    EXPECT_EQ(bf16.tile_rows, rows_per_expert <= 48 ? 64 : 128) << T;
    EXPECT_FALSE(bf16.masked) << T;
    mc::ExpertsPlan fp8 = mc::plan_deepgemm(experts_shape(true, T, 8, 256, 7168, 2048), h100);
    EXPECT_EQ(fp8.gemm, mc::GemmPath::kWgmmaFp8) << T;
    EXPECT_EQ(fp8.tile_rows, 128) << T;
    EXPECT_FALSE(fp8.masked) << T;
    fp8.masked = true;  // (E * T >= P: accepted)
    EXPECT_NO_THROW(mc::check_plan(fp8, experts_shape(true, T, 8, 256, 7168, 2048), h100)) << T;
    EXPECT_NE(fp8.describe().find("masked layout"), std::string::npos) << fp8.describe();
  }
  // The masked table must hold a contiguous fallback (E * T >= P): not with fewer experts than
  // slots per token, where the contiguous layout runs; a plan forcing it is refused.
  const mc::ExpertsShape few = experts_shape(false, 4, 8, 4, 256, 128);
  mc::ExpertsPlan forced = mc::plan_deepgemm(few, h100);
  forced.masked = true;
  EXPECT_THROW(mc::check_plan(forced, few, h100), InvalidInput);
  // Nor on the fused path or the CUDA-core paths.
  mc::ExpertsPlan fused = mc::plan_sonicmoe(experts_shape(false, 4, 2, 8, 256, 128), h100);
  fused.masked = true;
  EXPECT_THROW(mc::check_plan(fused, experts_shape(false, 4, 2, 8, 256, 128), h100), InvalidInput);
  mc::ExpertsPlan gemv = mc::plan_grouped_mm(experts_shape(true, 4, 2, 8, 256, 128), h100);
  gemv.masked = true;
  EXPECT_THROW(mc::check_plan(gemv, experts_shape(true, 4, 2, 8, 256, 128), h100), InvalidInput);
  mc::ExpertsShape unaligned = experts_shape(false, 4, 2, 8, 256, 128);
  unaligned.aligned16 = false;
  EXPECT_THROW(mc::plan_deepgemm(unaligned, h100), InvalidInput);
  // Off Hopper the plan refuses (the backend refuses earlier, with the requirement's words).
  EXPECT_THROW(mc::plan_deepgemm(experts_shape(false, 4, 2, 8, 256, 128), mc::DeviceTraits{8, 9, 128}), InvalidInput);
}

TEST(CudaDeepGemm, Bf16AgainstReference) {
  SKIP_WITHOUT_HOPPER();
  struct Case {
    ExpertsSpec spec;
    int64_t k;
  };
  const Case cases[] = {
      {bf16_spec(8, 256, 128), 2},                       // small DeepSeek-like
      {bf16_spec(9, 136, 72), 3},                        // K, N not multiples of 64: TMA tails
      {bf16_spec(5, 264, 200, true, true), 2},           // biases
      {bf16_spec(6, 128, 96, false), 2},                 // ungated
      {bf16_spec(4, 192, 64, true, false, Activation::kGeluTanh), 2},
  };
  uint64_t seed = 9100;
  for (const Case& c : cases)
    for (int64_t T : {1, 7, 64, 300, 1000})
      for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kEmptyExperts, RoutingCase::kDuplicates,
                             RoutingCase::kSentinels})
        check_experts_case(Device::cuda(), "deepgemm", c.spec, DType::kBF16, T, c.k, rc, ++seed);
  // int32 ids and [T, E] routing weights.
  check_experts_case(Device::cuda(), "deepgemm", bf16_spec(8, 256, 128), DType::kBF16, 50, 2,
                     RoutingCase::kRandom, ++seed, /*per_expert_weights=*/true, DType::kI32);
}

TEST(CudaDeepGemm, Fp8AgainstBoundedReference) {
  SKIP_WITHOUT_HOPPER();
  struct Case {
    int64_t E, H, I, k;
  };
  const Case cases[] = {{8, 256, 128, 2}, {9, 272, 80, 3}, {5, 400, 208, 2}};
  uint64_t seed = 9300;
  for (const Case& c : cases)
    for (DType sd : {DType::kF32, DType::kF8E8M0})
      for (int64_t T : {1, 5, 17, 300})
        for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kDuplicates, RoutingCase::kSentinels,
                               RoutingCase::kEmptyExperts}) {
          const ExpertsSpec s = quantized_spec(QuantScheme::Kind::kFp8E4M3, sd, c.E, c.H, c.I);
          const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
          const Routing r = random_routing(s, T, c.k, DType::kBF16, ++seed, rc);
          SCOPED_TRACE(s.str() + " scales " + std::string(dtype_name(sd)) + " T=" + std::to_string(T) + " " +
                       routing_case_name(rc) + " seed=" + std::to_string(seed));
          const QuantizedReference ref = experts_reference_f64_bounded(
              s, w, r.hidden, r.top_k_index, r.top_k_weights, kFp8TensorCoreUnitRoundoff);
          const Tensor out = experts_forward("deepgemm", s, experts_weights_to(w, Device::cuda()), on_gpu(r.hidden),
                                             on_gpu(r.top_k_index), on_gpu(r.top_k_weights))
                                 .to(Device::cpu());
          const double norm = l2_f64(ref.out);
          const double bound = experts_tolerance(DType::kBF16, std::max(c.H, c.I)) * norm + ref.crossing_bound +
                               ref.accumulation_bound;
          EXPECT_LE(l2_diff(out, ref.out), bound) << "relative " << l2_diff(out, ref.out) / std::max(norm, 1e-300);
        }
}

// One call captured into a CUDA graph and replayed with new routing written into the same
// device tensors: every replay equals a direct launch on that routing, bit for bit.
TEST(CudaDeepGemm, GraphReplayEqualsDirectLaunches) {
  SKIP_WITHOUT_HOPPER();
  for (bool fp8 : {false, true}) {
    const ExpertsSpec s = fp8 ? quantized_spec(QuantScheme::Kind::kFp8E4M3, DType::kF32, 8, 256, 128)
                              : bf16_spec(8, 256, 128);
    const ExpertsWeights w = fp8 ? random_quantized_experts_weights(s, 9501)
                                 : random_experts_weights(s, DType::kBF16, 9501);
    for (int64_t T : {3, 200}) {
      SCOPED_TRACE(fp8 ? "fp8" : "bf16");
      expect_graph_replay_equals_direct("deepgemm", s, w, T, 9501);
    }
  }
}

// deepgemm on the masked layout (the policy's plan runs the contiguous one), wherever the table
// can hold the call (E * T >= P), so both layouts run at every size in the tests.
class DeepGemmMaskedLayout final : public mc::CudaExpertsBackend {
 protected:
  std::string description() const override { return "deepgemm on the masked layout (tests)"; }
  mc::ExpertsPlan plan(const mc::ExpertsArgs& a, const mc::DeviceTraits& d) const override {
    const mc::ExpertsShape s = mc::shape_of(a);
    mc::ExpertsPlan p = mc::plan_deepgemm(s, d);
    p.masked = int64_t(s.experts) * s.tokens >= s.pairs;
    mc::check_plan(p, s, d);
    return p;
  }
  size_t workspace_bytes(const mc::ExpertsArgs& a, const mc::ExpertsPlan& p) const override {
    return mc::grouped_mm_workspace_bytes(a, p);
  }
  void run(const mc::ExpertsArgs& a, const mc::ExpertsPlan& p, void* ws, cudaStream_t st) const override {
    mc::grouped_mm_experts(a, p, ws, st);
  }
};
MOEX_REGISTER_EXPERTS_BACKEND("deepgemm_masked_layout", DeepGemmMaskedLayout);

// The masked layout against the references (the contiguous one: the tests above), bf16 and
// FP8, every routing case (duplicates: a token naming one expert twice, which the masked layout
// lays out contiguously), and its graph replays.
TEST(CudaDeepGemm, MaskedLayoutAgainstReference) {
  SKIP_WITHOUT_HOPPER();
  uint64_t seed = 9700;
  const ExpertsSpec bf = bf16_spec(9, 136, 72);
  const ExpertsSpec q = quantized_spec(QuantScheme::Kind::kFp8E4M3, DType::kF32, 9, 272, 80);
  const ExpertsWeights wq = random_quantized_experts_weights(q, ++seed);
  const ExpertsWeights wq_gpu = experts_weights_to(wq, Device::cuda());
  for (int64_t T : {1, 7, 64, 65, 300})
    for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kEmptyExperts, RoutingCase::kDuplicates,
                           RoutingCase::kSentinels}) {
      check_experts_case(Device::cuda(), "deepgemm_masked_layout", bf, DType::kBF16, T, 3, rc, ++seed);
      const Routing r = random_routing(q, T, 3, DType::kBF16, ++seed, rc);
      SCOPED_TRACE("fp8 T=" + std::to_string(T) + " " + routing_case_name(rc) + " seed=" + std::to_string(seed));
      const QuantizedReference ref = experts_reference_f64_bounded(
          q, wq, r.hidden, r.top_k_index, r.top_k_weights, kFp8TensorCoreUnitRoundoff);
      const Tensor out = experts_forward("deepgemm_masked_layout", q, wq_gpu, on_gpu(r.hidden),
                                         on_gpu(r.top_k_index), on_gpu(r.top_k_weights))
                             .to(Device::cpu());
      const double norm = l2_f64(ref.out);
      const double bound = experts_tolerance(DType::kBF16, 272) * norm + ref.crossing_bound +
                           ref.accumulation_bound;
      EXPECT_LE(l2_diff(out, ref.out), bound) << "relative " << l2_diff(out, ref.out) / std::max(norm, 1e-300);
    }
  for (bool fp8 : {false, true}) {
    const ExpertsSpec s = fp8 ? q : bf16_spec(8, 256, 128);
    const ExpertsWeights w = fp8 ? wq : random_experts_weights(s, DType::kBF16, 9701);
    for (int64_t T : {3, 200}) {
      SCOPED_TRACE(fp8 ? "graph fp8" : "graph bf16");
      expect_graph_replay_equals_direct("deepgemm_masked_layout", s, w, T, 9702);
    }
  }
}

// The masked route itself: expert e's pairs at positions [e * T, e * T + count_e), sorted_pair
// -1 everywhere else, offsets[e] = e * T and offsets[E] = the valid pairs, tiles of at most
// tile_rows rows covering each expert's rows once; a token naming one expert twice (more than T
// rows for it) lays the call out contiguously instead, every pair still placed once.
TEST(CudaDeepGemm, MaskedRoutePlacement) {
  if (mc::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int E = 6, tile_rows = 4;
  for (bool dup : {false, true}) {
    const int T = dup ? 3 : 11, k = 3, P = T * k;
    std::vector<int64_t> ids(static_cast<size_t>(P));
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) ids[size_t(t * k + j)] = (t * 5 + j * (t % 2 ? 1 : 2)) % E;
    ids[1] = -1;  // a sentinel
    if (dup)      // expert 2 for every slot of every token: 9 rows > T = 3
      for (auto& id : ids) id = 2;
    const Tensor idx = Tensor::from_ints(ids, {P}, DType::kI32).to(Device::cuda());
    const int max_tiles = int(mc::route_max_tiles(P, E, tile_rows));
    Tensor offsets = Tensor::zeros({E + 1}, DType::kI32).to(Device::cuda());
    Tensor sorted = Tensor::zeros({int64_t(E) * T}, DType::kI32).to(Device::cuda());
    Tensor pos = Tensor::zeros({P}, DType::kI32).to(Device::cuda());
    Tensor tiles = Tensor::zeros({int64_t(max_tiles) * 4}, DType::kI32).to(Device::cuda());
    Tensor ntiles = Tensor::zeros({1}, DType::kI32).to(Device::cuda());
    mc::launch_route_masked(idx.raw(), false, P, E, T, tile_rows, 8, offsets.data<int>(), sorted.data<int>(),
                            pos.data<int>(), reinterpret_cast<mc::Tile*>(tiles.data<int>()), max_tiles,
                            ntiles.data<int>(), mc::current_stream());
    mc::synchronize();
    const std::vector<int64_t> off = offsets.to(Device::cpu()).to_int_vector();
    const std::vector<int64_t> sp = sorted.to(Device::cpu()).to_int_vector();
    const std::vector<int64_t> pp = pos.to(Device::cpu()).to_int_vector();
    const std::vector<int64_t> tl = tiles.to(Device::cpu()).to_int_vector();
    const int nt = int(ntiles.to(Device::cpu()).to_int_vector()[0]);
    SCOPED_TRACE(dup ? "duplicates" : "distinct");
    std::vector<int> count(E, 0);
    int valid = 0;
    for (int p = 0; p < P; ++p) {
      if (ids[size_t(p)] < 0) {
        EXPECT_EQ(pp[size_t(p)], -1) << p;
        continue;
      }
      const int e = int(ids[size_t(p)]);
      ++count[size_t(e)];
      ++valid;
      ASSERT_GE(pp[size_t(p)], 0) << p;
      EXPECT_EQ(sp[size_t(pp[size_t(p)])], p) << p;
      if (!dup) EXPECT_EQ(pp[size_t(p)] / T, e) << "pair " << p << " outside expert " << e << "'s rows";
    }
    EXPECT_EQ(off[size_t(E)], valid);
    if (dup)  // (contiguous: the valid pairs take the first positions)
      for (int p = 0; p < P; ++p) EXPECT_LT(pp[size_t(p)], valid) << p;
    int taken = 0;
    for (int64_t r = 0; r < int64_t(E) * T; ++r) taken += sp[size_t(r)] >= 0;
    EXPECT_EQ(taken, valid) << "positions no pair takes must hold -1";
    int tile_rows_sum = 0;
    for (int t = 0; t < nt; ++t) {
      const int e = int(tl[size_t(4 * t)]), start = int(tl[size_t(4 * t + 1)]), rows = int(tl[size_t(4 * t + 2)]);
      ASSERT_TRUE(e >= 0 && e < E && rows >= 1 && rows <= tile_rows) << t;
      if (!dup) {
        EXPECT_EQ(off[size_t(e)], e * T);
        EXPECT_EQ(start / T, e) << t;
        EXPECT_LE(start + rows, e * T + count[size_t(e)]) << t;
      }
      for (int r = start; r < start + rows; ++r) EXPECT_EQ(ids[size_t(sp[size_t(r)])], e) << r;
      tile_rows_sum += rows;
    }
    EXPECT_EQ(tile_rows_sum, valid);
  }
}

// What a user meets on the H200 when deepgemm cannot run the call: one Unsupported / InvalidInput
// naming the requirement, never a result from another path.
TEST(CudaDeepGemm, RequirementErrorsOnHopper) {
  SKIP_WITHOUT_HOPPER();
  auto expect_refusal = [](const ExpertsSpec& s, const ExpertsWeights& w, DType act, const char* needle) {
    const Routing r = random_routing(s, 4, 2, act, 9601, RoutingCase::kRandom);
    try {
      (void)experts_forward("deepgemm", s, experts_weights_to(w, Device::cuda()), on_gpu(r.hidden),
                            on_gpu(r.top_k_index), on_gpu(r.top_k_weights));
      ADD_FAILURE() << "deepgemm ran " << s.str() << " in " << dtype_name(act);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const ExpertsSpec bf = bf16_spec(8, 256, 128);
  expect_refusal(bf, random_experts_weights(bf, DType::kF16, 1), DType::kF16, "bfloat16");
  expect_refusal(bf, random_experts_weights(bf, DType::kF32, 1), DType::kF32, "bfloat16");
  const ExpertsSpec fp4 = quantized_spec(QuantScheme::Kind::kFp4E2M1, DType::kF8E8M0, 8, 256, 128);
  expect_refusal(fp4, random_quantized_experts_weights(fp4, 2), DType::kBF16, "FP4");
  ExpertsSpec tr = bf;
  tr.is_transposed = true;
  expect_refusal(tr, random_experts_weights(tr, DType::kBF16, 3), DType::kBF16, "transposed");
  // (Unaligned pointers: CudaDeepGemmPlan.HopperKernelsAtEverySize.)
}

// On a GPU that is not Hopper the backend refuses every call with the requirement.
TEST(CudaDeepGemm, RefusedOffHopper) {
  if (mc::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (on_hopper()) GTEST_SKIP() << "a Hopper GPU: RequirementErrorsOnHopper";
  const std::string why =
      get_experts_backend("deepgemm")->unsupported_reason(bf16_spec(8, 256, 128), DType::kBF16, Device::cuda());
  EXPECT_NE(why.find("compute capability"), std::string::npos) << why;
}

// The transformers fixtures through deepgemm on the GPU: bf16 models within the bf16 tolerance
// of transformers' logits and of grouped_mm on the same GPU.
TEST(CudaDeepGemmModels, Bf16FixturesMatchTransformers) {
  SKIP_WITHOUT_HOPPER();
  for (const char* model : {"qwen2_moe", "mixtral", "olmoe", "qwen3_moe", "deepseek_v3", "gpt_oss"}) {
    auto ref = SafetensorsFile::open(data_path(std::string("hf-tiny/") + model + "/reference.safetensors"));
    const Tensor ids = ref->get("input_ids");
    const std::string dir = std::string("hf-tiny/") + model + "/checkpoint_bf16";
    const Tensor d = load_on_gpu(dir, DType::kBF16, "deepgemm")->logits(ids).to(Device::cpu());
    const Tensor g = load_on_gpu(dir, DType::kBF16, "grouped_mm")->logits(ids).to(Device::cpu());
    // 4 bf16 units: measured on an H100 (2026-12-07) at most 7.7e-3 to transformers (deepseek_v3),
    // and 0 to grouped_mm (the same wgmma kernels).
    const double tol = 4.0 * std::ldexp(1.0, -8);
    const double e_tf = rel_l2_error(d, ref->get("logits_bf16_eager")), e_g = rel_l2_error(d, g);
    std::printf("%s deepgemm bf16: rel L2 %.3g to transformers, %.3g to grouped_mm\n", model, e_tf, e_g);
    EXPECT_LE(e_tf, tol) << model;
    EXPECT_LE(e_g, tol) << model;
  }
}

// The FP8 checkpoints on the quantized path (bf16 activations, FP8 tensor cores) against the same
// bf16 model with batched_mm's experts (the CUDA-core GEMV: exact e4m3 products in float32), so
// that only the experts' arithmetic differs; the distance to transformers' fake-quantized float32
// logits is printed (it is the bf16 model's, equal for every backend). The FP4 checkpoint is
// refused on Hopper, with the reason.
TEST(CudaDeepGemmModels, Fp8CheckpointsOnTheQuantizedPath) {
  SKIP_WITHOUT_HOPPER();
  for (const char* fixture : {"deepseek_v3_fp8_float", "deepseek_v3_fp8_ue8m0"}) {
    const std::string base = std::string("hf-tiny/") + fixture;
    auto dq = SafetensorsFile::open(data_path(base + "/dequantized_reference.safetensors"));
    auto ref = SafetensorsFile::open(data_path(base + "/reference.safetensors"));
    const Tensor ids = ref->get("input_ids");
    const Tensor d = load_on_gpu(base + "/checkpoint", DType::kBF16, "deepgemm")->logits(ids).to(Device::cpu());
    const Tensor b = load_on_gpu(base + "/checkpoint", DType::kBF16, "batched_mm")->logits(ids).to(Device::cpu());
    const double e_b = rel_l2_error(d, b), e_tf = rel_l2_error(d, dq->get("logits_fp32_fake_quant"));
    const double b_tf = rel_l2_error(b, dq->get("logits_fp32_fake_quant"));
    std::printf("%s bf16: deepgemm to batched_mm %.3g; to transformers' fake-quantized fp32: deepgemm %.3g, "
                "batched_mm %.3g\n", fixture, e_b, e_tf, b_tf);
    // 4 bf16 units: measured 4.4e-3 / 4.6e-3 (float / ue8m0 scales) on an H100 (2026-12-07).
    EXPECT_LE(e_b, 4.0 * std::ldexp(1.0, -8)) << fixture;
  }
  try {
    (void)load_on_gpu("hf-tiny/deepseek_v3_fp4_experts_ue8m0/checkpoint", DType::kBF16, "deepgemm");
    ADD_FAILURE() << "deepgemm accepted FP4 experts on Hopper";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("FP4"), std::string::npos) << e.what();
  }
}

}  // namespace

#endif
