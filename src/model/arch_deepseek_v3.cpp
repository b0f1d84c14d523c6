// DeepSeek-V3 (model_type "deepseek_v3"), matching transformers 5.17's DeepseekV3ForCausalLM.
//
// Attention is Multi-head Latent Attention: queries go through a low-rank path (q_a_proj ->
// q_a_layernorm -> q_b_proj), keys and values are expanded per head from one compressed latent
// c = kv_a_layernorm(kv_a_proj_with_mqa(x)[:kv_lora]) (kv_b_proj) plus one rotary key part k_rot
// shared by every head.
//
// The cache is compressed: per token and layer it holds [c; k_rot] (kv_lora + rope values, the
// key of a multi-query attention) and nothing else; AttentionSpec::v_from_k reads the values as
// its first kv_lora columns. With W_UK[h] / W_UV[h] the key / value rows of head h in kv_b_proj
// (GroupedWeight views of the loaded weight, no copies):
// - decode steps (past > 0, tokens <= kAbsorbTokens) run the absorbed form:
//   q_lat[h] = W_UK[h]^T q_nope[h] (rounded to act), scores [q_lat; q_rot] . [c; k_rot]
//   (= q_nope . k_nope + q_rot . k_rot), o_lat[h] = sum_j p_j c_j (rounded), value output
//   W_UV[h] o_lat[h]. One MQA over the latent: the step reads kv_lora + rope values per cached
//   token instead of heads * (qk + v).
// - prompts (past == 0, or more tokens) keep transformers' arithmetic and, when long, the
//   tensor-core kernel: the latents of columns [0, past + T) (the step's own when past == 0, else
//   read back from the cache) are expanded with kv_b_proj into per-head keys [k_nope; k_rot] and
//   values, and the ordinary attention runs on a temporary cache of those. Expansion costs
//   heads * (nope + v) * kv_lora multiply-adds per cached column, which a prompt amortises over
//   its tokens and a decode step would not.
// transformers rounds k_nope / v after kv_b_proj and attends over them; the absorbed form rounds
// q_lat and o_lat instead, so bf16 decode steps differ at bf16-rounding level (float32: summation
// order only). A prompt always takes the expanded form, so its bf16 logits round where
// transformers does: the absorbed rounding flips a near-tie of the router on one token of the
// tiny bf16 fixture's prompt (that row then differs by 23%).
//
// The MoE block routes with sigmoid scores plus e_score_correction_bias (bias used for the
// choice only), group-limited top-k (n_group / topk_group), optional renormalisation and
// routed_scaling_factor, then calls the registered experts backend and adds the shared experts.
// The first `first_k_dense_replace` layers use a dense MLP.
//
// Block-quantized checkpoints (FP8 linears, FP8 or FP4 routed experts; quantized_weights.hpp)
// load through the same loaders: every linear with a weight_scale_inv stays quantized unless
// LoadOptions::dequantize. Prompts run a quantized kv_b_proj as its FP8 linear (transformers'
// arithmetic); decode steps absorb a copy dequantized to the model dtype (see the loader), where
// transformers re-expands every cached latent through the FP8 linear per step. Exact formulas,
// tensor names and config defaults: docs/arch_deepseek_v3_gpt_oss.md.
#include <string>
#include <vector>

#include "core/device_hooks.hpp"
#include "model/architecture.hpp"
#include "model/deepseek_mla.hpp"
#include "model/deepseek_router.hpp"
#include "model/quantized_weights.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace moex::model {
namespace {

struct MlaWeights {
  Linear q_proj;                 // used when q_lora_rank is null
  Linear q_a_proj, q_b_proj;     // the low-rank query path otherwise
  Tensor q_a_norm;
  Linear kv_a_proj, kv_b_proj;
  Tensor kv_a_norm;
  Linear o_proj;
  ops::GroupedWeight w_uk, w_uv;  // per-head key / value rows of kv_b_proj (views)
};

struct DeepseekLayer {
  MlaWeights attn;
  Tensor input_norm, post_norm;
  bool moe = false;
  GatedMlp dense;        // dense layers
  Linear router;         // [E, H], float32
  Tensor correction;     // e_score_correction_bias [E], float32 (absent -> zeros)
  GatedMlp shared;       // shared experts (when n_shared_experts > 0)
  bool has_shared = false;
  int64_t experts_index = -1;  // into experts_
};

class DeepseekV3LM final : public DecoderLM {
 public:
  DeepseekV3LM(const Checkpoint& ckpt, const LoadOptions& o)
      : DecoderLM(ckpt, o, ckpt.config()), shared_stream_(o.shared_experts_stream) {
    const DecoderConfig& c = cfg();
    const DType dt = act();
    const Device dev = info_.device;
    const int64_t H = c.hidden_size;
    heads_ = c.num_heads;
    // Defaults are DeepseekV3Config's, used when a key is absent (or null, except q_lora_rank
    // where an explicit null means "no query low-rank path").
    const auto q_lora_it = c.json.find("q_lora_rank");
    q_lora_ = q_lora_it == c.json.end() ? 1536 : (q_lora_it->is_null() ? 0 : c.get_int("q_lora_rank"));
    kv_lora_ = c.get_int("kv_lora_rank", 512);
    nope_ = c.get_int("qk_nope_head_dim", 128);
    rope_dim_ = c.get_int("qk_rope_head_dim", 64);
    v_dim_ = c.get_int("v_head_dim", 128);
    qk_dim_ = nope_ + rope_dim_;
    const bool attn_bias = c.get_bool("attention_bias", false);
    const int64_t first_dense = c.get_int("first_k_dense_replace", 3);
    const int64_t E = c.get_int("n_routed_experts", 256);
    const int64_t n_shared = c.get_int("n_shared_experts", 1);
    const int64_t moe_inter = c.get_int("moe_intermediate_size", 2048);
    const int64_t inter = c.get_int("intermediate_size", 18432);
    router_.top_k = c.get_int("num_experts_per_tok", 8);
    router_.num_experts = E;
    router_.n_group = c.get_int("n_group", 8);
    router_.topk_group = c.get_int("topk_group", 4);
    router_.norm_topk_prob = c.get_bool("norm_topk_prob", true);
    router_.routed_scaling_factor = float(c.get_double("routed_scaling_factor", 2.5));
    validate_router_config(router_, c.where);
    if (kv_lora_ <= 0 || nope_ < 0 || v_dim_ <= 0 || q_lora_ < 0)
      throw InvalidInput(c.where + ": kv_lora_rank, v_head_dim must be positive; q_lora_rank, "
                         "qk_nope_head_dim non-negative");
    if (rope_dim_ % 2 != 0 || rope_dim_ <= 0)
      throw InvalidInput(c.where + ": qk_rope_head_dim must be a positive even number, got " +
                         std::to_string(rope_dim_));
    const Activation activation = parse_activation(c.get_string("hidden_act", "silu"));
    layout_ = c.get_bool("rope_interleave", true) ? RopeLayout::kInterleaved : RopeLayout::kHalf;
    // The config's sizes against the headers before the first allocation they drive (the rope
    // table: qk_rope_head_dim; the fused experts: n_routed_experts x moe_intermediate_size x H).
    ExpectedShapes expected(c.where);
    const int64_t q_rows = expected.mul(heads_, nope_ + rope_dim_, "num_attention_heads x qk_head_dim");
    const int64_t kv_b_rows = expected.mul(heads_, nope_ + v_dim_, "num_attention_heads x (qk_nope_head_dim + v_head_dim)");
    const int64_t o_cols = expected.mul(heads_, v_dim_, "num_attention_heads x v_head_dim");
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = prefix() + "layers." + std::to_string(l) + ".";
      const std::string ap = p + "self_attn.";
      if (q_lora_ > 0) {
        expected.add_linear(ap + "q_a_proj", q_lora_, H);
        expected.add_linear(ap + "q_b_proj", q_rows, q_lora_);
      } else {
        expected.add_linear(ap + "q_proj", q_rows, H);
      }
      expected.add_linear(ap + "kv_a_proj_with_mqa", kv_lora_ + rope_dim_, H);
      expected.add_linear(ap + "kv_b_proj", kv_b_rows, kv_lora_);
      expected.add_linear(ap + "o_proj", H, o_cols);
      if (l >= first_dense) {
        expected.add_linear(p + "mlp.gate", E, H);
        expected.add_experts(ckpt, p + "mlp.experts", E, H, moe_inter, {}, quant().fp4_experts);
      }
    }
    expected.check(ckpt);
    rope_ = make_rope(c.json, rope_dim_, c.where);
    scale_ = mla_softmax_scale(c.json, qk_dim_, c.where);
    eps_ = float(c.rms_norm_eps);
    // The cache holds [latent; rope key] per token; a decode step's absorbed MQA computes
    // q.k over kv_lora + rope and p.v over kv_lora per head and pair (see the top of this file).
    // Tensor parallelism: whole heads per rank (q_b / kv_b rows, o_proj columns); the latent
    // path (q_a, kv_a, their norms) and so the compressed cache are replicated.
    const TpSplit tp_share = tp();
    if (tp_share.parts > 1) tp_share.along(TpSplit::Dim::kOut).range(heads_, c.where + ": num_attention_heads");
    const int64_t all_heads = heads_, h0 = heads_ / tp_share.parts * tp_share.index;
    heads_ /= tp_share.parts;
    set_attention_cost(kv_lora_ + rope_dim_, 2 * heads_ * (kv_lora_ + rope_dim_ + kv_lora_));

    const ExpertsSpec spec = gated_experts_spec(E, H, moe_inter, activation);
    const ExpertShard shard = expert_shard(E);
    const QuantLoad& q = quant();

    layers_.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = prefix() + "layers." + std::to_string(l) + ".";
      DeepseekLayer& L = layers_[size_t(l)];
      MlaWeights& a = L.attn;
      const std::string ap = p + "self_attn.";
      if (q_lora_ > 0) {
        a.q_a_proj = load_linear(ckpt, ap + "q_a_proj", q_lora_, H, dt, attn_bias, dev, false, q);
        a.q_a_norm = load_vector(ckpt, ap + "q_a_layernorm.weight", q_lora_, dt, dev);
        a.q_b_proj = load_linear(ckpt, ap + "q_b_proj", all_heads * qk_dim_, q_lora_, dt, false, dev, false, q,
                                 tp_share.along(TpSplit::Dim::kOut, qk_dim_));
        record_weights("attention", {&a.q_a_proj, &a.q_b_proj});
      } else {
        a.q_proj = load_linear(ckpt, ap + "q_proj", all_heads * qk_dim_, H, dt, false, dev, false, q,
                               tp_share.along(TpSplit::Dim::kOut, qk_dim_));
        record_weights("attention", {&a.q_proj});
      }
      a.kv_a_proj = load_linear(ckpt, ap + "kv_a_proj_with_mqa", kv_lora_ + rope_dim_, H, dt, attn_bias, dev, false, q);
      a.kv_a_norm = load_vector(ckpt, ap + "kv_a_layernorm.weight", kv_lora_, dt, dev);
      // The absorbed decode reads kv_b_proj per head (ops::linear_per_group): keep its tensor.
      a.kv_b_proj = load_linear(ckpt, ap + "kv_b_proj", all_heads * (nope_ + v_dim_), kv_lora_, dt, false, dev,
                                /*keep_tensor=*/true, q, tp_share.along(TpSplit::Dim::kOut, nope_ + v_dim_));
      Tensor per_head = a.kv_b_proj.weight.tensor;
      if (a.kv_b_proj.weight.quantized()) {
        // Block-quantized, kv_b_proj has no per-head form (a 128-row block spans heads' key and
        // value rows): decode absorbs a copy dequantized to the model dtype, as DeepSeek's own
        // inference code does (weight_dequant of wkv_b); prompts keep the FP8 linear. It costs
        // heads x (nope + v) x kv_lora values per layer (33.5 MB of bf16 in DeepSeek-V3) and keeps
        // a decode step's work independent of the cache length (the expanded form re-expands
        // every cached latent each step, with the length on the host: no decode graph).
        per_head = read_dequantized(ckpt, ap + "kv_b_proj", all_heads * (nope_ + v_dim_), kv_lora_, dt)
                       .slice(0, h0 * (nope_ + v_dim_), (h0 + heads_) * (nope_ + v_dim_))
                       .contiguous()
                       .to(dev);
        record_weights("attention", per_head, /*second_form=*/true);
      }
      a.w_uk = {per_head, heads_, nope_ + v_dim_, 0, nope_};
      a.w_uv = {per_head, heads_, nope_ + v_dim_, nope_, v_dim_};
      a.o_proj = load_linear(ckpt, ap + "o_proj", H, all_heads * v_dim_, dt, attn_bias, dev, false, q,
                             tp_share.along(TpSplit::Dim::kIn, v_dim_));
      record_weights("attention", {&a.kv_a_proj, &a.kv_b_proj, &a.o_proj});
      L.input_norm = load_vector(ckpt, p + "input_layernorm.weight", H, dt, dev);
      L.post_norm = load_vector(ckpt, p + "post_attention_layernorm.weight", H, dt, dev);

      if (l < first_dense) {
        L.dense = load_gated_mlp(ckpt, p + "mlp", H, inter, dt, activation, dev, q, tp_share);
        record_mlp("dense_mlp", L.dense);
        continue;
      }
      L.moe = true;
      // The router runs in float32 whatever the model dtype (transformers upcasts it).
      L.router = load_linear(ckpt, p + "mlp.gate", E, H, DType::kF32, false, dev, false, q);
      record_weights("router", {&L.router});
      // Required, as every other tensor: transformers would start a missing one at zeros with a
      // warning, and the routing would then silently differ from the checkpoint's.
      L.correction = ckpt.get(p + "mlp.gate.e_score_correction_bias", {E}, DType::kF32).to(dev);
      if (n_shared > 0) {
        L.shared = load_gated_mlp(ckpt, p + "mlp.shared_experts", H, moe_inter * n_shared, dt, activation, dev, q,
                                  tp_share);
        record_mlp("shared_experts", L.shared);
        L.has_shared = true;
      }
      L.experts_index = int64_t(experts_.size());
      experts_.push_back(load_experts(ckpt, p + "mlp.experts", spec, dt, {}, info_.device, q, &shard));
      info_.moe_layers.push_back(l);
    }
    finish_experts(experts_, "", E, router_.top_k, o.experts_implementation);
  }

 protected:
  void layer_forward(int64_t layer, Tensor& h, const Step& step, LayerKV& kv) override {
    const DeepseekLayer& L = layers_[size_t(layer)];
    const DType dt = act();
    Tensor x = ops::rms_norm(h, L.input_norm, eps_, dt);
    Tensor attn = attention_block(L.attn, x, step, kv);
    tp_reduce_(attn);
    x = ops::add_rms_norm(h, attn, L.post_norm, eps_, dt);
    Tensor mlp;
    if (L.moe) {
      mlp = moe_block(L, x);
    } else {
      mlp = gated_mlp(x, L.dense, dt);
      tp_reduce_(mlp);
    }
    ops::add_(h, mlp, dt);
  }

 private:
  // Query tokens per step up to which a step with a cache runs the absorbed form (decode; the
  // split attention kernel's range).
  static constexpr int64_t kAbsorbTokens = 16;

  Tensor attention_block(const MlaWeights& a, const Tensor& x, const Step& step, LayerKV& kv) {
    const DType dt = act();
    // The q_a / kv_a norms are built without eps in transformers, so they use the 1e-6 default.
    constexpr float kLatentEps = 1e-6f;
    Tensor q = q_lora_ > 0 ? linear(ops::rms_norm(linear(x, a.q_a_proj, dt), a.q_a_norm, kLatentEps, dt),
                                    a.q_b_proj, dt)
                           : linear(x, a.q_proj, dt);
    ops::rope_(q, heads_, qk_dim_, nope_, rope_, layout_, step, dt);

    Tensor ckv = linear(x, a.kv_a_proj, dt);  // [rows, kv_lora + rope]
    Tensor latent = ops::rms_norm(ops::slice_columns(ckv, 1, 0, kv_lora_), a.kv_a_norm, kLatentEps, dt);
    Tensor k_rot = ops::slice_columns(ckv, 1, kv_lora_, rope_dim_);
    ops::rope_(k_rot, 1, rope_dim_, 0, rope_, layout_, step, dt);
    // The compressed cache entry: [c; k_rot], the values being its first kv_lora columns.
    ops::kv_append(kv, ops::concat_columns(latent, k_rot, 1), Tensor(), step);

    const bool absorbed = step.past > 0 && step.tokens <= kAbsorbTokens;
    Tensor o = absorbed ? absorbed_attention(a, q, kv, step) : expanded_attention(a, q, latent, k_rot, kv, step);
    return linear(o, a.o_proj, dt);
  }

  // MQA of [q_lat; q_rot] over the cached [c; k_rot], then W_UV per head. -> [rows, heads * v].
  Tensor absorbed_attention(const MlaWeights& a, const Tensor& q, const LayerKV& kv, const Step& step) const {
    const DType dt = act();
    Tensor q_lat = ops::linear_per_group(ops::slice_columns(q, heads_, 0, nope_), a.w_uk, /*transpose_weight=*/true, dt);
    Tensor q_abs = ops::concat_columns(q_lat, ops::slice_columns(q, heads_, nope_, rope_dim_), heads_);
    AttentionSpec spec = gqa_spec(heads_, 1, kv_lora_ + rope_dim_);
    spec.head_dim_v = kv_lora_;
    spec.scale = scale_;  // MLA's own (yarn mscale), unchanged by the absorption
    spec.v_from_k = true;
    Tensor o_lat = ops::attention(q_abs, kv, step, spec, dt);  // [rows, heads * kv_lora]
    return ops::linear_per_group(o_lat, a.w_uv, /*transpose_weight=*/false, dt);
  }

  // transformers' form: per-head keys [k_nope(h); k_rot] and values expanded from the latents of
  // columns [0, past + T), attended through a temporary cache. -> [rows, heads * v].
  Tensor expanded_attention(const MlaWeights& a, const Tensor& q, const Tensor& latent, const Tensor& k_rot,
                            const LayerKV& kv, const Step& step) const {
    // Sizes below come from the step's host length: such a step must not be recorded in a graph.
    if (step.past > 0 && detail::capturing(info_.device))
      throw Unsupported("DeepSeek MLA: a step of " + std::to_string(step.tokens) + " tokens over a cache expands " +
                        "the cached latents by the host's length and cannot be captured in a graph");
    const DType dt = act();
    const int64_t n = step.past + step.tokens;
    Tensor lat = latent, rot = k_rot;
    if (step.past > 0) {
      Tensor cached = ops::kv_columns(kv.k, n);  // [batch * n, kv_lora + rope]
      lat = ops::slice_columns(cached, 1, 0, kv_lora_);
      rot = ops::slice_columns(cached, 1, kv_lora_, rope_dim_);
    }
    Tensor kvb = linear(lat, a.kv_b_proj, dt);  // [batch * n, heads * (nope + v)]
    Tensor k = ops::concat_columns(ops::slice_columns(kvb, heads_, 0, nope_), rot, heads_, /*b_shared=*/true);
    Tensor v = ops::slice_columns(kvb, heads_, nope_, v_dim_);
    LayerKV expanded;
    expanded.k = k.view({step.batch, n, heads_ * qk_dim_});
    expanded.v = v.view({step.batch, n, heads_ * v_dim_});
    expanded.filled = n;
    AttentionSpec spec = gqa_spec(heads_, heads_, qk_dim_);
    spec.head_dim_v = v_dim_;
    spec.scale = scale_;
    return ops::attention(q, expanded, step, spec, dt);
  }

  Tensor moe_block(const DeepseekLayer& L, const Tensor& x) {
    const DType dt = act();
    // x holds act-rounded values; the router reads them as float32, as transformers does.
    std::unique_ptr<detail::StreamBranch> branch;
    Tensor shared;
    if (L.has_shared && shared_experts_beside(shared_stream_, x, L.shared)) {
      // The shared experts on a second stream beside the router and the routed experts.
      branch = detail::open_stream_branch(x.device());
      detail::StreamBranch::Side side(*branch);
      shared = gated_mlp(x, L.shared, dt);
    }
    Routing routing = ops::sigmoid_group_topk(linear(x, L.router, DType::kF32), L.correction, router_);
    Tensor out = run_experts(experts_[size_t(L.experts_index)], experts_backend(), x, routing, dt);
    if (branch) branch->join();
    else if (L.has_shared) shared = gated_mlp(x, L.shared, dt);
    if (L.has_shared) {
      tp_reduce_(shared);
      ops::add_(out, shared, dt);
    }
    return out;
  }

  std::vector<DeepseekLayer> layers_;
  std::vector<Experts> experts_;
  DeepseekRouterConfig router_;
  SharedExpertsStream shared_stream_ = SharedExpertsStream::kAuto;
  Rope rope_;
  RopeLayout layout_ = RopeLayout::kInterleaved;
  int64_t heads_ = 0, q_lora_ = 0, kv_lora_ = 0, nope_ = 0, rope_dim_ = 0, v_dim_ = 0, qk_dim_ = 0;
  float scale_ = 1.0f;
  float eps_ = 1e-6f;
};

}  // namespace

std::unique_ptr<CausalLM> make_deepseek_v3(const Checkpoint& ckpt, const LoadOptions& options) {
  check_model_target(options);
  return std::make_unique<DeepseekV3LM>(ckpt, options);
}

}  // namespace moex::model
