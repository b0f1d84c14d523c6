// The attention plan rules (see attention_plan.hpp). The thresholds are first choices made from
// the shapes of the kernels, to be revisited by measurement on the H200.
#include "ops/cuda/attention_plan.hpp"

#include <algorithm>

#include "moex/error.hpp"

namespace moex::ops::cuda {

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kFlashMma: return "flash mma.sync";
    case AttentionKernel::kSplitVec: return "split-KV vector";
    case AttentionKernel::kCudnn: return "cuDNN flash";
    case AttentionKernel::kSplitSimt: break;
  }
  return "split-KV SIMT";
}

const char* flash_block_name(FlashBlock b) {
  switch (b) {
    case FlashBlock::k4x16n64: return "4 warps x 16 rows, 64-column tiles";
    case FlashBlock::k8x16n64: return "8 warps x 16 rows, 64-column tiles";
    case FlashBlock::k4x32n64: return "4 warps x 32 rows, 64-column tiles";
    case FlashBlock::k4x32n32: return "4 warps x 32 rows, 32-column tiles";
  }
  return "?";
}

bool flash_block_fits(FlashBlock b, int64_t head_dim_k, int64_t head_dim_v) {
  return b == FlashBlock::k4x16n64 || (head_dim_k <= 128 && head_dim_v <= 128);
}

std::string AttentionPlan::describe() const {
  if (kernel == AttentionKernel::kFlashMma)
    return std::string(attention_kernel_name(kernel)) + ", " + flash_block_name(flash_block);
  if (kernel == AttentionKernel::kCudnn) return attention_kernel_name(kernel);
  return std::string(attention_kernel_name(kernel)) + ", " + std::to_string(splits) +
         (splits == 1 ? " split" : " splits");
}

bool flash_mma_applies(const AttentionShape& s) {
  const bool half = s.cache == DType::kBF16 || s.cache == DType::kF16;
  auto dim_ok = [](int64_t d) { return d > 0 && d % 16 == 0 && d <= 256; };
  // eager_rounding needs the row maximum and the denominator before any p.v product (p is
  // normalised, then rounded): the split kernel's three passes do that; the online softmax here
  // cannot.
  return half && s.act == s.cache && !s.eager && s.aligned16 && dim_ok(s.head_dim_k) && dim_ok(s.head_dim_v);
}

bool split_vec_applies(const AttentionShape& s) {
  const bool half = s.cache == DType::kBF16 || s.cache == DType::kF16;
  return half && s.act == s.cache && !s.eager && !s.v_from_k && s.aligned16 && s.head_dim_k == s.head_dim_v &&
         (s.head_dim_k == 64 || s.head_dim_k == 128);
}

bool cudnn_applies(const AttentionShape& s) {
  const bool half = s.cache == DType::kBF16 || s.cache == DType::kF16;
  auto dim_ok = [](int64_t d) { return d > 0 && d % 8 == 0 && d <= 256; };
  return s.cudnn && half && s.act == s.cache && !s.eager && !s.v_from_k && s.plain_causal && s.aligned16 &&
         dim_ok(s.head_dim_k) && dim_ok(s.head_dim_v);
}

int split_vec_queries(int64_t tokens_x_group) {
  int q = 1;
  while (q < 8 && q < tokens_x_group) q *= 2;
  return q;
}

AttentionPlan plan_attention(const AttentionShape& s) {
  AttentionPlan p;
  if (s.tokens >= kCudnnMinTokens && cudnn_applies(s)) {
    p.kernel = AttentionKernel::kCudnn;
    return p;
  }
  if (s.tokens > kAttentionDecodeTokens && flash_mma_applies(s)) {
    p.kernel = AttentionKernel::kFlashMma;
    // H200, 4096-token causal prompts (lab/cuda/attention_lab.cpp): 16 heads of 128, 0.389 ms with
    // 4 x 32 rows against 0.439 (8 x 16) and 0.494 (4 x 16); 64 heads of 64 (gpt-oss), 0.792 ms
    // with 8 x 16 against 0.832 (4 x 32).
    const int64_t d = std::max(s.head_dim_k, s.head_dim_v);
    p.flash_block = d <= 64 ? FlashBlock::k8x16n64 : d <= 128 ? FlashBlock::k4x32n64 : FlashBlock::k4x16n64;
    return p;
  }
  const bool vec = split_vec_applies(s);
  p.kernel = vec ? AttentionKernel::kSplitVec : AttentionKernel::kSplitSimt;
  const int64_t group = std::max<int64_t>(1, s.heads / std::max<int64_t>(1, s.kv_heads));
  const int64_t per_block = vec ? split_vec_queries(s.tokens * group) : kSplitQueries;
  const int64_t qblocks = (s.tokens * group + per_block - 1) / per_block;
  const int64_t blocks = std::max<int64_t>(1, s.batch * s.kv_heads * qblocks);
  const int64_t want = (2 * int64_t(std::max(1, s.sm_count)) + blocks - 1) / blocks;
  const int64_t by_capacity = std::max<int64_t>(1, (s.capacity + kSplitMinColumns - 1) / kSplitMinColumns);
  p.splits = int(std::clamp<int64_t>(want, 1, std::min<int64_t>(by_capacity, kSplitMaxSplits)));
  return p;
}

void check_attention_plan(const AttentionPlan& p, const AttentionShape& s) {
  if (p.kernel == AttentionKernel::kFlashMma && !flash_mma_applies(s))
    throw InvalidInput("attention plan: the flash mma kernel needs bf16 / f16 with act equal to the cache "
                       "dtype, sdpa semantics, 16-byte aligned tensors and head dims that are multiples "
                       "of 16 up to 256 (got " + std::string(dtype_name(s.cache)) + " k " +
                       std::to_string(s.head_dim_k) + " v " + std::to_string(s.head_dim_v) + ")");
  if (p.kernel == AttentionKernel::kFlashMma) {
    bool known = false;
    for (FlashBlock b : kFlashBlocks) known = known || b == p.flash_block;
    if (!known) throw InvalidInput("attention plan: unknown flash block shape " + std::to_string(int(p.flash_block)));
    if (!flash_block_fits(p.flash_block, s.head_dim_k, s.head_dim_v))
      throw InvalidInput(std::string("attention plan: the flash block '") + flash_block_name(p.flash_block) +
                         "' needs head dims up to 128 (got " + std::to_string(s.head_dim_k) + " / " +
                         std::to_string(s.head_dim_v) + ")");
  }
  if (p.kernel == AttentionKernel::kSplitVec && !split_vec_applies(s))
    throw InvalidInput("attention plan: the vector split kernel needs bf16 / f16 with act equal to the cache "
                       "dtype, sdpa semantics, separate keys and values, 16-byte aligned tensors and head dims "
                       "both 64 or both 128 (got " + std::string(dtype_name(s.cache)) + " k " +
                       std::to_string(s.head_dim_k) + " v " + std::to_string(s.head_dim_v) + ")");
  if (p.kernel == AttentionKernel::kCudnn && !cudnn_applies(s))
    throw InvalidInput("attention plan: cuDNN attention needs the library loaded (" +
                       std::string(s.cudnn ? "it is" : "it is not") + "), bf16 / f16 with act equal to the cache "
                       "dtype, causal sdpa without sinks, window or left padding, separate keys and values and "
                       "head dims that are multiples of 8 up to 256 (got " + std::string(dtype_name(s.cache)) +
                       " k " + std::to_string(s.head_dim_k) + " v " + std::to_string(s.head_dim_v) + ")");
  if (p.kernel != AttentionKernel::kFlashMma && p.kernel != AttentionKernel::kCudnn && (p.splits < 1 || p.splits > 65535))
    throw InvalidInput("attention plan: splits " + std::to_string(p.splits) + " outside [1, 65535]");
}

}  // namespace moex::ops::cuda
