// transformers' eager attention (AttentionSpec::eager_rounding; see ops.hpp), one query row and
// head at a time: it rounds the scores, subtracts the maximum over all visible keys and normalises
// before the product with v, so it needs every score of a row before any value (gpt-oss, whose
// heads are few and whose sliding window is short, is the only model that asks for it). Left padding
// (Step::pad) only narrows the range of keys a query reads; the arithmetic over that range is
// the same as without padding, so a padded sequence's real rows match its unpadded run bit for
// bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel_errors.hpp"
#include "ops/cpu/attention_eager.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops::cpu {

Tensor attention_eager(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec,
                      DType act) {
  // v_from_k: the values are the leading head_dim_v columns of each kv head's key slice.
  const int64_t kd = kv.k.size(2), vd = spec.v_from_k ? kd : kv.v.size(2), cap = kv.capacity();
  const int64_t v_head = spec.v_from_k ? spec.head_dim_k : spec.head_dim_v;  // kv head stride in V
  const int64_t group = spec.heads / spec.kv_heads;
  const int64_t qd = spec.heads * spec.head_dim_k, od = spec.heads * spec.head_dim_v;
  Tensor out = Tensor::empty({step.rows(), od}, DType::kF32);
  const float* Q = q.data<float>();
  const float* K = kv.k.data<float>();
  const float* V = spec.v_from_k ? K : kv.v.data<float>();
  float* O = out.data<float>();
  const bool has_sinks = spec.sinks.defined();
  std::vector<float> sinks;
  if (has_sinks) sinks = spec.sinks.to_float_vector();
  // Scores are rounded only where transformers' eager bf16 path holds a bf16 tensor.
  const DType sa = spec.eager_rounding ? act : DType::kF32;
  const int64_t work = step.rows() * spec.heads * (step.past + step.tokens) * (spec.head_dim_k + spec.head_dim_v);
  // Scratch is allocated once per thread, at its largest (every cache column), so that nothing
  // inside the loop can throw; a failed allocation is rethrown after the region.
  ParallelErrors errors;
#pragma omp parallel if (work >= kParallelWork)
  {
    std::vector<float> scores, acc;
    bool ready = false;
    errors.run([&] {
      scores.resize(size_t(step.past + step.tokens));
      acc.resize(size_t(spec.head_dim_v));
      ready = true;
    });
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < step.rows(); ++r) {
      for (int64_t h = 0; h < spec.heads; ++h) {
        if (!ready) continue;
        // Visible keys are cache columns [first, col]: causal up to the query's own column, never
        // a left-padding column, and within the sliding window counted in columns (transformers
        // masks by cache position). A real query of a padded sequence thus sees exactly the keys,
        // in the same order, that it sees when its sequence runs alone.
        const int64_t b = r / step.tokens, col = step.column(r);
        const float* keys = K + b * cap * kd + (h / group) * spec.head_dim_k;
        const float* vals = V + b * cap * vd + (h / group) * v_head;
        int64_t first = step.pad_of(b);
        if (spec.sliding_window > 0) first = std::max(first, col - spec.sliding_window + 1);
        const int64_t n = col + 1 - first;
        float* o = O + r * od + h * spec.head_dim_v;
        if (n <= 0) {
          // A padding query sees no key: zeros (its logits are not meaningful, and no real query
          // ever reads its keys or values).
          std::fill(o, o + spec.head_dim_v, 0.0f);
          continue;
        }
        const float* qv = Q + r * qd + h * spec.head_dim_k;
        const float sink = has_sinks ? round_act(sinks[size_t(h)], sa) : -INFINITY;
        float mx = sink;
        for (int64_t j = 0; j < n; ++j) {
          const float d = round_act(dot(qv, keys + (first + j) * kd, spec.head_dim_k), sa);
          scores[size_t(j)] = round_act(d * spec.scale, sa);
          mx = std::max(mx, scores[size_t(j)]);
        }
        double denom = has_sinks ? std::exp(double(round_act(sink - mx, sa))) : 0.0;
        // sdpa takes exp in float32 (torch's vectorised exp); the eager path keeps the double exp
        // it was matched to transformers with.
        for (int64_t j = 0; j < n; ++j) {
          const float d = round_act(scores[size_t(j)] - mx, sa);
          scores[size_t(j)] = spec.eager_rounding ? float(std::exp(double(d))) : std::exp(d);
          denom += scores[size_t(j)];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        // eager: p = round(e / sum), out = round(sum p v). sdpa (torch's CPU flash kernel):
        // p = round(e) unnormalised, out = round(sum p v / sum).
        const float after = spec.eager_rounding ? 1.0f : float(denom);
        for (int64_t j = 0; j < n; ++j) {
          const float e = scores[size_t(j)];
          const float w = round_act(spec.eager_rounding ? float(e / denom) : e, act);
          const float* vv = vals + (first + j) * vd;
          for (int64_t i = 0; i < spec.head_dim_v; ++i) acc[size_t(i)] += w * vv[i];
        }
        for (int64_t i = 0; i < spec.head_dim_v; ++i) o[i] = round_act(acc[size_t(i)] / after, act);
      }
    }
  }
  errors.rethrow();
  return out;
}

}  // namespace moex::ops::cpu
