// Host implementations of the model ops (see ops.hpp for the numerics contract).
// Parallelism: OpenMP over independent output rows / (sequence, head) pairs; each output value is
// computed by one thread in a fixed order, so results do not depend on the thread count.
#include "model/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "moex/error.hpp"

namespace moex::model {

namespace {

// Below this many multiply-adds a parallel region costs more than it saves (thread wake-up on a
// shared machine dominates the tiny decode-step ops).
constexpr int64_t kParallelWork = 1 << 15;

// Dot product with 8 independent float accumulators (lets the compiler vectorise without
// -ffast-math); the fixed combination order keeps it deterministic.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// Float view of `n` contiguous elements starting at element `offset` of a host tensor: a direct
// pointer for float32, otherwise converted into `buf`.
const float* float_row(const Tensor& t, int64_t offset, int64_t n, float* buf) {
  if (t.dtype() == DType::kF32) return t.data<float>() + offset;
  const char* base = static_cast<const char*>(t.raw()) + size_t(offset) * dtype_size(t.dtype());
  convert_floats(base, t.dtype(), buf, DType::kF32, n);
  return buf;
}

float apply_activation(Activation a, float x) {
  switch (a) {
    case Activation::kSilu: return x / (1.0f + std::exp(-x));
    case Activation::kGelu: return 0.5f * x * (1.0f + std::erf(x * float(M_SQRT1_2)));
    case Activation::kGeluTanh: {
      const float c = 0.7978845608028654f;  // sqrt(2 / pi)
      return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
    }
    case Activation::kRelu: return x > 0 ? x : 0.0f;
    case Activation::kSwigluOai: break;
  }
  throw Unsupported("activation " + std::string(activation_name(a)) + " is not a plain MLP activation");
}

}  // namespace

// ---- cache ----

KVCache::KVCache(int64_t b, int64_t n_layers) : batch(b), layers(size_t(n_layers)) {
  for (auto& l : layers) {
    l.k.resize(size_t(b));
    l.v.resize(size_t(b));
  }
}

int64_t KVCache::length() const { return layers.empty() ? 0 : layers[0].length(); }

// ---- element-wise ----

void round_to(Tensor& x, DType act) {
  if (act != DType::kBF16) return;
  float* p = x.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
}

Tensor new_act(int64_t rows, int64_t dim) { return Tensor::empty({rows, dim}, DType::kF32); }
Tensor zeros_act(int64_t rows, int64_t dim) { return Tensor::zeros({rows, dim}, DType::kF32); }

void add_inplace(Tensor& a, const Tensor& b, DType act) {
  float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) pa[i] = round_act(pa[i] + pb[i], act);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

Tensor embedding(const Tensor& table, const std::vector<int64_t>& ids) {
  const int64_t h = table.size(1);
  Tensor out = new_act(int64_t(ids.size()), h);
  float* o = out.data<float>();
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* row = float_row(table, ids[r] * h, h, o + r * h);
    if (row != o + r * h) std::memcpy(o + r * h, row, size_t(h) * sizeof(float));
  }
  return out;
}

// ---- linear ----

Linear load_linear(const Checkpoint& ckpt, const std::string& name, int64_t out, int64_t in,
                   DType dtype, bool bias) {
  Linear l;
  l.weight = ckpt.get(name + ".weight", {out, in}, dtype);
  // Biases are kept as float32 holding `dtype` values (rounded like the weights).
  if (bias) l.bias = ckpt.get(name + ".bias", {out}, dtype).to(DType::kF32);
  return l;
}

Tensor linear(const Tensor& x, const Linear& l, DType act) {
  const int64_t rows = x.size(0), in = l.in_features(), out = l.out_features();
  Tensor y = new_act(rows, out);
  const float* X = x.data<float>();
  float* Y = y.data<float>();
  const float* B = l.bias.defined() ? l.bias.data<float>() : nullptr;
  constexpr int64_t kBlock = 16;  // weight rows converted together, reused for every token
#pragma omp parallel if (rows * in * out >= kParallelWork)
  {
    std::vector<float> buf(l.weight.dtype() == DType::kF32 ? 0 : size_t(kBlock * in));
#pragma omp for schedule(static)
    for (int64_t j0 = 0; j0 < out; j0 += kBlock) {
      const int64_t nj = std::min(kBlock, out - j0);
      const float* W = float_row(l.weight, j0 * in, nj * in, buf.data());
      for (int64_t t = 0; t < rows; ++t) {
        const float* xr = X + t * in;
        float* yr = Y + t * out + j0;
        for (int64_t j = 0; j < nj; ++j) {
          float v = dot(xr, W + j * in, in);
          if (B) v += B[j0 + j];
          yr[j] = round_act(v, act);
        }
      }
    }
  }
  return y;
}

Tensor lm_head(const Tensor& x, const Tensor& weight, DType act) {
  Linear l;
  l.weight = weight;
  return linear(x, l, act);
}

// ---- norms ----

Tensor load_vector(const Checkpoint& ckpt, const std::string& name, int64_t dim, DType dtype) {
  return ckpt.get(name, {dim}, dtype);
}

void rms_norm_inplace(Tensor& x, const Tensor& weight, float eps, DType act, int64_t dim) {
  const int64_t width = x.size(1);
  if (dim <= 0) dim = width;
  const int64_t groups = x.numel() / dim;
  std::vector<float> wbuf(static_cast<size_t>(dim));
  const float* w = float_row(weight, 0, dim, wbuf.data());
  float* p = x.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelWork)
  for (int64_t g = 0; g < groups; ++g) {
    float* v = p + g * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(v[i]) * v[i];
    const float r = float(1.0 / std::sqrt(float(ss / double(dim)) + eps));
    for (int64_t i = 0; i < dim; ++i) v[i] = round_act(w[i] * round_act(v[i] * r, act), act);
  }
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, DType act, int64_t dim) {
  Tensor y = x.clone();
  rms_norm_inplace(y, weight, eps, act, dim);
  return y;
}

// ---- rope ----

void Rope::cos_sin(int64_t position, DType act, float* cos_out, float* sin_out) const {
  // float32 as transformers computes it: freqs = inv_freq (f32) * position (f32), then cos/sin.
  const float scale = float(attention_scaling);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float f = float(inv_freq[i]) * float(position);
    cos_out[i] = round_act(float(std::cos(double(f))) * scale, act);
    sin_out[i] = round_act(float(std::sin(double(f))) * scale, act);
  }
}

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

void apply_rope(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
                RopeLayout layout, const Step& step, DType act) {
  const int64_t d = rope.rotary_dim, half = d / 2, width = x.size(1);
  float* p = x.data<float>();
#pragma omp parallel if (x.numel() * 8 >= kParallelWork)
  {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half)), tmp(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < step.rows(); ++r) {
      rope.cos_sin(step.position(r), act, c.data(), s.data());
      for (int64_t h = 0; h < heads; ++h) {
        float* v = p + r * width + h * head_stride + offset;
        if (layout == RopeLayout::kInterleaved) {
          for (int64_t i = 0; i < half; ++i) {
            tmp[size_t(i)] = v[2 * i];
            tmp[size_t(i + half)] = v[2 * i + 1];
          }
          std::memcpy(v, tmp.data(), size_t(d) * sizeof(float));
        }
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          // (x * cos) + (rotate_half(x) * sin), each product rounded as torch does in bf16.
          v[i] = round_act(round_act(x1 * c[size_t(i)], act) + round_act(-x2 * s[size_t(i)], act), act);
          v[i + half] = round_act(round_act(x2 * c[size_t(i)], act) + round_act(x1 * s[size_t(i)], act), act);
        }
      }
    }
  }
}

// ---- attention ----

void append_kv(const Tensor& k, const Tensor& v, LayerKV& kv, const Step& step,
               const AttentionSpec& spec) {
  const int64_t kd = spec.kv_heads * spec.head_dim_k, vd = spec.kv_heads * spec.head_dim_v;
  if (kv.k.size() != size_t(step.batch)) {
    kv.k.assign(size_t(step.batch), {});
    kv.v.assign(size_t(step.batch), {});
  }
  kv.k_dim = kd;
  kv.v_dim = vd;
  const float* K = k.data<float>();
  const float* V = v.data<float>();
  for (int64_t r = 0; r < step.rows(); ++r) {
    const int64_t b = r / step.tokens;
    kv.k[size_t(b)].insert(kv.k[size_t(b)].end(), K + r * kd, K + (r + 1) * kd);
    kv.v[size_t(b)].insert(kv.v[size_t(b)].end(), V + r * vd, V + (r + 1) * vd);
  }
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, LayerKV& kv, const Step& step,
                 const AttentionSpec& spec, DType act) {
  append_kv(k, v, kv, step, spec);
  const int64_t kd = spec.kv_heads * spec.head_dim_k, vd = spec.kv_heads * spec.head_dim_v;

  const int64_t group = spec.heads / spec.kv_heads;
  const int64_t qd = spec.heads * spec.head_dim_k, od = spec.heads * spec.head_dim_v;
  Tensor out = new_act(step.rows(), od);
  const float* Q = q.data<float>();
  float* O = out.data<float>();
  std::vector<float> sinks;
  if (spec.sinks) sinks = spec.sinks->to(DType::kF32).to_float_vector();
const int64_t work = step.rows() * spec.heads * (step.past + step.tokens) * (spec.head_dim_k + spec.head_dim_v);
#pragma omp parallel if (work >= kParallelWork)
  {
    std::vector<float> scores, acc(static_cast<size_t>(spec.head_dim_v));
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < step.rows(); ++r) {
      for (int64_t h = 0; h < spec.heads; ++h) {
        const int64_t b = r / step.tokens, pos = step.position(r);
        const float* keys = kv.k[size_t(b)].data();
        const float* vals = kv.v[size_t(b)].data();
        const int64_t hk = h / group;
        int64_t first = 0;
        if (spec.sliding_window > 0) first = std::max<int64_t>(0, pos - spec.sliding_window + 1);
        const int64_t n = pos + 1 - first;
        scores.resize(size_t(n));
        const float* qv = Q + r * qd + h * spec.head_dim_k;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float sc = dot(qv, keys + (first + j) * kd + hk * spec.head_dim_k, spec.head_dim_k) * spec.scale;
          scores[size_t(j)] = sc;
          mx = std::max(mx, sc);
        }
        const float sink = spec.sinks ? sinks[size_t(h)] : -INFINITY;
        mx = std::max(mx, sink);
        double denom = spec.sinks ? std::exp(double(sink - mx)) : 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const float e = std::exp(scores[size_t(j)] - mx);
          scores[size_t(j)] = e;
          denom += e;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        const float inv = float(1.0 / denom);
        for (int64_t j = 0; j < n; ++j) {
          const float w = round_act(scores[size_t(j)] * inv, act);
          const float* vv = vals + (first + j) * vd + hk * spec.head_dim_v;
          for (int64_t i = 0; i < spec.head_dim_v; ++i) acc[size_t(i)] += w * vv[i];
        }
        float* o = O + r * od + h * spec.head_dim_v;
        for (int64_t i = 0; i < spec.head_dim_v; ++i) o[i] = round_act(acc[size_t(i)], act);
      }
    }
  }
  return out;
}

// ---- MLP / MoE ----

GatedMlp load_gated_mlp(const Checkpoint& ckpt, const std::string& prefix, int64_t hidden,
                        int64_t intermediate, DType dtype, Activation activation) {
  GatedMlp m;
  m.gate = load_linear(ckpt, prefix + ".gate_proj", intermediate, hidden, dtype);
  m.up = load_linear(ckpt, prefix + ".up_proj", intermediate, hidden, dtype);
  m.down = load_linear(ckpt, prefix + ".down_proj", hidden, intermediate, dtype);
  m.activation = activation;
  return m;
}

Tensor gated_mlp(const Tensor& x, const GatedMlp& mlp, DType act) {
  Tensor g = linear(x, mlp.gate, act);
  Tensor u = linear(x, mlp.up, act);
  float* pg = g.data<float>();
  const float* pu = u.data<float>();
  const int64_t n = g.numel();
  for (int64_t i = 0; i < n; ++i)
    pg[i] = round_act(round_act(apply_activation(mlp.activation, pg[i]), act) * pu[i], act);
  return linear(g, mlp.down, act);
}

void torch_topk(const float* values, int64_t n, int64_t k, bool sorted, int64_t* idx_out, float* val_out) {
  using Elem = std::pair<float, int64_t>;
  std::vector<Elem> queue(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[size_t(j)] = {values[j], j};
  auto larger = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), larger);
  } else {
    std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), larger);
    if (sorted) std::sort(queue.begin(), queue.begin() + (k - 1), larger);
  }
  for (int64_t j = 0; j < k; ++j) {
    idx_out[j] = queue[size_t(j)].second;
    if (val_out) val_out[j] = queue[size_t(j)].first;
  }
}

void topk_rows(const float* scores, int64_t n, int64_t k, int64_t* idx_out, float* val_out) {
  torch_topk(scores, n, k, /*sorted=*/true, idx_out, val_out);
}

Routing softmax_topk(const Tensor& router_logits, int64_t k, bool norm_topk_prob, DType act) {
  const int64_t rows = router_logits.size(0), n = router_logits.size(1);
  Routing r;
  r.top_k_index = Tensor::empty({rows, k}, DType::kI64);
  r.top_k_weights = Tensor::empty({rows, k}, DType::kF32);
  const float* L = router_logits.data<float>();
  int64_t* I = r.top_k_index.data<int64_t>();
  float* W = r.top_k_weights.data<float>();
  std::vector<float> probs(static_cast<size_t>(n));
  for (int64_t t = 0; t < rows; ++t) {
    const float* l = L + t * n;
    const float mx = *std::max_element(l, l + n);
    float sum = 0;
    for (int64_t e = 0; e < n; ++e) sum += (probs[size_t(e)] = std::exp(l[e] - mx));
    for (int64_t e = 0; e < n; ++e) probs[size_t(e)] /= sum;
    topk_rows(probs.data(), n, k, I + t * k, W + t * k);
    if (norm_topk_prob) {
      float s = 0;
      for (int64_t j = 0; j < k; ++j) s += W[t * k + j];
      for (int64_t j = 0; j < k; ++j) W[t * k + j] /= s;
    }
    for (int64_t j = 0; j < k; ++j) W[t * k + j] = round_act(W[t * k + j], act);
  }
  return r;
}

Experts load_experts(const Checkpoint& ckpt, const std::string& prefix, const ExpertsSpec& spec,
                     DType dtype, const ExpertNames& names, Device device) {
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  ExpertsWeights w;
  if (ckpt.has(prefix + ".gate_up_proj")) {
    w.gate_up = ckpt.get(prefix + ".gate_up_proj", {E, 2 * I, H}, dtype);
    w.down = ckpt.get(prefix + ".down_proj", {E, H, I}, dtype);
  } else {
    // Fuse the hub's per-expert tensors once: gate_up[e] = [gate_e; up_e], down[e] = down_e.
    w.gate_up = Tensor::empty({E, 2 * I, H}, dtype);
    w.down = Tensor::empty({E, H, I}, dtype);
    const size_t es = dtype_size(dtype);
    char* gu = static_cast<char*>(w.gate_up.raw());
    char* dn = static_cast<char*>(w.down.raw());
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = prefix + "." + std::to_string(e) + ".";
      Tensor g = ckpt.get(p + names.gate + names.suffix, {I, H}, dtype).contiguous();
      Tensor u = ckpt.get(p + names.up + names.suffix, {I, H}, dtype).contiguous();
      Tensor d = ckpt.get(p + names.down + names.suffix, {H, I}, dtype).contiguous();
      std::memcpy(gu + size_t(e * 2 * I * H) * es, g.raw(), size_t(I * H) * es);
      std::memcpy(gu + size_t((e * 2 + 1) * I * H) * es, u.raw(), size_t(I * H) * es);
      std::memcpy(dn + size_t(e * H * I) * es, d.raw(), size_t(H * I) * es);
    }
  }
  Experts e(spec, std::move(w));
  return device.host_accessible() ? e : experts_to(e, device);
}

Experts experts_to(const Experts& experts, Device device) {
  const ExpertsWeights& w = experts.weights();
  if (device.host_accessible() || w.gate_up.device() == device) return experts;
  ExpertsWeights d;
  for (auto [src, dst] : {std::pair{&w.gate_up, &d.gate_up}, {&w.down, &d.down},
                          {&w.gate_up_bias, &d.gate_up_bias}, {&w.down_bias, &d.down_bias},
                          {&w.gate_up_scale, &d.gate_up_scale}, {&w.down_scale, &d.down_scale}})
    if (src->defined()) *dst = src->to(device);
  return Experts(experts.spec(), std::move(d));
}

Tensor run_experts(const Experts& experts, const std::string& backend, const Tensor& x,
                   const Routing& routing, DType act) {
  const Device dev = experts.weights().gate_up.device();
  Tensor h = act == DType::kF32 ? x : x.to(act);
  if (dev.host_accessible()) {
    Tensor out = experts.forward(backend, h, routing.top_k_index, routing.top_k_weights);
    return act == DType::kF32 ? out : out.to(DType::kF32);
  }
  Tensor out = experts.forward(backend, h.to(dev), routing.top_k_index.to(dev), routing.top_k_weights.to(dev));
  out = out.to(Device::cpu());
  return act == DType::kF32 ? out : out.to(DType::kF32);
}

}  // namespace moex::model
