// gpt-oss (model_type "gpt_oss"), matching transformers 5.17's GptOssForCausalLM.
//
// Attention: q/k/v/o projections with biases, rotate-half rope (yarn by default, whose
// attention factor scales cos and sin), grouped kv heads, one learned sink logit per head that
// joins the softmax denominator and is then dropped, and a sliding window on the layers that
// config.layer_types marks "sliding_attention" (by default the even ones).
// MoE: a linear router with bias, top-k on the logits, softmax over the k chosen logits; experts
// stored fused, transposed and gate/up-interleaved, with biases and the clamped SwiGLU
// (kSwigluOai: limit 7, alpha 1.702). The block routes, then calls the registered experts backend.
// Exact formulas and tensor names: docs/arch_deepseek_v3_gpt_oss.md.
#include <string>
#include <vector>

#include "model/architecture.hpp"
#include "model/gpt_oss_layers.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace moex::model {
namespace {

struct GptOssLayer {
  Linear q_proj, k_proj, v_proj, o_proj;
  Tensor sinks;  // [heads] float32
  Tensor input_norm, post_norm;
  Linear router;
  int64_t sliding_window = 0;  // 0: full attention
};

class GptOssLM final : public DecoderLM {
 public:
  GptOssLM(const Checkpoint& ckpt, const LoadOptions& o) : DecoderLM(ckpt, o, ckpt.config()) {
    const DecoderConfig& c = cfg();
    const DType dt = act();
    const Device dev = info_.device;
    const int64_t H = c.hidden_size;
    heads_ = c.num_heads;
    kv_heads_ = c.num_kv_heads;
    head_dim_ = c.head_dim;
    if (heads_ % kv_heads_ != 0)
      throw InvalidInput(c.where + ": num_attention_heads (" + std::to_string(heads_) +
                         ") must be a multiple of num_key_value_heads (" + std::to_string(kv_heads_) + ")");
    const int64_t E = c.get_int("num_local_experts");
    const int64_t I = c.get_int("intermediate_size");
    top_k_ = c.get_int("num_experts_per_tok");
    if (top_k_ < 1 || top_k_ > E)
      throw InvalidInput(c.where + ": num_experts_per_tok must be in [1, num_local_experts = " +
                         std::to_string(E) + "], got " + std::to_string(top_k_));
    const bool bias = c.get_bool("attention_bias", true);
    const int64_t window = c.get_int("sliding_window", 0);
    // transformers hard-codes limit 7 and alpha 1.702; real configs carry swiglu_limit = 7 too.
    const float limit = float(c.get_double("swiglu_limit", 7.0));
    // Absent: 0, no window (as before); given, it must hold at least one key.
    if (c.has("sliding_window") && window < 1)
      throw InvalidInput(c.where + ": sliding_window must be >= 1, got " + std::to_string(window));
    if (!(limit > 0)) throw InvalidInput(c.where + ": swiglu_limit must be > 0, got " + std::to_string(limit));
    constexpr float kAlpha = 1.702f;
    // The config's sizes against the headers before the rope table (head_dim) is allocated.
    ExpectedShapes expected(c.where);
    const int64_t q_rows = expected.mul(heads_, head_dim_, "num_attention_heads x head_dim");
    const int64_t kv_rows = expected.mul(kv_heads_, head_dim_, "num_key_value_heads x head_dim");
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = prefix() + "layers." + std::to_string(l) + ".self_attn.";
      expected.add_linear(p + "q_proj", q_rows, H);
      expected.add_linear(p + "k_proj", kv_rows, H);
      expected.add_linear(p + "v_proj", kv_rows, H);
      expected.add_linear(p + "o_proj", H, q_rows);
    }
    expected.check(ckpt);
    rope_ = make_rope(gpt_oss_rope_config(c.json), head_dim_, c.where);
    eps_ = float(c.rms_norm_eps);
    // Tensor parallelism: whole query and key / value heads per rank, with their biases and sinks.
    const TpSplit tp_share = tp();
    if (tp_share.parts > 1) {
      tp_share.along(TpSplit::Dim::kOut).range(heads_, c.where + ": num_attention_heads");
      tp_share.along(TpSplit::Dim::kOut).range(kv_heads_, c.where + ": num_key_value_heads");
    }
    const TpSplit heads_out = tp_share.along(TpSplit::Dim::kOut, head_dim_);
    const TpSplit heads_in = tp_share.along(TpSplit::Dim::kIn, head_dim_);
    const int64_t all_heads = heads_, all_kv_heads = kv_heads_;
    heads_ /= tp_share.parts;
    kv_heads_ /= tp_share.parts;
    set_attention_cost(2 * kv_heads_ * head_dim_, 4 * heads_ * head_dim_);

    const std::vector<bool> sliding = sliding_layers([](int64_t l) { return l % 2 == 0; });

    layers_.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = prefix() + "layers." + std::to_string(l) + ".";
      GptOssLayer& L = layers_[size_t(l)];
      L.q_proj = load_linear(ckpt, p + "self_attn.q_proj", all_heads * head_dim_, H, dt, bias, dev, false, quant(),
                             heads_out);
      L.k_proj = load_linear(ckpt, p + "self_attn.k_proj", all_kv_heads * head_dim_, H, dt, bias, dev, false,
                             quant(), heads_out);
      L.v_proj = load_linear(ckpt, p + "self_attn.v_proj", all_kv_heads * head_dim_, H, dt, bias, dev, false,
                             quant(), heads_out);
      L.o_proj = load_linear(ckpt, p + "self_attn.o_proj", H, all_heads * head_dim_, dt, bias, dev, false, quant(),
                             heads_in);
      L.sinks = ckpt.get(p + "self_attn.sinks", {all_heads}, DType::kF32)
                    .slice(0, heads_ * tp_share.index, heads_ * (tp_share.index + 1))
                    .contiguous()
                    .to(dev);
      // gpt-oss keeps its norm weights in float32 (_keep_in_fp32_modules).
      L.input_norm = load_vector(ckpt, p + "input_layernorm.weight", H, DType::kF32, dev);
      L.post_norm = load_vector(ckpt, p + "post_attention_layernorm.weight", H, DType::kF32, dev);
      L.router = load_linear(ckpt, p + "mlp.router", E, H, dt, /*bias=*/true, dev, false, quant());
      record_weights("attention", {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj});
      record_weights("router", {&L.router});
      L.sliding_window = sliding[size_t(l)] ? window : 0;
      Experts experts = load_gpt_oss_experts(ckpt, p + "mlp.experts", E, H, I, dt, limit, kAlpha);
      // Expert parallelism: the rank's share as views (the fused checkpoint tensors are read whole).
      if (const ExpertShard shard = expert_shard(E); shard.size > 1)
        experts = Experts(shard_experts_spec(experts.spec(), shard),
                          shard_experts_weights(experts.spec(), experts.weights(), shard));
      // On a GPU, the layout its tensor-core experts kernels read (gpt_oss_layers.hpp).
      if (info_.device.is_cuda()) experts = gpt_oss_experts_row_major(experts);
      experts_.push_back(experts_to(experts, info_.device));
      info_.moe_layers.push_back(l);
    }
    finish_experts(experts_, "", E, top_k_, o.experts_implementation);
  }

 protected:
  void layer_forward(int64_t layer, Tensor& h, const Step& step, LayerKV& kv) override {
    const GptOssLayer& L = layers_[size_t(layer)];
    const DType dt = act();
    Tensor x = ops::rms_norm(h, L.input_norm, eps_, dt, 0, ops::RmsNormStyle::kGptOss);
    std::vector<Tensor> qkv = linears(x, {&L.q_proj, &L.k_proj, &L.v_proj}, dt);
    Tensor q = std::move(qkv[0]), k = std::move(qkv[1]), v = std::move(qkv[2]);
    ops::rope_kv_append_(q, heads_, k, kv_heads_, v, kv, head_dim_, rope_, RopeLayout::kHalf, step, dt);
    AttentionSpec spec = gqa_spec(heads_, kv_heads_, head_dim_, L.sliding_window);
    spec.sinks = L.sinks;
    spec.eager_rounding = true;  // gpt-oss runs transformers' eager attention (no sdpa)
    Tensor attn = linear(ops::attention(q, kv, step, spec, dt), L.o_proj, dt);
    tp_reduce_(attn);
    x = ops::add_rms_norm(h, attn, L.post_norm, eps_, dt, ops::RmsNormStyle::kGptOss);
    Routing routing = ops::topk_softmax(linear(x, L.router, dt), top_k_, dt);
    ops::add_(h, run_experts(experts_[size_t(layer)], experts_backend(), x, routing, dt), dt);
  }

 private:
  std::vector<GptOssLayer> layers_;
  std::vector<Experts> experts_;
  Rope rope_;
  int64_t heads_ = 0, kv_heads_ = 0, head_dim_ = 0, top_k_ = 1;
  float eps_ = 1e-5f;
};

}  // namespace

std::unique_ptr<CausalLM> make_gpt_oss(const Checkpoint& ckpt, const LoadOptions& options) {
  check_model_target(options);
  return std::make_unique<GptOssLM>(ckpt, options);
}

}  // namespace moex::model
