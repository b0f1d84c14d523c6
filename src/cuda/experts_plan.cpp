// Kernel plans of the CUDA experts backends (see experts_plan.hpp). Host code only: no CUDA call,
// so the policy is testable on machines without a GPU.
#include "cuda/experts_plan.hpp"

#include <algorithm>

#include "cuda/launchers.hpp"
#include "moex/error.hpp"

namespace moex::cuda {

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kSimt: return "simt";
    case GemmPath::kMmaSync: return "mma.sync";
    case GemmPath::kWgmma: return "wgmma";
    case GemmPath::kGemv: return "gemv";
    case GemmPath::kWgmmaFp8: return "wgmma.fp8";
  }
  return "?";
}

std::string ExpertsPlan::describe() const {
  const bool wgmma = gemm == GemmPath::kWgmma || gemm == GemmPath::kWgmmaFp8;
  return describe_path() + (wgmma && dynamic_items ? ", work items claimed at run time" : "");
}

std::string ExpertsPlan::describe_path() const {
  const std::string rows = std::to_string(tile_rows);
  switch (gemm) {
    case GemmPath::kSimt: return "SIMT tiles of " + rows + " rows";
    case GemmPath::kMmaSync: return "mma.sync tiles of " + rows + " rows";
    case GemmPath::kGemv: return "GEMV per pair (CUDA cores, weights streamed in 16-byte loads)";
    case GemmPath::kWgmmaFp8:
      return "TMA + wgmma FP8 e4m3 (sm_90a) tiles of " + rows + " rows, " +
             std::to_string(b_rows) + " weight rows per stage, block scales applied per "
             "128-wide K block" + std::string(masked ? ", masked layout" : "");
    case GemmPath::kWgmma: break;
  }
  if (fused)
    return "TMA + wgmma (sm_90a) tiles of " + rows +
           " rows, gate_up reading the hidden rows in place (cp.async), per-pair rows in the "
           "element type" + std::string(tile_rows == 128 && pingpong_down ? ", down GEMM on ping-pong warpgroups" : "");
  if (cluster_pairs())
    return "TMA + wgmma (sm_90a) tiles of 128 rows in 2-CTA clusters sharing each weight tile";
  std::string s = "TMA + wgmma (sm_90a) tiles of " + rows + " rows";
  if (masked) s += ", masked layout";
  if (b_rows != 256) s += ", " + std::to_string(b_rows) + " weight rows per stage";
  if (tile_rows == 128 && pingpong_gate_up && pingpong_down)
    s += ", both GEMMs on ping-pong warpgroups";
  else if (tile_rows == 128 && pingpong_down) s += ", down GEMM on ping-pong warpgroups";
  else if (tile_rows == 128 && pingpong_gate_up) s += ", gate_up GEMM on ping-pong warpgroups";
  return s;
}

bool mma_applies(const ExpertsShape& s) {
  // Both GEMMs read 16-byte chunks of A and of the weights: K and N multiples of 8, aligned bases
  // (the strides follow from the sizes). Transposed + interleaved would mix gate and up columns
  // in one chunk.
  return s.elem != Elem::kF32 && s.hidden % 8 == 0 && s.intermediate % 8 == 0 && s.aligned16 &&
         !(s.gated && s.transposed && !s.concatenated);
}

bool gemv_applies(const ExpertsShape& s) {
  // Each lane reads 16-byte chunks along K of one weight row: K a multiple of 8, row-major
  // weights (a transposed layout would make every load a strided gather).
  return s.elem != Elem::kF32 && s.hidden % 8 == 0 && s.intermediate % 8 == 0 && s.aligned16 &&
         !s.transposed;
}

bool wgmma_applies(const ExpertsShape& s, const DeviceTraits& d) {
  // The TMA maps read weights row-major ([rows, K]) and the epilogue pairs gate and up column
  // blocks, so transposed or interleaved layouts stay on mma.sync.
  return d.hopper() && mma_applies(s) && !s.transposed && (!s.gated || s.concatenated);
}

bool quant_gemv_applies(const ExpertsShape& s) {
  return s.quantized && s.hidden % 16 == 0 && s.intermediate % 16 == 0 && s.aligned16;
}

std::string wgmma_fp8_unsupported(const ExpertsShape& s, const DeviceTraits& d) {
  if (!d.hopper()) return "needs a compute capability 9.0 device";
  if (!s.quantized || s.fp4) return "runs FP8 (e4m3) quantized experts only";
  // The gate_up epilogue stages the activated intermediate as 16-bit values.
  if (s.elem == Elem::kF32) return "needs bf16 / f16 activations";
  // TMA reads the weights row-major; the epilogue pairs gate and up column blocks.
  if (!s.gated || !s.concatenated || s.transposed)
    return "needs gated, concatenated, row-major weights";
  // TMA row strides are multiples of 16 bytes: H and I (the two K's) multiples of 16 codes.
  if (s.hidden % 16 != 0 || s.intermediate % 16 != 0) return "needs H and I multiples of 16";
  if (!s.aligned16) return "needs 16-byte aligned hidden states and weights";
  return {};
}

namespace {

ExpertsPlan simt_plan() {
  ExpertsPlan p;
  p.gemm = GemmPath::kSimt;
  p.tile_rows = kSimtTileRows;
  p.raster_tiles = 1024 / kSimtTileRows;
  return p;
}

// Quantized experts read their weights in place: decode-sized calls stream them through the
// CUDA-core GEMV (up to 16 rows per tile for grouped_mm; quant_gemv.cuh decodes each weight once
// per chunk of tile rows); larger grouped calls run the FP8 tensor-core kernel on Hopper (128-row
// tiles of e4m3 codes, as DeepGEMM), or else the 32-row CUDA-core tile kernel (~6 TFLOP/s at
// DeepSeek-V3 T = 256 on the H200). batched_mm's tiles hold one pair each, at every T: the GEMV
// computes that row alone, where a 32-row tile would compute 31 rows of padding (measured on the
// H200 with 32 DeepSeek-sized experts, T = 4096: seconds per call).
//
// Between the two, grouped_mm's FP8 calls leave the GEMV once experts average more than 2 rows:
// the GEMV reads an expert once per 4 tile rows and decodes each weight per chunk, the wgmma
// kernel once per 128-row tile. 32 DeepSeek-V3-sized experts, k = 8, graphs: H200 (2026-12-02)
// T = 8 GEMV 0.496 / wgmma 0.527 ms, T = 9 - 32 wgmma 0.445-0.495 against the GEMV's 0.753 at
// T = 16; H100 with the few-row A boxes (2026-12-05) T = 4 0.409 / 0.405, T = 16 0.79-0.81 /
// 0.570 (docs/cuda.md).
bool quant_gemv_preferred(const ExpertsShape& s, const DeviceTraits& d) {
  if (s.tokens > kQuantGemvMaxTokens) return false;
  return s.pairs <= 2 * int64_t(s.experts) || !wgmma_fp8_applies(s, d);
}

// The FP8 wgmma kernel's stage width: 256 weight rows (gate_up items of 128 output columns, 128
// gate + 128 up rows; down items of 256 columns, two scale blocks) where the experts average at
// least 8 rows, else 128 (64 / 128 columns, twice the items). The wide items read each A tile
// from L2 once for twice the MMAs; at 128 weight rows the kernel streamed 32 KB a stage for its
// 128 x 128 x 128 block, which held it back. 32 DeepSeek-V3-sized experts, k = 8, H100
// (docs/cuda.md): T = 4096 / 16384 4.17-4.21 / 17.09-17.12 -> 3.38-3.39 / 13.75-13.76 ms, T = 32
// (8 rows per expert) 0.575 -> 0.551.
int fp8_wgmma_b_rows(const ExpertsShape& s) {
  return s.pairs >= 8 * int64_t(s.experts) ? 256 : 128;
}

ExpertsPlan quant_plan(const ExpertsShape& s, const DeviceTraits& d, bool per_pair) {
  ExpertsPlan p = simt_plan();
  if (per_pair) p.raster_tiles = 1;
  if (quant_gemv_applies(s) && (per_pair || quant_gemv_preferred(s, d))) {
    p.gemm = GemmPath::kGemv;
    p.tile_rows = per_pair ? 1 : 16;
    p.raster_tiles = per_pair ? 1 : 64;
  } else if (!per_pair && wgmma_fp8_applies(s, d)) {
    p.gemm = GemmPath::kWgmmaFp8;
    p.tile_rows = 128;
    p.b_rows = fp8_wgmma_b_rows(s);
    p.raster_tiles = 8;
  }
  return p;
}

}  // namespace

ExpertsPlan plan_batched_mm(const ExpertsShape& s, const DeviceTraits& d) {
  if (s.quantized) return quant_plan(s, d, true);
  // One token: its k pairs read k different experts once each, and the GEMV streams them without
  // the 15 padding rows of a tensor-core tile (H200, `moex bench experts --backends batched_mm
  // --tokens 1 --graph on`: Qwen1.5-MoE 0.0442 -> 0.0390 ms, Mixtral 0.2472 -> 0.1915, DeepSeek
  // 0.1989 -> 0.2014). From two tokens on, pairs that share an expert re-read its weights, and
  // the tensor-core tiles were faster (Qwen T = 4 0.0812 against 0.0934 ms, Mixtral T = 16 1.23
  // against 1.42, batch-32 decode 2806 against 1960 tokens/s; docs/cuda.md).
  if (gemv_applies(s) && s.tokens == 1) {
    ExpertsPlan p;
    p.gemm = GemmPath::kGemv;
    p.tile_rows = 1;
    p.raster_tiles = 1;
    return p;
  }
  if (!mma_applies(s)) {
    ExpertsPlan p = simt_plan();
    p.raster_tiles = 1;  // (per-pair tiles make no raster groups)
    return p;
  }
  ExpertsPlan p;
  p.gemm = GemmPath::kMmaSync;
  p.tile_rows = 16;
  p.raster_tiles = 1;
  return p;
}

ExpertsPlan plan_grouped_mm(const ExpertsShape& s, const DeviceTraits& d) {
  if (s.quantized) return quant_plan(s, d, false);
  if (!mma_applies(s)) return simt_plan();
  const bool wgmma = wgmma_applies(s, d);
  const int64_t active = std::max<int64_t>(1, std::min<int64_t>(s.experts, s.pairs));
  const int64_t rows = s.pairs / active;
  ExpertsPlan p;
  // Measured on the H200 (docs/cuda.md, "Tile rows"): 16-row mma.sync tiles win up to ~20 rows
  // per expert (Qwen T = 256: 0.301 ms vs 0.348 with 64-row wgmma tiles); at ~32 rows 64-row
  // wgmma tiles read each expert's weights once instead of twice (DeepSeek T = 1024: 5.80 ms vs
  // 8.41 with 16-row, 6.06 with 128-row tiles); from ~64 rows the 128-row tiles are fastest.
  if (rows <= 24 || (rows <= 48 && !wgmma)) {
    p.gemm = GemmPath::kMmaSync;
    p.tile_rows = 16;
  } else {
    p.gemm = wgmma ? GemmPath::kWgmma : GemmPath::kMmaSync;
    p.tile_rows = rows <= 48 ? 64 : 128;
  }
  // Ping-pong for the down GEMM when its reduction is short (K = I <= 2048: the fp32 epilogue is
  // a large share of an item; DeepSeek T = 4096 -5.6%, Qwen T = 4096 -2.6% on the H200). Not for
  // gate_up: 1-4% slower on Mixtral, level on Qwen, and at DeepSeek T = 4096 (-3%) behind the
  // down GEMM's ping-pong (docs/cuda.md, "Measured and not kept").
  p.pingpong_down = p.gemm == GemmPath::kWgmma && p.tile_rows == 128 && s.intermediate <= 2048;
  p.raster_tiles = std::max(1, 1024 / p.tile_rows);
  return p;
}

namespace {

// The bf16 / f16 wgmma plan of the Hopper-only backends at every size: few rows per expert
// (decode) on 64-row tiles of one consumer warpgroup, as grouped_mm's wgmma plans (each
// expert's weights still read once), 128-row tiles from 49 rows per expert on; the down GEMM on
// ping-pong warpgroups when I <= 2048 (grouped_mm's rule, measured there).
ExpertsPlan hopper_tiles_plan(const ExpertsShape& s) {
  const int64_t active = std::max<int64_t>(1, std::min<int64_t>(s.experts, s.pairs));
  ExpertsPlan p;
  p.gemm = GemmPath::kWgmma;
  p.tile_rows = s.pairs / active <= 48 ? 64 : 128;
  p.b_rows = 256;
  p.pingpong_down = p.tile_rows == 128 && s.intermediate <= 2048;
  p.raster_tiles = 1024 / p.tile_rows;
  return p;
}

}  // namespace

ExpertsPlan plan_deepgemm(const ExpertsShape& s, const DeviceTraits& d) {
  if (!s.aligned16)
    throw InvalidInput("deepgemm: the hidden states and the expert weights must start on 16-byte "
                       "boundaries (TMA); use grouped_mm for unaligned views");
  ExpertsPlan p;
  if (s.quantized) {
    p.gemm = GemmPath::kWgmmaFp8;
    p.tile_rows = 128;
    p.b_rows = fp8_wgmma_b_rows(s);
    p.raster_tiles = 8;
  } else {
    p = hopper_tiles_plan(s);
  }
  // The contiguous layout at every size: on an H100 the masked one was 3-12 % slower at 1-16
  // tokens with FP8 experts (its A tiles read whole boxes of the [E T] table where the
  // contiguous layout's small calls read past the end, which costs nothing) and level or up to
  // 2 % slower elsewhere (docs/cuda.md). It stays reachable through ExpertsPlan::masked.
  p.masked = false;
  check_plan(p, s, d);
  return p;
}

ExpertsPlan plan_sonicmoe(const ExpertsShape& s, const DeviceTraits& d) {
  if (!s.aligned16)
    throw InvalidInput("sonicmoe: the hidden states and the expert weights must start on 16-byte "
                       "boundaries (cp.async / TMA); use grouped_mm for unaligned views");
  ExpertsPlan p = hopper_tiles_plan(s);
  p.fused = true;
  // gate_up's producer reads the hidden rows in place with cp.async, and with the static
  // round-robin schedule its CTAs drift apart: ncu at Mixtral T = 16384 (H100) measured 52.6 GB
  // read from DRAM by that GEMM against 8.7 GB with items claimed at run time, 19.5 -> 11.5 ms
  // (docs/cuda.md, "sonicmoe: the fused path").
  p.dynamic_items = true;
  // The down GEMM on cooperative warpgroups, its bf16 / f16 per-pair rows staged through shared
  // memory (whole-row 16-byte stores) and its items claimed too: DeepSeek-V3 T = 16384 26.8 ->
  // 21.3 ms, Qwen1.5-MoE 2.29 -> 1.99 ms against the ping-pong down with direct stores (H100).
  p.pingpong_down = false;
  check_plan(p, s, d);
  return p;
}

void check_plan(const ExpertsPlan& p, const ExpertsShape& s, const DeviceTraits& d) {
  auto fail = [](const std::string& why) { throw InvalidInput("experts plan: " + why); };
  if (p.masked && ((p.gemm != GemmPath::kWgmma && p.gemm != GemmPath::kWgmmaFp8) || p.fused ||
                   p.cluster_pairs()))
    fail("the masked layout runs the single-CTA wgmma kernels (bf16 / f16 or FP8), not the fused "
         "path");
  if (p.masked && int64_t(s.experts) * s.tokens < s.pairs)
    fail("the masked layout needs E * T >= T * k (as many experts as slots per token)");
  if (p.fused) {
    if (p.gemm != GemmPath::kWgmma || s.quantized || !s.gated)
      fail("the fused path runs gated bf16 / f16 experts on the wgmma kernel");
    if ((p.tile_rows != 64 && p.tile_rows != 128) || p.b_rows != 256 || p.pingpong_gate_up)
      fail("the fused path runs cooperative 64- or 128-row tiles of 256 weight rows");
  }
  if (s.quantized && p.gemm != GemmPath::kSimt && p.gemm != GemmPath::kGemv &&
      p.gemm != GemmPath::kWgmmaFp8)
    fail("quantized experts run SIMT tiles, the GEMV or (FP8 on sm_90) the FP8 wgmma kernel");
  if (p.gemm == GemmPath::kWgmmaFp8) {
    if (const std::string why = wgmma_fp8_unsupported(s, d); !why.empty())
      fail("the FP8 wgmma path " + why);
    if (p.tile_rows != 128 || (p.b_rows != 128 && p.b_rows != 256))
      fail("the FP8 wgmma path runs tiles of 128 rows and stages of 128 or 256 weight rows");
    if (p.pingpong_gate_up || p.pingpong_down)
      fail("the FP8 wgmma path runs cooperative warpgroups (no ping-pong)");
  }
  if (p.dynamic_items && p.gemm != GemmPath::kWgmma && p.gemm != GemmPath::kWgmmaFp8)
    fail("work items are claimed at run time by the wgmma kernels only");
  if (s.quantized && p.gemm == GemmPath::kGemv) {
    if (!quant_gemv_applies(s)) fail("the quantized GEMV needs H and I multiples of 16");
    if (p.raster_tiles < 1 || p.raster_tiles > 0xffff) fail("raster_tiles must be in [1, 65535]");
    return;
  }
  switch (p.gemm) {
    case GemmPath::kSimt:
      if (p.tile_rows != kSimtTileRows)
        fail("SIMT tiles have " + std::to_string(kSimtTileRows) + " rows");
      return;
    case GemmPath::kMmaSync:
      if (!mma_applies(s)) fail("mma.sync does not apply to this layout, dtype or alignment");
      if (p.tile_rows != 16 && p.tile_rows != 64 && p.tile_rows != 128)
        fail("mma.sync tiles have 16, 64 or 128 rows, not " + std::to_string(p.tile_rows));
      break;
    case GemmPath::kGemv:
      if (!gemv_applies(s)) fail("the GEMV needs bf16 / f16 row-major weights with K a multiple of 8");
      break;
    case GemmPath::kWgmma:
      if (!wgmma_applies(s, d))
        fail("wgmma needs an sm_90 device and a row-major, concatenated layout");
      if (p.tile_rows != 64 && p.tile_rows != 128 && p.tile_rows != 256)
        fail("wgmma tiles have 64, 128 or 256 (cluster pair) rows, not " +
             std::to_string(p.tile_rows));
      if (p.b_rows != 128 && p.b_rows != 256) fail("wgmma stages hold 128 or 256 weight rows");
      if (p.cluster_pairs() && (p.b_rows != 256 || p.pingpong_gate_up || p.pingpong_down))
        fail("cluster pairs run cooperative 256-row stages");
      break;
    case GemmPath::kWgmmaFp8:  // (checked above)
      break;
  }
  if (p.raster_tiles < 1 || p.raster_tiles > 0xffff) fail("raster_tiles must be in [1, 65535]");
}

}  // namespace moex::cuda
