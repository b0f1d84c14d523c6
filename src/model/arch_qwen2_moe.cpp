// qwen2_moe (Qwen1.5-MoE / Qwen2-MoE): qkv biases, softmax top-k router with norm_topk_prob from
// the config, and a shared expert whose output is scaled by sigmoid(shared_expert_gate(x)).
#include "model/sparse_moe_lm.hpp"

namespace moex::model {

std::unique_ptr<CausalLM> make_qwen2_moe(const Checkpoint& ckpt, const LoadOptions& options) {
  SparseMoeFlags f;
  f.qkv_bias_key = "qkv_bias";
  f.qkv_bias_default = true;
  f.o_bias_follows = false;
  f.shared_expert = true;
  f.sparse_step = true;
  f.window = SparseMoeFlags::Window::kLayerTypes;
  return std::make_unique<SparseMoeLM>(ckpt, options, ckpt.config(), f);
}

}  // namespace moex::model
