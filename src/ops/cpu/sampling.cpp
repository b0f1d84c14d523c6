// The next-token choice from a row of logits (see ops.hpp).
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops::cpu {

int64_t argmax_row(const Tensor& logits, int64_t row) {
  const int64_t n = logits.size(1);
  const float* l = logits.data<float>() + row * n;
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

int64_t sample_row(const Tensor& logits, int64_t row, const SamplingSpec& o, std::mt19937_64& rng) {
  const int64_t n = logits.size(1);
  const float* src = logits.data<float>() + row * n;
  std::vector<double> l(src, src + n);
  for (auto& v : l) v /= double(o.temperature);
  if (o.top_k > 0 && o.top_k < n) {
    std::vector<double> sorted = l;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[size_t(o.top_k - 1)];
    for (auto& v : l)
      if (v < kth) v = -INFINITY;
  }
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (p[size_t(i)] = std::exp(l[size_t(i)] - mx));
  for (auto& v : p) v /= sum;
  if (o.top_p < 1.0f) {
    // Drop the least likely tokens whose cumulative mass (ascending) is <= 1 - top_p, keeping
    // at least the most likely one, as transformers' TopPLogitsWarper does.
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] < p[size_t(b)]; });
    double cum = 0;
    for (int64_t j = 0; j + 1 < n; ++j) {
      cum += p[size_t(order[size_t(j)])];
      if (cum <= 1.0 - double(o.top_p)) p[size_t(order[size_t(j)])] = 0;
    }
    sum = std::accumulate(p.begin(), p.end(), 0.0);
    for (auto& v : p) v /= sum;
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  double cum = 0;
  int64_t last_nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[size_t(i)] <= 0) continue;
    last_nonzero = i;
    cum += p[size_t(i)];
    if (u < cum) return i;
  }
  return last_nonzero;  // rounding left u just above the total
}

}  // namespace moex::ops::cpu
