// qwen3_moe: per-head RMSNorm on q and k before rope, softmax top-k router (norm_topk_prob from
// the config), sliding window on every layer when the config sets one.
#include "model/sparse_moe_lm.hpp"

namespace moex::model {

std::unique_ptr<CausalLM> make_qwen3_moe(const Checkpoint& ckpt, const LoadOptions& options) {
  SparseMoeFlags f;
  f.qk_norm = SparseMoeFlags::QkNorm::kPerHead;
  f.sparse_step = true;
  f.window = SparseMoeFlags::Window::kAllLayers;
  return std::make_unique<SparseMoeLM>(ckpt, options, ckpt.config(), f);
}

}  // namespace moex::model
