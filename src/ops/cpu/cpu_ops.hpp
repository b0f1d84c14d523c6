// Host implementations of the ops in src/ops/ops.hpp (same names, same contracts), reached only
// through the dispatch in src/ops/dispatch.cpp. Shared helpers of the files in this folder.
//
// Parallelism: OpenMP over independent output rows / (sequence, head) pairs; each output value is
// computed by one thread in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/ops.hpp"

namespace moex::ops::cpu {

// Below this many multiply-adds a parallel region costs more than it saves (thread wake-up on a
// shared machine dominates the tiny decode-step ops).
constexpr int64_t kParallelWork = 1 << 15;

inline float round_act(float v, DType act) { return act == DType::kBF16 ? round_bf16(v) : v; }

// Dot product with 8 independent float accumulators (lets the compiler vectorise without
// -ffast-math); the fixed combination order keeps it deterministic.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// Float view of `n` contiguous elements starting at element `offset` of a host tensor: a direct
// pointer for float32, otherwise converted into `buf` (n floats).
const float* float_row(const Tensor& t, int64_t offset, int64_t n, float* buf);

void kv_append(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step);
Tensor kv_columns(const Tensor& cache, int64_t n);

void round_(Tensor& x, DType act);
void add_(Tensor& a, const Tensor& b, DType act);
void clamp_(Tensor& x, float limit);
void gated_activation_(Tensor& gate, const Tensor& up, Activation act_fn, DType act);
void add_gated_(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act);
Tensor embedding(const Tensor& table, const Step& step, DType act);
Tensor slice_columns(const Tensor& x, int64_t groups, int64_t begin, int64_t width);
Tensor concat_columns(const Tensor& a, const Tensor& b, int64_t groups, bool b_shared);
Tensor last_rows(const Tensor& x, const Step& step);

void rms_norm_(Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style);

void rope_(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
           RopeLayout layout, const Step& step, DType act);

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act);
LinearWeight prepare_linear(const Tensor& weight, bool keep_tensor);
// A quantized linear's host codes as the kernel reads them: on huge pages, out of the file mapping.
Tensor prepare_quantized_codes(const Tensor& codes);
Tensor linear(const Tensor& x, const LinearWeight& weight, const Tensor& bias, DType act);
Tensor linear_per_group(const Tensor& x, const GroupedWeight& w, bool transpose_weight, DType act);

Tensor attention(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act);

Routing softmax_topk(const Tensor& logits, int64_t k, bool normalize, DType weights_dtype);
Routing topk_softmax(const Tensor& logits, int64_t k, DType act);
Routing sigmoid_group_topk(const Tensor& logits, const Tensor& correction, const GroupLimitedTopk& spec);

int64_t argmax_row(const Tensor& logits, int64_t row);
int64_t sample_row(const Tensor& logits, int64_t row, const SamplingSpec& spec, std::mt19937_64& rng);

}  // namespace moex::ops::cpu
