// The CUDA experts plans as pure functions of (shape, device traits): fixed inputs, no GPU needed,
// so CI checks the policy that the H200 measurements chose (docs/cuda.md, "Tile rows").
#include <gtest/gtest.h>

#include <string>

#ifndef MOEX_WITH_CUDA

TEST(CudaPlan, SkippedInCpuOnlyBuild) { GTEST_SKIP() << "built without CUDA (MOEX_CUDA=OFF)"; }

#else

#include "cuda/experts_plan.hpp"
#include "cuda/launchers.hpp"
#include "moex/error.hpp"

using namespace moex::cuda;

namespace {

const DeviceTraits kH200{9, 0, 132};
const DeviceTraits kA100{8, 0, 108};

ExpertsShape shape(int64_t tokens, int k, int E, int H, int I, Elem e = Elem::kBF16) {
  ExpertsShape s;
  s.elem = e;
  s.tokens = tokens;
  s.pairs = tokens * k;
  s.experts = E;
  s.hidden = H;
  s.intermediate = I;
  return s;
}
ExpertsShape qwen(int64_t T) { return shape(T, 4, 60, 2048, 1408); }
ExpertsShape mixtral(int64_t T) { return shape(T, 2, 8, 4096, 14336); }

TEST(CudaPlan, GroupedComputeBoundOnHopper) {
  const ExpertsPlan p = plan_grouped_mm(qwen(4096), kH200);
  EXPECT_EQ(p.gemm, GemmPath::kWgmma);
  EXPECT_EQ(p.tile_rows, 128);
  EXPECT_EQ(p.b_rows, 256);
  EXPECT_TRUE(p.pingpong_down);  // K = I = 1408 <= 2048
  EXPECT_FALSE(p.pingpong_gate_up);
  EXPECT_EQ(p.raster_tiles, 8);
  EXPECT_FALSE(p.cluster_pairs());
  EXPECT_EQ(p.describe(), "TMA + wgmma (sm_90a) tiles of 128 rows, down GEMM on ping-pong warpgroups");
  // Mixtral's K = 14336: the down GEMM stays cooperative.
  const ExpertsPlan m = plan_grouped_mm(mixtral(4096), kH200);
  EXPECT_EQ(m.gemm, GemmPath::kWgmma);
  EXPECT_EQ(m.tile_rows, 128);
  EXPECT_FALSE(m.pingpong_down);
  EXPECT_EQ(m.describe(), "TMA + wgmma (sm_90a) tiles of 128 rows");
}

TEST(CudaPlan, GroupedTileRowsFollowRowsPerExpert) {
  // 480 * 4 / 60 = 32 rows per expert: 64-row wgmma tiles on Hopper, 16-row mma.sync elsewhere.
  const ExpertsPlan mid = plan_grouped_mm(qwen(480), kH200);
  EXPECT_EQ(mid.gemm, GemmPath::kWgmma);
  EXPECT_EQ(mid.tile_rows, 64);
  EXPECT_EQ(mid.raster_tiles, 16);
  EXPECT_FALSE(mid.pingpong_down);
  const ExpertsPlan mid_a100 = plan_grouped_mm(qwen(480), kA100);
  EXPECT_EQ(mid_a100.gemm, GemmPath::kMmaSync);
  EXPECT_EQ(mid_a100.tile_rows, 16);
  // Decode (2 tokens) and up to 24 rows per expert: 16-row mma.sync tiles everywhere.
  for (int64_t T : {1, 2, 256, 360})
    for (const DeviceTraits& d : {kH200, kA100}) {
      const ExpertsPlan p = plan_grouped_mm(qwen(T), d);
      EXPECT_EQ(p.gemm, GemmPath::kMmaSync) << T;
      EXPECT_EQ(p.tile_rows, 16) << T;
      EXPECT_EQ(p.describe(), "mma.sync tiles of 16 rows");
    }
  // Past 48 rows per expert off Hopper: the 128-row mma.sync configuration.
  const ExpertsPlan big_a100 = plan_grouped_mm(qwen(4096), kA100);
  EXPECT_EQ(big_a100.gemm, GemmPath::kMmaSync);
  EXPECT_EQ(big_a100.tile_rows, 128);
  EXPECT_FALSE(big_a100.pingpong_down);
}

TEST(CudaPlan, LayoutsAndDtypesOutsideTheTensorCoreKernels) {
  ExpertsShape t = qwen(4096);
  t.transposed = true;  // mma.sync reads transposed weights; wgmma does not
  EXPECT_EQ(plan_grouped_mm(t, kH200).gemm, GemmPath::kMmaSync);
  EXPECT_EQ(plan_grouped_mm(t, kH200).tile_rows, 128);
  ExpertsShape inter = qwen(4096);
  inter.concatenated = false;  // interleaved gate/up: mma.sync only
  EXPECT_EQ(plan_grouped_mm(inter, kH200).gemm, GemmPath::kMmaSync);
  inter.transposed = true;  // transposed + interleaved: SIMT
  EXPECT_EQ(plan_grouped_mm(inter, kH200).gemm, GemmPath::kSimt);
  ExpertsShape ungated = qwen(4096);
  ungated.gated = false;
  ungated.concatenated = false;  // (irrelevant without a gate)
  EXPECT_EQ(plan_grouped_mm(ungated, kH200).gemm, GemmPath::kWgmma);
  // fp32, sizes that are not multiples of 8, misaligned tensors: SIMT.
  EXPECT_EQ(plan_grouped_mm(shape(4096, 4, 60, 2048, 1408, Elem::kF32), kH200).gemm, GemmPath::kSimt);
  EXPECT_EQ(plan_grouped_mm(shape(4096, 4, 60, 2047, 1408), kH200).gemm, GemmPath::kSimt);
  EXPECT_EQ(plan_grouped_mm(shape(4096, 4, 60, 2048, 1404), kH200).gemm, GemmPath::kSimt);
  ExpertsShape mis = qwen(4096);
  mis.aligned16 = false;
  const ExpertsPlan p = plan_grouped_mm(mis, kH200);
  EXPECT_EQ(p.gemm, GemmPath::kSimt);
  EXPECT_EQ(p.tile_rows, kSimtTileRows);
  EXPECT_EQ(p.describe(), "SIMT tiles of 32 rows");
}

TEST(CudaPlan, BatchedIsAGemvForOneTokenAndTensorCoreTilesBeyond) {
  const ExpertsPlan one = plan_batched_mm(qwen(1), kH200);
  EXPECT_EQ(one.gemm, GemmPath::kGemv);
  EXPECT_EQ(one.tile_rows, 1);
  EXPECT_NO_THROW(check_plan(one, qwen(1), kH200));
  for (int64_t T : {2, 8, 4096}) {  // pairs may share experts: one 16-row tensor-core tile per pair
    const ExpertsPlan p = plan_batched_mm(qwen(T), kH200);
    EXPECT_EQ(p.gemm, GemmPath::kMmaSync);
    EXPECT_EQ(p.tile_rows, 16);
  }
  // Transposed weights: the GEMV's loads along K would be strided; 16-row mma.sync tiles.
  ExpertsShape t = qwen(1);
  t.transposed = true;
  EXPECT_EQ(plan_batched_mm(t, kH200).gemm, GemmPath::kMmaSync);
  EXPECT_EQ(plan_batched_mm(t, kH200).tile_rows, 16);
  EXPECT_THROW(check_plan(ExpertsPlan{GemmPath::kGemv, 1, 256, false, false, 1}, t, kH200), moex::InvalidInput);
  EXPECT_EQ(plan_batched_mm(shape(1, 4, 60, 2048, 1408, Elem::kF32), kH200).gemm, GemmPath::kSimt);
}

// Quantized experts: batched_mm streams every pair through the GEMV at any T; grouped_mm uses
// the GEMV up to 16 tokens and the CUDA-core tiles beyond; shapes the GEMV cannot read (I % 16)
// take the tiles; no tensor-core plan is accepted.
TEST(CudaPlan, QuantizedExpertsRunTheCudaCoreKernels) {
  for (int64_t T : {1, 16, 17, 4096}) {
    ExpertsShape s = shape(T, 8, 32, 7168, 2048);
    s.quantized = true;
    const ExpertsPlan b = plan_batched_mm(s, kH200), g = plan_grouped_mm(s, kA100);
    EXPECT_EQ(b.gemm, GemmPath::kGemv) << T;
    EXPECT_EQ(b.tile_rows, 1) << T;
    EXPECT_EQ(g.gemm, T <= kQuantGemvMaxTokens ? GemmPath::kGemv : GemmPath::kSimt) << T;
    EXPECT_NO_THROW(check_plan(b, s, kH200));
    EXPECT_NO_THROW(check_plan(g, s, kA100));
    EXPECT_NO_THROW(check_plan(g, s, kH200));  // (how tests force the CUDA-core tiles on Hopper)
    ExpertsPlan mma = g;
    mma.gemm = GemmPath::kMmaSync;
    mma.tile_rows = 16;
    EXPECT_THROW(check_plan(mma, s, kH200), moex::InvalidInput);
    ExpertsShape ragged = shape(T, 8, 32, 7168, 200);
    ragged.quantized = true;
    EXPECT_EQ(plan_batched_mm(ragged, kH200).gemm, GemmPath::kSimt) << T;
    EXPECT_EQ(plan_grouped_mm(ragged, kH200).gemm, GemmPath::kSimt) << T;
  }
}

// FP8 experts above the GEMV's token range on Hopper: the FP8 wgmma kernel (128-row tiles,
// cooperative; 256 weight rows per stage from 8 rows per expert, else 128); not for FP4,
// float32 activations, H or I not multiples of 16, ungated or interleaved layouts, misaligned
// tensors, other GPUs, or batched_mm.
TEST(CudaPlan, QuantizedFp8OnHopperTensorCores) {
  auto fp8 = [](int64_t T) {
    ExpertsShape s = shape(T, 8, 256, 7168, 2048);  // DeepSeek-V3's experts
    s.quantized = true;
    return s;
  };
  for (int64_t T : {17, 256, 4096, 16384}) {
    const ExpertsPlan p = plan_grouped_mm(fp8(T), kH200);
    EXPECT_EQ(p.gemm, GemmPath::kWgmmaFp8) << T;
    EXPECT_EQ(p.tile_rows, 128);
    // 256 experts, k = 8: T / 32 rows per expert; wide stages from 8 rows (T = 256).
    const int b_rows = T >= 256 ? 256 : 128;
    EXPECT_EQ(p.b_rows, b_rows) << T;
    EXPECT_FALSE(p.pingpong_gate_up || p.pingpong_down || p.cluster_pairs());
    EXPECT_EQ(p.raster_tiles, 8);
    EXPECT_NO_THROW(check_plan(p, fp8(T), kH200));
    EXPECT_EQ(p.describe(), "TMA + wgmma FP8 e4m3 (sm_90a) tiles of 128 rows, " +
                                std::to_string(b_rows) +
                                " weight rows per stage, block scales applied per 128-wide K "
                                "block");
    EXPECT_EQ(plan_batched_mm(fp8(T), kH200).gemm, GemmPath::kGemv) << T;
    EXPECT_EQ(plan_grouped_mm(fp8(T), kA100).gemm, GemmPath::kSimt) << T;
  }
  EXPECT_STREQ(gemm_path_name(GemmPath::kWgmmaFp8), "wgmma.fp8");
  EXPECT_EQ(plan_grouped_mm(fp8(16), kH200).gemm, GemmPath::kGemv);
  EXPECT_EQ(plan_grouped_mm(fp8(1), kH200).gemm, GemmPath::kGemv);
  // Within the GEMV's token range, grouped_mm leaves it once experts average more than 2 rows
  // (32 experts, k = 8: from T = 9), where the wgmma kernel applies.
  auto fp8_32 = [](int64_t T) {
    ExpertsShape s = shape(T, 8, 32, 7168, 2048);
    s.quantized = true;
    return s;
  };
  EXPECT_EQ(plan_grouped_mm(fp8_32(8), kH200).gemm, GemmPath::kGemv);
  EXPECT_EQ(plan_grouped_mm(fp8_32(9), kH200).gemm, GemmPath::kWgmmaFp8);
  EXPECT_EQ(plan_grouped_mm(fp8_32(16), kH200).gemm, GemmPath::kWgmmaFp8);
  EXPECT_EQ(plan_grouped_mm(fp8_32(16), kA100).gemm, GemmPath::kGemv);
  EXPECT_EQ(plan_batched_mm(fp8_32(16), kH200).gemm, GemmPath::kGemv);
  ExpertsShape fp4_32 = fp8_32(16);
  fp4_32.fp4 = true;
  EXPECT_EQ(plan_grouped_mm(fp4_32, kH200).gemm, GemmPath::kGemv);
  ExpertsShape half = fp8(4096);
  half.elem = Elem::kF16;
  EXPECT_EQ(plan_grouped_mm(half, kH200).gemm, GemmPath::kWgmmaFp8);

  const ExpertsPlan forced = plan_grouped_mm(fp8(4096), kH200);
  auto outside = [&](ExpertsShape s, const std::string& what) {
    EXPECT_EQ(plan_grouped_mm(s, kH200).gemm, GemmPath::kSimt) << what;
    EXPECT_FALSE(wgmma_fp8_applies(s, kH200)) << what;
    EXPECT_FALSE(wgmma_fp8_unsupported(s, kH200).empty()) << what;
    EXPECT_THROW(check_plan(forced, s, kH200), moex::InvalidInput) << what;
  };
  ExpertsShape s = fp8(4096);
  s.fp4 = true;
  outside(s, "fp4");
  s = fp8(4096);
  s.elem = Elem::kF32;
  outside(s, "f32");
  s = shape(4096, 8, 256, 7168, 2040);  // I % 16 != 0 (the GEMV does not apply either)
  s.quantized = true;
  outside(s, "I % 16");
  s = shape(4096, 8, 256, 7160, 2048);
  s.quantized = true;
  outside(s, "H % 16");
  s = fp8(4096);
  s.gated = false;
  outside(s, "ungated");
  s = fp8(4096);
  s.concatenated = false;
  outside(s, "interleaved");
  s = fp8(4096);
  s.aligned16 = false;
  outside(s, "misaligned");
  // Off Hopper, on a bf16 shape, or with an edited configuration, check_plan refuses it.
  EXPECT_THROW(check_plan(forced, fp8(4096), kA100), moex::InvalidInput);
  EXPECT_THROW(check_plan(forced, qwen(4096), kH200), moex::InvalidInput);
  for (auto edit : {+[](ExpertsPlan& p) { p.tile_rows = 64; },
                    +[](ExpertsPlan& p) { p.b_rows = 64; },
                    +[](ExpertsPlan& p) { p.pingpong_down = true; }}) {
    ExpertsPlan e = forced;
    edit(e);
    EXPECT_THROW(check_plan(e, fp8(4096), kH200), moex::InvalidInput);
  }
  // The CUDA-core tiles stay a valid plan for every FP8 shape (tests force them to compare).
  ExpertsPlan simt = plan_grouped_mm(fp8(4096), kA100);
  EXPECT_EQ(simt.gemm, GemmPath::kSimt);
  EXPECT_NO_THROW(check_plan(simt, fp8(4096), kH200));
}

TEST(CudaPlan, PlansArePureFunctions) {
  // The same inputs give the same plan (no hidden state: the policy reads nothing else).
  for (int64_t T : {1, 480, 4096, 16384})
    EXPECT_EQ(plan_grouped_mm(qwen(T), kH200), plan_grouped_mm(qwen(T), kH200));
}

TEST(CudaPlan, CheckPlanRejectsWhatCannotRun) {
  const ExpertsShape q = qwen(4096);
  ExpertsPlan w = plan_grouped_mm(q, kH200);
  EXPECT_NO_THROW(check_plan(w, q, kH200));
  EXPECT_THROW(check_plan(w, q, kA100), moex::InvalidInput);  // wgmma off Hopper
  ExpertsPlan bad_rows = w;
  bad_rows.tile_rows = 96;
  EXPECT_THROW(check_plan(bad_rows, q, kH200), moex::InvalidInput);
  ExpertsPlan bad_b = w;
  bad_b.b_rows = 64;
  EXPECT_THROW(check_plan(bad_b, q, kH200), moex::InvalidInput);
  ExpertsPlan pair = w;
  pair.tile_rows = 256;  // cluster pairs run cooperative stages only
  EXPECT_THROW(check_plan(pair, q, kH200), moex::InvalidInput);
  pair.pingpong_down = false;
  EXPECT_NO_THROW(check_plan(pair, q, kH200));
  EXPECT_TRUE(pair.cluster_pairs());
  ExpertsPlan mma = {GemmPath::kMmaSync, 16, 256, false, false, 64};
  ExpertsShape f32 = shape(4, 4, 60, 2048, 1408, Elem::kF32);
  EXPECT_THROW(check_plan(mma, f32, kH200), moex::InvalidInput);
  EXPECT_NO_THROW(check_plan(plan_grouped_mm(f32, kH200), f32, kH200));
}

}  // namespace

#endif  // MOEX_WITH_CUDA
