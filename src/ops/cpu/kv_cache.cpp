// The KV cache as preallocated tensors (see ops.hpp).
#include <algorithm>
#include <cstring>

#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops {

KVCache::KVCache(int64_t b, int64_t n_layers, int64_t capacity) : batch(b), layers(size_t(n_layers)) {
  for (auto& l : layers) l.capacity_hint = capacity;
}

int64_t KVCache::length() const { return layers.empty() ? 0 : layers[0].length(); }

namespace cpu {

namespace {

// A [batch, capacity, dim] tensor holding the first `filled` positions of `old` (if any).
Tensor regrow(const Tensor& old, int64_t batch, int64_t capacity, int64_t dim, int64_t filled) {
  Tensor t = Tensor::empty({batch, capacity, dim}, DType::kF32);
  if (old.defined() && filled > 0)
    for (int64_t b = 0; b < batch; ++b)
      std::memcpy(t.data<float>() + b * capacity * dim, old.data<float>() + b * old.size(1) * dim,
                  size_t(filled * dim) * sizeof(float));
  return t;
}

void copy_rows(Tensor& cache, const Tensor& x, int64_t filled, const Step& step) {
  const int64_t cap = cache.size(1), dim = cache.size(2);
  const float* src = x.data<float>();
  float* dst = cache.data<float>();
  for (int64_t b = 0; b < step.batch; ++b)
    std::memcpy(dst + (b * cap + filled) * dim, src + b * step.tokens * dim,
                size_t(step.tokens * dim) * sizeof(float));
}

}  // namespace

void kv_append(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step) {
  const int64_t need = kv.filled + step.tokens;
  if (!kv.k.defined() || need > kv.capacity()) {
    // First use: what the caller planned for; later: double, so that appends stay amortised O(1).
    const int64_t cap = kv.k.defined() ? std::max(need, 2 * kv.capacity()) : std::max(need, kv.capacity_hint);
    kv.k = regrow(kv.k, step.batch, cap, k.size(1), kv.filled);
    if (v.defined()) kv.v = regrow(kv.v, step.batch, cap, v.size(1), kv.filled);
  }
  copy_rows(kv.k, k, kv.filled, step);
  if (v.defined()) copy_rows(kv.v, v, kv.filled, step);
  kv.filled = need;
}

Tensor kv_columns(const Tensor& cache, int64_t n) {
  const int64_t batch = cache.size(0), cap = cache.size(1), dim = cache.size(2);
  Tensor out = Tensor::empty({batch * n, dim}, DType::kF32);
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(out.data<float>() + b * n * dim, cache.data<float>() + b * cap * dim, size_t(n * dim) * sizeof(float));
  return out;
}

}  // namespace cpu
}  // namespace moex::ops
