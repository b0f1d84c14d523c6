// Routers: torch.topk's tie order and the three routing rules (see ops.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops {

void torch_topk(const float* values, int64_t n, int64_t k, bool sorted, int64_t* idx_out, float* val_out) {
  using Elem = std::pair<float, int64_t>;
  std::vector<Elem> queue(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[size_t(j)] = {values[j], j};
  auto larger = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  // The same libstdc++ algorithms torch's CPU kernel calls, so that ties land where torch's do.
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

namespace cpu {

namespace {

struct RoutingOut {
  Routing r;
  int64_t* idx;
  float* w;
  RoutingOut(int64_t rows, int64_t k) {
    r.top_k_index = Tensor::empty({rows, k}, DType::kI64);
    r.top_k_weights = Tensor::empty({rows, k}, DType::kF32);
    idx = r.top_k_index.data<int64_t>();
    w = r.top_k_weights.data<float>();
  }
};

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

Routing softmax_topk(const Tensor& logits, int64_t k, bool normalize, DType weights_dtype) {
  const int64_t rows = logits.size(0), n = logits.size(1);
  RoutingOut o(rows, k);
  const float* L = logits.data<float>();
  std::vector<float> probs(static_cast<size_t>(n));
  for (int64_t t = 0; t < rows; ++t) {
    const float* l = L + t * n;
    const float mx = *std::max_element(l, l + n);
    float sum = 0;
    for (int64_t e = 0; e < n; ++e) sum += (probs[size_t(e)] = std::exp(l[e] - mx));
    for (int64_t e = 0; e < n; ++e) probs[size_t(e)] /= sum;
    float* w = o.w + t * k;
    torch_topk(probs.data(), n, k, /*sorted=*/true, o.idx + t * k, w);
    if (normalize) {
      float s = 0;
      for (int64_t j = 0; j < k; ++j) s += w[j];
      for (int64_t j = 0; j < k; ++j) w[j] /= s;
    }
    for (int64_t j = 0; j < k; ++j) w[j] = round_act(w[j], weights_dtype);
  }
  return o.r;
}

Routing topk_softmax(const Tensor& logits, int64_t k, DType act) {
  const int64_t rows = logits.size(0), E = logits.size(1);
  RoutingOut o(rows, k);
  const float* lg = logits.data<float>();
  std::vector<float> vals(static_cast<size_t>(k));
  for (int64_t t = 0; t < rows; ++t) {
    torch_topk(lg + t * E, E, k, /*sorted=*/true, o.idx + t * k, vals.data());
    // vals[0] is the largest, so exp(v - top) <= 1: no overflow.
    const float top = vals[0];
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      vals[size_t(j)] = std::exp(vals[size_t(j)] - top);
      sum += vals[size_t(j)];
    }
    for (int64_t j = 0; j < k; ++j) o.w[t * k + j] = round_act(vals[size_t(j)] / sum, act);
  }
  return o.r;
}

Routing sigmoid_group_topk(const Tensor& logits, const Tensor& correction, const GroupLimitedTopk& c) {
  const int64_t rows = logits.size(0), E = c.num_experts, k = c.top_k;
  const int64_t G = c.n_group, per_group = E / G;
  RoutingOut o(rows, k);
  const float* lg = logits.data<float>();
  const float* bias = correction.data<float>();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<float> group_score(static_cast<size_t>(G));
  std::vector<int64_t> groups(static_cast<size_t>(c.topk_group));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      scores[size_t(e)] = sigmoid(lg[t * E + e]);
      choice[size_t(e)] = scores[size_t(e)] + bias[e];
    }
    // Group score: topk(group, 2).sum() as transformers writes it. Which of two equal values
    // torch picks cannot change a sum of two, so the two largest are found directly.
    for (int64_t g = 0; g < G; ++g) {
      float best = kNegInf, second = kNegInf;
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
        const float v = choice[size_t(e)];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_score[size_t(g)] = per_group >= 2 ? best + second : best;
    }
    torch_topk(group_score.data(), G, c.topk_group, /*sorted=*/false, groups.data(), nullptr);
    std::vector<bool> kept(size_t(G), false);
    for (int64_t g : groups) kept[size_t(g)] = true;
    for (int64_t e = 0; e < E; ++e)
      if (!kept[size_t(e / per_group)]) choice[size_t(e)] = kNegInf;
    int64_t* idx = o.idx + t * k;
    torch_topk(choice.data(), E, k, /*sorted=*/false, idx, nullptr);

    float* w = o.w + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = scores[size_t(idx[j])];
      sum += w[j];
    }
    const float denom = c.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int64_t j = 0; j < k; ++j) {
      float v = w[j];
      if (c.norm_topk_prob) v /= denom;
      w[j] = v * c.routed_scaling_factor;
    }
  }
  return o.r;
}

}  // namespace cpu
}  // namespace moex::ops
