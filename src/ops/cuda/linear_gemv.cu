// ops::linear for decode-sized inputs (a few rows) with 16-bit weights: a bandwidth-bound GEMV.
//
// Why not cuBLASLt here: at one to eight rows a projection only streams its weight once, and
// the time is bytes / bandwidth plus the launch. Measured on the H200 (ncu, one decode step of
// a 24-layer Qwen1.5-MoE-shaped model, docs/gpu_model.md), cuBLASLt's kernels for these shapes
// reached 1.2 TB/s with the bias epilogue and 2.2 TB/s without (the 2048 x 2048 projections
// took 7-8.4 us for 8.4 MB), and a one-column output (qwen2_moe's shared-expert gate) ran as
// two kernels (a dot and a reduce). Nothing about these shapes needs tensor cores.
//
// Shape of the work: a block of 8 warps owns kColumns output columns for every row at a time; the
// warps split K into 256-element chunks (32 lanes x 8 elements, one 16-byte load per lane per
// column), so each block keeps kColumns x 4 KiB of weight loads in flight and even a 2048-column
// matrix has 512 column groups. At one row a block walks several column groups (gemv_grid says
// why): short blocks paid the PDL wait, the norm and a DRAM round trip once per group, in waves.
// Two columns per block measured 7-14 % faster alone (lab/cuda/gemv_lab.cu,
// back-to-back launches of one kernel) but 7 % slower inside a decode step (ncu, weights
// prefetched before the PDL wait: half the bytes in flight), so four stay. x is read through the L1 (it is at most 8 rows). Partial sums are reduced
// in a fixed order (lanes by shuffle-xor, then warps 0..7 in order), the bias added in float32,
// and the result rounded once to act: the ops contract of linear(), with an accumulation order
// of its own (so its bits differ from cuBLASLt's, as cuBLASLt's differ between its kernels).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/small_ops.cuh"

namespace moex::ops::cuda {

using moex::cuda::aligned16;

namespace {

constexpr int kWarps = 8;
constexpr int kColumns = 4;
constexpr int kChunk = 256;  // K elements one warp reads per column per step
constexpr int kGemvBlocksPerSm = 4;  // the persistent grid (gemv_grid), at one row

// Up to kGemvMaxSegments linears of the same x in one launch (q / k / v; a router beside a
// shared expert's gate and up): segment i owns blocks [block0, next block0). A single linear is
// a one-segment launch of the same kernel, so linears() and linear() give the same bits.
template <class T>
struct Segment {
  const T* w;
  const T* bias;
  T* y;
  int64_t out;
  int64_t block0;
};
template <class T>
struct Segments {
  Segment<T> s[kGemvMaxSegments];
  int n;
};

// The RMSNorm in front of a GEMV, formed by every block (norm_linears): x = rms_norm(h) or, with
// delta, h' = round(h + delta) and x = rms_norm(h'). Block 0 also writes x (x_out, when set) and
// h' (h_out) for the kernels after. Each block reads the M rows of h (and delta) once for the
// sum of squares (at most 8 x 16 KiB, from L2) and again, chunk by chunk, beside its weights.
template <class T>
struct NormArgs {
  const T* delta;  // null: no residual add
  const T* w;      // the norm weight [in]
  float eps;
  int act, inner;  // rounding codes: act, and the one of x * r (act for Llama, float32 for gpt-oss)
  T* x_out;        // null: x is not needed elsewhere
  T* h_out;        // with delta: h' (a tensor other than h: blocks read h while block 0 writes)
};

// norm.cu's arithmetic, to the bit: v in act, the double sum of squares, r with the host's
// float / double roundings, out = round(w * round(v * r, inner)).
__device__ __forceinline__ float norm_value(float v, float r, float w, int inner, int act) {
  return round_to(__fmul_rn(w, round_to(__fmul_rn(v, r), inner)), act);
}

template <class T>
__device__ __forceinline__ void residual8(const T* h, const NormArgs<T>& na, int64_t at, float* v) {
  moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(h + at)), v);
  if (na.delta) {
    float d[8];
    moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(na.delta + at)), d);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = round_to(__fadd_rn(v[i], d[i]), na.act);
  }
}

// One column group of one segment: kColumns output columns starting at n0.
template <class T>
struct ColumnGroup {
  const T* w;
  const T* bias;
  T* y;
  int64_t out, n0;
  int cols;
};
template <class T>
__device__ __forceinline__ ColumnGroup<T> column_group(const Segments<T>& segs, int64_t g) {
  int si = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegments; ++i)
    if (i < segs.n && g >= segs.s[i].block0) si = i;
  ColumnGroup<T> c;
  c.w = segs.s[si].w;
  c.bias = segs.s[si].bias;
  c.y = segs.s[si].y;
  c.out = segs.s[si].out;
  c.n0 = (g - segs.s[si].block0) * kColumns;
  c.cols = c.out - c.n0 < kColumns ? int(c.out - c.n0) : kColumns;
  return c;
}

// Block b computes column groups b, b + gridDim.x, ... of `groups` (a grid of a few blocks per SM,
// every block resident: each loads its first group's weights before the PDL wait, forms the norm
// once, and loads the next group's first chunk before reducing the current one).
template <class T, int M, bool kNorm>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T* __restrict__ x, const Segments<T> segs, int64_t groups, int64_t in, const NormArgs<T> na) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t step = int64_t(kWarps) * kChunk;
  const int64_t k0 = int64_t(warp) * kChunk + lane * 8;
  uint4 wv[kColumns];
  auto load_w = [&](const ColumnGroup<T>& g, int64_t kk) {
#pragma unroll
    for (int c = 0; c < kColumns; ++c)
      wv[c] = c < g.cols ? __ldcs(reinterpret_cast<const uint4*>(g.w + (g.n0 + c) * in + kk)) : make_uint4(0, 0, 0, 0);
  };

  // The weights are no kernel's output: the first chunk is loaded before waiting for the kernel
  // that writes x (pdl.cuh), and each later chunk is loaded before the previous one is used.
  int64_t gi = blockIdx.x;
  ColumnGroup<T> cur = column_group(segs, gi);
  if (k0 < in) load_w(cur, k0);
  // One row: the bias of the column this thread finishes (threads below kColumns), loaded a group
  // ahead like the weights; in the epilogue its load was a dependent round trip per group of the
  // persistent grid (batch-1 decode +0.7-0.8 % on the H100, docs/gpu_model.md). More rows keep the
  // epilogue's load: the register held across the loop would cost those instances occupancy.
  auto load_bias = [&](const ColumnGroup<T>& g) {
    const int c = int(threadIdx.x);
    if constexpr (M == 1) return c < g.cols && g.bias ? moex::cuda::to_float<T>(g.bias[g.n0 + c]) : 0.0f;
    return 0.0f;
  };
  float bias_cur = load_bias(cur);
  moex::cuda::pdl_wait();
  moex::cuda::pdl_trigger();
  __shared__ float r_sh[M];
  if constexpr (kNorm) {
    __shared__ double ss_sh[kWarps][M];
    double ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) ss[m] = 0;
    for (int64_t c = int64_t(threadIdx.x) * 8; c < in; c += kWarps * 32 * 8)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float v[8];
        residual8<T>(x, na, int64_t(m) * in + c, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) ss[m] += double(v[i]) * double(v[i]);
      }
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss[m] += __shfl_xor_sync(0xffffffffu, ss[m], o);
      if (lane == 0) ss_sh[warp][m] = ss[m];
    }
    __syncthreads();
    if (threadIdx.x < M) {
      double t = 0;
      for (int q = 0; q < kWarps; ++q) t += ss_sh[q][threadIdx.x];
      const float mean = float(t / double(in));
      r_sh[threadIdx.x] = float(1.0 / double(__fsqrt_rn(__fadd_rn(mean, na.eps))));
    }
    __syncthreads();
    if (blockIdx.x == 0 && (na.x_out || na.h_out))
      for (int64_t c = int64_t(threadIdx.x) * 8; c < int64_t(M) * in; c += kWarps * 32 * 8) {
        const int m = int(c / in);
        float v[8], wn[8], xn[8];
        residual8<T>(x, na, c, v);
        moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(na.w + (c - int64_t(m) * in))), wn);
#pragma unroll
        for (int i = 0; i < 8; ++i) xn[i] = norm_value(v[i], r_sh[m], wn[i], na.inner, na.act);
        if (na.h_out) *reinterpret_cast<uint4*>(na.h_out + c) = moex::cuda::narrow8<T>(v);
        if (na.x_out) *reinterpret_cast<uint4*>(na.x_out + c) = moex::cuda::narrow8<T>(xn);
      }
  }

  __shared__ float part[kWarps][M][kColumns];
  for (;;) {
    const int64_t gn = gi + gridDim.x;
    const bool has_next = gn < groups;
    ColumnGroup<T> next = cur;
    if (has_next) next = column_group(segs, gn);
    const float bias_next = has_next ? load_bias(next) : 0.0f;
    float acc[M][kColumns];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int c = 0; c < kColumns; ++c) acc[m][c] = 0.0f;
    for (int64_t k = k0; k < in; k += step) {
      float wf[kColumns][8];
#pragma unroll
      for (int c = 0; c < kColumns; ++c) moex::cuda::widen8<T>(wv[c], wf[c]);
      if (k + step < in) load_w(cur, k + step);
      else if (has_next) load_w(next, k0);
      float wn[8];
      if constexpr (kNorm) moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(na.w + k)), wn);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        if constexpr (kNorm) {
          residual8<T>(x, na, int64_t(m) * in + k, xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) xf[i] = norm_value(xf[i], r_sh[m], wn[i], na.inner, na.act);
        } else {
          moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(x + m * in + k)), xf);
        }
#pragma unroll
        for (int c = 0; c < kColumns; ++c)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m][c] = fmaf(xf[i], wf[c][i], acc[m][c]);
      }
    }

#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        float v = acc[m][c];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) part[warp][m][c] = v;
      }
    __syncthreads();
    if (threadIdx.x < M * kColumns) {
      const int m = threadIdx.x / kColumns, c = threadIdx.x % kColumns;
      if (c < cur.cols) {
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < kWarps; ++q) v += part[q][m][c];
        if (cur.bias) v += M == 1 ? bias_cur : moex::cuda::to_float<T>(cur.bias[cur.n0 + c]);
        cur.y[int64_t(m) * cur.out + cur.n0 + c] = moex::cuda::from_float<T>(v);
      }
    }
    if (!has_next) break;
    __syncthreads();  // part is rewritten for the next group
    gi = gn;
    cur = next;
    bias_cur = bias_next;
  }
}

// Blocks of the grid for M rows. One row: a persistent grid of a few blocks per SM, never more
// than fit at once (every block must be resident to load its first weights before the PDL wait).
// Measured on the H200 inside a batch-1 decode step of a 24-layer Qwen1.5-MoE-shaped model
// (docs/gpu_model.md): the step's graph 2.24 -> 1.88 ms, the norm + q / k / v GEMV 16-17 ->
// 12-13 us (25 MB), the shared expert's gate / up beside the routed experts 45 -> 32 us; decode
// 428 / 430 -> 498 / 497 tokens/s with 4 blocks per SM asked (484 with 2, 497 with 8). What fits
// caps it: with today's registers (ptxas: 72 plain, 99 norm-forming) 3 and 2 blocks, so 4 and 8
// now ask for the same grid. At 8 rows the
// same grid lost 1.5 % (1,491 / 1,495 -> 1,469 / 1,470 tokens/s), so more rows keep one block per
// column group. MOEX_GEMV_BLOCKS_PER_SM (measuring only) sets the blocks per SM at every row
// count, 0 = one block per column group.
template <class Kernel>
int64_t gemv_grid(Kernel kernel, int64_t groups, int64_t rows, int device) {
  static const int per_sm_env = moex::cuda::env_int("MOEX_GEMV_BLOCKS_PER_SM", -1);
  int per_sm = per_sm_env >= 0 ? per_sm_env : rows == 1 ? kGemvBlocksPerSm : 0;
  if (per_sm == 0) return groups;
  if (const int side = moex::cuda::side_blocks_per_sm(); side > 0) per_sm = std::min(per_sm, side);
  static thread_local std::map<std::pair<const void*, int>, int> fits;
  int& fit = fits[{reinterpret_cast<const void*>(kernel), device}];
  if (fit == 0) {
    MOEX_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kWarps * 32, 0));
    fit = std::max(fit, 1);
  }
  const int64_t sms = moex::cuda::device_info(device).sm_count;
  return std::min<int64_t>(groups, sms * std::min(per_sm, fit));
}

template <class T, int M>
void launch(const T* x, const Segments<T>& segs, int64_t groups, int64_t in, cudaStream_t s, int device,
            const NormArgs<T>* na) {
  if constexpr (M <= kNormGemvMaxRows) {
    if (na) {
      auto k = gemv_kernel<T, M, true>;
      moex::cuda::launch_pdl(k, dim3(unsigned(gemv_grid(k, groups, M, device))), dim3(kWarps * 32), 0, s, device, x,
                             segs, groups, in, *na);
      return;
    }
  }
  if (na) throw InvalidInput("norm_linears: more rows than the norm-forming GEMV takes");
  auto k = gemv_kernel<T, M, false>;
  moex::cuda::launch_pdl(k, dim3(unsigned(gemv_grid(k, groups, M, device))), dim3(kWarps * 32), 0, s, device, x, segs,
                         groups, in, NormArgs<T>{});
}

// x [rows, in]; weights[i] [out_i, in] with bias[i] (or undefined) into ys[i] [rows, out_i]. With
// na, x is the h of NormArgs and the linears read its norm.
template <class T>
void launch_segments(const Tensor& x, std::span<const Tensor* const> weights,
                     std::span<const Tensor* const> biases, std::vector<Tensor>& ys, cudaStream_t s,
                     const NormArgs<T>* na = nullptr) {
  const int device = x.device().index;
  Segments<T> segs{};
  int64_t blocks = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const Tensor& w = *weights[i];
    const int64_t out = w.size(0);
    if (out == 0) continue;
    segs.s[segs.n++] = {static_cast<const T*>(w.raw()),
                        biases[i] && biases[i]->defined() ? static_cast<const T*>(biases[i]->raw()) : nullptr,
                        static_cast<T*>(ys[i].raw()), out, blocks};
    blocks += (out + kColumns - 1) / kColumns;
  }
  if (blocks == 0) return;
  const T* xp = static_cast<const T*>(x.raw());
  const int64_t in = weights[0]->size(1);
  switch (x.size(0)) {
    case 1: launch<T, 1>(xp, segs, blocks, in, s, device, na); break;
    case 2: launch<T, 2>(xp, segs, blocks, in, s, device, na); break;
    case 3: launch<T, 3>(xp, segs, blocks, in, s, device, na); break;
    case 4: launch<T, 4>(xp, segs, blocks, in, s, device, na); break;
    case 5: launch<T, 5>(xp, segs, blocks, in, s, device, na); break;
    case 6: launch<T, 6>(xp, segs, blocks, in, s, device, na); break;
    case 7: launch<T, 7>(xp, segs, blocks, in, s, device, na); break;
    default: launch<T, 8>(xp, segs, blocks, in, s, device, na); break;
  }
}

}  // namespace

bool gemv_serves(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act) {
  const DType wt = weight.dtype();
  if (wt != DType::kBF16 && wt != DType::kF16) return false;
  if (x.dtype() != wt || act != wt || (bias.defined() && bias.dtype() != wt)) return false;
  const int64_t rows = x.size(0), in = weight.size(1);
  return rows >= 1 && rows <= kGemvMaxRows && in % 8 == 0 && weight.nbytes() <= kGemvMaxWeightBytes &&
         x.is_contiguous() &&
         weight.is_contiguous() && aligned16(x.raw()) && aligned16(weight.raw());
}

std::vector<Tensor> linear_gemv_segments(const Tensor& x, std::span<const Tensor* const> weights,
                                         std::span<const Tensor* const> biases) {
  if (weights.empty() || weights.size() > size_t(kGemvMaxSegments) || biases.size() != weights.size())
    throw InvalidInput("linear_gemv: 1.." + std::to_string(kGemvMaxSegments) + " weights, one bias slot each");
  std::vector<Tensor> ys;
  ys.reserve(weights.size());
  for (const Tensor* w : weights) {
    if (w->size(1) != weights[0]->size(1) || w->dtype() != weights[0]->dtype())
      throw InvalidInput("linear_gemv: the weights of one launch share in_features and dtype");
    ys.push_back(Tensor::empty({x.size(0), w->size(0)}, w->dtype(), x.device()));
  }
  cudaStream_t s = moex::cuda::current_stream();
  if (weights[0]->dtype() == DType::kBF16) launch_segments<__nv_bfloat16>(x, weights, biases, ys, s);
  else launch_segments<__half>(x, weights, biases, ys, s);
  return ys;
}

bool norm_gemv_serves(const Tensor& h, const Tensor* delta, const Tensor& norm_weight, DType act) {
  const auto ok16 = [&](const Tensor& t) {
    return t.dtype() == act && t.is_contiguous() && aligned16(t.raw());
  };
  return (act == DType::kBF16 || act == DType::kF16) && h.dim() == 2 && h.size(0) >= 1 &&
         h.size(0) <= kNormGemvMaxRows && h.size(1) % 8 == 0 && ok16(h) && (!delta || (ok16(*delta) && delta->shape() == h.shape())) &&
         ok16(norm_weight) && norm_weight.numel() == h.size(1);
}

std::vector<Tensor> norm_linear_gemv_segments(Tensor& h, const Tensor* delta, const Tensor& norm_weight, float eps,
                                              RmsNormStyle style, std::span<const Tensor* const> weights,
                                              std::span<const Tensor* const> biases, Tensor* x_out) {
  if (weights.empty() || weights.size() > size_t(kGemvMaxSegments) || biases.size() != weights.size())
    throw InvalidInput("norm_linears: 1.." + std::to_string(kGemvMaxSegments) + " weights, one bias slot each");
  const DType act = h.dtype();
  std::vector<Tensor> ys;
  ys.reserve(weights.size());
  for (const Tensor* w : weights) {
    if (w->size(1) != h.size(1) || w->dtype() != act)
      throw InvalidInput("norm_linears: the weights of one launch share in_features and dtype with h");
    ys.push_back(Tensor::empty({h.size(0), w->size(0)}, act, h.device()));
  }
  Tensor h_new = delta ? Tensor::empty(h.shape(), act, h.device()) : Tensor();
  if (x_out) *x_out = Tensor::empty(h.shape(), act, h.device());
  cudaStream_t s = moex::cuda::current_stream();
  const int code = act == DType::kBF16 ? moex::cuda::kCodeBF16 : moex::cuda::kCodeF16;
  auto run = [&](auto t) {
    using T = decltype(t);
    NormArgs<T> na{};
    na.delta = delta ? static_cast<const T*>(delta->raw()) : nullptr;
    na.w = static_cast<const T*>(norm_weight.raw());
    na.eps = eps;
    na.act = code;
    na.inner = style == RmsNormStyle::kLlama ? code : moex::cuda::kCodeF32;
    na.x_out = x_out ? static_cast<T*>(x_out->raw()) : nullptr;
    na.h_out = h_new.defined() ? static_cast<T*>(h_new.raw()) : nullptr;
    launch_segments<T>(h, weights, biases, ys, s, &na);
  };
  if (act == DType::kBF16) run(__nv_bfloat16{});
  else run(__half{});
  if (h_new.defined()) h = h_new;
  return ys;
}

Tensor linear_gemv(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor* w[1] = {&weight};
  const Tensor* b[1] = {&bias};
  return std::move(linear_gemv_segments(x, w, b)[0]);
}

}  // namespace moex::ops::cuda
