#include "cpu/experts_common.hpp"

#include <cstring>

#include "core/activation.hpp"
#include "cpu/backends.hpp"
#include "moex/error.hpp"

namespace moex::cpu {

BackendCaps cpu_caps(std::string description) {
  BackendCaps c;
  c.devices = {DeviceKind::kCPU};
  c.dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  c.graph_capturable = false;
  c.reads_per_expert = true;  // gate_up_view / down_view and the engine's packing read both forms
  c.quantized_weights = true;  // FP8 / FP4 through experts_quant.hpp
  c.description = std::move(description);
  return c;
}

RoutingView::RoutingView(const ExpertsProblem& p)
    : T(p.tokens()), k(p.top_k()), E(p.spec->num_experts), w(p.top_k_weights.raw()),
      w_dtype(p.top_k_weights.dtype()), per_expert(p.weights_per_expert) {
  if (p.top_k_index.dtype() == DType::kI64) idx64 = p.top_k_index.data<int64_t>();
  else idx32 = p.top_k_index.data<int32_t>();
}

float RoutingView::weight(int64_t t, int64_t j) const {
  int64_t i = per_expert ? t * E + id(t, j) : t * k + j;
  switch (w_dtype) {
    case DType::kF32: return static_cast<const float*>(w)[i];
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(w)[i]);
    case DType::kF16: return f16_to_float(static_cast<const uint16_t*>(w)[i]);
    default: return 0.f;  // validated at the boundary
  }
}

ExpertGroups group_by_expert(const RoutingView& r) {
  ExpertGroups g;
  g.offsets.assign(size_t(r.E + 1), 0);
  const int64_t n = r.T * r.k;
  for (int64_t p = 0; p < n; ++p) {
    int64_t e = r.id(p / r.k, p % r.k);
    if (e < r.E) ++g.offsets[size_t(e + 1)];
  }
  for (int64_t e = 0; e < r.E; ++e) g.offsets[size_t(e + 1)] += g.offsets[size_t(e)];
  g.pairs.resize(size_t(g.offsets[size_t(r.E)]));
  std::vector<int64_t> fill(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t p = 0; p < n; ++p) {
    int64_t e = r.id(p / r.k, p % r.k);
    if (e < r.E) g.pairs[size_t(fill[size_t(e)]++)] = p;
  }
  return g;
}

void gather_expert_rows(const ExpertsProblem& p, const RoutingView& r, const ExpertGroups& g,
                        int64_t e, std::vector<float>& x) {
  const int64_t H = p.spec->hidden, n = g.count(e);
  const int64_t* pairs = g.pairs.data() + g.offsets[size_t(e)];
  const size_t es = dtype_size(p.hidden.dtype());
  const char* hid = static_cast<const char*>(p.hidden.raw());
  x.resize(size_t(n * H));
  for (int64_t i = 0; i < n; ++i)
    load_floats(hid + size_t(pairs[i] / r.k * H) * es, p.hidden.dtype(), H, x.data() + i * H);
}

void scatter_expert_rows(const ExpertGroups& g, int64_t e, const float* y, int64_t H,
                         float* pair_out) {
  const int64_t* pairs = g.pairs.data() + g.offsets[size_t(e)];
  for (int64_t i = 0; i < g.count(e); ++i)
    std::memcpy(pair_out + pairs[i] * H, y + i * H, sizeof(float) * size_t(H));
}

MatrixView gate_up_view(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e) {
  const int64_t R = s.gate_up_rows(), H = s.hidden;
  if (!w.fused()) {  // per expert: [gate_e; up_e], rows contiguous, no bias
    const PerExpertWeights& pe = *w.per_expert;
    MatrixView v{pe.gate[size_t(e)].raw(), w.dtype(), R, H, H, 1};
    v.upper = pe.up[size_t(e)].raw();
    v.split = s.intermediate;
    return v;
  }
  size_t es = dtype_size(w.gate_up.dtype());
  MatrixView v{static_cast<const char*>(w.gate_up.raw()) + size_t(e * R * H) * es,
               w.gate_up.dtype(), R, H, s.is_transposed ? 1 : H, s.is_transposed ? R : 1};
  if (s.has_bias) v.bias = static_cast<const char*>(w.gate_up_bias.raw()) + size_t(e * R) * es;
  return v;
}

MatrixView down_view(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e) {
  const int64_t I = s.intermediate, H = s.hidden;
  if (!w.fused()) return MatrixView{w.per_expert->down[size_t(e)].raw(), w.dtype(), H, I, I, 1};
  size_t es = dtype_size(w.down.dtype());
  MatrixView v{static_cast<const char*>(w.down.raw()) + size_t(e * I * H) * es, w.down.dtype(),
               H, I, s.is_transposed ? 1 : I, s.is_transposed ? H : 1};
  if (s.has_bias) v.bias = static_cast<const char*>(w.down_bias.raw()) + size_t(e * H) * es;
  return v;
}

void load_floats(const void* src, DType t, int64_t n, float* dst) {
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(static_cast<const uint16_t*>(src)[i]);
      return;
    default: throw Unsupported("load_floats: dtype " + std::string(dtype_name(t)));
  }
}

void round_floats(float* v, int64_t n, DType t) {
  if (t == DType::kBF16) for (int64_t i = 0; i < n; ++i) v[i] = round_bf16(v[i]);
  else if (t == DType::kF16) for (int64_t i = 0; i < n; ++i) v[i] = round_f16(v[i]);
}

void linear_rows(const MatrixView& W, const float* X, int64_t M, float* Y) {
  const size_t es = dtype_size(W.dtype);
  std::vector<float> bias(size_t(W.N), 0.f);
  if (W.bias) load_floats(W.bias, W.dtype, W.N, bias.data());
  const char* base = static_cast<const char*>(W.base);
  if (W.sk == 1) {
    // Rows of W are contiguous: convert one row, reuse it for all M tokens.
    std::vector<float> row(static_cast<size_t>(W.K));
    for (int64_t n = 0; n < W.N; ++n) {
      load_floats(W.row(n), W.dtype, W.K, row.data());
      for (int64_t m = 0; m < M; ++m) {
        const float* x = X + m * W.K;
        float acc = 0.f;
        for (int64_t c = 0; c < W.K; ++c) acc += x[c] * row[size_t(c)];
        Y[m * W.N + n] = acc + bias[size_t(n)];
      }
    }
  } else {
    // Transposed storage: W(., c) is a contiguous row of length N; accumulate axpy-style.
    std::vector<float> row(static_cast<size_t>(W.N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < W.N; ++n) Y[m * W.N + n] = 0.f;
    for (int64_t c = 0; c < W.K; ++c) {
      load_floats(base + size_t(c * W.sk) * es, W.dtype, W.N, row.data());
      for (int64_t m = 0; m < M; ++m) {
        float xv = X[m * W.K + c];
        float* y = Y + m * W.N;
        for (int64_t n = 0; n < W.N; ++n) y[n] += xv * row[size_t(n)];
      }
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < W.N; ++n) Y[m * W.N + n] += bias[size_t(n)];
  }
}

void expert_mlp_rows(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e, const float* X,
                     int64_t M, float* Y, DType act_dtype, std::vector<float>& scratch) {
  const int64_t R = s.gate_up_rows(), I = s.intermediate;
  scratch.resize(size_t(M * (R + I)));
  float* gu = scratch.data();
  float* h = gu + M * R;
  linear_rows(gate_up_view(s, w, e), X, M, gu);
  for (int64_t m = 0; m < M; ++m) detail::activate_row<float>(s, gu + m * R, h + m * I);
  round_floats(h, M * I, act_dtype);
  linear_rows(down_view(s, w, e), h, M, Y);
}

void combine(const RoutingView& r, const float* pair_out, int64_t H, Tensor& out) {
  std::vector<float> acc;
#pragma omp parallel for schedule(static) firstprivate(acc)
  for (int64_t t = 0; t < r.T; ++t) {
    acc.assign(size_t(H), 0.f);
    for (int64_t j = 0; j < r.k; ++j) {
      if (r.id(t, j) >= r.E) continue;
      const float wt = r.weight(t, j);
      const float* src = pair_out + (t * r.k + j) * H;
      for (int64_t c = 0; c < H; ++c) acc[size_t(c)] += wt * src[c];
    }
    convert_floats(acc.data(), DType::kF32, static_cast<char*>(out.raw()) +
                   size_t(t * H) * dtype_size(out.dtype()), out.dtype(), H);
  }
}

}  // namespace moex::cpu
