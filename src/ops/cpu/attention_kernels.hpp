// Inner loops of the host attention (attention.cpp holds the tiling, the threading and the order
// of every reduction). Two sets with one contract: AVX-512 (attention_avx512.cpp, compiled in a
// target region and chosen when cpuid says the CPU has it) and portable C++ (attention_portable.cpp).
// The two need not agree bit for bit; each is deterministic and depends only on its arguments.
//
// Every score is one dot product accumulated over d = 0 .. head_dim_k - 1 in order, so a score does
// not depend on which tile or key block computed it. Keys are packed transposed in blocks of
// kKeyBlock so that one vector holds the partial dot products of 16 keys.
#pragma once

#include <cstdint>

namespace moex::ops::cpu {

inline constexpr int64_t kKeyBlock = 64;

struct AttentionKernels {
  // kt[d * kKeyBlock + j] = k[j * stride + d] for j < nk (<= kKeyBlock), 0 for nk <= j < kKeyBlock.
  void (*pack_keys)(const float* k, int64_t stride, int64_t nk, int64_t dk, float* kt);
  // s[r * s_stride + j] = (sum over d ascending of q[r][d] * kt[d][j]) * scale, for r < rows and
  // j < kKeyBlock.
  void (*scores)(const float* const* q, int64_t rows, const float* kt, int64_t dk, float scale,
                 float* s, int64_t s_stride);
  // In place over s[0, n): m = max(init_max, max s_j); s_j <- p_j = exp(s_j - m) (float32, rounded
  // to bf16 when `bf16`). Returns the sum of the unrounded e_j in double, accumulated in 16 lanes
  // (lane j mod 16) and combined by a fixed tree; *max_out = m.
  double (*softmax)(float* s, int64_t n, float init_max, bool bf16, float* max_out);
  // For each of `rows` rows r (p_r = p + r * p_stride, acc_r = acc + r * acc_stride):
  // acc_r[i] += sum over j ascending of p_r[j] * v[j * stride + i], i < dv. Rows share the values
  // they read; each row's sums are those of a call for that row alone.
  void (*pv)(const float* p, int64_t p_stride, int64_t rows, int64_t n, const float* v, int64_t stride,
             int64_t dv, float* acc, int64_t acc_stride);
};

const AttentionKernels& attention_kernels_portable();
const AttentionKernels& attention_kernels_avx512();
// The AVX-512 set where the CPU and OS support it, else the portable one (read once per process).
const AttentionKernels& attention_kernels();

}  // namespace moex::ops::cpu
