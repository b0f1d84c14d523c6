// Portable attention kernels (attention_kernels.hpp): plain loops the compiler vectorises for the
// baseline instruction set, for CPUs without AVX-512.
#include <algorithm>
#include <cmath>

#include "cpu/engine.hpp"
#include "moex/dtype.hpp"
#include "ops/cpu/attention_kernels.hpp"

namespace moex::ops::cpu {
namespace {

void pack_keys(const float* k, int64_t stride, int64_t nk, int64_t dk, float* kt) {
  for (int64_t d = 0; d < dk; ++d) {
    float* row = kt + d * kKeyBlock;
    for (int64_t j = 0; j < nk; ++j) row[j] = k[j * stride + d];
    std::fill(row + nk, row + kKeyBlock, 0.0f);
  }
}

void scores(const float* const* q, int64_t rows, const float* kt, int64_t dk, float scale, float* s,
            int64_t s_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    float acc[kKeyBlock] = {};
    for (int64_t d = 0; d < dk; ++d) {
      const float qd = q[r][d];
      const float* kd = kt + d * kKeyBlock;
      for (int64_t j = 0; j < kKeyBlock; ++j) acc[j] += qd * kd[j];
    }
    for (int64_t j = 0; j < kKeyBlock; ++j) s[r * s_stride + j] = acc[j] * scale;
  }
}

double softmax(float* s, int64_t n, float init_max, bool bf16, float* max_out) {
  float m = init_max;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  double lanes[16] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float e = std::exp(s[j] - m);
    lanes[j % 16] += e;
    s[j] = bf16 ? round_bf16(e) : e;
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) lanes[i] += lanes[i + w];
  *max_out = m;
  return lanes[0];
}

void pv(const float* p, int64_t p_stride, int64_t rows, int64_t n, const float* v, int64_t stride,
        int64_t dv, float* acc, int64_t acc_stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float w = p[r * p_stride + j];
      const float* vj = v + j * stride;
      float* a = acc + r * acc_stride;
      for (int64_t i = 0; i < dv; ++i) a[i] += w * vj[i];
    }
}

}  // namespace

const AttentionKernels& attention_kernels_portable() {
  static const AttentionKernels k{pack_keys, scores, softmax, pv};
  return k;
}

const AttentionKernels& attention_kernels() {
  static const AttentionKernels& k = moex::cpu::detect_cpu_features().avx512
                                         ? attention_kernels_avx512()
                                         : attention_kernels_portable();
  return k;
}

}  // namespace moex::ops::cpu
