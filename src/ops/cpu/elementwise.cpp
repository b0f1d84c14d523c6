// Element-wise ops, embedding and the column / row reshuffles (see ops.hpp for the contracts).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "moex/error.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops::cpu {

namespace {

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

const float* float_row(const Tensor& t, int64_t offset, int64_t n, float* buf) {
  if (t.dtype() == DType::kF32) return t.data<float>() + offset;
  const char* base = static_cast<const char*>(t.raw()) + size_t(offset) * dtype_size(t.dtype());
  convert_floats(base, t.dtype(), buf, DType::kF32, n);
  return buf;
}

void round_(Tensor& x, DType act) {
  if (act != DType::kBF16) return;
  float* p = x.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
}

void add_(Tensor& a, const Tensor& b, DType act) {
  float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) pa[i] = round_act(pa[i] + pb[i], act);
}

void clamp_(Tensor& x, float limit) {
  float* p = x.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = std::clamp(p[i], -limit, limit);
}

void gated_activation_(Tensor& gate, const Tensor& up, Activation act_fn, DType act) {
  float* pg = gate.data<float>();
  const float* pu = up.data<float>();
  const int64_t n = gate.numel();
  for (int64_t i = 0; i < n; ++i)
    pg[i] = round_act(round_act(apply_activation(act_fn, pg[i]), act) * pu[i], act);
}

void add_gated_(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act) {
  const int64_t rows = y.size(0), h = y.size(1);
  float* py = y.data<float>();
  const float* ps = shared.data<float>();
  const float* pg = gate_logit.data<float>();
  for (int64_t t = 0; t < rows; ++t) {
    const float gate = round_act(1.0f / (1.0f + std::exp(-pg[t])), act);
    for (int64_t i = 0; i < h; ++i)
      py[t * h + i] = round_act(py[t * h + i] + round_act(gate * ps[t * h + i], act), act);
  }
}

Tensor embedding(const Tensor& table, const Step& step, DType act) {
  const std::vector<int64_t>& ids = step.ids;
  const int64_t h = table.size(1);
  Tensor out = Tensor::empty({int64_t(ids.size()), h}, DType::kF32);
  float* o = out.data<float>();
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* row = float_row(table, ids[r] * h, h, o + r * h);
    if (row != o + r * h) std::memcpy(o + r * h, row, size_t(h) * sizeof(float));
  }
  round_(out, act);
  return out;
}

Tensor slice_columns(const Tensor& x, int64_t groups, int64_t begin, int64_t width) {
  const int64_t rows = x.size(0), g_in = x.size(1) / groups;
  Tensor out = Tensor::empty({rows, groups * width}, DType::kF32);
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows * groups; ++r)
    std::memcpy(dst + r * width, src + r * g_in + begin, size_t(width) * sizeof(float));
  return out;
}

Tensor concat_columns(const Tensor& a, const Tensor& b, int64_t groups, bool b_shared) {
  const int64_t rows = a.size(0), wa = a.size(1) / groups;
  const int64_t wb = b_shared ? b.size(1) : b.size(1) / groups;
  Tensor out = Tensor::empty({rows, groups * (wa + wb)}, DType::kF32);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float* o = po + (r * groups + g) * (wa + wb);
      std::memcpy(o, pa + (r * groups + g) * wa, size_t(wa) * sizeof(float));
      const float* src = b_shared ? pb + r * wb : pb + (r * groups + g) * wb;
      std::memcpy(o + wa, src, size_t(wb) * sizeof(float));
    }
  return out;
}

Tensor last_rows(const Tensor& x, const Step& step) {
  const int64_t w = x.size(1);
  Tensor out = Tensor::empty({step.batch, w}, DType::kF32);
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  for (int64_t b = 0; b < step.batch; ++b)
    std::memcpy(dst + b * w, src + ((b + 1) * step.tokens - 1) * w, size_t(w) * sizeof(float));
  return out;
}

}  // namespace moex::ops::cpu
