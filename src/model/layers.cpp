// See layers.hpp. Weight loading and config reading; the computations are ops calls.
#include "model/layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "core/device_hooks.hpp"
#include "io/strict_json.hpp"
#include "moex/error.hpp"

namespace moex::model {

// ---- shapes ----

int64_t ExpectedShapes::mul(int64_t a, int64_t b, const char* what) const {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    throw InvalidInput(where + ": " + what + " (" + std::to_string(a) + " x " + std::to_string(b) +
                       ") is negative or overflows 64 bits");
  return r;
}

void ExpectedShapes::add_experts(const Checkpoint& ckpt, const std::string& prefix, int64_t num_experts,
                                 int64_t hidden, int64_t intermediate, const ExpertNames& names,
                                 bool fp4_packed) {
  if (ckpt.has(prefix + ".gate_up_proj")) {
    add(prefix + ".gate_up_proj", {num_experts, mul(2, intermediate, "2 x intermediate size"), hidden});
    add(prefix + ".down_proj", {num_experts, hidden, intermediate});
    return;
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    const std::string p = prefix + "." + std::to_string(e) + ".";
    // FP4 with an odd K is reported by the loader, which names the tensor and the reason.
    const int64_t h = fp4_packed ? hidden / 2 : hidden, i = fp4_packed ? intermediate / 2 : intermediate;
    if (fp4_packed && (hidden % 2 || intermediate % 2)) return;
    add(p + names.gate + names.suffix, {intermediate, h});
    add(p + names.up + names.suffix, {intermediate, h});
    add(p + names.down + names.suffix, {hidden, i});
    // A missing expert stops the listing: check() reports it without listing every later one.
    if (!ckpt.has(p + names.gate + names.suffix)) return;
  }
}

void ExpectedShapes::check(const Checkpoint& ckpt) const {
  for (const auto& [name, shape] : list) {
    if (!ckpt.has(name))
      throw InvalidInput("missing tensor '" + name + "' in " + ckpt.dir() + " (expected " +
                         shape_str(shape) + " from " + where + ")");
    const Shape got = ckpt.shape(name);
    if (got != shape)
      throw InvalidInput("tensor '" + name + "' in " + ckpt.dir() + " has shape " + shape_str(got) +
                         ", expected " + shape_str(shape) + " from " + where);
  }
}

// ---- linear ----

Linear load_linear(const Checkpoint& ckpt, const std::string& name, int64_t out, int64_t in,
                   DType dtype, bool bias, Device device, bool keep_tensor, const QuantLoad& quant,
                   const TpSplit& tp) {
  Linear l;
  l.weight = load_linear_weight(ckpt, name, out, in, dtype, device, keep_tensor, quant, tp);
  // Biases hold `dtype` values (rounded like the weights): float32 on the host (the host ops'
  // activation storage), `dtype` on a device (what the cuBLASLt epilogue adds).
  if (bias && !(tp.active() && tp.dim == TpSplit::Dim::kIn && tp.index != 0)) {
    Tensor b = ckpt.get(name + ".bias", {out}, dtype);
    if (tp.active() && tp.dim == TpSplit::Dim::kOut) {
      const auto [b0, b1] = tp.range(out, "'" + name + ".bias'");
      b = b.slice(0, b0, b1).contiguous();
    }
    l.bias = device.is_cuda() ? b.to(device) : b.to(DType::kF32);
  }
  return l;
}

std::vector<Tensor> linears(const Tensor& x, std::initializer_list<const Linear*> ls, DType act) {
  std::vector<ops::LinearOf> of;
  of.reserve(ls.size());
  for (const Linear* l : ls) of.push_back({&l->weight, l->bias.defined() ? &l->bias : nullptr});
  return ops::linears(x, of, act);
}

std::vector<Tensor> norm_linears(Tensor& h, const Tensor* delta, const Tensor& norm, float eps,
                                 std::initializer_list<const Linear*> ls, DType act, Tensor* x_out) {
  std::vector<ops::LinearOf> of;
  of.reserve(ls.size());
  for (const Linear* l : ls) of.push_back({&l->weight, l->bias.defined() ? &l->bias : nullptr});
  return ops::norm_linears(h, delta, ops::NormOf{&norm, eps}, of, act, x_out);
}

// ---- norms ----


Tensor load_vector(const Checkpoint& ckpt, const std::string& name, int64_t dim, DType dtype, Device device) {
  return ckpt.get(name, {dim}, dtype).to(device);
}

// ---- rope ----

Rope make_rope(const nlohmann::json& config, int64_t rotary_dim, const std::string& where) {
  // transformers 5 keeps everything in "rope_parameters"; older configs have rope_theta at the
  // top level and the scaling in "rope_scaling". A value of the wrong type is an error, never a
  // silent default: a rope that falls back to defaults gives plausible but wrong logits.
  const char* pkey = nullptr;
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    const auto it = config.find(k);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object())
      throw InvalidInput(where + ": key '" + k + "' must be an object, got " + io::json_type_name(*it));
    if (!pkey) pkey = k;
  }
  const nlohmann::json p = pkey ? config[pkey] : nlohmann::json::object();
  // The value of `k` (rope parameters first, then the top level), checked: a number, finite.
  auto find_num = [&](const char* k) -> std::optional<double> {
    for (const auto* j : {&p, &config}) {
      const auto it = j->find(k);
      if (it == j->end() || it->is_null()) continue;
      const std::string name = j == &p ? std::string(pkey) + "." + k : std::string(k);
      if (!it->is_number())
        throw InvalidInput(where + ": key '" + name + "' must be a number, got " + io::json_type_name(*it));
      const double v = it->get<double>();
      if (!std::isfinite(v)) throw InvalidInput(where + ": key '" + name + "' must be finite");
      return v;
    }
    return std::nullopt;
  };
  auto num = [&](const char* k, double dflt) { return find_num(k).value_or(dflt); };
  // A positive number when present (rope_theta, factor, ...): 0 or less gives NaN or inf logits.
  auto positive = [&](const char* k, double dflt) {
    const auto v = find_num(k);
    if (v && !(*v > 0))
      throw InvalidInput(where + ": key '" + (p.contains(k) ? std::string(pkey) + "." + k : std::string(k)) +
                         "' must be > 0, got " + std::to_string(*v));
    return v.value_or(dflt);
  };
  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    const auto it = p.find(k);
    if (it == p.end() || it->is_null()) continue;
    if (!it->is_string())
      throw InvalidInput(where + ": key '" + std::string(pkey) + "." + k + "' must be a string, got " +
                         io::json_type_name(*it));
    type = it->get<std::string>();
    break;
  }
  const double theta = positive("rope_theta", 10000.0);
  const int64_t dim = rotary_dim;
  if (dim <= 0 || dim % 2)
    throw InvalidInput(where + ": the rotary dimension (head_dim) must be even and positive, got " +
                       std::to_string(dim));

  Rope r;
  r.rotary_dim = dim;
  // Exponents in float32 as torch does (arange(0, dim, 2).float() / dim, then base ** that).
  std::vector<float> pos_freqs(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i)
    pos_freqs[size_t(i)] = std::pow(float(theta), float(2 * i) / float(dim));
  r.inv_freq.resize(size_t(dim / 2));
  if (type == "default" || type == "linear") {
    const float factor = type == "linear" ? float(positive("factor", 1.0)) : 1.0f;
    for (int64_t i = 0; i < dim / 2; ++i) r.inv_freq[size_t(i)] = (1.0f / pos_freqs[size_t(i)]) / factor;
  } else if (type == "yarn") {
    double factor = positive("factor", 0.0);
    const double orig = num("original_max_position_embeddings", 0.0);
    if (orig <= 0) throw InvalidInput(where + ": yarn rope needs original_max_position_embeddings > 0");
    if (factor <= 0) factor = positive("max_position_embeddings", orig) / orig;
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    const double mscale = num("mscale", 0.0), mscale_all = num("mscale_all_dim", 0.0);
    if (p.contains("attention_factor") && !p["attention_factor"].is_null())
      r.attention_scaling = positive("attention_factor", 1.0);
    else if (mscale != 0 && mscale_all != 0)
      r.attention_scaling = get_mscale(factor, mscale) / get_mscale(factor, mscale_all);
    else
      r.attention_scaling = get_mscale(factor, 1.0);
    double beta_fast = num("beta_fast", 0.0), beta_slow = num("beta_slow", 0.0);
    if (beta_fast == 0) beta_fast = 32;
    if (beta_slow == 0) beta_slow = 1;
    bool truncate = true;
    if (const auto it = p.find("truncate"); it != p.end() && !it->is_null()) {
      if (!it->is_boolean())
        throw InvalidInput(where + ": key '" + std::string(pkey) + ".truncate' must be true or false, got " +
                           io::json_type_name(*it));
      truncate = it->get<bool>();
    }
    auto corr_dim = [&](double rot) {
      return (double(dim) * std::log(orig / (rot * 2 * M_PI))) / (2 * std::log(theta));
    };
    double low = corr_dim(beta_fast), high = corr_dim(beta_slow);
    if (truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < dim / 2; ++i) {
      float ramp = (float(i) - float(low)) / (float(high) - float(low));
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      const float extrap_factor = 1.0f - ramp;
      const float extrap = 1.0f / pos_freqs[size_t(i)];
      const float interp = 1.0f / (float(factor) * pos_freqs[size_t(i)]);
      r.inv_freq[size_t(i)] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
    }
  } else {
    throw Unsupported(where + ": rope type '" + type + "' is not supported (default, linear, yarn)");
  }
  return r;
}

// ---- attention ----

AttentionSpec gqa_spec(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t sliding_window) {
  AttentionSpec s;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim_k = s.head_dim_v = head_dim;
  s.scale = float(1.0 / std::sqrt(double(head_dim)));
  s.sliding_window = sliding_window;
  return s;
}

// ---- MLP / MoE ----

GatedMlp load_gated_mlp(const Checkpoint& ckpt, const std::string& prefix, int64_t hidden,
                        int64_t intermediate, DType dtype, Activation activation, Device device,
                        const QuantLoad& quant, const TpSplit& tp) {
  GatedMlp m;
  const TpSplit cols = tp.along(TpSplit::Dim::kOut), rows = tp.along(TpSplit::Dim::kIn);
  m.gate = load_linear(ckpt, prefix + ".gate_proj", intermediate, hidden, dtype, false, device, false, quant, cols);
  m.up = load_linear(ckpt, prefix + ".up_proj", intermediate, hidden, dtype, false, device, false, quant, cols);
  m.down = load_linear(ckpt, prefix + ".down_proj", hidden, intermediate, dtype, false, device, false, quant, rows);
  m.activation = activation;
  return m;
}

Tensor gated_mlp(const Tensor& x, const GatedMlp& mlp, DType act) {
  std::vector<Tensor> gu = linears(x, {&mlp.gate, &mlp.up}, act);
  return gated_mlp_rest(gu[0], gu[1], mlp, act);
}

Tensor gated_mlp_rest(Tensor& gate, const Tensor& up, const GatedMlp& mlp, DType act) {
  ops::gated_activation_(gate, up, mlp.activation, act);
  return linear(gate, mlp.down, act);
}

bool shared_experts_beside(SharedExpertsStream mode, const Tensor& x, const GatedMlp& shared) {
  if (mode == SharedExpertsStream::kOff || !x.device().is_cuda()) return false;
  for (const Linear* l : {&shared.gate, &shared.up, &shared.down})
    if (l->weight.quantized()) return false;
  return mode == SharedExpertsStream::kOn || x.size(0) <= kSharedExpertsBesideRows;
}

ExpertsSpec gated_experts_spec(int64_t num_experts, int64_t hidden, int64_t intermediate, Activation act) {
  ExpertsSpec spec;
  spec.num_experts = num_experts;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.act = act;
  return spec;
}

// Quantized experts kept as stored: each expert's codes and scales copied into their slices of
// the fused tensors (quant.hpp's layout), built on the host and then copied to `device`.
static Experts load_quantized_experts(const Checkpoint& ckpt, const std::string& prefix, ExpertsSpec spec,
                                      const ExpertNames& names, Device device, bool fp4, int64_t first) {
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  const std::string base = names.suffix.substr(0, names.suffix.rfind(".weight"));  // "" for ".weight"
  auto read = [&](int64_t e, const std::string& proj, int64_t n, int64_t k) {
    return read_quantized(ckpt, prefix + "." + std::to_string(first + e) + "." + proj + base, n, k, fp4);
  };
  ExpertsWeights w;
  for (int64_t e = 0; e < E; ++e) {
    const QuantizedTensor g = read(e, names.gate, I, H), u = read(e, names.up, I, H), d = read(e, names.down, H, I);
    if (e == 0) {
      spec.quant = g.scheme;
      w.gate_up = Tensor::empty({E, 2 * g.codes.size(0), g.codes.size(1)}, g.codes.dtype());
      w.gate_up_scale = Tensor::empty({E, 2 * g.scale.size(0), g.scale.size(1)}, g.scale.dtype());
      w.down = Tensor::empty({E, d.codes.size(0), d.codes.size(1)}, d.codes.dtype());
      w.down_scale = Tensor::empty({E, d.scale.size(0), d.scale.size(1)}, d.scale.dtype());
    }
    // One scale dtype per module (the backends read one): a checkpoint mixing them is inconsistent.
    for (const QuantizedTensor* q : {&g, &u, &d})
      if (q->scale.dtype() != spec.quant.scale_dtype)
        throw InvalidInput("experts '" + prefix + "' in " + ckpt.dir() + ": expert " + std::to_string(e) +
                           " has " + std::string(dtype_name(q->scale.dtype())) + " scales, expert 0 " +
                           std::string(dtype_name(spec.quant.scale_dtype)));
    auto put = [](Tensor& dst, int64_t e, int64_t half, const Tensor& src) {
      const Tensor c = src.contiguous();
      std::memcpy(static_cast<char*>(dst.raw()) + (e * (dst.nbytes() / size_t(dst.size(0)))) + half * c.nbytes(),
                  c.raw(), c.nbytes());
      c.release_file_pages();
    };
    put(w.gate_up, e, 0, g.codes);
    put(w.gate_up, e, 1, u.codes);
    put(w.gate_up_scale, e, 0, g.scale);
    put(w.gate_up_scale, e, 1, u.scale);
    put(w.down, e, 0, d.codes);
    put(w.down_scale, e, 0, d.scale);
  }
  if (!device.host_accessible())
    for (Tensor* t : {&w.gate_up, &w.gate_up_scale, &w.down, &w.down_scale}) *t = t->to(device);
  return Experts(spec, std::move(w));
}

Experts load_experts(const Checkpoint& ckpt, const std::string& prefix, const ExpertsSpec& full_spec,
                     DType dtype, const ExpertNames& names, Device device, const QuantLoad& quant,
                     const ExpertShard* shard) {
  // Local expert e is global expert first + e.
  const ExpertsSpec spec = shard ? shard_experts_spec(full_spec, *shard) : full_spec;
  const int64_t first = shard ? shard->first : 0;
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  ExpertsWeights w;
  const std::string probe = prefix + "." + std::to_string(first) + "." + names.gate +
                            names.suffix.substr(0, names.suffix.rfind(".weight"));
  const bool quantized = !ckpt.has(prefix + ".gate_up_proj") && is_quantized_weight(ckpt, probe);
  if (quantized && !quant.quantized)
    throw InvalidInput("tensor '" + probe + ".weight_scale_inv' in " + ckpt.dir() +
                       " is a block scale, but its config.json has no quantization_config");
  if (quantized && !quant.dequantize)
    return load_quantized_experts(ckpt, prefix, spec, names, device, quant.fp4_experts, first);
  if (ckpt.has(prefix + ".gate_up_proj")) {
    if (!is_floating(ckpt.get(prefix + ".gate_up_proj").dtype()) ||
        ckpt.get(prefix + ".gate_up_proj").dtype() == DType::kF8E4M3)
      throw Unsupported("tensor '" + prefix + ".gate_up_proj' in " + ckpt.file_of(prefix + ".gate_up_proj") +
                        " is " + std::string(dtype_name(ckpt.get(prefix + ".gate_up_proj").dtype())) +
                        ": fused quantized experts are not a supported checkpoint layout");
    // The shard's experts are sliced from the mapping before any conversion or copy.
    const auto shard_rows = [&](const std::string& name, const Shape& shape) {
      const Tensor stored = ckpt.get(name, shape, ckpt.get(name).dtype());  // shape checked, no copy
      return stored.slice(0, first, first + E).to(dtype).to(device);
    };
    const int64_t all = full_spec.num_experts;
    w.gate_up = shard_rows(prefix + ".gate_up_proj", {all, 2 * I, H});
    w.down = shard_rows(prefix + ".down_proj", {all, H, I});
    return Experts(spec, std::move(w));
  }
  const auto expert_tensor = [&](int64_t e, const std::string& proj, Shape shape) {
    const std::string name = prefix + "." + std::to_string(first + e) + "." + proj + names.suffix;
    if (quantized)  // dequantized at load: value x scale in float32, rounded to dtype
      return dequantize(read_quantized(ckpt, name.substr(0, name.rfind(".weight")), shape[0], shape[1],
                                       quant.fp4_experts), dtype);
    // Stored codes without their scale would be read as bare values.
    const DType stored = ckpt.has(name) ? ckpt.get(name).dtype() : dtype;
    if (stored == DType::kF8E4M3 || stored == DType::kI8)
      read_quantized(ckpt, name.substr(0, name.rfind(".weight")), shape[0], shape[1], stored == DType::kI8);
    return ckpt.get(name, shape, dtype);
  };
  if (device.host_accessible()) {
    // On the host the experts keep the hub's per-expert tensors as they are: views into the
    // memory map (copies only when the dtype is converted). Backends that pack the weights read
    // them from there, so the experts cost one copy in memory; a fused copy is made only for a
    // backend that needs it (Experts).
    auto pe = std::make_shared<PerExpertWeights>();
    for (int64_t e = 0; e < E; ++e) {
      pe->gate.push_back(expert_tensor(e, names.gate, {I, H}).contiguous());
      pe->up.push_back(expert_tensor(e, names.up, {I, H}).contiguous());
      pe->down.push_back(expert_tensor(e, names.down, {H, I}).contiguous());
    }
    w.per_expert = std::move(pe);
    return Experts(spec, std::move(w));
  }
  // On a device: fuse the hub's per-expert tensors once, where the weights will live:
  // gate_up[e] = [gate_e; up_e], down[e] = down_e. Each expert tensor is read from the memory
  // map (converted only when its dtype differs) and copied into its slice.
  const Device where = device.host_accessible() ? Device::cpu() : device;
  w.gate_up = Tensor::empty({E, 2 * I, H}, dtype, where);
  w.down = Tensor::empty({E, H, I}, dtype, where);
  const size_t es = dtype_size(dtype);
  char* gu = static_cast<char*>(w.gate_up.raw());
  char* dn = static_cast<char*>(w.down.raw());
  auto put = [&](char* dst, const Tensor& t) {
    const Tensor c = t.contiguous();
    if (where.is_cuda()) {
      detail::device_copy(dst, where, c.raw(), c.device(), c.nbytes());
      c.release_file_pages();
    } else {
      std::memcpy(dst, c.raw(), c.nbytes());
    }
  };
  for (int64_t e = 0; e < E; ++e) {
    put(gu + size_t(e * 2 * I * H) * es, expert_tensor(e, names.gate, {I, H}));
    put(gu + size_t((e * 2 + 1) * I * H) * es, expert_tensor(e, names.up, {I, H}));
    put(dn + size_t(e * H * I) * es, expert_tensor(e, names.down, {H, I}));
  }
  return Experts(spec, std::move(w));
}

Experts experts_to(const Experts& experts, Device device) {
  if (device.host_accessible() || experts.device() == device) return experts;
  const ExpertsWeights& w = experts.weights();
  ExpertsWeights d;
  for (auto [src, dst] : {std::pair{&w.gate_up, &d.gate_up}, {&w.down, &d.down},
                          {&w.gate_up_bias, &d.gate_up_bias}, {&w.down_bias, &d.down_bias},
                          {&w.gate_up_scale, &d.gate_up_scale}, {&w.down_scale, &d.down_scale}})
    if (src->defined()) *dst = src->to(device);
  return Experts(experts.spec(), std::move(d));
}

Tensor run_experts(const Experts& experts, const std::string& backend, const Tensor& x,
                   const Routing& routing, DType act) {
  // Host activations are float32 holding act values: the experts read act; device activations
  // are act already.
  const bool widen = x.dtype() != act;
  Tensor h = widen ? x.to(act) : x;
  Tensor out = experts.forward(backend, h, routing.top_k_index, routing.top_k_weights);
  return widen ? out.to(x.dtype()) : out;
}

}  // namespace moex::model
