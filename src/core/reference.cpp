// The float64 reference every backend is checked against: the experts formula of experts.hpp,
// evaluated in double with the straightforward loops (no grouping, no intermediate rounding).
#include <map>

#include "core/activation.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace moex {

Tensor experts_reference_f64(const ExpertsSpec& s, const ExpertsWeights& w, const Tensor& hidden,
                             const Tensor& idx, const Tensor& tw) {
  validate_experts_weights(s, w);
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
    ex.gu = host(w.gate_up.select(0, e)).to_float_vector();
    ex.dn = host(w.down.select(0, e)).to_float_vector();
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
      detail::activate_row<double>(s, a.data(), h.data());
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

}  // namespace moex
