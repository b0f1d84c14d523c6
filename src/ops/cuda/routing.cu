// Routers on CUDA (contracts: ops.hpp; host: src/ops/cpu/routing.cpp): the same experts in the
// same slots as the host, ties included, because the selection replays libstdc++'s element
// movements (ops/cuda/torch_topk.cuh says why and how).
//
// Layout: a warp per row, the row's (value, index) pairs in shared memory. The lanes do the
// element-wise parts (loads, max, exp, sigmoid, group scores) and the sorted selection when no tie
// can decide it (distinct_sorted_topk: ranks counted in parallel); lane 0 does everything whose
// order the host fixes (float sums in index order, the selection when ties make the replay
// necessary, and the unsorted selections, whose slot order is the algorithm's). E is at most a few hundred
// in practice, so a row costs a few thousand shared-memory steps; rows run in parallel across
// warps and blocks. Device values equal the host's wherever the host's are equal (same float32
// operations; exp / sigmoid evaluated as in small_ops.cuh), which is all the replay needs.
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/pdl.cuh"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/small_ops.cuh"
#include "ops/cuda/torch_topk.cuh"

namespace moex::ops::cuda {

namespace {

using topk_replay::Elem;
using topk_replay::kStack;
using topk_replay::torch_topk;
constexpr int kMaxExperts = topk_replay::kMaxElems;

// ---------------------------------------------------------------- routers

// Shared memory of one row: E pairs, G group pairs, the introsort stack.
struct RowSmem {
  Elem* experts;
  Elem* groups;
  unsigned long long* stack;
};
__device__ __forceinline__ RowSmem row_smem(int E, int G) {
  extern __shared__ unsigned long long smem_raw[];
  const int words = E + G + kStack;  // 8 bytes each
  unsigned long long* base = smem_raw + int64_t(threadIdx.x / 32) * words;
  return {reinterpret_cast<Elem*>(base), reinterpret_cast<Elem*>(base + E), base + E + G};
}

__device__ __forceinline__ float bcast(float v) { return __shfl_sync(0xffffffffu, v, 0); }

// The sorted top k of a[0, E) by the whole warp, when ties cannot matter: if no value among the k
// largest equals any other value of the row and there is no NaN, the k largest in descending
// order are unique, so libstdc++'s moves (the replay) and a rank count put the same elements in
// the same slots. Each lane ranks its elements (how many values are larger) against the row
// read by broadcast; the winners move to a[rank]. Returns false, leaving `a` untouched, when a
// tie or a NaN needs the replay (warp-uniform), or E is beyond the per-lane budget.
constexpr int kFastPerLane = 8;  // E <= 256
// kPerLane: the elements each lane ranks (E <= 32 * kPerLane). A row of 60 experts ranks two per
// lane, not eight: a quarter of the compares, in a warp that shares its SM with the blocks of a
// GEMV streaming beside it in a decode step.
template <int kPerLane>
__device__ bool distinct_sorted_topk_n(Elem* a, int E, int k, int lane) {
  float v[kPerLane];
  int greater[kPerLane], equal[kPerLane];
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int e = lane + 32 * r;
    v[r] = e < E ? a[e].v : 0.0f;
    greater[r] = 0;
    equal[r] = 0;
  }
  bool nan = false;
#pragma unroll 4
  for (int j = 0; j < E; ++j) {
    const float x = a[j].v;  // the same address for every lane: a broadcast
    nan |= x != x;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      greater[r] += x > v[r];
      equal[r] += x == v[r];
    }
  }
  bool tie = false;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r)
    tie |= lane + 32 * r < E && greater[r] < k && equal[r] > 1;  // equal counts the element itself
  if (__any_sync(0xffffffffu, tie || nan)) return false;
  __syncwarp();  // every lane has read the row before the winners move
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int e = lane + 32 * r;
    if (e < E && greater[r] < k) a[greater[r]] = {v[r], e};
  }
  __syncwarp();
  return true;
}
__device__ bool distinct_sorted_topk(Elem* a, int E, int k, int lane) {
  if (E <= 32) return distinct_sorted_topk_n<1>(a, E, k, lane);
  if (E <= 64) return distinct_sorted_topk_n<2>(a, E, k, lane);
  if (E <= 128) return distinct_sorted_topk_n<4>(a, E, k, lane);
  if (E <= 32 * kFastPerLane) return distinct_sorted_topk_n<kFastPerLane>(a, E, k, lane);
  return false;
}

// std::max_element's result over a[0, E): its scan never moves past index 0 when a[0] is NaN
// and skips NaN elsewhere, so it is NaN when a[0] is and the largest non-NaN value otherwise
// (which of equal maxima, +0 or -0, it names cannot change exp(v - max)).
__device__ float warp_max_element(const Elem* a, int E, int lane) {
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, a[e].v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float first = a[0].v;
  return first != first ? first : m;
}

__global__ void softmax_topk_kernel(const void* __restrict__ logits, int code, int64_t rows, int E, int k,
                                    bool normalize, int w_code, int64_t* __restrict__ idx_out,
                                    float* __restrict__ w_out) {
  moex::cuda::pdl_enter();
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const int lane = threadIdx.x % 32;
  const RowSmem m = row_smem(E, 0);
  Elem* a = m.experts;
  for (int e = lane; e < E; e += 32) a[e] = {load_float(logits, code, row * E + e), e};
  __syncwarp();
  // std::max_element's value, then exp and the float sum in index order (one lane: the host's order).
  const float mx = warp_max_element(a, E, lane);
  for (int e = lane; e < E; e += 32) a[e].v = exp_f(__fsub_rn(a[e].v, mx));
  __syncwarp();
  float sum = 0.0f;
  if (lane == 0) {
#pragma unroll 8
    for (int e = 0; e < E; ++e) sum = __fadd_rn(sum, a[e].v);
  }
  sum = bcast(sum);
  for (int e = lane; e < E; e += 32) a[e].v = __fdiv_rn(a[e].v, sum);
  __syncwarp();
  const bool fast = distinct_sorted_topk(a, E, k, lane);
  if (lane != 0) return;
  if (!fast) torch_topk(a, E, k, /*sorted=*/true, m.stack);
  float s = 0.0f;
  if (normalize)
    for (int j = 0; j < k; ++j) s = __fadd_rn(s, a[j].v);
  for (int j = 0; j < k; ++j) {
    const float w = normalize ? __fdiv_rn(a[j].v, s) : a[j].v;
    idx_out[row * k + j] = a[j].i;
    w_out[row * k + j] = round_to(w, w_code);
  }
}

__global__ void topk_softmax_kernel(const void* __restrict__ logits, int code, int64_t rows, int E, int k,
                                    int act, int64_t* __restrict__ idx_out, float* __restrict__ w_out) {
  moex::cuda::pdl_enter();
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const RowSmem m = row_smem(E, 0);
  Elem* a = m.experts;
  for (int e = lane; e < E; e += 32) a[e] = {load_float(logits, code, row * E + e), e};
  __syncwarp();
  const bool fast = distinct_sorted_topk(a, E, k, lane);
  if (lane != 0) return;
  if (!fast) torch_topk(a, E, k, /*sorted=*/true, m.stack);
  // a[0] holds the largest chosen value, so every exp(v - top) <= 1.
  const float top = a[0].v;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    a[j].v = exp_f(__fsub_rn(a[j].v, top));
    sum = __fadd_rn(sum, a[j].v);
  }
  for (int j = 0; j < k; ++j) {
    idx_out[row * k + j] = a[j].i;
    w_out[row * k + j] = round_to(__fdiv_rn(a[j].v, sum), act);
  }
}

struct GroupParams {
  int E, k, G, topk_group;
  bool norm_topk_prob;
  float routed_scaling_factor;
};

__global__ void sigmoid_group_topk_kernel(const void* __restrict__ logits, int code,
                                          const void* __restrict__ correction, int c_code, int64_t rows,
                                          GroupParams p, int64_t* __restrict__ idx_out,
                                          float* __restrict__ w_out) {
  moex::cuda::pdl_enter();
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32, E = p.E, G = p.G, per_group = E / G;
  const RowSmem m = row_smem(E, G);
  Elem* a = m.experts;
  Elem* grp = m.groups;
  const float neg_inf = -INFINITY;
  // Choice values: sigmoid(logit) + correction, in index order.
  for (int e = lane; e < E; e += 32)
    a[e] = {__fadd_rn(sigmoid_f(load_float(logits, code, row * E + e)), load_float(correction, c_code, e)), e};
  __syncwarp();
  // Group scores: the sum of the two largest choices (the host's scan; which of two equal values
  // is "the" largest cannot change their sum).
  for (int g = lane; g < G; g += 32) {
    float best = neg_inf, second = neg_inf;
    for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
      const float v = a[e].v;
      if (v > best) {
        second = best;
        best = v;
      } else if (v > second) {
        second = v;
      }
    }
    grp[g] = {per_group >= 2 ? __fadd_rn(best, second) : best, g};
  }
  __syncwarp();
  if (lane == 0) torch_topk(grp, G, p.topk_group, /*sorted=*/false, m.stack);
  __syncwarp();
  // Experts of groups that were not kept cannot be chosen.
  for (int e = lane; e < E; e += 32) {
    bool kept = false;
    for (int j = 0; j < p.topk_group; ++j) kept |= grp[j].i == e / per_group;
    if (!kept) a[e].v = neg_inf;
  }
  __syncwarp();
  if (lane != 0) return;
  torch_topk(a, E, p.k, /*sorted=*/false, m.stack);
  // Weights: the sigmoid scores (not the corrected choices) of the chosen experts.
  float sum = 0.0f;
  for (int j = 0; j < p.k; ++j) {
    a[j].v = sigmoid_f(load_float(logits, code, row * E + a[j].i));
    sum = __fadd_rn(sum, a[j].v);
  }
  const float denom = p.norm_topk_prob ? __fadd_rn(sum, 1e-20f) : 1.0f;
  for (int j = 0; j < p.k; ++j) {
    float v = a[j].v;
    if (p.norm_topk_prob) v = __fdiv_rn(v, denom);
    idx_out[row * p.k + j] = a[j].i;
    w_out[row * p.k + j] = __fmul_rn(v, p.routed_scaling_factor);
  }
}

// ---------------------------------------------------------------- launch

// Warps (rows) per block and the dynamic shared memory of a block, for `words` 8-byte words per row.
struct RowLaunch {
  unsigned blocks = 0;
  int threads = 0;
  size_t smem = 0;
};
template <class Kernel>
RowLaunch plan_rows(Kernel kernel, int64_t rows, int64_t words, int device, const char* what) {
  const size_t per_row = size_t(words) * 8;
  const size_t optin = moex::cuda::device_info(device).smem_per_block_optin;
  const size_t budget = std::max<size_t>(48 * 1024, std::min<size_t>(optin, 96 * 1024));
  if (per_row > std::max<size_t>(optin, 48 * 1024))
    throw Unsupported(std::string(what) + ": " + std::to_string(words - kStack) +
                      " experts per row do not fit one block's shared memory");
  const int64_t per_block = std::clamp<int64_t>(int64_t(std::max<size_t>(budget, per_row) / per_row), 1, 8);
  RowLaunch l;
  l.threads = int(32 * per_block);
  l.smem = size_t(per_block) * per_row;
  const int64_t blocks = (rows + per_block - 1) / per_block;
  if (blocks > 0x7fffffff) throw Unsupported(std::string(what) + ": " + std::to_string(rows) + " rows");
  l.blocks = unsigned(blocks);
  if (l.smem > 48 * 1024)
    MOEX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.smem)));
  return l;
}

void check_k(int64_t E, int64_t k, const char* what) {
  if (E < 1 || E > kMaxExperts)
    throw Unsupported(std::string(what) + ": " + std::to_string(E) + " experts (the CUDA routers take 1.." +
                      std::to_string(kMaxExperts) + ")");
  if (k < 1 || k > E)
    throw InvalidInput(std::string(what) + ": top_k " + std::to_string(k) + " of " + std::to_string(E) + " experts");
}

Routing make_routing(int64_t rows, int64_t k, Device dev) {
  Routing r;
  r.top_k_index = Tensor::empty({rows, k}, DType::kI64, dev);
  r.top_k_weights = Tensor::empty({rows, k}, DType::kF32, dev);
  return r;
}

}  // namespace

Routing softmax_topk(const Tensor& logits, int64_t k, bool normalize, DType weights_dtype) {
  const int64_t rows = logits.size(0), E = logits.size(1);
  check_k(E, k, "softmax_topk");
  const int code = float_code(logits.dtype(), "softmax_topk"), w_code = float_code(weights_dtype, "softmax_topk");
  const Device dev = logits.device();
  moex::cuda::DeviceGuard g(dev.index);
  Routing r = make_routing(rows, k, dev);
  if (rows == 0) return r;
  const RowLaunch l = plan_rows(softmax_topk_kernel, rows, E + kStack, dev.index, "softmax_topk");
  moex::cuda::launch_pdl_here(softmax_topk_kernel, dim3(l.blocks), dim3(l.threads), l.smem, moex::cuda::current_stream(),
      logits.raw(), code, rows, int(E), int(k), normalize, w_code, r.top_k_index.data<int64_t>(),
      r.top_k_weights.data<float>());
  MOEX_CUDA_CHECK_LAUNCH(softmax_topk_kernel);
  return r;
}

Routing topk_softmax(const Tensor& logits, int64_t k, DType act) {
  const int64_t rows = logits.size(0), E = logits.size(1);
  check_k(E, k, "topk_softmax");
  const int code = float_code(logits.dtype(), "topk_softmax"), act_code = float_code(act, "topk_softmax");
  const Device dev = logits.device();
  moex::cuda::DeviceGuard g(dev.index);
  Routing r = make_routing(rows, k, dev);
  if (rows == 0) return r;
  const RowLaunch l = plan_rows(topk_softmax_kernel, rows, E + kStack, dev.index, "topk_softmax");
  moex::cuda::launch_pdl_here(topk_softmax_kernel, dim3(l.blocks), dim3(l.threads), l.smem, moex::cuda::current_stream(),
      logits.raw(), code, rows, int(E), int(k), act_code, r.top_k_index.data<int64_t>(),
      r.top_k_weights.data<float>());
  MOEX_CUDA_CHECK_LAUNCH(topk_softmax_kernel);
  return r;
}

Routing sigmoid_group_topk(const Tensor& logits, const Tensor& correction, const GroupLimitedTopk& spec) {
  const int64_t rows = logits.size(0), E = spec.num_experts, k = spec.top_k, G = spec.n_group;
  check_k(E, k, "sigmoid_group_topk");
  if (G < 1 || E % G != 0 || spec.topk_group < 1 || spec.topk_group > G)
    throw InvalidInput("sigmoid_group_topk: " + std::to_string(E) + " experts in " + std::to_string(G) +
                       " groups, keeping " + std::to_string(spec.topk_group));
  const int code = float_code(logits.dtype(), "sigmoid_group_topk");
  const int c_code = float_code(correction.dtype(), "sigmoid_group_topk");
  const Device dev = logits.device();
  moex::cuda::DeviceGuard g(dev.index);
  Routing r = make_routing(rows, k, dev);
  if (rows == 0) return r;
  GroupParams p{int(E), int(k), int(G), int(spec.topk_group), spec.norm_topk_prob, spec.routed_scaling_factor};
  const RowLaunch l = plan_rows(sigmoid_group_topk_kernel, rows, E + G + kStack, dev.index, "sigmoid_group_topk");
  moex::cuda::launch_pdl_here(sigmoid_group_topk_kernel, dim3(l.blocks), dim3(l.threads), l.smem, moex::cuda::current_stream(),
      logits.raw(), code, correction.raw(), c_code, rows, p, r.top_k_index.data<int64_t>(),
      r.top_k_weights.data<float>());
  MOEX_CUDA_CHECK_LAUNCH(sigmoid_group_topk_kernel);
  return r;
}

}  // namespace moex::ops::cuda
