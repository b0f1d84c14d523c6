// The float64 reference of quantized experts (moex/quant.hpp, the contract next to QuantScheme in
// moex/experts.hpp): weights dequantized exactly (value x block scale, in double), activations
// quantized by the one float32 quantizer of quant.hpp, every product and sum in double.
//
// The activation quantizer is a step function (and so is the rounding of the intermediate to a
// 16-bit activation dtype before it), so a backend whose float32 intermediate differs from the
// double one by an ulp may land on the neighbouring e4m3 value. Rather than hide that in a loose
// tolerance, the reference estimates the float32 error of each intermediate element (a
// ten-sigma random-walk estimate of the float32 accumulation of the gate_up product, propagated
// through the activation by its derivative, plus 8 ulps for the activation itself), pushes the
// element's error interval through the same rounding chain as the backend, and flags the
// elements whose two ends land on different e4m3 values; what those can change in the output is
// summed into an absolute bound (experts.hpp, QuantizedReference). Elements far from a midpoint
// round identically, so where nothing is flagged the comparison is the plain ~1e-5 one.
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/quant.hpp"

namespace moex {

double intermediate_value(const ExpertsSpec& s, double gate, double up);  // reference.cpp

namespace {

constexpr double kU32 = 1.0 / 16777216.0;  // 2^-24, float32 unit roundoff

// W_real of expert e of a block-scaled [N, K] weight in double (exact: a float32 scale times an
// e4m3 / e2m1 value has at most 28 significant bits). `fused_rows` = I for a gated gate_up (its
// scale rows are gate's then up's), N otherwise.
std::vector<double> dequantize(const ExpertsSpec& s, const Tensor& W, const Tensor& S, int64_t e,
                               int64_t N, int64_t K, int64_t fused_rows) {
  const bool fp4 = s.quant.kind == QuantScheme::Kind::kFp4E2M1;
  const int64_t row_bytes = fp4 ? K / 2 : K, bn = s.quant.block_n, bk = s.quant.block_k;
  const int64_t srows = S.size(1), scols = S.size(2);
  const uint8_t* base = static_cast<const uint8_t*>(W.raw()) + e * N * row_bytes;
  std::vector<double> out(size_t(N * K));
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = base + n * row_bytes;
    const int64_t srow = e * srows * scols + quant::fused_scale_row(n, fused_rows, bn) * scols;
    for (int64_t c = 0; c < K; ++c) {
      const float v = fp4 ? quant::fp4_weight(row, c) : f8e4m3_to_float(row[c]);
      out[size_t(n * K + c)] =
          double(v) * double(quant::scale_value(S.raw(), S.dtype(), srow + c / bk));
    }
  }
  return out;
}

// x quantized per quant.hpp, as the double values q x s the quantized product sees.
void quantized_values(const float* x, int64_t K, std::vector<uint8_t>& q, std::vector<float>& sc,
                      std::vector<double>& out) {
  q.resize(size_t(K));
  sc.resize(size_t(quant::ceil_div(K, quant::kActBlock)));
  out.resize(size_t(K));
  quant::quantize_activation_row(x, K, q.data(), sc.data());
  for (int64_t c = 0; c < K; ++c)
    out[size_t(c)] = double(f8e4m3_to_float(q[size_t(c)])) * double(sc[size_t(c / quant::kActBlock)]);
}

float round_to(float v, DType dt) {
  return dt == DType::kBF16 ? round_bf16(v) : dt == DType::kF16 ? round_f16(v) : v;
}

}  // namespace

QuantizedReference quantized_reference(const ExpertsSpec& s, const ExpertsWeights& w,
                                       const Tensor& hidden, const Tensor& idx, const Tensor& tw,
                                       double accumulation_unit_roundoff) {
  auto host = [](const Tensor& t) { return t.device().host_accessible() ? t : t.to(Device::cpu()); };
  const int64_t T = hidden.size(0), H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  const int64_t k = idx.size(1), E = s.num_experts;
  const DType act_dt = hidden.dtype();
  const std::vector<float> x = host(hidden).to_float_vector();
  const std::vector<int64_t> ids = host(idx).to_int_vector();
  const std::vector<float> rw = host(tw).to_float_vector();
  const bool per_expert = tw.size(1) != k;
  const Tensor gu_w = host(w.gate_up), gu_s = host(w.gate_up_scale);
  const Tensor dn_w = host(w.down), dn_s = host(w.down_scale);
  struct ExpertF64 {
    std::vector<double> gu, dn, dn_col_norm;  // dn_col_norm[i] = ||down[:, i]||_2
  };
  // Expert-major: each hit expert is dequantized to double once and dropped before the next, so
  // the reference holds one expert's float64 copy at a time (a DeepSeek-V3 expert is 352 MB in
  // double; keeping every hit one, as a per-token loop must, needs up to 45 GB for 16 tokens of
  // DeepSeek-V3's 256 experts).
  auto dequantize_expert = [&](int64_t e) {
    ExpertF64 ex;
    ex.gu = dequantize(s, gu_w, gu_s, e, R, H, s.has_gate ? I : R);
    ex.dn = dequantize(s, dn_w, dn_s, e, H, I, H);
    ex.dn_col_norm.assign(size_t(I), 0.0);
    for (int64_t c = 0; c < H; ++c)
      for (int64_t i = 0; i < I; ++i) ex.dn_col_norm[size_t(i)] += ex.dn[size_t(c * I + i)] * ex.dn[size_t(c * I + i)];
    for (double& v : ex.dn_col_norm) v = std::sqrt(v);
    return ex;
  };

  QuantizedReference res;
  res.out = Tensor::zeros({T, H}, DType::kF64);
  double* o = res.out.data<double>();
  // Float32 error of a dot product of K exact products p_c: each addition rounds its partial sum
  // s_i by up to u |s_i|, independently, so the error is ~ u / sqrt(3) x sqrt(sum s_i^2) <=
  // 0.41 u K rms(p) for a sequential sum (the kernel's blocked, multi-lane sums do better).
  // 4 u sqrt(K) ||p||_2 = 4 u K rms(p) is ten of those standard deviations.
  const double u_acc = accumulation_unit_roundoff > kU32 ? accumulation_unit_roundoff : kU32;
  const double gamma_gu = 4.0 * std::sqrt(double(H)) * u_acc;
  const double gamma_dn = 4.0 * std::sqrt(double(I)) * u_acc;
  const bool coarse = u_acc > kU32;  // float32 sums of the down projection: the tolerance covers them
  // Per token: the crossing bound and (coarse) each output's accumulation bound, summed over its
  // experts before they are squared (tokens write different output rows: their bounds add in
  // squares).
  std::vector<double> token_bound(size_t(T), 0.0), row_acc(coarse ? size_t(T * H) : 0, 0.0);
  std::vector<uint8_t> q;
  std::vector<float> sc, hf(static_cast<size_t>(I)), hs;
  std::vector<double> hq, a(static_cast<size_t>(R)), mag(static_cast<size_t>(R));
  std::vector<double> h(static_cast<size_t>(I)), dh(static_cast<size_t>(I));
  std::vector<double> xq_all(size_t(T * H));
  {
    std::vector<double> xq;
    for (int64_t t = 0; t < T; ++t) {
      quantized_values(x.data() + t * H, H, q, sc, xq);
      std::copy(xq.begin(), xq.end(), xq_all.begin() + t * H);
    }
  }
  // The (token, slot) pairs of each hit expert, in token order.
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> pairs_of;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[size_t(t * k + j)];
      if (e < 0) throw InvalidInput("negative expert id in reference");
      if (e >= E) continue;  // sentinel
      pairs_of[e].emplace_back(t, j);
    }
  for (const auto& [e, pairs] : pairs_of) {
    const ExpertF64 ex = dequantize_expert(e);
    for (const auto& [t, j] : pairs) {
      const double wt = per_expert ? rw[size_t(t * E + e)] : rw[size_t(t * k + j)];
      const double* xq = xq_all.data() + t * H;
      for (int64_t r = 0; r < R; ++r) {
        double acc = 0, m = 0;
        const double* wr = ex.gu.data() + r * H;
        for (int64_t c = 0; c < H; ++c) {
          const double p = xq[c] * wr[c];
          acc += p;
          m += p * p;
        }
        a[size_t(r)] = acc;
        mag[size_t(r)] = std::sqrt(m);
      }
      // Intermediate and its float32 error estimate: |dh/dg| dg + |dh/du| du (central differences
      // in double), plus 8 ulps for the activation's own float32 evaluation.
      for (int64_t i = 0; i < I; ++i) {
        const double g = a[size_t(i)], u = s.has_gate ? a[size_t(I + i)] : 0.0;
        const double v = intermediate_value(s, g, u);
        const double eg = 1e-6 * (std::fabs(g) + 1e-6), eu = 1e-6 * (std::fabs(u) + 1e-6);
        const double dg = (intermediate_value(s, g + eg, u) - intermediate_value(s, g - eg, u)) / (2 * eg);
        double err = std::fabs(dg) * gamma_gu * mag[size_t(i)] + 8 * kU32 * std::fabs(v);
        if (s.has_gate) {
          const double du = (intermediate_value(s, g, u + eu) - intermediate_value(s, g, u - eu)) / (2 * eu);
          err += std::fabs(du) * gamma_gu * mag[size_t(I + i)];
        }
        h[size_t(i)] = v;
        dh[size_t(i)] = err;
        hf[size_t(i)] = round_to(float(v), act_dt);
      }
      quantized_values(hf.data(), I, q, hs, hq);
      // Push each element's error interval through the same chain the backend runs (rounding to
      // float32 and the activation dtype, division by the block scale, e4m3 rounding): all of it
      // is monotone, so the interval's ends bound what a backend can get. The block scale has an
      // interval too (from its largest element's); where it is one value and both ends round to
      // the same e4m3 code the element contributes nothing.
      for (int64_t b0 = 0; b0 < I; b0 += quant::kActBlock) {
        const int64_t b1 = std::min(I, b0 + quant::kActBlock);
        double amax = 0, amax_err = 0;
        for (int64_t i = b0; i < b1; ++i)
          if (std::fabs(h[size_t(i)]) >= amax) amax = std::fabs(h[size_t(i)]), amax_err = dh[size_t(i)];
        auto block_scale = [&](double v) {
          return std::max(std::fabs(round_to(float(std::max(v, 0.0)), act_dt)) / quant::kE4M3Max,
                          quant::kMinActScale);
        };
        const float s_lo = block_scale(amax - amax_err), s_hi = block_scale(amax + amax_err);
        // In float32 the scale moves continuously with amax (a relative change of float32 size,
        // which the tolerance covers); in a 16-bit dtype amax's own rounding can jump, and then
        // every element of the block may move by a 16-bit ulp.
        const bool scale_jumps = act_dt != DType::kF32 && s_lo != s_hi;
        for (int64_t i = b0; i < b1; ++i) {
          ++res.elements;
          const double v = std::fabs(h[size_t(i)]);
          const float lo = std::fabs(round_to(float(std::max(v - dh[size_t(i)], 0.0)), act_dt));
          const float hi = std::fabs(round_to(float(v + dh[size_t(i)]), act_dt));
          const float q_lo = f8e4m3_to_float(float_to_f8e4m3(lo / s_hi));
          const float q_hi = f8e4m3_to_float(float_to_f8e4m3(std::min(hi / s_lo, quant::kE4M3Max)));
          if (q_lo == q_hi && !scale_jumps) continue;
          if (q_lo != q_hi) ++res.near_midpoints;
          const double got = std::fabs(hq[size_t(i)]);
          const double change = std::max(double(q_hi) * double(s_hi) - got, got - double(q_lo) * double(s_lo));
          token_bound[size_t(t)] += std::fabs(wt) * std::max(change, 0.0) * ex.dn_col_norm[size_t(i)];
        }
      }
      for (int64_t c = 0; c < H; ++c) {
        double acc = 0, m = 0;
        const double* wr = ex.dn.data() + c * I;
        for (int64_t i = 0; i < I; ++i) {
          const double p = hq[size_t(i)] * wr[i];
          acc += p;
          m += p * p;
        }
        o[t * H + c] += wt * acc;
        if (coarse) row_acc[size_t(t * H + c)] += std::fabs(wt) * gamma_dn * std::sqrt(m);
      }
    }
  }
  double bound_sq = 0, acc_sq = 0;
  for (double b : token_bound) bound_sq += b * b;
  for (double r : row_acc) acc_sq += r * r;
  res.crossing_bound = std::sqrt(bound_sq);
  res.accumulation_bound = std::sqrt(acc_sq);
  return res;
}

}  // namespace moex
