// The Llama-style sparse-MoE decoder shared by qwen2_moe, qwen3_moe, qwen3_vl_moe (text),
// mixtral and olmoe: pre-norm attention (GQA, rotate-half rope, optional q/k RMSNorm, optional
// sliding window) and a softmax top-k router in front of the experts (plus qwen2_moe's shared
// expert with a sigmoid gate). The five differ only in the flags below, set by their factories
// (arch_<model_type>.cpp), so the forward exists once.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "model/architecture.hpp"

namespace moex::model {

struct SparseMoeFlags {
  std::string experts_key;                // "" or the sub-config that governs these experts
  std::string weights_prefix = "model.";  // embed_tokens / layers / norm live under it
  std::string moe_block = "mlp";          // mixtral: "block_sparse_moe"
  ExpertNames expert_names;               // mixtral: w1 / w3 / w2
  // q/k/v biases: config key that enables them (qwen2_moe "qkv_bias", default true; others
  // "attention_bias", default false) and whether o_proj follows that key too.
  std::string qkv_bias_key = "attention_bias";
  bool qkv_bias_default = false;
  bool o_bias_follows = true;
  enum class QkNorm : unsigned char { kNone, kPerHead, kFullProjection } qk_norm = QkNorm::kNone;
  // norm_topk_prob: read from the config when present, else this default (mixtral and
  // qwen3_vl_moe always renormalise).
  bool norm_topk_prob_default = false;
  bool norm_topk_prob_from_config = true;
  bool round_routing_weights = true;  // mixtral keeps its routing weights in float32
  bool shared_expert = false;         // qwen2_moe
  bool sparse_step = false;           // qwen: decoder_sparse_step + mlp_only_layers pick MoE layers
  enum class Window : unsigned char {
    kNone,        // full causal attention everywhere (olmoe, qwen3_vl_moe)
    kAllLayers,   // config sliding_window (when not null) on every layer (mixtral, qwen3_moe)
    kLayerTypes,  // layer_types[l] == "sliding_attention" (qwen2_moe)
  } window = Window::kNone;
  bool clip_qkv = false;  // olmoe: clamp q, k, v to +-config clip_qkv when set
};

class SparseMoeLM final : public DecoderLM {
 public:
  SparseMoeLM(const Checkpoint& ckpt, const LoadOptions& options, const nlohmann::json& text_config,
              SparseMoeFlags flags, std::vector<std::string> sub_configs = {});

 protected:
  void layer_forward(int64_t layer, Tensor& h, const Step& step, LayerKV& kv) override;

 private:
  struct Layer {
    Tensor input_norm, post_norm;
    Linear q, k, v, o;
    Tensor q_norm, k_norm;       // when flags.qk_norm != kNone
    int64_t sliding_window = 0;  // 0 = full attention
    bool moe = false;
    Linear router;               // [E, H]
    const Experts* experts = nullptr;
    GatedMlp dense;              // non-MoE layers
    GatedMlp shared;             // qwen2_moe shared expert
    Linear shared_gate;          // [1, H]
  };
  // h += attn_out, then the MoE block on post_attention_layernorm(h), added to h.
  void moe_forward(const Layer& L, const Tensor& attn_out, Tensor& h) const;

  SparseMoeFlags flags_;
  Rope rope_;
  AttentionSpec attn_;
  int64_t heads_ = 0, kv_heads_ = 0;  // this rank's (all of them without tensor parallelism)
  bool norm_full_qk_ = false;         // tensor parallel OLMoE: q / k projected and normed whole
  int64_t num_experts_ = 0, top_k_ = 0;
  bool norm_topk_prob_ = false;
  float clip_qkv_ = 0;
  SharedExpertsStream shared_stream_ = SharedExpertsStream::kAuto;
  std::vector<Layer> layers_;
  std::deque<Experts> experts_;  // a deque: addresses stay valid while it grows
};

}  // namespace moex::model
