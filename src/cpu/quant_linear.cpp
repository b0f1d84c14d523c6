// See quant_linear.hpp. The loop over weight-row tiles, rows of x and K blocks; the decode of a
// tile and the block dot products come from the portable functions below or the AVX-512 ones
// (quant_linear_avx512.cpp), picked once per process; CPUs with AVX512-BF16 or AVX2 only run the
// experts' block-scaled kernel instead (run_block_scaled).
#include "cpu/quant_linear.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include "core/parallel_errors.hpp"
#include "cpu/engine.hpp"
#include "cpu/experts_quant.hpp"
#include "cpu/kernels/kernels.hpp"
#include "cpu/quant_linear_kernels.hpp"
#include "moex/quant.hpp"

namespace moex::cpu {
namespace quant_kernels {

namespace {
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int c = 0; c < 256; ++c) a[size_t(c)] = f8e4m3_to_float(uint8_t(c));
    return a;
  }();
  return t;
}
}  // namespace

void decode_fp8_portable(const uint8_t* codes, int64_t n, float* out) {
  const auto& t = e4m3_table();
  for (int64_t i = 0; i < n; ++i) out[i] = t[codes[i]];
}

void decode_fp4_portable(const uint8_t* packed, int64_t n, float* out) {
  for (int64_t i = 0; i < n / 2; ++i) {
    out[2 * i] = fp4_e2m1_to_float(packed[i] & 0xf);
    out[2 * i + 1] = fp4_e2m1_to_float(packed[i] >> 4);
  }
}

float dot_portable(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

float dot_fp8_portable(const float* x, const uint8_t* codes, int64_t n) {
  float w[quant::kActBlock];
  float s = 0.f;
  for (int64_t k0 = 0; k0 < n; k0 += quant::kActBlock) {
    const int64_t m = std::min(n - k0, quant::kActBlock);
    decode_fp8_portable(codes + k0, m, w);
    s += dot_portable(x + k0, w, m);
  }
  return s;
}

float dot_fp4_portable(const float* x, const uint8_t* packed, int64_t n) {
  float w[quant::kActBlock];
  float s = 0.f;
  for (int64_t k0 = 0; k0 < n; k0 += quant::kActBlock) {
    const int64_t m = std::min(n - k0, quant::kActBlock);
    decode_fp4_portable(packed + k0 / 2, m, w);
    s += dot_portable(x + k0, w, m);
  }
  return s;
}

}  // namespace quant_kernels

namespace {

using namespace quant_kernels;

// Weight rows decoded together and reused by every row of x: few for decode-sized calls (the
// scratch stays in L1/L2 while the codes stream), more when many rows share them.
int64_t tile_rows(int64_t rows) { return rows <= 16 ? 4 : 16; }
// Rows of x up to which the codes are read directly instead of through a decoded tile.
constexpr int64_t kDirectRows = 2;

Tensor run(const Tensor& x, const Tensor& codes, const Tensor& scale, const QuantScheme& q, int64_t N,
           int64_t K, const Tensor& bias, DType act, const QuantKernels& kern) {
  const int64_t rows = x.size(0);
  Tensor y = Tensor::empty({rows, N}, DType::kF32);
  if (rows == 0 || N == 0) return y;
  const bool fp4 = q.kind == QuantScheme::Kind::kFp4E2M1;
  const int64_t row_bytes = fp4 ? K / 2 : K;
  const int64_t nkb = quant::ceil_div(K, q.block_k);  // scale columns
  const int64_t nab = quant::ceil_div(K, quant::kActBlock);
  const float* X = x.data<float>();
  float* Y = y.data<float>();
  const float* B = bias.defined() ? bias.data<float>() : nullptr;
  const uint8_t* W = static_cast<const uint8_t*>(codes.raw());
  const void* S = scale.raw();
  const DType sdt = scale.dtype();

  // The activations, quantized per row and decoded: xq [rows, K] (exact e4m3 values), xs
  // [rows, nab] their block scales.
  std::vector<float> xq(size_t(rows * K)), xs(size_t(rows * nab));
  ParallelErrors errors;
#pragma omp parallel if (rows * K >= (1 << 15))
  {
    std::vector<uint8_t> qc;
    bool ready = false;
    errors.run([&] {
      qc.resize(size_t(K));
      ready = true;
    });
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
      if (!ready) continue;
      quant::quantize_activation_row(X + t * K, K, qc.data(), xs.data() + t * nab);
      kern.decode_fp8(qc.data(), K, xq.data() + t * K);
    }
  }
  errors.rethrow();

  const int64_t tile = tile_rows(rows);
  // Decode-sized calls read the codes straight into the products (the weight streams once from
  // memory with nothing written back); larger ones decode a tile once for all their rows.
  const bool direct = rows <= kDirectRows;
  const int64_t sub = quant::kActBlock / std::min(q.block_k, quant::kActBlock);  // weight blocks per act block
#pragma omp parallel if (rows * K * N >= (1 << 15))
  {
    std::vector<float> wf;
    bool ready = false;
    errors.run([&] {
      wf.resize(direct ? 0 : size_t(tile * K));
      ready = true;
    });
#pragma omp for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += tile) {
      if (!ready) continue;
      const int64_t nt = std::min(tile, N - n0);
      for (int64_t j = 0; j < nt && !direct; ++j) {
        const uint8_t* src = W + (n0 + j) * row_bytes;
        if (fp4) kern.decode_fp4(src, K, wf.data() + j * K);
        else kern.decode_fp8(src, K, wf.data() + j * K);
      }
      for (int64_t t = 0; t < rows; ++t) {
        const float* xr = xq.data() + t * K;
        const float* sr = xs.data() + t * nab;
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t n = n0 + j;
          const float* wr = wf.data() + j * K;
          const uint8_t* cr = W + n * row_bytes;
          const int64_t srow = (n / q.block_n) * nkb;
          float acc = 0.f;
          for (int64_t b = 0; b < nab; ++b) {
            const int64_t k0 = b * quant::kActBlock, k1 = std::min(K, k0 + quant::kActBlock);
            float blk = 0.f;
            for (int64_t i = 0; i < sub; ++i) {
              const int64_t a0 = k0 + i * q.block_k;
              if (a0 >= k1) break;
              const int64_t a1 = std::min(k1, a0 + q.block_k);
              const float d = !direct ? kern.dot(xr + a0, wr + a0, a1 - a0)
                              : fp4 ? kern.dot_fp4(xr + a0, cr + a0 / 2, a1 - a0)
                                    : kern.dot_fp8(xr + a0, cr + a0, a1 - a0);
              blk += quant::scale_value(S, sdt, srow + a0 / q.block_k) * d;
            }
            acc += sr[b] * blk;
          }
          if (B) acc += B[n];
          Y[t * N + n] = act == DType::kBF16 ? round_bf16(acc) : acc;
        }
      }
    }
  }
  errors.rethrow();
  return y;
}

// The experts' block-scaled kernel (kernels.hpp) on a CPU with AVX512-BF16 or with AVX2 but no
// AVX-512: activation rows quantized once (QuantRows, with their bf16 copies where the kernel
// reads them), then tasks of 64 weight rows over threads, each running its rows against chunks of
// kRowChunk activation rows, so a task's codes are read from memory once and a chunk's rows stay
// in L2 meanwhile. Every row count runs the same kernel, so a row's bits do not depend on the
// others. (On AVX2 the generic loop below with AVX2 block dots, one call per 128 or 32 codes,
// streamed FP8 at 8 GB/s and FP4 at 1 GB/s on 2 Zen 3 cores where this streams ~20 and ~8.)
constexpr int64_t kTaskRows = 64;
constexpr int64_t kRowChunk = 64;

Tensor run_block_scaled(const Tensor& x, const Tensor& codes, const Tensor& scale, const QuantScheme& q,
                        int64_t N, int64_t K, const Tensor& bias, DType act, kernels::BlockScaledFn fn) {
  const int64_t rows = x.size(0);
  Tensor y = Tensor::empty({rows, N}, DType::kF32);
  if (rows == 0 || N == 0) return y;
  const bool fp4 = q.kind == QuantScheme::Kind::kFp4E2M1;
  QuantRows X;
  X.resize(rows, K, fp4);
  const float* xf = x.data<float>();
#pragma omp parallel for schedule(static) if (rows * K >= (1 << 15))
  for (int64_t t = 0; t < rows; ++t) X.set_row(t, xf + t * K);

  kernels::BlockScaledArgs a;
  a.fp4 = fp4;
  a.row_bytes = fp4 ? K / 2 : K;
  a.k = K;
  a.w = static_cast<const uint8_t*>(codes.raw());
  a.scale = scale.raw();
  a.scale_dtype = scale.dtype();
  a.scale_cols = quant::ceil_div(K, q.block_k);
  a.fused_rows = N;
  a.bn = q.block_n;
  a.pair_from_rows = block_scaled_pair_from_rows(detect_cpu_features());
  a.x_ld = X.ld;
  a.nb = X.nb;
  float* Y = y.data<float>();
  const float* B = bias.defined() ? bias.data<float>() : nullptr;
  const int64_t tasks = quant::ceil_div(N, kTaskRows);
#pragma omp parallel for schedule(dynamic, 1) if (rows * K * N >= (1 << 15))
  for (int64_t t = 0; t < tasks; ++t) {
    kernels::BlockScaledArgs w = a;
    w.n0 = t * kTaskRows;
    w.n1 = std::min(N, w.n0 + kTaskRows);
    for (int64_t m0 = 0; m0 < rows; m0 += kRowChunk) {
      w.xq = X.q.data() + m0 * X.ld;
      w.xb = X.b.empty() ? nullptr : X.b.data() + m0 * X.ld;
      w.xs = X.s.data() + m0 * X.nb;
      w.m = int(std::min(kRowChunk, rows - m0));
      w.y = Y + m0 * N;
      w.ldy = N;
      fn(w);
      for (int64_t r = m0; r < m0 + w.m; ++r)
        for (int64_t n = w.n0; n < w.n1; ++n) {
          float v = Y[r * N + n];
          if (B) v += B[n];
          Y[r * N + n] = act == DType::kBF16 ? round_bf16(v) : v;
        }
    }
  }
  return y;
}

const QuantKernels& portable_kernels() {
  static const QuantKernels k{decode_fp8_portable, decode_fp4_portable, dot_portable, dot_fp8_portable,
                              dot_fp4_portable};
  return k;
}

}  // namespace

Tensor quant_linear(const Tensor& x, const Tensor& codes, const Tensor& scale, const QuantScheme& quant,
                    int64_t out, int64_t in, const Tensor& bias, DType act) {
  // The experts' kernel choice (QuantRows' layout follows it too); with the float AVX-512 kernel
  // or none, the loop below.
  const kernels::BlockScaledFn fn = block_scaled_kernel();
  if (fn == kernels::gemm_block_scaled_avx512bf16 || fn == kernels::gemm_block_scaled_avx2)
    return run_block_scaled(x.contiguous(), codes, scale, quant, out, in, bias, act, fn);
  static const QuantKernels& k = detect_cpu_features().avx512 ? avx512_kernels() : portable_kernels();
  return run(x.contiguous(), codes, scale, quant, out, in, bias, act, k);
}

Tensor quant_linear_portable(const Tensor& x, const Tensor& codes, const Tensor& scale,
                             const QuantScheme& quant, int64_t out, int64_t in, const Tensor& bias,
                             DType act) {
  return run(x.contiguous(), codes, scale, quant, out, in, bias, act, portable_kernels());
}

}  // namespace moex::cpu
