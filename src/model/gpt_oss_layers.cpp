// See gpt_oss_layers.hpp.
#include "model/gpt_oss_layers.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "moex/error.hpp"

namespace moex::model {

nlohmann::json gpt_oss_rope_config(const nlohmann::json& config) {
  nlohmann::json c = config;
  auto is_obj = [&](const char* k) { return c.contains(k) && c[k].is_object(); };
  if (!is_obj("rope_parameters") && !is_obj("rope_scaling"))
    c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 32.0},
                            {"beta_fast", 32.0},   {"beta_slow", 1.0},
                            {"truncate", false},   {"original_max_position_embeddings", 4096}};
  const char* key = is_obj("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const bool has_theta = (c[key].contains("rope_theta") && c[key]["rope_theta"].is_number()) ||
                         (c.contains("rope_theta") && c["rope_theta"].is_number());
  if (!has_theta) c[key]["rope_theta"] = 150000.0;
  return c;
}

Tensor gpt_oss_rms_norm(const Tensor& x, const Tensor& w, float eps, DType act) {
  const int64_t rows = x.size(0), dim = x.size(1);
  const std::vector<float> weight = w.to_float_vector();
  Tensor out = new_act(rows, dim);
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = src + r * dim;
    double ss = 0.0;  // double: the float32 mean of transformers, without summation-order noise
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i) dst[r * dim + i] = round_act(weight[size_t(i)] * (xr[i] * inv), act);
  }
  return out;
}

Routing gpt_oss_route(const Tensor& logits, int64_t k, DType act) {
  const int64_t rows = logits.size(0), E = logits.size(1);
  Routing r;
  r.top_k_index = Tensor::empty({rows, k}, DType::kI64);
  r.top_k_weights = Tensor::empty({rows, k}, DType::kF32);
  const float* lg = logits.data<float>();
  int64_t* idx = r.top_k_index.data<int64_t>();
  float* w = r.top_k_weights.data<float>();
  std::vector<float> vals(static_cast<size_t>(k));
  for (int64_t t = 0; t < rows; ++t) {
    torch_topk(lg + t * E, E, k, /*sorted=*/true, idx + t * k, vals.data());
    // vals[0] is the largest, so exp(v - top) <= 1: no overflow.
    const float top = vals[0];
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      vals[size_t(j)] = std::exp(vals[size_t(j)] - top);
      sum += vals[size_t(j)];
    }
    for (int64_t j = 0; j < k; ++j) w[t * k + j] = round_act(vals[size_t(j)] / sum, act);
  }
  return r;
}

Tensor gpt_oss_attention(const Tensor& q, const Tensor& k, const Tensor& v, LayerKV& kv, const Step& step,
                         const AttentionSpec& spec, DType act) {
  if (act == DType::kF32) return attention(q, k, v, kv, step, spec, act);
  append_kv(k, v, kv, step, spec);  // the cache layout of ops.hpp's attention()
  const int64_t kd = spec.kv_heads * spec.head_dim_k, vd = spec.kv_heads * spec.head_dim_v;
  const int64_t group = spec.heads / spec.kv_heads;
  const int64_t qd = spec.heads * spec.head_dim_k, od = spec.heads * spec.head_dim_v;
  Tensor out = new_act(step.rows(), od);
  const float* Q = q.data<float>();
  float* O = out.data<float>();
  std::vector<float> sinks;
  if (spec.sinks) sinks = spec.sinks->to(DType::kF32).to_float_vector();
  // One (row, head) per iteration, each output written by one thread: thread-count independent.
#pragma omp parallel
  {
    std::vector<float> scores, acc(size_t(spec.head_dim_v));
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < step.rows(); ++r) {
      for (int64_t h = 0; h < spec.heads; ++h) {
        const int64_t b = r / step.tokens, pos = step.position(r);
        const float* keys = kv.k[size_t(b)].data();
        const float* vals = kv.v[size_t(b)].data();
        const int64_t hk = h / group;
        const int64_t first =
            spec.sliding_window > 0 ? std::max<int64_t>(0, pos - spec.sliding_window + 1) : 0;
        const int64_t n = pos + 1 - first;
        scores.resize(size_t(n));
        const float* qv = Q + r * qd + h * spec.head_dim_k;
        float mx = spec.sinks ? round_act(sinks[size_t(h)], act) : -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* kk = keys + (first + j) * kd + hk * spec.head_dim_k;
          float dot = 0.0f;
          for (int64_t i = 0; i < spec.head_dim_k; ++i) dot += qv[i] * kk[i];
          scores[size_t(j)] = round_act(round_act(dot, act) * spec.scale, act);
          mx = std::max(mx, scores[size_t(j)]);
        }
        double denom =
            spec.sinks ? std::exp(double(round_act(round_act(sinks[size_t(h)], act) - mx, act))) : 0.0;
        for (int64_t j = 0; j < n; ++j) {
          scores[size_t(j)] = float(std::exp(double(round_act(scores[size_t(j)] - mx, act))));
          denom += scores[size_t(j)];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float w = round_act(float(scores[size_t(j)] / denom), act);
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

Experts load_gpt_oss_experts(const Checkpoint& ckpt, const std::string& prefix, int64_t num_experts,
                             int64_t hidden, int64_t intermediate, DType dtype, float limit, float alpha) {
  if (ckpt.has(prefix + ".gate_up_proj_blocks") && !ckpt.has(prefix + ".gate_up_proj"))
    throw Unsupported("'" + prefix + ".gate_up_proj_blocks' in " + ckpt.dir() +
                      ": MXFP4 gpt-oss experts are not supported; dequantize the checkpoint to "
                      "bfloat16 first");
  ExpertsSpec spec;
  spec.num_experts = num_experts;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.has_gate = true;
  spec.has_bias = true;
  spec.is_transposed = true;
  spec.is_concatenated = false;
  spec.act = Activation::kSwigluOai;
  spec.swiglu_limit = limit;
  spec.swiglu_alpha = alpha;
  const int64_t E = num_experts, H = hidden, I = intermediate;
  ExpertsWeights w;
  w.gate_up = ckpt.get(prefix + ".gate_up_proj", {E, H, 2 * I}, dtype);
  w.gate_up_bias = ckpt.get(prefix + ".gate_up_proj_bias", {E, 2 * I}, dtype);
  w.down = ckpt.get(prefix + ".down_proj", {E, I, H}, dtype);
  w.down_bias = ckpt.get(prefix + ".down_proj_bias", {E, H}, dtype);
  return Experts(spec, std::move(w));
}

}  // namespace moex::model
