// Launchers of the attention kernels (the middle tier): raw pointers, sizes and a stream, no
// Tensor. The op (attention.cu) validates, plans and allocates; the kernels
// (attention_split.cuh, attention_flash.cuh) compute.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moex::ops::cuda {

// Float dtype codes of the launchers (the values of moex::cuda::FloatCode).
inline constexpr int kAttnF32 = 0, kAttnF16 = 1, kAttnBF16 = 2;

// One attention call. q [batch * tokens, heads * dk], k [batch, capacity, kv_heads * dk],
// v [batch, capacity, kv_heads * dv], all of dtype `elem`, contiguous; with v_from_k, v == k and
// kv head g's values are the first dv columns of its key (row stride kv_heads * dk, head stride
// dk). step: the device step (int32 {past, pad[batch], ...}).
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int32_t* step = nullptr;
  const void* sinks = nullptr;  // [heads] of dtype sinks_code, or null
  int sinks_code = kAttnF32;
  int elem = kAttnBF16;  // q / k / v dtype
  int act = kAttnBF16;   // rounding dtype (and the output dtype)
  int batch = 1, tokens = 1, heads = 1, kv_heads = 1, dk = 0, dv = 0;
  int capacity = 0;
  float scale = 1.f;
  int window = 0;  // 0: none
  bool eager = false;
  bool v_from_k = false;
  bool split_vec = false;  // the split pass on attention_decode.cuh's vector kernel
  // Flash kernel block shape: warps, m-tiles of 16 query rows per warp, K/V tile columns (the
  // combinations of attention_plan.hpp's FlashBlock).
  int flash_warps = 4, flash_warp_mtiles = 1, flash_columns = 64;
};

// Tensor-core prefill: writes out [rows, heads * dv] of dtype elem (== act) directly.
void launch_attention_flash_mma(const AttentionArgs& a, void* out, cudaStream_t stream);

// Float32 workspace of the split kernel, `splits` partial states per (row, head):
// l (double) [splits][rows * heads], m [splits][rows * heads], acc [splits][rows * heads][dv].
struct SplitWorkspace {
  double* l = nullptr;
  float* m = nullptr;
  float* acc = nullptr;
  int splits = 1;
  static int64_t bytes(int64_t splits, int64_t rows_heads, int64_t dv) {
    return splits * rows_heads * (8 + 4 + 4 * dv);
  }
};
// The split kernel (one pass for sdpa, three for eager_rounding; the vector kernel with
// split_vec) and the combine kernel, which writes out [rows, heads * dv] of dtype act.
void launch_attention_split(const AttentionArgs& a, const SplitWorkspace& ws, void* out, cudaStream_t stream);

// dst[i] = src[i] converted between float dtypes (codes above).
void launch_convert_floats(const void* src, int src_code, void* dst, int dst_code, int64_t n, cudaStream_t stream);

}  // namespace moex::ops::cuda
