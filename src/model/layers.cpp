// See layers.hpp. Weight loading and config reading; the computations are ops calls.
#include "model/layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/device_hooks.hpp"
#include "moex/error.hpp"

namespace moex::model {

// ---- linear ----

Linear load_linear(const Checkpoint& ckpt, const std::string& name, int64_t out, int64_t in,
                   DType dtype, bool bias, Device device, bool keep_tensor) {
  Linear l;
  l.weight = ops::prepare_linear(ckpt.get(name + ".weight", {out, in}, dtype).to(device), keep_tensor);
  // Biases hold `dtype` values (rounded like the weights): float32 on the host (the host ops'
  // activation storage), `dtype` on a device (what the cuBLASLt epilogue adds).
  if (bias) {
    Tensor b = ckpt.get(name + ".bias", {out}, dtype);
    l.bias = device.is_cuda() ? b.to(device) : b.to(DType::kF32);
  }
  return l;
}

// ---- norms ----


Tensor load_vector(const Checkpoint& ckpt, const std::string& name, int64_t dim, DType dtype, Device device) {
  return ckpt.get(name, {dim}, dtype).to(device);
}

// ---- rope ----

Rope make_rope(const nlohmann::json& config, int64_t rotary_dim) {
  // transformers 5 keeps everything in "rope_parameters"; older configs have rope_theta at the
  // top level and the scaling in "rope_scaling".
  nlohmann::json p = nlohmann::json::object();
  if (config.contains("rope_parameters") && config["rope_parameters"].is_object()) {
    p = config["rope_parameters"];
  } else if (config.contains("rope_scaling") && config["rope_scaling"].is_object()) {
    p = config["rope_scaling"];
  }
  auto num = [&](const char* k, double dflt) {
    if (p.contains(k) && p[k].is_number()) return p[k].get<double>();
    if (config.contains(k) && config[k].is_number()) return config[k].get<double>();
    return dflt;
  };
  std::string type = "default";
  if (p.contains("rope_type") && p["rope_type"].is_string()) type = p["rope_type"];
  else if (p.contains("type") && p["type"].is_string()) type = p["type"];
  const double theta = num("rope_theta", 10000.0);
  const int64_t dim = rotary_dim;
  if (dim <= 0 || dim % 2) throw InvalidInput("rotary dimension must be even and positive, got " + std::to_string(dim));

  Rope r;
  r.rotary_dim = dim;
  // Exponents in float32 as torch does (arange(0, dim, 2).float() / dim, then base ** that).
  std::vector<float> pos_freqs(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i)
    pos_freqs[size_t(i)] = std::pow(float(theta), float(2 * i) / float(dim));
  r.inv_freq.resize(size_t(dim / 2));
  if (type == "default" || type == "linear") {
    const float factor = type == "linear" ? float(num("factor", 1.0)) : 1.0f;
    for (int64_t i = 0; i < dim / 2; ++i) r.inv_freq[size_t(i)] = (1.0f / pos_freqs[size_t(i)]) / factor;
  } else if (type == "yarn") {
    double factor = num("factor", 0.0);
    const double orig = num("original_max_position_embeddings", 0.0);
    if (orig <= 0) throw InvalidInput("yarn rope needs original_max_position_embeddings");
    if (factor <= 0) factor = num("max_position_embeddings", orig) / orig;
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    const double mscale = num("mscale", 0.0), mscale_all = num("mscale_all_dim", 0.0);
    if (p.contains("attention_factor") && p["attention_factor"].is_number())
      r.attention_scaling = p["attention_factor"].get<double>();
    else if (mscale != 0 && mscale_all != 0)
      r.attention_scaling = get_mscale(factor, mscale) / get_mscale(factor, mscale_all);
    else
      r.attention_scaling = get_mscale(factor, 1.0);
    double beta_fast = num("beta_fast", 0.0), beta_slow = num("beta_slow", 0.0);
    if (beta_fast == 0) beta_fast = 32;
    if (beta_slow == 0) beta_slow = 1;
    const bool truncate = p.contains("truncate") && p["truncate"].is_boolean() ? p["truncate"].get<bool>() : true;
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
    throw Unsupported("rope type '" + type + "' is not supported (default, linear, yarn)");
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

Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, LayerKV& kv, const Step& step,
              const AttentionSpec& spec, DType act) {
  ops::kv_append(kv, k, v, step);
  return ops::attention(q, kv, step, spec, act);
}

// ---- MLP / MoE ----

GatedMlp load_gated_mlp(const Checkpoint& ckpt, const std::string& prefix, int64_t hidden,
                        int64_t intermediate, DType dtype, Activation activation, Device device) {
  GatedMlp m;
  m.gate = load_linear(ckpt, prefix + ".gate_proj", intermediate, hidden, dtype, false, device);
  m.up = load_linear(ckpt, prefix + ".up_proj", intermediate, hidden, dtype, false, device);
  m.down = load_linear(ckpt, prefix + ".down_proj", hidden, intermediate, dtype, false, device);
  m.activation = activation;
  return m;
}

Tensor gated_mlp(const Tensor& x, const GatedMlp& mlp, DType act) {
  Tensor g = linear(x, mlp.gate, act);
  ops::gated_activation_(g, linear(x, mlp.up, act), mlp.activation, act);
  return linear(g, mlp.down, act);
}

ExpertsSpec gated_experts_spec(int64_t num_experts, int64_t hidden, int64_t intermediate, Activation act) {
  ExpertsSpec spec;
  spec.num_experts = num_experts;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.act = act;
  return spec;
}

Experts load_experts(const Checkpoint& ckpt, const std::string& prefix, const ExpertsSpec& spec,
                     DType dtype, const ExpertNames& names, Device device) {
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  ExpertsWeights w;
  if (ckpt.has(prefix + ".gate_up_proj")) {
    w.gate_up = ckpt.get(prefix + ".gate_up_proj", {E, 2 * I, H}, dtype).to(device);
    w.down = ckpt.get(prefix + ".down_proj", {E, H, I}, dtype).to(device);
    return Experts(spec, std::move(w));
  }
  const auto expert_tensor = [&](int64_t e, const std::string& proj, Shape shape) {
    return ckpt.get(prefix + "." + std::to_string(e) + "." + proj + names.suffix, shape, dtype);
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
    const std::string p = prefix + "." + std::to_string(e) + ".";
    put(gu + size_t(e * 2 * I * H) * es, ckpt.get(p + names.gate + names.suffix, {I, H}, dtype));
    put(gu + size_t((e * 2 + 1) * I * H) * es, ckpt.get(p + names.up + names.suffix, {I, H}, dtype));
    put(dn + size_t(e * H * I) * es, ckpt.get(p + names.down + names.suffix, {H, I}, dtype));
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
