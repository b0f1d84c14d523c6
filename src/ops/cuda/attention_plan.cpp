// The attention plan rules (see attention_plan.hpp). The thresholds are first choices made from
// the shapes of the kernels, to be revisited by measurement on the H200.
#include "ops/cuda/attention_plan.hpp"

#include <algorithm>

#include "moex/error.hpp"

namespace moex::ops::cuda {

const char* attention_kernel_name(AttentionKernel k) {
  return k == AttentionKernel::kFlashMma ? "flash mma.sync" : "split-KV SIMT";
}

std::string AttentionPlan::describe() const {
  if (kernel == AttentionKernel::kFlashMma) return attention_kernel_name(kernel);
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

AttentionPlan plan_attention(const AttentionShape& s) {
  AttentionPlan p;
  if (s.tokens > kAttentionDecodeTokens && flash_mma_applies(s)) {
    p.kernel = AttentionKernel::kFlashMma;
    return p;
  }
  p.kernel = AttentionKernel::kSplitSimt;
  const int64_t group = std::max<int64_t>(1, s.heads / std::max<int64_t>(1, s.kv_heads));
  const int64_t qblocks = (s.tokens * group + kSplitQueries - 1) / kSplitQueries;
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
  if (p.kernel == AttentionKernel::kSplitSimt && (p.splits < 1 || p.splits > 65535))
    throw InvalidInput("attention plan: splits " + std::to_string(p.splits) + " outside [1, 65535]");
}

}  // namespace moex::ops::cuda
