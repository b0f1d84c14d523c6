// Quantized (FP8 e4m3 / FP4 e2m1) experts on CUDA: every CUDA backend against the float64
// reference of the quantized math with its midpoint-crossing bound (the same rule as the CPU
// backends, tests/test_experts_quant.cpp), on every kernel path (the decode GEMV at T <= 16 with
// H, I multiples of 16, including tiles of several rows and shapes not multiples of 128;
// grouped_mm's FP8 wgmma kernel above that on Hopper; the CUDA-core tiles otherwise, and forced
// through a test backend to compare with the wgmma kernel), graph capture, and agreement between
// the CUDA backends. Skips cleanly where no GPU exists (CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "moex/bench.hpp"
#include "moex/experts.hpp"
#include "moex/quant.hpp"
#include "support/test_support.hpp"

#ifndef MOEX_WITH_CUDA

TEST(CudaQuantExperts, SkippedInCpuOnlyBuild) { GTEST_SKIP() << "built without CUDA (MOEX_CUDA=OFF)"; }

#else

#include "cuda/experts_backend.hpp"
#include "cuda/experts_ops.hpp"
#include "cuda/runtime.hpp"

using namespace moex;
using namespace moex::test;

namespace {

// Hopper's FP8 tensor cores keep only about 14 bits in their running sums (DeepGEMM's README; the
// reason it promotes to float32 every 128-wide K block). Taken as a unit roundoff of 2^-13: with
// float32's 2^-24 the wgmma kernel's float16 results fell outside the bound on the H200 (by
// 1.4-2.2x), its bfloat16 results inside.
constexpr double kFp8TensorCoreUnitRoundoff = 1.0 / 8192;

#define SKIP_WITHOUT_GPU() \
  if (moex::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

ExpertsSpec quant_spec(bool fp4, DType scale_dtype, int64_t E, int64_t H, int64_t I,
                       bool gated = true) {
  return quantized_spec(fp4 ? QuantScheme::Kind::kFp4E2M1 : QuantScheme::Kind::kFp8E4M3,
                        scale_dtype, E, H, I, gated);
}

Tensor on_gpu(const Tensor& t) { return t.defined() ? t.to(Device::cuda()) : t; }

// grouped_mm with its plan edited wherever the policy picks the FP8 wgmma kernel (test backends).
class GroupedMmEditedFp8Plan : public moex::cuda::CudaExpertsBackend {
 protected:
  virtual moex::cuda::ExpertsPlan edit(const moex::cuda::ExpertsShape& s,
                                       const moex::cuda::DeviceTraits& d,
                                       moex::cuda::ExpertsPlan p) const = 0;
  moex::cuda::ExpertsPlan plan(const moex::cuda::ExpertsArgs& a,
                               const moex::cuda::DeviceTraits& d) const override {
    const moex::cuda::ExpertsShape s = moex::cuda::shape_of(a);
    moex::cuda::ExpertsPlan p = moex::cuda::plan_grouped_mm(s, d);
    if (p.gemm == moex::cuda::GemmPath::kWgmmaFp8) p = edit(s, d, p);
    moex::cuda::check_plan(p, s, d);
    return p;
  }
  size_t workspace_bytes(const moex::cuda::ExpertsArgs& a,
                         const moex::cuda::ExpertsPlan& p) const override {
    return moex::cuda::grouped_mm_workspace_bytes(a, p);
  }
  void run(const moex::cuda::ExpertsArgs& a, const moex::cuda::ExpertsPlan& p, void* ws,
           cudaStream_t st) const override {
    moex::cuda::grouped_mm_experts(a, p, ws, st);
  }
};

// The CUDA-core tiles (what other GPUs run), so the two paths can be compared on one device.
class GroupedMmQuantTiles final : public GroupedMmEditedFp8Plan {
 protected:
  std::string description() const override { return "grouped_mm on CUDA-core quantized tiles (tests)"; }
  moex::cuda::ExpertsPlan edit(const moex::cuda::ExpertsShape& s, const moex::cuda::DeviceTraits& d,
                               moex::cuda::ExpertsPlan) const override {
    return moex::cuda::plan_grouped_mm(s, moex::cuda::DeviceTraits{8, 0, d.sm_count});
  }
};
MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_quant_tiles", GroupedMmQuantTiles);

// The FP8 wgmma kernel's other stage width (128 <-> 256 weight rows), so both widths run on
// every shape the tests use.
class GroupedMmFp8OtherWidth final : public GroupedMmEditedFp8Plan {
 protected:
  std::string description() const override {
    return "grouped_mm, FP8 wgmma with the other stage width (tests)";
  }
  moex::cuda::ExpertsPlan edit(const moex::cuda::ExpertsShape&, const moex::cuda::DeviceTraits&,
                               moex::cuda::ExpertsPlan p) const override {
    p.b_rows = p.b_rows == 256 ? 128 : 256;
    return p;
  }
};
MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_fp8_other_width", GroupedMmFp8OtherWidth);

// What the plans see of an FP8 call with 16-bit activations (bf16 / f16).
moex::cuda::ExpertsShape fp8_call_shape(const ExpertsSpec& s, DType act, int64_t T, int64_t k) {
  moex::cuda::ExpertsShape sh;
  sh.elem = act == DType::kBF16 ? moex::cuda::Elem::kBF16 : moex::cuda::Elem::kF16;
  sh.tokens = T;
  sh.pairs = T * k;
  sh.experts = int(s.num_experts);
  sh.hidden = int(s.hidden);
  sh.intermediate = int(s.intermediate);
  sh.gated = s.has_gate;
  sh.quantized = true;
  return sh;
}

// Whether `backend` runs this call on the FP8 wgmma kernel (grouped_mm's plan on Hopper), whose
// block sums the reference is told are coarser (kFp8TensorCoreUnitRoundoff).
bool runs_wgmma_fp8(const std::string& backend, const ExpertsSpec& s, DType act, int64_t T,
                    int64_t k) {
  if (backend != "grouped_mm" || s.quant.kind != QuantScheme::Kind::kFp8E4M3 ||
      (act != DType::kBF16 && act != DType::kF16))
    return false;
  const moex::cuda::DeviceTraits traits = moex::cuda::traits_of(moex::cuda::current_device());
  return moex::cuda::plan_grouped_mm(fp8_call_shape(s, act, T, k), traits).gemm ==
         moex::cuda::GemmPath::kWgmmaFp8;
}

void check_case(const std::string& backend, const ExpertsSpec& s, const ExpertsWeights& w_host,
                const ExpertsWeights& w_gpu, DType act, int64_t T, int64_t k, RoutingCase rc,
                uint64_t seed) {
  SCOPED_TRACE(backend + " " + s.str() + " " + std::string(dtype_name(act)) + " T=" +
               std::to_string(T) + " " + routing_case_name(rc) + " seed=" + std::to_string(seed));
  Routing r = random_routing(s, T, k, act, seed, rc);
  const QuantizedReference ref = experts_reference_f64_bounded(
      s, w_host, r.hidden, r.top_k_index, r.top_k_weights,
      runs_wgmma_fp8(backend, s, act, T, k) ? kFp8TensorCoreUnitRoundoff : 0.0);
  Tensor out = experts_forward(backend, s, w_gpu, on_gpu(r.hidden), on_gpu(r.top_k_index),
                               on_gpu(r.top_k_weights))
                   .to(Device::cpu());
  ASSERT_EQ(out.shape(), (Shape{T, s.hidden}));
  const double err = l2_diff(out, ref.out), norm = l2_f64(ref.out);
  const double tol = experts_tolerance(act, std::max(s.hidden, s.intermediate));
  EXPECT_LE(err, tol * norm + ref.crossing_bound)
      << "relative error " << (norm > 0 ? err / norm : err) << ", tolerance " << tol
      << ", elements near an e4m3 midpoint " << ref.near_midpoints << " of " << ref.elements;
}

class CudaQuantExperts : public ::testing::TestWithParam<std::string> {};

// (H, I) = (256, 128) and (160, 96) take the GEMV up to 16 tokens; (160, 200) never (I % 16).
TEST_P(CudaQuantExperts, Fp8BothPathsAndUglyShapes) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7100;
  for (DType sd : {DType::kF32, DType::kF8E8M0})
    for (auto [H, I] : {std::pair<int64_t, int64_t>{256, 128}, {160, 96}, {160, 200}}) {
      const ExpertsSpec s = quant_spec(false, sd, 6, H, I);
      const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
      const ExpertsWeights wg = experts_weights_to(w, Device::cuda());
      for (DType act : {DType::kF32, DType::kBF16})
        for (int64_t T : {0, 1, 7, 16, 17, 64, 300})
          check_case(GetParam(), s, w, wg, act, T, 3, RoutingCase::kRandom, ++seed);
    }
}

TEST_P(CudaQuantExperts, Fp4BothPaths) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7200;
  for (auto [H, I] : {std::pair<int64_t, int64_t>{256, 96}, {288, 32}}) {
    const ExpertsSpec s = quant_spec(true, DType::kF8E8M0, 5, H, I);
    const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
    const ExpertsWeights wg = experts_weights_to(w, Device::cuda());
    for (DType act : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t T : {1, 7, 64, 1000})
        check_case(GetParam(), s, w, wg, act, T, 2, RoutingCase::kRandom, ++seed);
  }
}

TEST_P(CudaQuantExperts, RoutingCasesAndUngated) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7300;
  for (bool gated : {true, false})
    for (RoutingCase rc : {RoutingCase::kEveryExpert, RoutingCase::kEmptyExperts,
                           RoutingCase::kDuplicates, RoutingCase::kSentinels})
      for (int64_t T : {1, 7, 64}) {
        for (bool fp4 : {false, true}) {
          const ExpertsSpec s = quant_spec(fp4, DType::kF8E8M0, 7, fp4 ? 64 : 160, 96, gated);
          const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
          check_case(GetParam(), s, w, experts_weights_to(w, Device::cuda()), DType::kF32, T, 4, rc,
                     ++seed);
        }
      }
}

// The GEMV's paths: H and I multiples of 16 (FP8) / 32 (FP4) but not of 128 (ragged last 128-wide
// block, ragged last 512-byte step), few experts so that grouped_mm's tiles hold 2-12 rows (the
// 2-, 4- and 8-row chunks; 12 = 8 + 4) and batched_mm repeats experts across pairs, duplicate ids.
// FP4 at H = 1312 / I = 416: rows of 656 / 208 bytes (a ragged last 512-byte step) whose last
// 128-wide activation block holds a single 32-wide weight scale block.
TEST_P(CudaQuantExperts, GemvUglyShapesAndSharedExperts) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7500;
  struct Shape3 {
    bool fp4;
    DType sd;
    int64_t H, I;
  };
  for (const Shape3 c : {Shape3{false, DType::kF32, 208, 144}, {false, DType::kF8E8M0, 208, 144},
                         {false, DType::kF32, 1040, 272}, {false, DType::kF8E8M0, 1040, 272},
                         {true, DType::kF8E8M0, 224, 96}, {true, DType::kF8E8M0, 1056, 288},
                         {true, DType::kF8E8M0, 1312, 416}}) {
    const ExpertsSpec s = quant_spec(c.fp4, c.sd, 4, c.H, c.I);
    const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
    const ExpertsWeights wg = experts_weights_to(w, Device::cuda());
    for (int64_t T : {1, 3, 16})
      for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kDuplicates})
        check_case(GetParam(), s, w, wg, DType::kBF16, T, 3, rc, ++seed);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaQuantExperts,
                         ::testing::Values("eager", "batched_mm", "grouped_mm",
                                           "grouped_mm_quant_tiles"),
                         [](const auto& info) { return info.param; });

// The FP8 wgmma kernel (grouped_mm above 16 tokens on Hopper) against the float64 bounded
// reference and against the CUDA-core tiles, on the DeepSeek-like small shape and on ugly ones:
// K not a multiple of 128 (H = 272, I = 80 / 208: TMA zero fill of the last K block), N tails
// (I = 80 < one 64-column gate_up block; H = 400, 272: partial down column blocks), experts with
// no token and one with exactly one token, several 128-row tiles per expert, float and UE8M0
// scales, bf16 and f16 activations. `router` edits the routing: -1 none, else expert E - 1
// receives exactly one pair (token 0, slot 0) on top of kEmptyExperts routing.
TEST(CudaQuantWgmmaFp8, AgainstReferenceAndCudaCoreTiles) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t E, H, I, k, T;
    RoutingCase rc;
    bool one_token_expert;
  };
  const Case cases[] = {
      {8, 256, 128, 2, 300, RoutingCase::kRandom, false},       // DeepSeek-like, small
      {9, 272, 80, 3, 200, RoutingCase::kEmptyExperts, true},   // K tails, N tails, 0 / 1 token
      {5, 400, 208, 2, 1000, RoutingCase::kRandom, false},      // several tiles per expert
      {6, 256, 128, 4, 17, RoutingCase::kDuplicates, false},    // just past the GEMV's range
      {7, 272, 208, 2, 64, RoutingCase::kSentinels, false},
      {16, 272, 208, 2, 40, RoutingCase::kRandom, false},       // 5 rows per expert: 128-row stages
  };
  const moex::cuda::DeviceTraits traits = moex::cuda::traits_of(moex::cuda::current_device());
  uint64_t seed = 7500;
  for (const Case& c : cases)
    for (DType sd : {DType::kF32, DType::kF8E8M0})
      for (DType act : {DType::kBF16, DType::kF16}) {
        const ExpertsSpec s = quant_spec(false, sd, c.E, c.H, c.I);
        const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
        const ExpertsWeights wg = experts_weights_to(w, Device::cuda());
        Routing r = random_routing(s, c.T, c.k, act, ++seed, c.rc);
        if (c.one_token_expert) r.top_k_index.data<int64_t>()[0] = c.E - 1;
        SCOPED_TRACE(s.str() + " " + std::string(dtype_name(act)) + " T=" + std::to_string(c.T) +
                     " " + routing_case_name(c.rc) + " seed=" + std::to_string(seed));
        // On Hopper the policy must pick the kernel under test (a silent fallback to the tiles
        // would pass every comparison below).
        if (traits.hopper())
          EXPECT_EQ(moex::cuda::plan_grouped_mm(fp8_call_shape(s, act, c.T, c.k), traits).gemm,
                    moex::cuda::GemmPath::kWgmmaFp8);
        // The CUDA-core tiles sum in float32; the FP8 tensor cores sum each 128-wide block more
        // coarsely before the float32 promotion (kFp8TensorCoreUnitRoundoff), which the wgmma
        // kernel's reference is told.
        const QuantizedReference ref =
            experts_reference_f64_bounded(s, w, r.hidden, r.top_k_index, r.top_k_weights);
        const QuantizedReference ref_tc = experts_reference_f64_bounded(
            s, w, r.hidden, r.top_k_index, r.top_k_weights, kFp8TensorCoreUnitRoundoff);
        auto run = [&](const std::string& backend) {
          return experts_forward(backend, s, wg, on_gpu(r.hidden), on_gpu(r.top_k_index),
                                 on_gpu(r.top_k_weights))
              .to(Device::cpu());
        };
        const Tensor wgmma = run("grouped_mm"), tiles = run("grouped_mm_quant_tiles");
        const double norm = l2_f64(ref.out);
        const double tol = experts_tolerance(act, std::max(c.H, c.I)) * norm;
        const double bound = tol + ref.crossing_bound;
        const double bound_tc = tol + ref_tc.crossing_bound + ref_tc.accumulation_bound;
        EXPECT_LE(l2_diff(wgmma, ref.out), bound_tc)
            << "wgmma: elements near an e4m3 midpoint " << ref_tc.near_midpoints << " of "
            << ref_tc.elements << ", accumulation bound " << ref_tc.accumulation_bound;
        // The kernel's other stage width (the policy's: 128 weight rows for the case of 5 rows
        // per expert, 256 for the others).
        EXPECT_LE(l2_diff(run("grouped_mm_fp8_other_width"), ref.out), bound_tc)
            << "wgmma, other stage width";
        EXPECT_LE(l2_diff(tiles, ref.out), bound) << "CUDA-core tiles";
        // Both within their bounds of the reference: within the sum of each other.
        const std::vector<float> a = wgmma.to_float_vector(), b = tiles.to_float_vector();
        double d = 0;
        for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        EXPECT_LE(std::sqrt(d), bound + bound_tc) << "wgmma vs CUDA-core tiles";
      }
}

// Quantized experts captured once in a CUDA graph and replayed with new routing written into the
// same device tensors (the GEMV path, T = 4; grouped_mm's FP8 wgmma path on Hopper, or the tile
// path, T = 40 and 300).
TEST(CudaQuantExpertsGraph, CapturedCallReplaysWithNewRouting) {
  SKIP_WITHOUT_GPU();
  for (bool fp4 : {false, true})
    for (int64_t T : {4, 40, 300})  // GEMV, FP8 wgmma on Hopper (tiles elsewhere), FP8 wgmma
      for (const std::string backend : {"batched_mm", "grouped_mm"}) {
        const ExpertsSpec s = quant_spec(fp4, DType::kF32, 8, 256, 128);
        const ExpertsWeights w = random_quantized_experts_weights(s, 7401);
        Experts experts(s, experts_weights_to(w, Device::cuda()));
        Routing r0 = random_routing(s, T, 2, DType::kBF16, 7402, RoutingCase::kRandom);
        Tensor hidden = on_gpu(r0.hidden), idx = on_gpu(r0.top_k_index),
               tw = on_gpu(r0.top_k_weights);
        (void)experts.forward(backend, hidden, idx, tw);  // warm: workspace cached
        moex::cuda::synchronize();
        cudaStream_t stream = moex::cuda::current_stream();
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        Tensor out = experts.forward(backend, hidden, idx, tw);
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int round = 0; round < 2; ++round) {
          Routing r = random_routing(s, T, 2, DType::kBF16, 7410 + round,
                                     round ? RoutingCase::kSentinels : RoutingCase::kDuplicates);
          for (auto [dst, src] : {std::pair<Tensor*, Tensor*>{&hidden, &r.hidden},
                                  {&idx, &r.top_k_index}, {&tw, &r.top_k_weights}})
            moex::cuda::copy_bytes(dst->raw(), dst->device(), src->raw(), Device::cpu(),
                                   dst->nbytes());
          ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
          moex::cuda::synchronize();
          const QuantizedReference ref =
              experts_reference_f64_bounded(s, w, r.hidden, r.top_k_index, r.top_k_weights);
          const double tol = experts_tolerance(DType::kBF16, 256);
          EXPECT_LE(l2_diff(out.to(Device::cpu()), ref.out), tol * l2_f64(ref.out) + ref.crossing_bound)
              << backend << " fp4=" << fp4 << " T=" << T << " round " << round;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
}

// The activation quantizer's kernels (warp per block for any K; the vectorised row kernel for
// 16-bit rows with K % 8 == 0, plain or gathering rows through sorted_pair) against the host
// quantizer of include/moex/quant.hpp, bit for bit: codes and scales. K with a partial last
// block, an all-zero block (the 1e-12 scale floor), blocks whose magnitudes span 2^-5 .. 2^4;
// rows at or past the device count of valid rows stay untouched.
TEST(CudaQuantActivation, KernelsMatchTheHostQuantizerBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int K : {8, 136, 1000, 1004, 2056, 7168})
    for (DType act : {DType::kBF16, DType::kF16})
      for (int variant = 0; variant < 3; ++variant) {
        // 0: rows in place, scales by row; 1: gathered rows, scales by row; 2: gathered rows,
        // scales by block (the FP8 wgmma path).
        const bool gather = variant > 0, by_block = variant == 2;
        if (gather && K % 8 != 0) continue;  // (the gathered path needs K % 8 == 0)
        SCOPED_TRACE("K=" + std::to_string(K) + " " + std::string(dtype_name(act)) +
                     " variant " + std::to_string(variant));
        const int tokens = 37, top_k = 3, rows = gather ? tokens * top_k : tokens, valid = rows - 5;
        std::vector<float> xv(size_t(tokens) * K);
        uint64_t st = 1234 + uint64_t(K);
        for (size_t i = 0; i < xv.size(); ++i) {
          st = st * 6364136223846793005ull + 1442695040888963407ull;
          const double u = double(st >> 11) / double(1ull << 53) - 0.5;
          xv[i] = float(u * std::exp2(double(int(i / 128 % 9)) - 4.0));
        }
        for (int k = 0; k < std::min(K, 128); ++k) xv[size_t(2) * K + k] = 0.f;  // a zero block
        const Tensor x = Tensor::from_floats(xv, {tokens, K}, act);
        const std::vector<float> xr = x.to_float_vector();  // as rounded to the element type
        std::vector<int64_t> perm(static_cast<size_t>(rows));
        for (int r = 0; r < rows; ++r) perm[size_t(r)] = (r * 7 + 3) % rows;  // a permutation
        const Tensor sp = Tensor::from_ints(perm, {rows}, DType::kI32).to(Device::cuda());
        const Tensor nvalid = Tensor::from_ints({valid}, {1}, DType::kI32).to(Device::cuda());
        const int nb = (K + 127) / 128;
        Tensor q = Tensor::empty({rows, K}, DType::kU8);
        std::fill_n(q.data<uint8_t>(), size_t(rows) * K, uint8_t(0xab));
        Tensor sc = Tensor::zeros({rows, nb}, DType::kF32);
        q = q.to(Device::cuda());
        sc = sc.to(Device::cuda());
        const Tensor xg = x.to(Device::cuda());
        const moex::cuda::Elem elem =
            act == DType::kBF16 ? moex::cuda::Elem::kBF16 : moex::cuda::Elem::kF16;
        moex::cuda::launch_quantize_act_gathered(
            xg.raw(), elem, gather ? sp.data<int>() : nullptr, top_k, rows, K,
            nvalid.data<int>(), q.data<uint8_t>(), sc.data<float>(), by_block,
            moex::cuda::current_stream());
        moex::cuda::synchronize();
        const Tensor qh = q.to(Device::cpu()), sh = sc.to(Device::cpu());
        std::vector<uint8_t> want(static_cast<size_t>(K));
        std::vector<float> want_s(static_cast<size_t>(nb));
        int bad = 0;
        for (int r = 0; r < rows; ++r) {
          const uint8_t* got = qh.data<uint8_t>() + size_t(r) * K;
          std::vector<float> got_s(static_cast<size_t>(nb));
          for (int b = 0; b < nb; ++b)
            got_s[size_t(b)] = sh.data<float>()[by_block ? size_t(b) * rows + r : size_t(r) * nb + b];
          if (r >= valid) {
            bad += std::count_if(got, got + K, [](uint8_t b) { return b != 0xab; }) > 0;
            continue;
          }
          const int64_t src = gather ? perm[size_t(r)] / top_k : r;
          quant::quantize_activation_row(xr.data() + src * K, K, want.data(), want_s.data());
          const bool same = std::equal(want.begin(), want.end(), got) &&
                            std::memcmp(want_s.data(), got_s.data(), sizeof(float) * size_t(nb)) == 0;
          if (!same && bad++ < 3) ADD_FAILURE() << "row " << r << " differs from the host quantizer";
        }
        EXPECT_EQ(bad, 0) << "rows differing (or written past the valid rows)";
      }
}

}  // namespace

#endif
