// CPU matrix micro-kernels of the experts engine: the device-code tier (see engine.hpp for the
// launcher tier and docs/cpu.md for the measurements behind the choices).
//
// Every kernel computes one block C[m, 32] = A[m, K] * B[K, 32] with float32 accumulation, where
// B is two consecutive 16-column *panels* of a packed weight matrix (packed in engine.cpp):
//   bf16 weights: "pair" layout [K/2][16][2]: row p of a panel holds, for 16 output columns,
//                 the two bf16 values W[n][2p], W[n][2p+1]. This is the VNNI layout that both
//                 AMX TDPBF16PS (a 16 x 32 B tile is 1 KiB of consecutive rows) and AVX512-BF16
//                 VDPBF16PS (one row = one zmm) consume directly, so one packing serves every
//                 bf16 path, including the ones that widen to fp32 (avx512, avx2, portable).
//   fp32 weights: "panel" layout [K][16]: row k holds W[n][k] for 16 columns (one zmm).
// A is row-major with leading dimension lda (elements) and holds at least K columns; K is padded
// to the packing's k multiple and the padding of both A and B is zero. Rows past m may be read
// (the AMX path loads whole 16-row tiles) but never influence rows < m, so A buffers carry a
// tail of kRowSlack readable rows.
//
// Each file compiles its kernels inside a target region (target.hpp), not with a global -m flag,
// so the library runs on any x86-64 and picks a path at run time (engine.cpp).
#pragma once

#include <cstdint>

#include "moex/dtype.hpp"

namespace moex::cpu::kernels {

constexpr int kPanelCols = 16;     // columns of one packed panel
constexpr int kBlockCols = 32;     // columns a kernel call produces (two panels)
constexpr int kBf16KMultiple = 32; // K padding of bf16 packing (one AMX tile row = 32 bf16)
constexpr int kRowSlack = 32;      // readable rows an A buffer must have past its last row

struct GemmArgs {
  const void* a = nullptr;  // bf16 (uint16_t) or fp32 rows
  int64_t lda = 0;          // elements
  const void* b = nullptr;  // first of two panels
  int64_t panel_stride = 0; // elements from panel 0 to panel 1
  int64_t k = 0;            // padded K
  int m = 0;                // rows, 1..kMaxRows
  float* c = nullptr;       // m x 32 fp32 output (overwritten)
  int64_t ldc = 0;          // elements
  // Optional: bytes the caller will need next (the following weight block), pulled into L2
  // while this call computes. The AMX kernel uses it; the vector kernels prefetch their own
  // stream instead.
  const void* prefetch = nullptr;
  int64_t prefetch_bytes = 0;
};
constexpr int kMaxRows = 32;  // rows one kernel call handles (the caller chunks M)

using GemmFn = void (*)(const GemmArgs&);

// bf16 A x bf16 pair-packed B.
void gemm_bf16_portable(const GemmArgs& g);
void gemm_bf16_avx2(const GemmArgs& g);
void gemm_bf16_avx512(const GemmArgs& g);
void gemm_bf16_avx512bf16(const GemmArgs& g);
void gemm_bf16_amx(const GemmArgs& g);
// fp32 A x fp32 panel-packed B.
void gemm_f32_portable(const GemmArgs& g);
void gemm_f32_avx2(const GemmArgs& g);
void gemm_f32_avx512(const GemmArgs& g);

// Gated SiLU epilogue of m rows of one fp32 result block (row stride kBlockCols, each row
// [16 gate | 16 up]): out[r * ldo + i] = silu(c[r][i] + b[i]) * (c[r][16 + i] + b[16 + i]) for
// i < valid (<= 16), 0 for valid <= i < 16; bias may be null (then b = 0). The _bf16 variant
// writes bf16 rounded to nearest even exactly like float_to_bf16 (integer rounding, not
// VCVTNEPS2BF16, which treats denormals as zero), the _f32 variant fp32. Whole rows with vector
// stores: the scalar per-element conversion took about half the gate_up phase (docs/cpu.md).
using GatedRowsFn = void (*)(const float* c, int m, const float* bias, int valid, void* out,
                             int64_t ldo);
void gated_silu_rows_bf16_avx512(const float* c, int m, const float* bias, int valid, void* out,
                                 int64_t ldo);
void gated_silu_rows_f32_avx512(const float* c, int m, const float* bias, int valid, void* out,
                                int64_t ldo);
// out[i] = ((0 + rows[0][i]) + rows[1][i]) + ... (in order), i < len, as bf16 (rounded like
// float_to_bf16) or fp32: the combine of a token's slots. n may be 0 (zeros).
using SumRowsFn = void (*)(const float* const* rows, int n, int64_t len, void* out);
void sum_rows_bf16_avx512(const float* const* rows, int n, int64_t len, void* out);
void sum_rows_f32_avx512(const float* const* rows, int n, int64_t len, void* out);

// AMX needs the kernel's permission to use tile data (Linux arch_prctl) once per process and a
// tile configuration per thread; amx_request_permission returns false when either is refused.
bool amx_request_permission();

// Packing (prepare time, pack_panel.cpp): one panel from the 16 source rows of its output columns,
// each `k` contiguous elements of `elem` bytes (2: bf16 -> pair layout, 4: fp32 -> panel layout;
// a null row reads as zeros), into k_pad packed rows of 64 bytes at `dst` (64-byte aligned);
// elements k .. k_pad - 1 are zero. Every byte of the panel is written (no zeroing pass needed);
// the AVX-512 variant uses non-temporal stores and ends with a store fence.
using PackPanelFn = void (*)(const void* const* rows, int64_t k, int64_t k_pad, int elem, void* dst);
void pack_panel_portable(const void* const* rows, int64_t k, int64_t k_pad, int elem, void* dst);
void pack_panel_avx512(const void* const* rows, int64_t k, int64_t k_pad, int elem, void* dst);

// Block-scaled weights (FP8 e4m3 / FP4 e2m1, moex/quant.hpp) times quantized activations, read
// straight from the stored bytes (gemm_block_scaled.cpp): for m < m rows and n0 <= n < n1,
//   y[m * ldy + n] = sum_b xs[b] * f_b * sum_{k in b} xq[k] * w_b(n, k)
// over the 128-wide activation blocks b, where w_b is the decoded weight (FP8: the e4m3 value,
// f_b its 128 x 128 block scale; FP4: e2m1 value x its 1 x 32 scale, f_b = 1), the inner sum in
// float32 per block. Each y element is computed the same way whatever m, n0, n1 or the thread,
// so backends that split the work differently agree bit for bit.
struct BlockScaledArgs {
  bool fp4 = false;
  const uint8_t* w = nullptr;        // row n at w + n * row_bytes
  int64_t row_bytes = 0;             // K (FP8) or K / 2 (FP4)
  int64_t k = 0;                     // K
  const void* scale = nullptr;       // the matrix's scale rows, scale_cols each
  DType scale_dtype = DType::kF32;   // kF32 or kF8E8M0
  int64_t scale_cols = 0;
  int64_t fused_rows = 0;            // quant::fused_scale_row's `intermediate` (N when not fused)
  int64_t bn = 128;                  // rows per scale row
  // Activations: row r at xq + r * x_ld holds the e4m3 values (as float, unscaled) of a row,
  // zero from K up to x_ld (a multiple of 128); for FP4 each 32-wide block is stored as its 16
  // even columns, then its 16 odd ones (the order the nibbles decode in). Its block scales at
  // xs + r * nb. Row m of this call reads activation row x_rows[m] (x_rows null: m).
  const float* xq = nullptr;
  // The same rows as bf16 for the AVX512-BF16 kernel (pack_activation_bf16's layout, from the
  // rows in column order, FP4 included); null where the caller did not make them (that kernel
  // then runs the float one, which reads xq).
  const uint16_t* xb = nullptr;
  const float* xs = nullptr;
  int64_t x_ld = 0, nb = 0;
  const int64_t* x_rows = nullptr;
  int m = 0;
  int64_t n0 = 0, n1 = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  // The bf16 kernel: from this many activation rows up, two weight rows share each activation
  // load (below, one weight row per pass). Only speed depends on it (the sums are the same bit
  // for bit); the measured choice per CPU is block_scaled_pair_from_rows (engine.hpp).
  int pair_from_rows = 3;
};
using BlockScaledFn = void (*)(const BlockScaledArgs&);
void gemm_block_scaled_portable(const BlockScaledArgs& a);
void gemm_block_scaled_avx512(const BlockScaledArgs& a);  // needs avx512 f/bw/vl (+ f16c)
// The same contract on AVX2 + FMA + F16C (gemm_block_scaled_avx2.cpp; its own summation order).
void gemm_block_scaled_avx2(const BlockScaledArgs& a);
// FP8 and FP4 through VDPBF16PS (needs avx512bf16; a.xb null: gemm_block_scaled_avx512).
void gemm_block_scaled_avx512bf16(const BlockScaledArgs& a);
// The bf16 activation layout of gemm_block_scaled_avx512bf16: n (a multiple of 64) e4m3 values
// (as float, unscaled) times 2^112 (exact: 3 mantissa bits, every e4m3 value and its product
// with 2^112 a normal bf16), each 64-wide group as its 32 even columns, then its 32 odd ones.
constexpr int kBf16ActShift = 112;
void pack_activation_bf16(const float* q, int64_t n, uint16_t* out);

// Register-resident peak loops for the ceilings (no memory traffic): returns flops done.
double peak_loop_amx(int64_t iters);
double peak_loop_avx512bf16(int64_t iters);
double peak_loop_avx512_f32(int64_t iters);
double peak_loop_avx2_f32(int64_t iters);

}  // namespace moex::cpu::kernels
