// Launchers: the middle tier. Each takes pointers, sizes, strides and a stream, launches one kernel
// of the same name (kernels live in the *.cuh files) and throws DeviceError on a launch failure.
// No launcher reads device memory on the host or synchronises: sizes that depend on the routing
// (tokens per expert, number of tiles) stay on the device and kernels read them there, so every
// launcher here may be captured in a CUDA graph and replayed with new routing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moex::cuda {

// Element type of hidden / weights / intermediate (the activation dtype).
enum class Elem : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
size_t elem_size(Elem e);

// A tile of the grouped GEMMs: `rows` consecutive sorted positions starting at `row_start`, all
// routed to `expert`. rows == 0 marks an unused slot. `group` places the tile in its raster group
// (consecutive tiles of one expert that the wgmma kernel computes column block by column block,
// see work_item in grouped_gemm_wgmma.cuh): (group size << 16) | index within the group; 0 for
// tiles that are not grouped.
struct Tile {
  int expert;
  int row_start;
  int rows;
  int group;
};

// ---- routing ----
// Groups the P = T*k (token, slot) pairs by expert, in one single-block launch (small routing
// problems are launch-bound; one block keeps counting, scan and scatter in shared memory):
//   offsets[E+1]   exclusive prefix sum of tokens per expert (offsets[E] = valid pairs)
//   sorted_pair[P] pair index at each sorted position (positions >= offsets[E] unused)
//   pos_of_pair[P] sorted position of each pair, -1 for a sentinel (id >= E or id < 0)
//   tiles[max_tiles], num_tiles[1]: the tiles of `tile_rows` rows each expert's group splits into,
//                  each expert's tiles cut into raster groups of at most `raster_tiles` tiles of
//                  about equal size (Tile::group)
// max_tiles must be >= route_max_tiles(P, E, tile_rows).
int64_t route_max_tiles(int64_t pairs, int64_t experts, int tile_rows);
void launch_route_by_expert(const void* top_k_index, bool index_i64, int64_t pairs, int experts,
                            int tile_rows, int raster_tiles, int* offsets, int* sorted_pair,
                            int* pos_of_pair, Tile* tiles, int max_tiles, int* num_tiles,
                            cudaStream_t stream);
// The same in DeepGEMM's masked layout ([E, masked_rows, .] with per-expert counts): expert e's
// pairs at sorted positions [e * masked_rows, e * masked_rows + count_e), offsets[e] =
// e * masked_rows, offsets[E] = valid pairs, sorted_pair [E * masked_rows] = -1 at every
// position no pair takes (readers skip those rows; offsets[E] bounds nothing here). With
// masked_rows = T an expert exceeds it only when a token names it twice; such a call is laid
// out contiguously in the same table (needs E * masked_rows >= P) with the same tiles. Same
// tiles as the contiguous layout otherwise (positions moved), so every tile-reading GEMM runs it.
void launch_route_masked(const void* top_k_index, bool index_i64, int64_t pairs, int experts,
                         int masked_rows, int tile_rows, int raster_tiles, int* offsets,
                         int* sorted_pair, int* pos_of_pair, Tile* tiles, int max_tiles,
                         int* num_tiles, cudaStream_t stream);

// ---- grouped GEMMs ----
// kind kGateUp: A row r = hidden[sorted_pair[r] / top_k], B = gate_up rows of the tile's expert;
//   the epilogue adds gate_up_bias, applies the activation (gate/up paired through the layout
//   flags) and stores the intermediate h[r, :I] rounded to the element type.
// kind kDown: A row r = h[r], B = down rows; the epilogue adds down_bias and stores y[r, :H] fp32.
enum class GemmKind : int { kGateUp = 0, kDown = 1 };
struct GroupedGemmArgs {
  GemmKind kind = GemmKind::kGateUp;
  Elem elem = Elem::kBF16;
  const void* a = nullptr;   // hidden [T, K] (kGateUp) or h [P, K] (kDown)
  const int* sorted_pair = nullptr;
  int top_k = 1;
  const Tile* tiles = nullptr;
  const int* num_tiles = nullptr;
  int max_tiles = 0;
  const void* w = nullptr;   // [E, N_rows, K] or transposed [E, K, N_rows]
  int64_t w_expert_stride = 0;
  bool transposed = false;
  int64_t ldw = 0;           // row length of one expert's matrix: K, or N_rows when transposed
  const void* bias = nullptr;  // [E, N_rows] or null
  int64_t bias_expert_stride = 0;
  int K = 0;                 // reduction length (H for kGateUp, I for kDown)
  int N = 0;                 // output columns (I for kGateUp, H for kDown)
  bool gated = true, concatenated = true;  // kGateUp only
  int act = 0;
  float limit = 7.f, alpha = 1.702f;
  void* out = nullptr;       // h [P, I] of elem (kGateUp) or y [P, H] float (kDown)
  // kDown: y [P, H] of elem, each value rounded once (the fused "sonicmoe" path's per-pair rows,
  // half the bytes of fp32 y); set only for the wgmma kernel.
  bool out_elem = false;
  // wgmma path only: A already in sorted order, [a_rows, K] contiguous.
  const void* a_sorted = nullptr;
  int64_t a_rows = 0;
  int64_t w_rows_total = 0;  // E * rows per expert (the B tensor map's extent)
  // batched_mm's routing read by the GEMM itself, with no routing kernel before it: when set,
  // tiles / num_tiles / sorted_pair are not read; block b's tile is pair b, one row at position
  // b of its expert pair_expert[b] (int64 when pair_i64; none for an id outside [0, experts)),
  // and gate_up's A row at position r is token r / top_k. The grid is then one tile per pair.
  const void* pair_expert = nullptr;
  bool pair_i64 = false;
  int experts = 0;
  // wgmma path, cooperative single-CTA instances (ExpertsPlan::dynamic_items): int[2], zero
  // before the launch and zero again after it (the kernel's last CTA resets them): the next
  // unclaimed work item and the CTAs done claiming. Null: the static round-robin schedule.
  int* item_claims = nullptr;
};
// Tensor-core path: mma.sync m16n8k16 with a cp.async pipeline (bf16 / f16; K, N multiples of 8;
// 16-byte aligned pointers; not transposed+interleaved: mma_applies in experts_plan.hpp).
// tile_rows 16 runs the small configuration, 64 and 128 the 128-row one.
void launch_grouped_gemm_mma(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream);
// CUDA-core GEMV over route tiles of one or a few rows (grouped_gemv.cuh): bf16 / f16, weights
// not transposed, K a multiple of 8, 16-byte aligned bases (gemv_applies in experts_plan.hpp).
void launch_grouped_gemv(const GroupedGemmArgs& a, cudaStream_t stream);
// Hopper path: TMA + wgmma, warp-specialised (grouped_gemm_wgmma.cuh). Needs a compute
// capability 9.0 device, bf16 / f16, non-transposed weights, gated layouts concatenated, K a
// multiple of 8, 16-byte aligned tensors (wgmma_applies in experts_plan.hpp), and A contiguous in
// sorted order: `a_sorted` with `a_rows` rows (gate_up: the gathered hidden rows, see
// launch_gather_sorted; down: h). The configuration comes from the plan:
struct WgmmaConfig {
  int tile_rows = 128;    // 64 (one consumer warpgroup), 128 (two), 256 (2-CTA cluster pairs)
  int b_rows = 256;       // weight rows per stage (128 or 256)
  bool pingpong = false;  // 128-row tiles: consumers take whole 128 x 128 items in turn
  // gate_up: A's rows read in place from the hidden states (`a`, via sorted_pair) with cp.async
  // instead of from a_sorted (cooperative tiles of 64 or 128 rows; bf16 / f16).
  bool gather_a = false;
  // down with y in the element type (GroupedGemmArgs::out_elem): y staged through shared memory
  // and stored in whole-row 16-byte pieces (cooperative tiles of 64 or 128 rows, 256 weight rows
  // per stage; bf16 / f16).
  bool staged_out = false;
};
void launch_grouped_gemm_wgmma(const GroupedGemmArgs& a, const WgmmaConfig& c, cudaStream_t stream);
// Any element type and layout, plain fp32 FMA (no tf32): the fallback and the fp32 path.
constexpr int kSimtTileRows = 32;
void launch_grouped_gemm_simt(const GroupedGemmArgs& a, cudaStream_t stream);

// ---- block-scaled FP8 / FP4 (quant_gemm.cuh; the math of include/moex/quant.hpp) ----
// q[r, :] = e4m3 codes of row r of x [rows, K] per 128-wide block, s[r, b] its scales, for
// r < *valid_rows (all rows when null).
void launch_quantize_act(const void* x, Elem elem, int64_t rows, int K, const int* valid_rows,
                         uint8_t* q, float* s, cudaStream_t stream);
// The same for row r read from x[sorted_pair[r] / top_k] when sorted_pair is given and top_k > 0
// (the gather into sorted order fused into the quantizer), and with scales_by_block the scales
// stored s[b, r] ([ceil(K/128), rows], the FP8 wgmma kernel's layout). With valid_rows null,
// rows whose sorted_pair[r] < 0 are skipped (the masked layout's free positions; top_k = 0
// reads row r in place). Either needs 16-bit x, K a multiple of 8 and 16-byte aligned rows;
// without both it is launch_quantize_act.
void launch_quantize_act_gathered(const void* x, Elem elem, const int* sorted_pair, int top_k,
                                  int64_t rows, int K, const int* valid_rows, uint8_t* q, float* s,
                                  bool scales_by_block, cudaStream_t stream);
// The weights of a quantized GEMM: `w` of GroupedGemmArgs holds e4m3 bytes [E, N_rows, K] (FP8)
// or e2m1 pairs [E, N_rows, K / 2] (FP4, low nibble = even column).
struct QuantWeightArgs {
  bool fp4 = false;
  bool scale_e8m0 = false;       // scales stored as UE8M0 bytes, else float32
  const void* scale = nullptr;   // FP8 [E, scale_rows, ceil(K/128)]; FP4 [E, N_rows, K/32]
  int64_t scale_expert_stride = 0;  // elements
  int block_n = 128;             // FP8 weight rows per scale row
};
// The grouped GEMM of GroupedGemmArgs (same tiles, epilogues and outputs) with A read as codes
// aq [rows, K] + scales as [rows, ceil(K/128)] (gate_up: rows are tokens; down: sorted positions)
// and the weights quantized. The weights' expert stride is in bytes.
void launch_grouped_gemm_quant(const GroupedGemmArgs& a, const QuantWeightArgs& w,
                               const uint8_t* aq, const float* as, cudaStream_t stream);
// The same on Hopper tensor cores (grouped_gemm_wgmma.cuh, FP8 operands): TMA + wgmma e4m3 with
// the block scales applied per 128-wide K block. A is read in sorted order: aq [a.a_rows, K]
// codes and as_by_block [ceil(K/128), a.a_rows] scales of the rows in sorted order (gate_up too;
// launch_quantize_act_gathered with scales_by_block writes both). Needs a
// compute capability 9.0 device, FP8 weights (not FP4), bf16 / f16 elem, gated concatenated
// gate_up (or down), K a multiple of 16, 16-byte aligned weights and 128-row route tiles
// (wgmma_fp8_applies in experts_plan.hpp). b_rows: weight rows per stage, 128 (gate_up items of
// 64 output columns, down 128) or 256 (128 / 256; ExpertsPlan::b_rows says when).
void launch_grouped_gemm_wgmma_fp8(const GroupedGemmArgs& a, const QuantWeightArgs& w,
                                   const uint8_t* aq, const float* as_by_block, int b_rows,
                                   cudaStream_t stream);
// The same for tiles of one or a few rows (decode): 16-byte weight loads, K a multiple of 16
// (FP8) / 32 (FP4), 16-byte aligned weights. max_tile_rows: the most rows a tile can hold (1
// picks the single-row instance).
void launch_grouped_gemv_quant(const GroupedGemmArgs& a, const QuantWeightArgs& w,
                               const uint8_t* aq, const float* as, int max_tile_rows,
                               cudaStream_t stream);
// out [rows, N] (elem) = quantized linear of the codes aq / as of x [rows, K] with one quantized
// weight [N, K] (+ bias [N] of elem, or null). Up to kQuantLinearGemvMaxRows rows (with K a
// multiple of 16 / 32 and an aligned weight) it runs the GEMV, else the tile kernel.
inline constexpr int64_t kQuantLinearGemvMaxRows = 16;
void launch_linear_quant(const uint8_t* aq, const float* as, int64_t rows, int K, int N,
                         const void* w, const QuantWeightArgs& qw, const void* bias, Elem elem,
                         void* out, cudaStream_t stream);
// The same on the Hopper FP8 wgmma kernel (launch_grouped_gemm_wgmma_fp8, the weight as one
// expert, its rows as kLinearWgmmaTileRows-row tiles, stages of kLinearWgmmaBRows weight rows),
// from x itself: x [rows, K] (bf16 / f16) quantized per 1 x 128 block into codes [rows, K] and
// scales by K block [ceil(K/128), rows], the tile table written into tiles
// [ceil(rows / kLinearWgmmaTileRows)] and num_tiles
// on the device. FP8 weights with 128 x 128 scale blocks, K a multiple of 16, 16-byte aligned x
// and weight (ops::cuda::linear_quantized_on_tensor_cores).
inline constexpr int kLinearWgmmaBRows = 256, kLinearWgmmaTileRows = 128;
void launch_linear_quant_wgmma(const void* x, Elem elem, int64_t rows, int K, int N,
                               const void* w, const QuantWeightArgs& qw, const void* bias,
                               void* out, uint8_t* codes, float* scales, Tile* tiles,
                               int* num_tiles, cudaStream_t stream);

// ---- elementwise ----
// out[t, :] = round( sum_{j<k, pos_of_pair[t*k+j] >= 0} w(t, j) * y[pos_of_pair[t*k+j], :] ),
// summed in fp32 in slot order; w(t, j) = weights[t, j], or weights[t, id] when per_expert,
// rounded to elem first when round_weights. y holds fp32 rows, or rows of elem when y_elem.
// pos_of_pair null (batched_mm): pair p's row is p, skipped when its id is outside [0, experts).
void launch_combine(const void* y, bool y_elem, const int* pos_of_pair, const void* top_k_index,
                    bool index_i64, const void* weights, Elem weights_elem, bool per_expert,
                    bool round_weights, int64_t tokens, int top_k, int experts, int hidden,
                    Elem elem, void* out, cudaStream_t stream);
// dst[r, :] = src[sorted_pair[r] / top_k, :] for r < rows.
void launch_gather(const void* src, const int* sorted_pair, int top_k, int64_t rows, int cols,
                   Elem elem, void* dst, cudaStream_t stream);
// dst[r, :] = src[sorted_pair[r] / top_k, :] for r < *valid (a device count, e.g. offsets[E]),
// or, valid null (the masked layout), for every r with sorted_pair[r] >= 0, over a grid of
// `rows` (an upper bound): the graph-capturable gather of the wgmma path.
void launch_gather_sorted(const void* src, const int* sorted_pair, const int* valid, int top_k,
                          int64_t rows, int cols, Elem elem, void* dst, cudaStream_t stream);
// h[r, i] = act(gate, up) of the fp32 gate_up product gu [rows, R] (R = 2I gated, I ungated).
void launch_activation(const float* gu, int64_t rows, int I, bool gated, bool concatenated,
                       int act, float limit, float alpha, Elem elem, void* h, cudaStream_t stream);
// Eager's dense product: c[m, n] = sum_k a[m, k] * W(n, k) + bias[n] (fp32 out), where
// W(n, k) = w[n * sn + k * sk].
void launch_dense_linear(const void* a, int64_t m, int k, const void* w, int64_t sn, int64_t sk,
                         const void* bias, int n, Elem elem, float* c, cudaStream_t stream);

}  // namespace moex::cuda
