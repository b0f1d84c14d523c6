// SparseMoeLM: the shared Llama-style sparse-MoE decoder (see sparse_moe_lm.hpp).
// Semantics follow transformers 5.17's modeling_{qwen2_moe,qwen3_moe,qwen3_vl_moe,mixtral,olmoe}.py.
#include "model/sparse_moe_lm.hpp"

#include <algorithm>

#include "core/device_hooks.hpp"
#include "io/strict_json.hpp"
#include "moex/error.hpp"

namespace moex::model {

SparseMoeLM::SparseMoeLM(const Checkpoint& ckpt, const LoadOptions& options,
                         const nlohmann::json& text_config, SparseMoeFlags flags,
                         std::vector<std::string> sub_configs)
    : DecoderLM(ckpt, options, text_config, flags.weights_prefix),
      flags_(std::move(flags)),
      shared_stream_(options.shared_experts_stream) {
  const DecoderConfig& c = cfg();
  const DType dt = act();
  const Device dev = info_.device;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  info_.sub_configs = std::move(sub_configs);

  num_experts_ = c.has("num_experts") ? c.get_int("num_experts") : c.get_int("num_local_experts");
  top_k_ = c.get_int("num_experts_per_tok");
  if (num_experts_ <= 0 || top_k_ <= 0 || top_k_ > num_experts_)
    throw InvalidInput(c.where + ": need 0 < num_experts_per_tok <= number of experts");
  const int64_t moe_I = c.has("moe_intermediate_size") ? c.get_int("moe_intermediate_size")
                                                       : c.get_int("intermediate_size");
  norm_topk_prob_ = flags_.norm_topk_prob_from_config
                        ? c.get_bool("norm_topk_prob", flags_.norm_topk_prob_default)
                        : flags_.norm_topk_prob_default;
  if (flags_.clip_qkv && c.has("clip_qkv")) clip_qkv_ = float(c.get_double("clip_qkv"));
  const Activation act_fn = parse_activation(c.get_string("hidden_act", "silu"));

  const bool qkv_bias = c.get_bool(flags_.qkv_bias_key, flags_.qkv_bias_default);
  const bool o_bias = flags_.o_bias_follows && qkv_bias;
  const int64_t sparse_step = flags_.sparse_step ? c.get_int("decoder_sparse_step", 1) : 1;
  // Every sparse_step-th layer is a MoE layer: 0 or a negative step would divide by zero below.
  if (sparse_step < 1)
    throw InvalidInput(c.where + ": decoder_sparse_step must be >= 1, got " +
                       std::to_string(sparse_step));
  std::vector<int64_t> mlp_only;
  if (flags_.sparse_step && c.has("mlp_only_layers")) {
    const auto& j = c.json["mlp_only_layers"];
    if (!j.is_array() || !std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_number_integer(); }))
      throw InvalidInput(c.where + ": key 'mlp_only_layers' must be a list of layer indices, got " +
                         io::json_type_name(j));
    mlp_only = j.get<std::vector<int64_t>>();
  }
  std::vector<bool> moe(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l)
    moe[size_t(l)] = std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end() &&
                     (l + 1) % sparse_step == 0;
  const int64_t window = c.get_int("sliding_window", 0);
  if (window < 0) throw InvalidInput(c.where + ": sliding_window must be >= 0, got " + std::to_string(window));
  const std::vector<bool> sliding = flags_.window == SparseMoeFlags::Window::kLayerTypes
                                        ? sliding_layers([](int64_t) { return false; })
                                        : std::vector<bool>(size_t(c.num_layers), false);

  // The config's sizes against the headers before the first allocation they drive (the rope
  // table: head_dim; the fused experts: num_experts x moe_intermediate_size x hidden_size).
  ExpectedShapes expected(c.where);
  const int64_t q_rows = expected.mul(c.num_heads, hd, "num_attention_heads x head_dim");
  const int64_t kv_rows = expected.mul(c.num_kv_heads, hd, "num_key_value_heads x head_dim");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = prefix() + "layers." + std::to_string(l) + ".";
    expected.add_linear(p + "self_attn.q_proj", q_rows, H);
    expected.add_linear(p + "self_attn.k_proj", kv_rows, H);
    expected.add_linear(p + "self_attn.v_proj", kv_rows, H);
    expected.add_linear(p + "self_attn.o_proj", H, q_rows);
    if (moe[size_t(l)]) {
      const std::string m = p + flags_.moe_block;
      expected.add_linear(m + ".gate", num_experts_, H);
      expected.add_experts(ckpt, m + ".experts", num_experts_, H, moe_I, flags_.expert_names, quant().fp4_experts);
    }
  }
  expected.check(ckpt);

  // Tensor parallelism: whole heads (query and key / value heads alike) per rank. OLMoE's q / k
  // RMSNorm spans every head's projection at once, so there q_proj and k_proj stay whole on each
  // rank, are normed whole, and the rank then takes its heads' columns (norm_full_qk_).
  const TpSplit tp_share = tp();
  norm_full_qk_ = tp_share.parts > 1 && flags_.qk_norm == SparseMoeFlags::QkNorm::kFullProjection;
  const TpSplit heads_out = tp_share.along(TpSplit::Dim::kOut, hd), heads_in = tp_share.along(TpSplit::Dim::kIn, hd);
  const TpSplit qk_out = norm_full_qk_ ? TpSplit{} : heads_out;
  if (tp_share.parts > 1) {
    tp_share.along(TpSplit::Dim::kOut).range(c.num_heads, c.where + ": num_attention_heads");
    tp_share.along(TpSplit::Dim::kOut).range(c.num_kv_heads, c.where + ": num_key_value_heads");
  }
  heads_ = c.num_heads / tp_share.parts;
  kv_heads_ = c.num_kv_heads / tp_share.parts;
  rope_ = make_rope(c.json, hd, c.where);
  attn_ = gqa_spec(heads_, kv_heads_, hd);
  set_attention_cost(2 * kv_heads_ * hd, 4 * heads_ * hd);

  const ExpertsSpec spec = gated_experts_spec(num_experts_, H, moe_I, act_fn);
  const ExpertShard shard = expert_shard(num_experts_);

  layers_.resize(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    const std::string p = prefix() + "layers." + std::to_string(l) + ".";
    L.input_norm = load_vector(ckpt, p + "input_layernorm.weight", H, dt, dev);
    L.post_norm = load_vector(ckpt, p + "post_attention_layernorm.weight", H, dt, dev);
    L.q = load_linear(ckpt, p + "self_attn.q_proj", c.num_heads * hd, H, dt, qkv_bias, dev, false, quant(), qk_out);
    L.k = load_linear(ckpt, p + "self_attn.k_proj", c.num_kv_heads * hd, H, dt, qkv_bias, dev, false, quant(), qk_out);
    L.v = load_linear(ckpt, p + "self_attn.v_proj", c.num_kv_heads * hd, H, dt, qkv_bias, dev, false, quant(), heads_out);
    L.o = load_linear(ckpt, p + "self_attn.o_proj", H, c.num_heads * hd, dt, o_bias, dev, false, quant(), heads_in);
    record_weights("attention", {&L.q, &L.k, &L.v, &L.o});
    if (flags_.qk_norm == SparseMoeFlags::QkNorm::kPerHead) {
      L.q_norm = load_vector(ckpt, p + "self_attn.q_norm.weight", hd, dt, dev);
      L.k_norm = load_vector(ckpt, p + "self_attn.k_norm.weight", hd, dt, dev);
    } else if (flags_.qk_norm == SparseMoeFlags::QkNorm::kFullProjection) {
      L.q_norm = load_vector(ckpt, p + "self_attn.q_norm.weight", c.num_heads * hd, dt, dev);
      L.k_norm = load_vector(ckpt, p + "self_attn.k_norm.weight", c.num_kv_heads * hd, dt, dev);
    }
    if (flags_.window == SparseMoeFlags::Window::kAllLayers || sliding[size_t(l)])
      L.sliding_window = window;

    L.moe = moe[size_t(l)];
    const std::string m = p + flags_.moe_block;
    if (L.moe) {
      L.router = load_linear(ckpt, m + ".gate", num_experts_, H, dt, false, dev, false, quant());
      experts_.push_back(load_experts(ckpt, m + ".experts", spec, dt, flags_.expert_names, info_.device, quant(), &shard));
      L.experts = &experts_.back();
      if (flags_.shared_expert) {
        L.shared = load_gated_mlp(ckpt, m + ".shared_expert", H,
                                  c.get_int("shared_expert_intermediate_size"), dt, act_fn, dev, quant(), tp_share);
        L.shared_gate = load_linear(ckpt, m + ".shared_expert_gate", 1, H, dt, false, dev, false, quant());
        record_mlp("shared_experts", L.shared);
        record_weights("shared_experts", {&L.shared_gate});
      }
      record_weights("router", {&L.router});
      info_.moe_layers.push_back(l);
    } else {
      L.dense = load_gated_mlp(ckpt, m, H, c.get_int("intermediate_size"), dt, act_fn, dev, quant(), tp_share);
      record_mlp("dense_mlp", L.dense);
    }
  }
  finish_experts(experts_, flags_.experts_key, num_experts_, top_k_, options.experts_implementation);
}

void SparseMoeLM::moe_forward(const Layer& L, const Tensor& attn_out, Tensor& h) const {
  const DType a = act();
  const float eps = float(cfg().rms_norm_eps);
  const DType routing_dtype = flags_.round_routing_weights ? a : DType::kF32;
  // h += attn_out, x = post_attention_layernorm(h), then the linears that read x: for decode-sized
  // rows on a device one launch, its blocks forming x themselves (ops::norm_linears).
  Tensor x;
  if (!flags_.shared_expert) {
    std::vector<Tensor> p = norm_linears(h, &attn_out, L.post_norm, eps, {&L.router}, a, &x);
    Routing r = ops::softmax_topk(p[0], top_k_, norm_topk_prob_, routing_dtype);
    ops::add_(h, run_experts(*L.experts, experts_backend(flags_.experts_key), x, r, a), a);
    return;
  }
  if (shared_experts_beside(shared_stream_, h, L.shared)) {
    // The shared expert on a second stream while the top-k and the routed experts run on this
    // one (the two chains share nothing until the sum); the router first, so that its small
    // launch does not queue behind the shared expert's projections.
    std::vector<Tensor> p = norm_linears(h, &attn_out, L.post_norm, eps, {&L.router, &L.shared_gate}, a, &x);
    auto branch = detail::open_stream_branch(x.device());
    Tensor s;
    {
      detail::StreamBranch::Side side(*branch);
      s = gated_mlp(x, L.shared, a);
    }
    Routing r = ops::softmax_topk(p[0], top_k_, norm_topk_prob_, routing_dtype);
    Tensor y = run_experts(*L.experts, experts_backend(flags_.experts_key), x, r, a);
    branch->join();
    tp_reduce_(s);
    ops::add_gated_residual_(h, y, s, p[1], a);
    return;
  }
  // The router and the shared expert's gate, up and gating column all read x: one launch for
  // decode-sized x on a device.
  std::vector<Tensor> p =
      norm_linears(h, &attn_out, L.post_norm, eps, {&L.router, &L.shared.gate, &L.shared.up, &L.shared_gate}, a, &x);
  Routing r = ops::softmax_topk(p[0], top_k_, norm_topk_prob_, routing_dtype);
  Tensor y = run_experts(*L.experts, experts_backend(flags_.experts_key), x, r, a);
  Tensor s = gated_mlp_rest(p[1], p[2], L.shared, a);
  tp_reduce_(s);
  ops::add_gated_residual_(h, y, s, p[3], a);
}

void SparseMoeLM::layer_forward(int64_t layer, Tensor& h, const Step& step, LayerKV& kv) {
  const Layer& L = layers_[size_t(layer)];
  const DType a = act();
  const float eps = float(cfg().rms_norm_eps);
  const int64_t hd = cfg().head_dim;

  // input_layernorm and q / k / v: one launch for decode-sized rows on a device.
  std::vector<Tensor> qkv = norm_linears(h, nullptr, L.input_norm, eps, {&L.q, &L.k, &L.v}, a);
  Tensor q = std::move(qkv[0]), k = std::move(qkv[1]), v = std::move(qkv[2]);
  if (clip_qkv_ > 0)
    for (Tensor* t : {&q, &k, &v}) ops::clamp_(*t, clip_qkv_);
  if (flags_.qk_norm != SparseMoeFlags::QkNorm::kNone) {
    // Per head, or over the whole projection (OLMoE).
    const int64_t group = flags_.qk_norm == SparseMoeFlags::QkNorm::kPerHead ? hd : 0;
    ops::rms_norm_(q, L.q_norm, eps, a, group);
    ops::rms_norm_(k, L.k_norm, eps, a, group);
    if (norm_full_qk_) {  // this rank's heads of the whole, normed projections
      const TpSplit t = tp();
      q = ops::slice_columns(q, 1, heads_ * hd * t.index, heads_ * hd);
      k = ops::slice_columns(k, 1, kv_heads_ * hd * t.index, kv_heads_ * hd);
    }
  }
  // Rotate q and k and append k and v to the cache: one launch on a device.
  ops::rope_kv_append_(q, heads_, k, kv_heads_, v, kv, hd, rope_, RopeLayout::kHalf, step, a);
  AttentionSpec spec = attn_;
  spec.sliding_window = L.sliding_window;
  Tensor attn_out = linear(ops::attention(q, kv, step, spec, a), L.o, a);
  tp_reduce_(attn_out);
  if (L.moe) {
    moe_forward(L, attn_out, h);
  } else {
    std::vector<Tensor> gu = norm_linears(h, &attn_out, L.post_norm, eps, {&L.dense.gate, &L.dense.up}, a);
    Tensor d = gated_mlp_rest(gu[0], gu[1], L.dense, a);
    tp_reduce_(d);
    ops::add_(h, d, a);
  }
}

}  // namespace moex::model
