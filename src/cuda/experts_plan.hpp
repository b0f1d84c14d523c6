// Kernel plans of the CUDA experts backends: which GEMM kernels run, on which tile shapes, as a
// pure function of the problem's shape and the device's traits. A plan is computed once per call
// (plan_* below), passed down as a value to the ops and launchers, printed by
// `moex bench experts --explain`, and unit-tested on fixed shapes and traits without a GPU. No
// environment variable or other hidden state changes it; tests that exercise the options the
// policy does not pick on their machine set the fields explicitly (check_plan validates them).
#pragma once

#include <cstdint>
#include <string>

namespace moex::cuda {

enum class Elem : int;

// What a plan depends on, read off a validated call (see shape_of in experts_ops.hpp).
struct ExpertsShape {
  Elem elem{};
  int64_t tokens = 0;
  int64_t pairs = 0;  // T * k
  int experts = 0, hidden = 0, intermediate = 0;
  bool gated = true, concatenated = true, transposed = false;
  bool aligned16 = true;  // hidden, gate_up and down start on 16-byte boundaries
  bool quantized = false;  // FP8 / FP4 experts: kSimt, kGemv, or kWgmmaFp8 (FP8 only)
  bool fp4 = false;        // quantized with FP4 (e2m1) weights
};

// What a plan depends on, read once per device (traits_of in experts_ops.hpp).
struct DeviceTraits {
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  bool hopper() const { return cc_major == 9 && cc_minor == 0; }
};

enum class GemmPath : unsigned char {
  kSimt,     // fp32 FMA, any layout and size (the fp32 path and the fallback)
  kMmaSync,  // mma.sync m16n8k16 + cp.async (bf16 / f16, K and N multiples of 8)
  kWgmma,    // Hopper TMA + wgmma, warp-specialised (sm_90a; not transposed; gated: concatenated)
  kGemv,     // CUDA-core GEMV per tile row (bf16 / f16, not transposed): batched_mm's pairs
  kWgmmaFp8, // quantized FP8 experts on Hopper: TMA + wgmma e4m3, block scales per 128-wide K
};
const char* gemm_path_name(GemmPath p);

struct ExpertsPlan {
  GemmPath gemm = GemmPath::kSimt;
  // Rows of A per route tile. kSimt: 32. kMmaSync: 16 (streaming, small T) or 128 (64 runs the
  // 128-row configuration). kWgmma: 64 (one consumer warpgroup), 128 (two), or 256: route tiles
  // of 256 rows, each computed by a 2-CTA cluster of 128-row CTAs that multicast every weight tile
  // to both (measured slower than single CTAs on every row but one, docs/cuda.md; never picked).
  int tile_rows = 32;
  // kWgmma: weight rows per pipeline stage (output columns per CTA): 256, or 128 (64-column
  // gate_up tiles; measured faster only at Qwen1.5-MoE T = 1024, docs/cuda.md; never picked).
  // kWgmmaFp8: 256 where experts average at least 8 rows (gate_up items of 128 output columns,
  // down 256), else 128 (64 / 128 columns); tile_rows 128.
  int b_rows = 256;
  // kWgmma with 128-row tiles: the two consumer warpgroups take whole 128 x 128 items in turn
  // (ping-pong) instead of sharing 128 x 256 items; per GEMM.
  bool pingpong_gate_up = false, pingpong_down = false;
  // Route tiles per raster group (tiles of one expert computed column block by column block while
  // their A rows stay in L2): about 1024 rows of A.
  int raster_tiles = 8;
  // kWgmma, sonicmoe's fused path: gate_up reads the hidden rows in place (no gathered copy) on
  // cooperative tiles of 256 weight rows, down writes per-pair rows in the element type.
  bool fused = false;
  // kWgmma / kWgmmaFp8: DeepGEMM's masked layout, expert e's rows at sorted positions
  // [e * T, e * T + count_e) of an [E * T] table (launch_route_masked), instead of the contiguous
  // layout's P positions in expert order. Same tiles and kernels; no policy picks it (measured
  // no faster, docs/cuda.md), tests and lab/cuda/experts_plan_variants.cpp set it.
  bool masked = false;
  // kWgmma / kWgmmaFp8, cooperative single-CTA instances: each CTA claims its next work item
  // from a counter when its producer is ready for one, instead of the fixed round-robin share
  // (the kernel's dynamic schedule; ping-pong and cluster instances keep the static one).
  bool dynamic_items = false;

  bool cluster_pairs() const { return gemm == GemmPath::kWgmma && tile_rows == 256; }
  bool operator==(const ExpertsPlan&) const = default;
  // One line for logs and `--explain`: "TMA + wgmma (sm_90a) tiles of 128 rows, down GEMM on
  // ping-pong warpgroups".
  std::string describe() const;

 private:
  std::string describe_path() const;
};

// Whether the tensor-core kernels serve both GEMMs of this shape (layout, sizes, alignment).
bool mma_applies(const ExpertsShape& s);
bool gemv_applies(const ExpertsShape& s);  // kGemv: bf16 / f16, row-major, K % 8, aligned

bool wgmma_applies(const ExpertsShape& s, const DeviceTraits& d);
// Quantized experts' GEMV (quant_gemv.cuh): 16-byte loads along K of e4m3 / e2m1 rows (H, I
// multiples of 16), each weight decoded once for up to 8 rows of a tile.
bool quant_gemv_applies(const ExpertsShape& s);
// kWgmmaFp8: sm_90, FP8 weights, bf16 / f16 activations, gated concatenated row-major weights,
// H and I multiples of 16 (TMA row strides of e4m3 codes), 16-byte aligned tensors. The empty
// string when it applies, else why not (for check_plan's message).
std::string wgmma_fp8_unsupported(const ExpertsShape& s, const DeviceTraits& d);
inline bool wgmma_fp8_applies(const ExpertsShape& s, const DeviceTraits& d) {
  return wgmma_fp8_unsupported(s, d).empty();
}

// grouped_mm: 16-row mma.sync tiles while experts average few rows (memory-bound: weights
// dominate), 64-row wgmma tiles around 32 rows per expert, 128-row tiles beyond (Hopper: wgmma,
// ping-pong down GEMM when I <= 2048); SIMT where the tensor-core kernels do not apply.
ExpertsPlan plan_grouped_mm(const ExpertsShape& s, const DeviceTraits& d);
// Quantized experts: the GEMV (batched_mm at every T, grouped_mm while T <=
// kQuantGemvMaxTokens and, where the FP8 wgmma kernel applies, while experts average at most 2
// rows) where it applies; grouped_mm beyond that on FP8 tensor cores where wgmma_fp8_applies
// (128-row tiles); else the CUDA-core tile kernel.
inline constexpr int64_t kQuantGemvMaxTokens = 16;
// deepgemm: the Hopper tensor-core kernels at every size, never another path: bf16 experts on
// the TMA + wgmma kernel (64-row tiles while experts average at most 48 rows, else 128), FP8
// experts on its e4m3 form (128-row tiles), over the contiguous layout (pairs sorted by expert on
// the device, each expert's rows starting a new tile, so no tile straddles two experts:
// DeepGEMM's M-grouped contiguous layout without the padded copy) at every size: the masked
// layout (ExpertsPlan::masked) measured no faster at decode sizes (docs/cuda.md).
// Throws InvalidInput naming the condition when those kernels cannot run the call (the spec-level
// conditions are deepgemm_unsupported's; this adds the pointers' 16-byte alignment).
ExpertsPlan plan_deepgemm(const ExpertsShape& s, const DeviceTraits& d);
// sonicmoe: the fused Hopper path at every size (64-row tiles while experts average at most 48
// rows, else 128; ping-pong down GEMM when I <= 2048, as grouped_mm's wgmma plans). Throws
// InvalidInput naming the condition when it cannot run the call (the spec-level conditions are
// sonicmoe_unsupported's; this adds the pointers' 16-byte alignment).
ExpertsPlan plan_sonicmoe(const ExpertsShape& s, const DeviceTraits& d);
// batched_mm: one 16-row mma.sync tile per (token, slot) pair, or one SIMT tile.
ExpertsPlan plan_batched_mm(const ExpertsShape& s, const DeviceTraits& d);
// Throws InvalidInput naming the field when `p` cannot run this shape on this device (a plan set
// by hand in a test or the bench).
void check_plan(const ExpertsPlan& p, const ExpertsShape& s, const DeviceTraits& d);

}  // namespace moex::cuda
