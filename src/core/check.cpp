#include "moex/check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moex {

double rel_l2_error(const Tensor& out, const Tensor& ref) {
  if (out.numel() != ref.numel()) return std::numeric_limits<double>::infinity();
  std::vector<float> o = out.to_float_vector();
  Tensor rh = (ref.device().host_accessible() ? ref : ref.to(Device::cpu())).contiguous();
  std::vector<double> r(o.size());
  if (rh.dtype() == DType::kF64) {
    std::copy(rh.data<double>(), rh.data<double>() + r.size(), r.begin());
  } else {
    std::vector<float> f = rh.to_float_vector();
    std::copy(f.begin(), f.end(), r.begin());
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    if (!std::isfinite(o[i])) return std::numeric_limits<double>::infinity();
    double d = double(o[i]) - r[i];
    num += d * d;
    den += r[i] * r[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

double experts_tolerance(DType dtype, int64_t reduction_length) {
  double u = dtype == DType::kF32 ? std::ldexp(1.0, -24)
             : dtype == DType::kF16 ? std::ldexp(1.0, -11)
                                    : std::ldexp(1.0, -8);
  double acc = std::sqrt(double(std::max<int64_t>(reduction_length, 1))) * std::ldexp(1.0, -24);
  return 8.0 * (u + acc);
}

}  // namespace moex
