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
#include <type_traits>
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

// One column group of one segment: kColumns output columns, column c being row
// n0 + (c & 1) + (c >> 1) * hop of the segment's weight: n0 .. n0 + 3 (hop 2), or in the rope
// launch's q / k segments the pairs i, i + 1 of a head beside their partners i + half, i + 1 + half
// (hop = half), so that a group's four results are two whole rotation pairs.
template <class T>
struct ColumnGroup {
  const T* w;
  const T* bias;
  T* y;
  int64_t out, n0;
  int cols, hop, seg;
  __device__ __forceinline__ int64_t row(int c) const { return n0 + (c & 1) + (c >> 1) * hop; }
};

// The rope launch (norm_qkv_rope_gemv): segments 0 / 1 / 2 are q / k / v of one row, q and k whole
// heads of head_dim = 2 * half rows. Their results are rounded to act, q and k rotated as rope.cu
// does (cos / sin of the row's position in double, every product and sum rounded to act), and k and
// v also written to column `past` of their cache (batch 1).
constexpr int kRopeMaxPairs = 256;
constexpr int kRopeSlots = 16;  // groups per block whose cos / sin are formed before the PDL wait
template <class T>
struct RopeArgs {
  float inv_freq[kRopeMaxPairs];
  const int32_t* position;  // the row's position (the step's device mirror)
  const int32_t* step;      // step[0]: past, the cache column of the row
  T* k_cache;               // [capacity, k width]
  T* v_cache;               // [capacity, v width]
  int64_t rope_groups;      // column groups of q and k: groups [0, rope_groups)
  int half;
  float scale;              // attention_scaling
  int act;
};
struct NoRope {};
template <class T, bool kRope>
using RopeOf = std::conditional_t<kRope, RopeArgs<T>, NoRope>;

// (cos, sin) of pair i at the row's position, rounded as rope.cu's kernel rounds them.
template <class T>
__device__ __forceinline__ float2 rope_cos_sin(const RopeArgs<T>& ra, int i) {
  const float f = __fmul_rn(ra.inv_freq[i], float(*ra.position));
  return make_float2(round_to(__fmul_rn(float(cos(double(f))), ra.scale), ra.act),
                     round_to(__fmul_rn(float(sin(double(f))), ra.scale), ra.act));
}

template <class T, bool kRope>
__device__ __forceinline__ ColumnGroup<T> column_group(const Segments<T>& segs, int64_t g, const RopeOf<T, kRope>& ra) {
  int si = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxSegments; ++i)
    if (i < segs.n && g >= segs.s[i].block0) si = i;
  ColumnGroup<T> c;
  c.w = segs.s[si].w;
  c.bias = segs.s[si].bias;
  c.y = segs.s[si].y;
  c.out = segs.s[si].out;
  c.seg = si;
  const int64_t gl = g - segs.s[si].block0;
  if constexpr (kRope) {
    if (g < ra.rope_groups) {  // half / 2 groups per head
      const int per_head = ra.half / 2;
      c.n0 = (gl / per_head) * (2 * ra.half) + (gl % per_head) * 2;
      c.hop = ra.half;
      c.cols = kColumns;
      return c;
    }
  }
  c.n0 = gl * kColumns;
  c.hop = 2;
  c.cols = c.out - c.n0 < kColumns ? int(c.out - c.n0) : kColumns;
  return c;
}

// The rope launch's result of one column group, threads 0..3 of the block (thread c: column c).
// A q / k group's threads c and c ^ 2 hold the two halves of a rotation pair.
template <class T>
__device__ __forceinline__ void rope_epilogue(const ColumnGroup<T>& cur, int64_t gi, int ord,
                                              const float (&part)[kWarps][1][kColumns], const float2* cs_sh,
                                              const RopeArgs<T>& ra) {
  const int c = threadIdx.x;
  if (c >= cur.cols) return;  // a v group's tail (q / k groups are whole)
  const int64_t n = cur.row(c);
  float v = 0.0f;
#pragma unroll
  for (int q = 0; q < kWarps; ++q) v += part[q][0][c];
  if (cur.bias) v += moex::cuda::to_float<T>(cur.bias[n]);
  float out = round_to(v, ra.act);  // the linear's result, as linear() rounds it
  if (gi < ra.rope_groups) {  // the same for the group's four threads
    const float other = __shfl_xor_sync(0xfu, out, 2);
    const float2 cs = ord < kRopeSlots ? cs_sh[2 * ord + (c & 1)] : rope_cos_sin(ra, int(n % (2 * ra.half)) - (c >> 1) * ra.half);
    const float x1 = c < 2 ? out : other, x2 = c < 2 ? other : out;
    // rope.cu's (x * cos) + (rotate_half(x) * sin), each product and sum rounded to act.
    if (c < 2) {
      const float a = round_to(__fmul_rn(x1, cs.x), ra.act), b = round_to(__fmul_rn(-x2, cs.y), ra.act);
      out = round_to(__fadd_rn(a, b), ra.act);
    } else {
      const float d = round_to(__fmul_rn(x2, cs.x), ra.act), e = round_to(__fmul_rn(x1, cs.y), ra.act);
      out = round_to(__fadd_rn(d, e), ra.act);
    }
  }
  const T o = moex::cuda::from_float<T>(out);
  cur.y[n] = o;
  if (cur.seg > 0) (cur.seg == 1 ? ra.k_cache : ra.v_cache)[int64_t(ra.step[0]) * cur.out + n] = o;
}

// Block b computes column groups b, b + gridDim.x, ... of `groups` (a grid of a few blocks per SM,
// every block resident: each loads its first group's weights before the PDL wait, forms the norm
// once, and loads the next group's first chunk before reducing the current one).
template <class T, int M, bool kNorm, bool kRope = false>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T* __restrict__ x, const Segments<T> segs, int64_t groups, int64_t in, const NormArgs<T> na,
                const RopeOf<T, kRope> ra) {
  static_assert(!kRope || (kNorm && M == 1), "the rope epilogue is the one-row q / k / v launch's");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t step = int64_t(kWarps) * kChunk;
  const int64_t k0 = int64_t(warp) * kChunk + lane * 8;
  uint4 wv[kColumns];
  auto load_w = [&](const ColumnGroup<T>& g, int64_t kk) {
#pragma unroll
    for (int c = 0; c < kColumns; ++c)
      wv[c] = c < g.cols ? __ldcs(reinterpret_cast<const uint4*>(g.w + (kRope ? g.row(c) : g.n0 + c) * in + kk))
                         : make_uint4(0, 0, 0, 0);
  };

  // The weights are no kernel's output: the first chunk is loaded before waiting for the kernel
  // that writes x (pdl.cuh), and each later chunk is loaded before the previous one is used.
  int64_t gi = blockIdx.x;
  ColumnGroup<T> cur = column_group<T, kRope>(segs, gi, ra);
  if (k0 < in) load_w(cur, k0);
  // cos / sin of the first kRopeSlots rope groups of this block, before the wait: the position is
  // written two or more launches earlier (pdl.cuh), and the double-precision sin / cos then
  // overlap the kernel before (the kernel's norm path has barriers before they are read).
  __shared__ float2 cs_sh[kRope ? 2 * kRopeSlots : 1];
  if constexpr (kRope) {
    if (threadIdx.x < 2 * kRopeSlots) {
      const int64_t g = blockIdx.x + int64_t(threadIdx.x >> 1) * gridDim.x;
      if (g < ra.rope_groups) cs_sh[threadIdx.x] = rope_cos_sin(ra, int(g % (ra.half / 2)) * 2 + (threadIdx.x & 1));
    }
  }
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
  for (int ord = 0;; ++ord) {  // ord: the group's rank among this block's groups
    const int64_t gn = gi + gridDim.x;
    const bool has_next = gn < groups;
    ColumnGroup<T> next = cur;
    if (has_next) next = column_group<T, kRope>(segs, gn, ra);
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
    if constexpr (kRope) {
      if (threadIdx.x < kColumns) rope_epilogue(cur, gi, ord, part, cs_sh, ra);
    } else if (threadIdx.x < M * kColumns) {
      const int m = threadIdx.x / kColumns, c = threadIdx.x % kColumns;
      if (c < cur.cols) {
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < kWarps; ++q) v += part[q][m][c];
        if (cur.bias) v += moex::cuda::to_float<T>(cur.bias[cur.n0 + c]);
        cur.y[int64_t(m) * cur.out + cur.n0 + c] = moex::cuda::from_float<T>(v);
      }
    }
    if (!has_next) break;
    __syncthreads();  // part is rewritten for the next group
    gi = gn;
    cur = next;
  }
}

// Blocks of the grid for M rows. One row: a persistent grid of a few blocks per SM, never more
// than fit at once (every block must be resident to load its first weights before the PDL wait).
// Measured on the H200 inside a batch-1 decode step of a 24-layer Qwen1.5-MoE-shaped model
// (docs/gpu_model.md): the step's graph 2.24 -> 1.88 ms, the norm + q / k / v GEMV 16-17 ->
// 12-13 us (25 MB), the shared expert's gate / up beside the routed experts 45 -> 32 us; decode
// 428 / 430 -> 498 / 497 tokens/s with 4 blocks per SM (484 with 2, 497 with 8). At 8 rows the
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
            const NormArgs<T>* na, const RopeArgs<T>* ra) {
  if constexpr (M == 1) {
    if (na && ra) {
      auto k = gemv_kernel<T, 1, true, true>;
      moex::cuda::launch_pdl(k, dim3(unsigned(gemv_grid(k, groups, M, device))), dim3(kWarps * 32), 0, s, device, x,
                             segs, groups, in, *na, *ra);
      return;
    }
  }
  if (ra) throw InvalidInput("norm_qkv_rope_gemv: one row with its norm");
  if constexpr (M <= kNormGemvMaxRows) {
    if (na) {
      auto k = gemv_kernel<T, M, true>;
      moex::cuda::launch_pdl(k, dim3(unsigned(gemv_grid(k, groups, M, device))), dim3(kWarps * 32), 0, s, device, x,
                             segs, groups, in, *na, NoRope{});
      return;
    }
  }
  if (na) throw InvalidInput("norm_linears: more rows than the norm-forming GEMV takes");
  auto k = gemv_kernel<T, M, false>;
  moex::cuda::launch_pdl(k, dim3(unsigned(gemv_grid(k, groups, M, device))), dim3(kWarps * 32), 0, s, device, x, segs,
                         groups, in, NormArgs<T>{}, NoRope{});
}

// x [rows, in]; weights[i] [out_i, in] with bias[i] (or undefined) into ys[i] [rows, out_i]. With
// na, x is the h of NormArgs and the linears read its norm; with ra (and na, one row), the
// weights are q / k / v, and ra's rope_groups is set here.
template <class T>
void launch_segments(const Tensor& x, std::span<const Tensor* const> weights,
                     std::span<const Tensor* const> biases, std::vector<Tensor>& ys, cudaStream_t s,
                     const NormArgs<T>* na = nullptr, RopeArgs<T>* ra = nullptr) {
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
  if (ra) {
    if (segs.n != 3) throw InvalidInput("norm_qkv_rope_gemv: q, k and v, none of them empty");
    ra->rope_groups = segs.s[2].block0;
  }
  const T* xp = static_cast<const T*>(x.raw());
  const int64_t in = weights[0]->size(1);
  switch (x.size(0)) {
    case 1: launch<T, 1>(xp, segs, blocks, in, s, device, na, ra); break;
    case 2: launch<T, 2>(xp, segs, blocks, in, s, device, na, nullptr); break;
    case 3: launch<T, 3>(xp, segs, blocks, in, s, device, na, nullptr); break;
    case 4: launch<T, 4>(xp, segs, blocks, in, s, device, na, nullptr); break;
    case 5: launch<T, 5>(xp, segs, blocks, in, s, device, na, nullptr); break;
    case 6: launch<T, 6>(xp, segs, blocks, in, s, device, na, nullptr); break;
    case 7: launch<T, 7>(xp, segs, blocks, in, s, device, na, nullptr); break;
    default: launch<T, 8>(xp, segs, blocks, in, s, device, na, nullptr); break;
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

namespace {

// The rope launch's part of a norm_linears launch (norm_qkv_rope_gemv).
struct QkvRope {
  int64_t head_dim;
  const Rope* rope;
  const Step* step;
  LayerKV* kv;
};

std::vector<Tensor> norm_gemv(Tensor& h, const Tensor* delta, const Tensor& norm_weight, float eps, RmsNormStyle style,
                              std::span<const Tensor* const> weights, std::span<const Tensor* const> biases,
                              Tensor* x_out, const QkvRope* qr) {
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
  if (qr) {
    kv_reserve(*qr->kv, ys[1], ys[2], *qr->step);
    const LayerKV& kv = *qr->kv;
    if (kv.k.dtype() != act || kv.v.dtype() != act || kv.k.size(0) != 1 || kv.k.size(2) != ys[1].size(1) ||
        kv.v.size(2) != ys[2].size(1))
      throw InvalidInput("norm_qkv_rope_gemv: a cache of one sequence in the activation dtype, as wide as k and v");
  }
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
    if (!qr) {
      launch_segments<T>(h, weights, biases, ys, s, &na);
      return;
    }
    const Step& step = *qr->step;
    const Rope& rope = *qr->rope;
    RopeArgs<T> ra{};
    ra.half = int(qr->head_dim / 2);
    for (int i = 0; i < ra.half; ++i) ra.inv_freq[i] = float(rope.inv_freq[size_t(i)]);
    ra.position = device_step_data(step, h.device(), "norm_qkv_rope_gemv") + device_step_position_offset(step);
    ra.step = device_step_data(step, h.device(), "norm_qkv_rope_gemv");
    ra.k_cache = static_cast<T*>(qr->kv->k.raw());
    ra.v_cache = static_cast<T*>(qr->kv->v.raw());
    ra.scale = float(rope.attention_scaling);
    ra.act = code;
    launch_segments<T>(h, weights, biases, ys, s, &na, &ra);
  };
  if (act == DType::kBF16) run(__nv_bfloat16{});
  else run(__half{});
  if (h_new.defined()) h = h_new;
  if (qr) qr->kv->filled += qr->step->tokens;
  return ys;
}

}  // namespace

std::vector<Tensor> norm_linear_gemv_segments(Tensor& h, const Tensor* delta, const Tensor& norm_weight, float eps,
                                              RmsNormStyle style, std::span<const Tensor* const> weights,
                                              std::span<const Tensor* const> biases, Tensor* x_out) {
  return norm_gemv(h, delta, norm_weight, eps, style, weights, biases, x_out, nullptr);
}

bool norm_qkv_rope_gemv_serves(const Tensor& h, std::span<const Tensor* const> weights, int64_t heads_q,
                               int64_t heads_k, int64_t head_dim, const Rope& rope, RopeLayout layout,
                               const Step& step, const LayerKV& kv, DType act) {
  if (weights.size() != 3 || h.dim() != 2 || h.size(0) != 1 || step.batch != 1 || step.tokens != 1) return false;
  const auto cache_ok = [&](const Tensor& c) { return !c.defined() || c.dtype() == act; };
  return layout == RopeLayout::kHalf && rope.rotary_dim == head_dim && head_dim % 4 == 0 && head_dim > 0 &&
         head_dim / 2 <= kRopeMaxPairs && int64_t(rope.inv_freq.size()) >= head_dim / 2 && heads_q > 0 &&
         heads_k > 0 && weights[0]->size(0) == heads_q * head_dim && weights[1]->size(0) == heads_k * head_dim &&
         weights[2]->size(0) > 0 && cache_ok(kv.k) && cache_ok(kv.v) && (kv.k.defined() == kv.v.defined());
}

std::vector<Tensor> norm_qkv_rope_gemv(Tensor& h, const Tensor& norm_weight, float eps, RmsNormStyle style,
                                       std::span<const Tensor* const> weights, std::span<const Tensor* const> biases,
                                       int64_t head_dim, const Rope& rope, const Step& step, LayerKV& kv) {
  const QkvRope qr{head_dim, &rope, &step, &kv};
  return norm_gemv(h, nullptr, norm_weight, eps, style, weights, biases, nullptr, &qr);
}

Tensor linear_gemv(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor* w[1] = {&weight};
  const Tensor* b[1] = {&bias};
  return std::move(linear_gemv_segments(x, w, b)[0]);
}

}  // namespace moex::ops::cuda
