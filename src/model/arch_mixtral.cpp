// mixtral: experts under block_sparse_moe with hub names w1 (gate), w3 (up), w2 (down); the
// router always renormalises its top-k and keeps the weights in float32; sliding window on every
// layer when the config sets one.
#include "model/sparse_moe_lm.hpp"

namespace moex::model {

std::unique_ptr<CausalLM> make_mixtral(const Checkpoint& ckpt, const LoadOptions& options) {
  SparseMoeFlags f;
  f.moe_block = "block_sparse_moe";
  f.expert_names.gate = "w1";
  f.expert_names.up = "w3";
  f.expert_names.down = "w2";
  f.norm_topk_prob_default = true;
  f.norm_topk_prob_from_config = false;
  f.round_routing_weights = false;
  f.window = SparseMoeFlags::Window::kAllLayers;
  return std::make_unique<SparseMoeLM>(ckpt, options, ckpt.config(), f);
}

}  // namespace moex::model
