// DecoderLM: what every decoder-only MoE LM shares (config fields, embedding, final norm,
// lm_head, the layer loop). Architectures add their layers (architecture.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/device_hooks.hpp"
#include "io/strict_json.hpp"
#include "model/architecture.hpp"
#include "moex/error.hpp"

namespace moex::model {

namespace {

const nlohmann::json* find_key(const nlohmann::json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// Routed experts' tensors are named "<layer>.mlp.experts.<e>.<proj>..." (one per expert) or
// "<layer>.mlp.experts.<proj>..." (fused, experts along dim 0); shared experts are not
// (".shared_expert(s)."). The expert index of a per-expert name, -1 for a fused one, nullopt
// for any other tensor.
std::optional<int64_t> routed_expert_of(const std::string& name) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + 9, j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return -1;
  return std::stoll(name.substr(i, j - i));
}

// Whether tensor parallelism loads 1 / N of this tensor: the attention projections that carry
// heads and the dense / shared MLPs' projections (with their scales and biases), by the
// architectures' names; the latent projections (q_a, kv_a), routers and routed experts stay whole,
// and so do q_proj / k_proj where `qk_whole` (a q / k norm over the whole projection, OLMoE's).
bool tensor_parallel_share(const std::string& name, bool qk_whole) {
  if (routed_expert_of(name)) return false;
  for (const char* tail : {".weight", ".weight_scale_inv", ".bias"}) {
    const std::string t = tail;
    if (name.size() <= t.size() || name.compare(name.size() - t.size(), t.size(), t) != 0) continue;
    const std::string stem = name.substr(0, name.size() - t.size());
    const std::string proj = stem.substr(stem.rfind('.') + 1);
    if (stem.find(".self_attn.") != std::string::npos)
      return (!qk_whole && (proj == "q_proj" || proj == "k_proj")) || proj == "v_proj" || proj == "o_proj" ||
             proj == "q_b_proj" || proj == "kv_b_proj";
    return stem.find(".mlp.") != std::string::npos &&
           (proj == "gate_proj" || proj == "up_proj" || proj == "down_proj");
  }
  return false;
}

}  // namespace

bool DecoderConfig::has(const std::string& key) const { return find_key(json, key) != nullptr; }

int64_t DecoderConfig::get_int(const std::string& key) const {
  const auto* v = find_key(json, key);
  if (!v) throw InvalidInput(where + ": missing key '" + key + "'");
  if (!v->is_number_integer())
    throw InvalidInput(where + ": key '" + key + "' must be an integer, got " + io::json_type_name(*v));
  return v->get<int64_t>();
}
int64_t DecoderConfig::get_int(const std::string& key, int64_t dflt) const {
  return has(key) ? get_int(key) : dflt;
}
double DecoderConfig::get_double(const std::string& key) const {
  const auto* v = find_key(json, key);
  if (!v) throw InvalidInput(where + ": missing key '" + key + "'");
  if (!v->is_number())
    throw InvalidInput(where + ": key '" + key + "' must be a number, got " + io::json_type_name(*v));
  if (!std::isfinite(v->get<double>())) throw InvalidInput(where + ": key '" + key + "' must be finite");
  return v->get<double>();
}
double DecoderConfig::get_double(const std::string& key, double dflt) const {
  return has(key) ? get_double(key) : dflt;
}
bool DecoderConfig::get_bool(const std::string& key, bool dflt) const {
  const auto* v = find_key(json, key);
  if (!v) return dflt;
  if (!v->is_boolean())
    throw InvalidInput(where + ": key '" + key + "' must be true or false, got " + io::json_type_name(*v));
  return v->get<bool>();
}
std::string DecoderConfig::get_string(const std::string& key, const std::string& dflt) const {
  const auto* v = find_key(json, key);
  if (!v) return dflt;
  if (!v->is_string())
    throw InvalidInput(where + ": key '" + key + "' must be a string, got " + io::json_type_name(*v));
  return v->get<std::string>();
}

bool parse_decoder_flag(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean())
    throw InvalidInput(where + ": key '" + key + "' must be true or false, got " + io::json_type_name(*it));
  return it->get<bool>();
}

DecoderConfig parse_decoder_config(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidInput(where + ": config is not a JSON object");
  DecoderConfig c;
  c.json = j;
  c.where = where;
  c.vocab_size = c.get_int("vocab_size");
  c.hidden_size = c.get_int("hidden_size");
  c.num_layers = c.get_int("num_hidden_layers");
  c.num_heads = c.get_int("num_attention_heads");
  c.num_kv_heads = c.get_int("num_key_value_heads", c.num_heads);
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 ||
      c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0)
    throw InvalidInput(where + ": invalid sizes (vocab_size, hidden_size, num_hidden_layers, "
                       "num_attention_heads, num_key_value_heads)");
  c.head_dim = c.get_int("head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim <= 0)
    throw InvalidInput(where + ": head_dim must be positive, got " + std::to_string(c.head_dim));
  c.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  // A negative epsilon makes rms_norm take the square root of a negative number for small
  // activations: NaN logits.
  if (c.rms_norm_eps < 0)
    throw InvalidInput(where + ": rms_norm_eps must be >= 0, got " + std::to_string(c.rms_norm_eps));
  c.max_positions = c.get_int("max_position_embeddings", 0);
  if (c.max_positions < 0)
    throw InvalidInput(where + ": max_position_embeddings must be >= 0, got " + std::to_string(c.max_positions));
  c.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  return c;
}

void check_model_target(const LoadOptions& options) {
  // The device must exist; the experts backends then say whether they serve the dtype there.
  require_device(options.device);
  const DType d = options.dtype.value_or(DType::kF32);
  if (d != DType::kF32 && d != DType::kBF16)
    throw Unsupported("model dtype " + std::string(dtype_name(d)) +
                      " is not supported; use float32 or bfloat16");
}

ExpertShard DecoderLM::expert_shard(int64_t num_experts) const {
  if (!ep_comm_) return make_expert_shard(num_experts, 1, 0);
  return make_expert_shard(num_experts, ep_comm_->size(), ep_comm_->rank());
}

Tensor DecoderLM::run_experts(const Experts& experts, const std::string& backend, const Tensor& x,
                              const Routing& routing, DType act) const {
  if (!ep_comm_) return model::run_experts(experts, backend, x, routing, act);
  // As model::run_experts: the experts read act values.
  const bool widen = x.dtype() != act;
  const Tensor h = widen ? x.to(act) : x;
  // The ranks run the same step, so a GPU model checks that they agree once per call shape (a
  // host synchronisation) and never inside a graph capture; host models check every call.
  bool check = true;
  std::vector<int64_t> shape;
  if (!h.device().host_accessible()) {
    shape = {h.size(0), h.size(1), routing.top_k_index.size(1)};
    check = shape != ep_checked_shape_ && !detail::capturing(h.device());
  }
  Tensor out = expert_parallel_forward(*ep_comm_, experts, backend, expert_shard(info_.num_experts), h,
                                       routing.top_k_index, routing.top_k_weights, ep_mode_, check);
  if (check && !shape.empty()) ep_checked_shape_ = shape;
  return widen ? out.to(x.dtype()) : out;
}

TpSplit DecoderLM::tp() const {
  TpSplit s;
  if (tp_comm_) s.parts = tp_comm_->size(), s.index = tp_comm_->rank();
  return s;
}

void DecoderLM::tp_reduce_(Tensor& t) const {
  if (!tp_comm_ || tp_comm_->size() == 1) return;
  if (t.device().host_accessible()) {
    tp_comm_->all_reduce_sum(t);
  } else {
    // The checked collective (a host synchronisation) for each new shape outside a capture;
    // stream work otherwise.
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    shape.push_back(int64_t(t.dtype()));
    if (shape != tp_checked_shape_ && !detail::capturing(t.device())) {
      tp_comm_->all_reduce_sum(t);
      tp_checked_shape_ = shape;
    } else {
      tp_comm_->all_reduce_sum_enqueue(t);
    }
  }
  // float32 storage holding act values (the host's activations): the sum rounded once to act.
  if (t.dtype() == DType::kF32 && act() != DType::kF32) ops::round_(t, act());
}

void DecoderLM::finish_call() {
  if (info_.device.host_accessible()) return;
  for (Communicator* c : groups()) c->barrier();
}

void DecoderLM::before_step() {
  for (Communicator* c : groups()) c->throw_if_aborted();
}

DecoderLM::DecoderLM(const Checkpoint& ckpt, const LoadOptions& options,
                     const nlohmann::json& text_config, std::string weights_prefix)
    : prefix_(std::move(weights_prefix)) {
  check_model_target(options);
  const bool is_sub = &text_config != &ckpt.config();
  cfg_ = parse_decoder_config(text_config, ckpt.dir() + "/config.json" + (is_sub ? ":text_config" : ""));
  info_.model_type = ckpt.model_type();
  const auto& top = ckpt.config();
  if (top.contains("architectures") && top["architectures"].is_array() && !top["architectures"].empty() &&
      top["architectures"][0].is_string())
    info_.architecture = top["architectures"][0].get<std::string>();
  info_.dtype = options.dtype.value_or(DType::kF32);
  info_.device = options.device;
  info_.vocab_size = cfg_.vocab_size;
  info_.hidden_size = cfg_.hidden_size;
  info_.num_layers = cfg_.num_layers;
  info_.max_position_embeddings = cfg_.max_positions;
  // Per-layer arrays are sized by num_hidden_layers before any layer is read: the last layer
  // must exist (its input norm is common to every architecture).
  const std::string last = prefix_ + "layers." + std::to_string(cfg_.num_layers - 1) + ".input_layernorm.weight";
  if (!ckpt.has(last))
    throw InvalidInput(cfg_.where + ": num_hidden_layers is " + std::to_string(cfg_.num_layers) +
                       ", but the checkpoint has no tensor '" + last + "'");
  for (const auto& name : ckpt.names()) info_.parameter_count += shape_numel(ckpt.get(name).shape());
  quant_ = parse_quant_load(ckpt, options.dequantize);
  ep_comm_ = options.ep_comm;
  tp_comm_ = options.tp_comm;
  ep_mode_ = options.ep_mode;
  for (auto [comm, what] : {std::pair{ep_comm_, "expert"}, std::pair{tp_comm_, "tensor"}})
    if (comm && !options.device.host_accessible() && comm->device() != options.device)
      // A GPU model's collectives run on its device: the rank's communicator must move data there
      // (NCCL on that GPU).
      throw InvalidInput(std::string(what) + " parallelism: the model is loaded on " + options.device.str() +
                         " but rank " + std::to_string(comm->rank()) + "'s communicator runs on " +
                         comm->device().str() + " (a GPU model needs an NCCL rank on its own device)");
  info_.quantized_checkpoint = quant_.quantized;
  info_.dequantized = quant_.quantized && quant_.dequantize;

  const DType dt = info_.dtype;
  const Device dev = info_.device;
  // The weights this model places on its device: every tensor of the language model (its prefix
  // and lm_head) in the model dtype. Checked against the device's free memory before anything
  // is allocated there.
  // Quantized weights and their scales count at their stored size, or, dequantized, at the
  // model dtype's (scales then vanish; an int8 FP4 byte holds two weights).
  // With expert parallelism only the rank's share of the routed experts counts (what
  // load_experts reads): its experts' own tensors, count / E of a fused tensor; with tensor
  // parallelism 1 / N of the split attention and MLP projections.
  int64_t per_expert_count = 0;  // E of per-expert checkpoints (the largest index + 1)
  if (ep_comm_)
    for (const auto& name : ckpt.names())
      if (const auto e = routed_expert_of(name); e && *e >= 0) per_expert_count = std::max(per_expert_count, *e + 1);
  // A q norm as wide as the whole projection (OLMoE) keeps q / k whole (the architecture checks
  // the config's sizes; here an overflowing product just means "no").
  const std::string q_norm = prefix_ + "layers.0.self_attn.q_norm.weight";
  int64_t q_width = 0;
  const bool qk_whole = tp_comm_ && cfg_.num_heads > 1 &&
                        !__builtin_mul_overflow(cfg_.num_heads, cfg_.head_dim, &q_width) && ckpt.has(q_norm) &&
                        ckpt.shape(q_norm) == Shape{q_width};
  auto rank_share = [&](const std::string& name, const Tensor& t) -> double {
    if (tp_comm_ && tensor_parallel_share(name, qk_whole)) return 1.0 / double(tp_comm_->size());
    const auto e = routed_expert_of(name);
    if (!ep_comm_ || !e) return 1.0;
    const int n = ep_comm_->size();
    const int64_t E = *e >= 0 ? per_expert_count : (t.dim() > 0 ? t.size(0) : 0);
    if (E < 1 || E % n != 0) return 1.0;  // the shard itself reports this at the layer's load
    const ExpertShard sh = make_expert_shard(E, n, ep_comm_->rank());
    if (*e >= 0) return sh.owns(*e) ? 1.0 : 0.0;
    return double(sh.count) / double(E);
  };
  double bytes = 0;
  for (const auto& name : ckpt.names()) {
    if (name.rfind(prefix_, 0) != 0 && name != "lm_head.weight" && name != "lm_head.weight_scale_inv") continue;
    const Tensor t = ckpt.get(name);
    const bool scale = name.size() > 17 && name.compare(name.size() - 17, 17, ".weight_scale_inv") == 0;
    const bool codes = quant_.quantized && (t.dtype() == DType::kF8E4M3 || t.dtype() == DType::kI8);
    const double share = rank_share(name, t);
    if (quant_.quantized && !quant_.dequantize && (scale || codes)) bytes += share * double(t.nbytes());
    else if (!scale)
      bytes += share * double(shape_numel(t.shape()) * (t.dtype() == DType::kI8 && codes ? 2 : 1) *
                              int64_t(dtype_size(dt)));
  }
  info_.weight_bytes = int64_t(bytes);
  if (dev.is_cuda()) {
    const size_t free = detail::device_free_bytes(dev);
    if (size_t(info_.weight_bytes) > free) {
      auto gb = [](double b) {
        char s[32];
        std::snprintf(s, sizeof(s), "%.2f", b / 1e9);
        return std::string(s);
      };
      throw DeviceError(ckpt.dir() + ": the weights need " + gb(double(info_.weight_bytes)) + " GB on " +
                        dev.str() + " (" + std::string(dtype_name(dt)) + "), but only " + gb(double(free)) +
                        " GB are free; use a smaller dtype, another device or --device cpu");
    }
  }
  if (is_quantized_weight(ckpt, prefix_ + "embed_tokens"))
    throw Unsupported("tensor '" + prefix_ + "embed_tokens.weight_scale_inv' in " + ckpt.dir() +
                      ": quantized embeddings are not supported");
  embed_ = ckpt.get(prefix_ + "embed_tokens.weight", {cfg_.vocab_size, cfg_.hidden_size}, dt).to(dev);
  final_norm_ = ckpt.get(prefix_ + "norm.weight", {cfg_.hidden_size}, dt).to(dev);
  if (ckpt.has("lm_head.weight")) {
    // An lm_head of its own may be block-quantized like any linear.
    lm_head_ = load_linear_weight(ckpt, "lm_head", cfg_.vocab_size, cfg_.hidden_size, dt, dev, false, quant_);
    info_.embedding_bytes = int64_t(embed_.nbytes());
  } else if (cfg_.tie_word_embeddings ||
             parse_decoder_flag(top, "tie_word_embeddings", ckpt.dir() + "/config.json")) {
    // A tied head shares the table embedding() reads: preparing it keeps the table (embed_ holds
    // it; a mapped table only gives its resident pages back).
    lm_head_ = ops::prepare_linear(embed_);
  } else {
    ckpt.get("lm_head.weight");  // throws "missing tensor 'lm_head.weight' in DIR"
  }
  record_weights("embeddings", embed_);
  record_weights("lm_head", lm_head_);

  // Stop tokens: generation_config.json first, then config.json (int or list; null = none).
  // Any other type is an error: ignoring it would generate past the stop token silently.
  auto read_eos = [](const nlohmann::json& j, const std::string& where, std::vector<int64_t>& out) {
    auto it = j.find("eos_token_id");
    if (it == j.end() || it->is_null()) return false;
    const bool ints = it->is_number_integer() ||
                      (it->is_array() && std::all_of(it->begin(), it->end(),
                                                     [](const auto& v) { return v.is_number_integer(); }));
    if (!ints)
      throw InvalidInput(where + ": key 'eos_token_id' must be an integer or a list of integers, got " +
                         it->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 80));
    if (it->is_number_integer()) out = {it->get<int64_t>()};
    else out = it->get<std::vector<int64_t>>();
    return !out.empty();
  };
  const std::string cfg_file = ckpt.dir() + "/config.json";
  if (!read_eos(ckpt.generation_config(), ckpt.dir() + "/generation_config.json", eos_) &&
      !read_eos(top, cfg_file, eos_))
    read_eos(text_config, cfg_.where, eos_);
}

namespace {

std::string scale_format(DType scale_dtype) { return scale_dtype == DType::kF8E8M0 ? "ue8m0" : "float32"; }

std::string quant_storage(const QuantScheme& q) {
  return q.kind == QuantScheme::Kind::kFp4E2M1 ? "fp4_e2m1 (2 per int8)" : "float8_e4m3fn";
}

}  // namespace

void DecoderLM::record_group(WeightGroupInfo entry) {
  for (WeightGroupInfo& g : info_.weight_groups)
    if (g.group == entry.group && g.storage == entry.storage && g.block == entry.block &&
        g.scale_format == entry.scale_format) {
      g.tensors += entry.tensors;
      g.bytes += entry.bytes;
      g.elements += entry.elements;
      return;
    }
  info_.weight_groups.push_back(std::move(entry));
}

void DecoderLM::record_weights(const std::string& group, const ops::LinearWeight& w) {
  WeightGroupInfo g{group, std::string(dtype_name(w.dtype)), "", "", 1, w.nbytes(), w.out * w.in};
  if (w.quantized()) {
    g.storage = quant_storage(w.quant);
    g.block = std::to_string(w.quant.block_n) + "x" + std::to_string(w.quant.block_k);
    g.scale_format = scale_format(w.quant.scale_dtype);
  }
  record_group(std::move(g));
}

void DecoderLM::record_weights(const std::string& group, const Tensor& t, bool second_form) {
  record_group({group, std::string(dtype_name(t.dtype())), "", "", 1, int64_t(t.nbytes()),
                second_form ? 0 : t.numel()});
}

void DecoderLM::record_experts(const std::string& group, const Experts& e) {
  const QuantScheme& q = e.spec().quant;
  const ExpertsSpec& s = e.spec();
  WeightGroupInfo g{group, std::string(dtype_name(e.dtype())), "", "", 1, e.stored_weights().nbytes(),
                    s.num_experts * (s.gate_up_rows() * s.hidden + s.hidden * s.intermediate)};
  if (q.quantized()) {
    g.storage = quant_storage(q);
    g.block = std::to_string(q.block_n) + "x" + std::to_string(q.block_k);
    g.scale_format = scale_format(q.scale_dtype);
  }
  record_group(std::move(g));
}

std::vector<bool> DecoderLM::sliding_layers(bool (*fallback)(int64_t layer)) const {
  std::vector<bool> sliding;
  if (!cfg_.has("layer_types")) {
    for (int64_t l = 0; l < cfg_.num_layers; ++l) sliding.push_back(fallback(l));
    return sliding;
  }
  const auto& lt = cfg_.json["layer_types"];
  if (!lt.is_array() || int64_t(lt.size()) != cfg_.num_layers)
    throw InvalidInput(cfg_.where + ": layer_types must be a list of num_hidden_layers strings");
  for (const auto& t : lt) {
    if (!t.is_string() || (t != "sliding_attention" && t != "full_attention"))
      throw InvalidInput(cfg_.where + ": layer_types entries must be \"sliding_attention\" or "
                         "\"full_attention\", got " + t.dump());
    sliding.push_back(t == "sliding_attention");
  }
  return sliding;
}

Tensor DecoderLM::forward(Step& step, KVCache& cache, bool last_only) {
  // The step's one upload (CUDA), unless the caller made the mirror already (a captured step:
  // no copy from pageable memory inside a capture).
  if (!step.device.defined()) ops::make_device_step(step, info_.device);
  Tensor h = ops::embedding(embed_, step, act());
  for (int64_t l = 0; l < cfg_.num_layers; ++l) layer_forward(l, h, step, cache.layers[size_t(l)]);
  // Only the last position of each sequence feeds the head (what generation needs).
  if (last_only && step.tokens > 1) h = ops::last_rows(h, step);
  ops::rms_norm_(h, final_norm_, float(cfg_.rms_norm_eps), act());
  return ops::linear(h, lm_head_, Tensor(), act());  // lm_head: no bias
}

}  // namespace moex::model
