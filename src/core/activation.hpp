// The gate variants of the experts core, written once for float (backends) and double
// (reference). `gu` is one row of the gate_up product in stored order (R = 2I or I values);
// the result is the I-wide intermediate fed to the down projection.
#pragma once

#include <cmath>
#include <cstdint>

#include "moex/experts.hpp"

namespace moex::detail {

template <class F>
inline F activation_scalar(Activation a, F x) {
  switch (a) {
    case Activation::kSilu: return x / (F(1) + std::exp(-x));
    case Activation::kGelu: return F(0.5) * x * (F(1) + std::erf(x * F(0.70710678118654752440)));
    case Activation::kGeluTanh: {
      const F c = F(0.79788456080286535588);  // sqrt(2/pi)
      return F(0.5) * x * (F(1) + std::tanh(c * (x + F(0.044715) * x * x * x)));
    }
    case Activation::kRelu: return x > F(0) ? x : F(0);
    case Activation::kSwigluOai: return x;  // handled in activate_row (needs gate and up)
  }
  return x;
}

template <class F>
inline void activate_row(const ExpertsSpec& s, const F* gu, F* h) {
  const int64_t I = s.intermediate;
  if (!s.has_gate) {
    for (int64_t i = 0; i < I; ++i) h[i] = activation_scalar<F>(s.act, gu[i]);
    return;
  }
  for (int64_t i = 0; i < I; ++i) {
    F g = s.is_concatenated ? gu[i] : gu[2 * i];
    F u = s.is_concatenated ? gu[I + i] : gu[2 * i + 1];
    if (s.act == Activation::kSwigluOai) {
      const F lim = F(s.swiglu_limit), alpha = F(s.swiglu_alpha);
      g = g > lim ? lim : g;
      u = u > lim ? lim : (u < -lim ? -lim : u);
      h[i] = (u + F(1)) * (g / (F(1) + std::exp(-alpha * g)));
    } else {
      h[i] = activation_scalar<F>(s.act, g) * u;
    }
  }
}

}  // namespace moex::detail
