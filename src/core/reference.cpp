// The float64 reference every backend is checked against: the experts formula of experts.hpp,
// evaluated in double with the straightforward loops (no grouping, no intermediate rounding).
//
// The activations are written out here a second time, in double, on purpose: the backends share
// core/activation.hpp, and a reference that called the same code could not catch a bug in it.
#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/quant.hpp"

namespace moex {
namespace {

// Each activation from its textbook definition (PyTorch's formulas), in double.
double activate(Activation a, double x) {
  switch (a) {
    case Activation::kSilu: return x / (1.0 + std::exp(-x));  // x * sigmoid(x)
    case Activation::kGelu: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));  // x * Phi(x)
    case Activation::kGeluTanh: {
      const double c = std::sqrt(2.0 / std::numbers::pi);
      return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * std::pow(x, 3))));
    }
    case Activation::kRelu: return std::max(x, 0.0);
    case Activation::kSwigluOai: break;  // needs gate and up: see intermediate_row
  }
  throw InvalidInput("reference: activation " + std::string(activation_name(a)) +
                     " has no single-input form");
}

}  // namespace

// One element of the intermediate from its gate and up values (ungated: `gate` is the product
// row's element and `up` is unused). Shared with reference_quant.cpp.
double intermediate_value(const ExpertsSpec& s, double gate, double up) {
  if (!s.has_gate) return activate(s.act, gate);
  if (s.act == Activation::kSwigluOai) {
    const double limit = s.swiglu_limit, alpha = s.swiglu_alpha;
    const double g = std::min(gate, limit);
    const double u = std::clamp(up, -limit, limit);
    return (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
  }
  return activate(s.act, gate) * up;
}

namespace {

// The I-wide intermediate from one row `a` of the gate_up product (R values in stored order):
// ungated: act(a[i]); gated: gate i and up i are a[i] and a[I + i] (concatenated halves) or
// a[2i] and a[2i + 1] (interleaved); gpt-oss clamps gate above and up on both sides at `limit`
// and computes (up + 1) * gate * sigmoid(alpha * gate).
void intermediate_row(const ExpertsSpec& s, const std::vector<double>& a, std::vector<double>& h) {
  const size_t I = size_t(s.intermediate);
  for (size_t i = 0; i < I; ++i) {
    if (!s.has_gate) {
      h[i] = intermediate_value(s, a[i], 0.0);
      continue;
    }
    const double gate = s.is_concatenated ? a[i] : a[2 * i];
    const double up = s.is_concatenated ? a[I + i] : a[2 * i + 1];
    h[i] = intermediate_value(s, gate, up);
  }
}

}  // namespace

QuantizedReference quantized_reference(const ExpertsSpec& s, const ExpertsWeights& w,
                                       const Tensor& hidden, const Tensor& idx, const Tensor& tw,
                                       double accumulation_unit_roundoff);

Tensor experts_reference_f64(const ExpertsSpec& s, const ExpertsWeights& w, const Tensor& hidden,
                             const Tensor& idx, const Tensor& tw) {
  validate_experts_weights(s, w);
  validate_experts_inputs(s, hidden, idx, tw);
  if (s.quant.quantized()) return quantized_reference(s, w, hidden, idx, tw, 0).out;
  auto host = [](const Tensor& t) { return t.device().host_accessible() ? t : t.to(Device::cpu()); };
  const int64_t T = hidden.size(0), H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const int64_t k = idx.size(1), E = s.num_experts;
  std::vector<float> x = host(hidden).to_float_vector();
  std::vector<int64_t> ids = host(idx).to_int_vector();
  std::vector<float> rw = host(tw).to_float_vector();
  const bool per_expert = tw.size(1) != k;
  // Experts are converted on first use only: a few tokens of a 256-expert layer touch a few
  // experts, and converting all of them would cost tens of GB.
  struct ExpertF32 {
    std::vector<float> gu, dn, gub, dnb;
  };
  std::map<int64_t, ExpertF32> cache;
  auto expert = [&](int64_t e) -> const ExpertF32& {
    auto it = cache.find(e);
    if (it != cache.end()) return it->second;
    ExpertF32 ex;
    if (w.fused()) {
      ex.gu = host(w.gate_up.select(0, e)).to_float_vector();
      ex.dn = host(w.down.select(0, e)).to_float_vector();
    } else {  // per expert: gate_up[e] = [gate_e; up_e]
      ex.gu = w.per_expert->gate[size_t(e)].to_float_vector();
      const std::vector<float> up = w.per_expert->up[size_t(e)].to_float_vector();
      ex.gu.insert(ex.gu.end(), up.begin(), up.end());
      ex.dn = w.per_expert->down[size_t(e)].to_float_vector();
    }
    if (s.has_bias) {
      ex.gub = host(w.gate_up_bias.select(0, e)).to_float_vector();
      ex.dnb = host(w.down_bias.select(0, e)).to_float_vector();
    }
    return cache.emplace(e, std::move(ex)).first->second;
  };
  Tensor out = Tensor::zeros({T, H}, DType::kF64);
  double* o = out.data<double>();
  std::vector<double> a(static_cast<size_t>(R)), h(static_cast<size_t>(I));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      int64_t e = ids[size_t(t * k + j)];
      if (e < 0) throw InvalidInput("negative expert id in reference");
      if (e >= E) continue;  // sentinel
      double wt = per_expert ? rw[size_t(t * E + e)] : rw[size_t(t * k + j)];
      const ExpertF32& x_e = expert(e);
      const std::vector<float>&gu = x_e.gu, &dn = x_e.dn, &gub = x_e.gub, &dnb = x_e.dnb;
      for (int64_t r = 0; r < R; ++r) {
        double acc = s.has_bias ? gub[size_t(r)] : 0.0;
        for (int64_t c = 0; c < H; ++c) {
          double wv = s.is_transposed ? gu[size_t(c * R + r)] : gu[size_t(r * H + c)];
          acc += double(x[size_t(t * H + c)]) * wv;
        }
        a[size_t(r)] = acc;
      }
      intermediate_row(s, a, h);
      for (int64_t c = 0; c < H; ++c) {
        double acc = s.has_bias ? dnb[size_t(c)] : 0.0;
        for (int64_t i = 0; i < I; ++i) {
          double wv = s.is_transposed ? dn[size_t(i * H + c)] : dn[size_t(c * I + i)];
          acc += h[size_t(i)] * wv;
        }
        o[t * H + c] += wt * acc;
      }
    }
  }
  return out;
}

QuantizedReference experts_reference_f64_bounded(const ExpertsSpec& s, const ExpertsWeights& w,
                                                 const Tensor& hidden, const Tensor& idx,
                                                 const Tensor& tw, double accumulation_unit_roundoff) {
  validate_experts_weights(s, w);
  validate_experts_inputs(s, hidden, idx, tw);
  if (s.quant.quantized())
    return quantized_reference(s, w, hidden, idx, tw, accumulation_unit_roundoff);
  QuantizedReference r;
  r.out = experts_reference_f64(s, w, hidden, idx, tw);
  return r;
}

}  // namespace moex
