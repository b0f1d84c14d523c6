// qwen3_vl_moe, text model only: the language model lives under model.language_model.* with its
// config in text_config; lm_head.weight is top-level. For text-only inputs the three M-RoPE
// position streams are equal, so M-RoPE reduces to the plain rotate-half rope over head_dim.
// The vision tower is not run (images are out of scope), but its sub-config exists, so the
// experts-implementation map has both "text_config" and "vision_config" entries, as in
// transformers.
#include "model/sparse_moe_lm.hpp"
#include "moex/error.hpp"

namespace moex::model {

std::unique_ptr<CausalLM> make_qwen3_vl_moe(const Checkpoint& ckpt, const LoadOptions& options) {
  const auto& cfg = ckpt.config();
  if (!cfg.contains("text_config") || !cfg["text_config"].is_object())
    throw InvalidInput(ckpt.dir() + "/config.json: qwen3_vl_moe needs a text_config object");
  SparseMoeFlags f;
  f.experts_key = "text_config";
  f.weights_prefix = "model.language_model.";
  f.qk_norm = SparseMoeFlags::QkNorm::kPerHead;
  f.norm_topk_prob_default = true;
  f.norm_topk_prob_from_config = false;
  f.sparse_step = true;
  ckpt.leave_unread("model.visual.");  // the vision tower: not an unused weight, a part not run
  return std::make_unique<SparseMoeLM>(ckpt, options, cfg["text_config"], f,
                                       std::vector<std::string>{"text_config", "vision_config"});
}

}  // namespace moex::model
