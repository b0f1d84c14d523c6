// Kernel plan of the CUDA attention op: which kernel runs and over how many cache splits, as a
// pure function of the call's shapes (never of the cache length, which lives on the device).
// Computed once per call by cuda::attention, passed down as a value, unit-tested without a GPU;
// tests that want the kernel the policy does not pick for a shape call attention_planned with a
// plan of their own (check_attention_plan validates it). Plain C++: no CUDA types here.
#pragma once

#include <cstdint>
#include <string>

#include "moex/dtype.hpp"
#include "ops/ops.hpp"

namespace moex::ops::cuda {

enum class AttentionKernel : unsigned char {
  // One block per (query block, kv head, sequence, cache split): scores and p.v on CUDA cores in
  // float32, partial softmax states in a float32 workspace, then a combine kernel. Any dtype, any
  // head dims, both rounding semantics. The decode kernel (flash decoding) and the general
  // fallback.
  kSplitSimt,
  // FA2-style prefill on the tensor cores: a warp owns 16 or 32 query rows of one head, K/V tiles
  // staged with cp.async, mma.sync m16n8k16 with float32 accumulation, online softmax. bf16 / f16
  // with act == the cache dtype, head dims multiples of 16 up to 256, sdpa semantics.
  kFlashMma,
  // Split-KV decode with 16-byte lanes (attention_decode.cuh): the cache streams into registers,
  // dot products finish by shuffles; partial states as kSplitSimt's, same combine. bf16 / f16 with
  // act == the cache dtype, sdpa semantics, separate K and V, head dims both 64 or both 128.
  kSplitVec,
  // cuDNN's fused flash attention (attention_cudnn.hpp), loaded at run time: prompts of bf16 / f16
  // with act == the cache dtype, sdpa semantics, causal only (no sinks, window or left padding),
  // separate K and V, head dims multiples of 8 up to 256 (DeepSeek's expanded 192 / 128 too; a
  // shape cuDNN has no engine for runs the flash kernel); never inside a graph capture.
  kCudnn,
};
const char* attention_kernel_name(AttentionKernel k);

// Block shapes of the flash kernel: warps x query rows per warp, K/V tile columns.
enum class FlashBlock : unsigned char {
  k4x16n64,  // 64 query rows per block; the only one for head dims above 128 (shared memory)
  k8x16n64,  // 128 rows, Q's fragments in registers
  k4x32n64,  // 128 rows, two m-tiles per warp: each K / V fragment feeds both (FA2's shape)
  k4x32n32,  // the same over 32-column tiles (fewer live scores)
};
inline constexpr FlashBlock kFlashBlocks[] = {FlashBlock::k4x16n64, FlashBlock::k8x16n64, FlashBlock::k4x32n64,
                                              FlashBlock::k4x32n32};
const char* flash_block_name(FlashBlock b);  // "4 warps x 16 rows, 64-column tiles"
// Whether block shape `b` has an instance for these head dims (all but k4x16n64 need both <= 128).
bool flash_block_fits(FlashBlock b, int64_t head_dim_k, int64_t head_dim_v);

// What a plan depends on, read off a call (shape_of in attention.cu).
struct AttentionShape {
  DType cache = DType::kF32;  // dtype of q (after conversion), k and v
  DType act = DType::kF32;
  int64_t batch = 1, tokens = 1, heads = 1, kv_heads = 1;
  int64_t head_dim_k = 0, head_dim_v = 0;
  int64_t capacity = 0;     // cache columns per sequence (not the length)
  bool eager = false;       // AttentionSpec::eager_rounding
  bool v_from_k = false;    // AttentionSpec::v_from_k
  bool aligned16 = true;    // q, k, v start on 16-byte boundaries
  int sm_count = 132;       // multiprocessors of the device (H200: 132)
  bool plain_causal = true; // no sinks, no sliding window, no left padding
  bool cudnn = false;       // cuDNN attention loaded and the stream not capturing (attention_cudnn.hpp)
};

struct AttentionPlan {
  AttentionKernel kernel = AttentionKernel::kSplitSimt;
  int splits = 1;  // kSplitSimt / kSplitVec: cache splits (each ceil(capacity / splits) columns)
  FlashBlock flash_block = FlashBlock::k4x16n64;  // kFlashMma: the block shape
  bool operator==(const AttentionPlan&) const = default;
  std::string describe() const;  // "split-KV SIMT, 8 splits" / "flash mma.sync"
};

// Query tokens per sequence up to which a call counts as decode (split-KV even in bf16).
inline constexpr int64_t kAttentionDecodeTokens = 16;
// Queries (tokens x heads of one GQA group) per block of the split kernel, and the fewest cache
// columns a split is given (below that the combine costs more than the parallelism brings).
inline constexpr int kSplitQueries = 16;
// H200, Qwen shape (16 heads of 128), batch 1 (lab/cuda/attention_lab.cpp): a 192-column cache
// took 0.061 ms in 1 split and 0.028 in 8; 1024 columns 0.082 in 4 and 0.048 in 16.
inline constexpr int64_t kSplitMinColumns = 32;
inline constexpr int kSplitMaxSplits = 64;

bool flash_mma_applies(const AttentionShape& s);
bool split_vec_applies(const AttentionShape& s);
bool cudnn_applies(const AttentionShape& s);
// Query tokens per sequence from which a prompt goes to cuDNN where it applies. H200, Qwen shape
// (lab/cuda/attention_lab.cpp): cuDNN 0.010 ms against the flash kernel's 0.024 at 128 tokens,
// 0.146 against 0.395 at 4096; shorter prompts (not measured) stay on the flash kernel rather than
// adding a cuDNN graph per length.
inline constexpr int64_t kCudnnMinTokens = 128;
// Queries (tokens x heads of one GQA group) per block of the vector split kernel: the power of
// two covering a sequence's queries, at most 8 (its accumulators live in registers).
int split_vec_queries(int64_t tokens_x_group);
// Rules: cuDNN for prompts of at least kCudnnMinTokens where it applies; the flash mma kernel for prefill (tokens > kAttentionDecodeTokens) where it applies,
// with blocks of 4 warps x 32 rows for head dims up to 128, 8 x 16 up to 64, 4 x 16 above
// (measured, docs/gpu_model.md);
// otherwise the vector split kernel where it applies, else the SIMT one, with enough splits that
// the grid gives every SM two blocks, at most one split per kSplitMinColumns of capacity and at
// most kSplitMaxSplits.
AttentionPlan plan_attention(const AttentionShape& s);
// Throws InvalidInput naming the field when `p` cannot run shape `s`.
void check_attention_plan(const AttentionPlan& p, const AttentionShape& s);

// The op with a given plan (cuda::attention = attention_planned with plan_attention).
Tensor attention_planned(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec,
                         DType act, const AttentionPlan& plan);
// The shape the op plans for (tests: to derive a plan and override one field).
AttentionShape attention_shape_of(const Tensor& q, const LayerKV& kv, const Step& step,
                                  const AttentionSpec& spec, DType act);

}  // namespace moex::ops::cuda
