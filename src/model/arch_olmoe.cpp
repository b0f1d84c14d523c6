// olmoe: RMSNorm over the whole q and k projections (not per head), optional clip_qkv, attention
// biases (q, k, v and o) when attention_bias, no sliding window.
#include "model/sparse_moe_lm.hpp"

namespace moex::model {

std::unique_ptr<CausalLM> make_olmoe(const Checkpoint& ckpt, const LoadOptions& options) {
  SparseMoeFlags f;
  f.qk_norm = SparseMoeFlags::QkNorm::kFullProjection;
  f.clip_qkv = true;
  return std::make_unique<SparseMoeLM>(ckpt, options, ckpt.config(), f);
}

}  // namespace moex::model
