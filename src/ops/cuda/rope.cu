// Rotary position embedding on CUDA (contract: ops.hpp; host: src/ops/cpu/rope.cpp).
//
// One block per row; thread (i, y) owns the frequency pair i of heads y, y + ty, ... of that row.
// cos / sin depend on (position, i) only, so each thread computes its pair once per row and
// reuses it for every head it rotates: the double-precision sin / cos (what the host's
// Rope::cos_sin evaluates) are the expensive part of this op.
//
// The frequencies travel by value in the kernel's parameter struct (at most kMaxPairs floats,
// 1 KiB of the 4 KiB parameter space): no per-call allocation or upload, and the same launch at
// every decode step. Positions come from the step's device mirror.
//
// Agreement with the host: f = inv_freq * position is the same float32 product; cos / sin are
// evaluated in double (CUDA: within 2 ulp of double, glibc: correctly rounded in practice), so
// their float32 roundings agree unless the double value lies within a few 1e-16 of a float32
// rounding boundary (about once in 10^8 values); every later step is the host's float32 / act
// rounding sequence, with products and sums kept apart (no FMA contraction).
#include <algorithm>
#include <string>

#include "cuda/pdl.cuh"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/small_ops.cuh"

namespace moex::ops::cuda {

namespace {

using moex::cuda::from_float;
using moex::cuda::to_float;

constexpr int kMaxPairs = 256;  // rotary_dim up to 512
constexpr int64_t kRopeSpreadRows = 8;  // rows up to which a row's heads spread over blocks

// Up to two tensors of the same rows (q and k) in one launch: blockIdx.y picks one.
struct RopeTarget {
  void* x;
  int64_t width;  // the row length
  int heads;
};
struct RopeParams {
  float inv_freq[kMaxPairs];
  const int32_t* positions;  // [rows] in the step's device mirror
  RopeTarget target[2];
  int64_t head_stride;
  int64_t offset;            // first rotated dim of each head
  int half;                  // rotary_dim / 2
  float scale;               // attention_scaling, as float (the host's factor)
  int act;
  bool interleaved;
  // rope_kv_append_: target 1 (k) is also written to its cache row, and blockIdx.y == 2 copies
  // the row of v to its cache row; row r = b * tokens + t goes to column past + t of sequence b.
  void* k_cache;
  const void* v;
  void* v_cache;
  int64_t v_width;
  int64_t capacity;
  int tokens;
  const int32_t* step;  // step[0]: past
  int head_blocks;      // blocks per tensor of a row (blockIdx.y = tensor * head_blocks + block)
};

template <class T>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeParams p) {
  const int64_t row = blockIdx.x;
  const int tensor = int(blockIdx.y) / p.head_blocks, hb = int(blockIdx.y) % p.head_blocks;
  const int i = threadIdx.x;
  const bool active = i < p.half && tensor < 2;
  // cos / sin before the PDL wait: the positions are written by the step's upload or the previous
  // step's feed kernel, always two or more launches before a rope (the embedding comes between),
  // so they are complete once this kernel may start (pdl.cuh), and the double-precision sin / cos
  // overlap the GEMV before it.
  float c = 0.0f, s = 0.0f;
  if (active) {
    const float f = __fmul_rn(p.inv_freq[i], float(p.positions[row]));
    c = round_to(__fmul_rn(float(cos(double(f))), p.scale), p.act);
    s = round_to(__fmul_rn(float(sin(double(f))), p.scale), p.act);
  }
  moex::cuda::pdl_enter();
  const int64_t cache_row = p.k_cache ? (row / p.tokens) * p.capacity + p.step[0] + row % p.tokens : 0;
  if (tensor == 2) {  // v into its cache row, a slice per block
    const T* src = static_cast<const T*>(p.v) + row * p.v_width;
    T* dst = static_cast<T*>(p.v_cache) + cache_row * p.v_width;
    const int64_t per = (p.v_width + p.head_blocks - 1) / p.head_blocks;
    const int64_t e1 = std::min<int64_t>(p.v_width, (hb + 1) * per);
    for (int64_t e = hb * per + threadIdx.y * blockDim.x + threadIdx.x; e < e1; e += blockDim.x * blockDim.y)
      dst[e] = src[e];
    return;
  }
  T* cached = tensor == 1 && p.k_cache ? static_cast<T*>(p.k_cache) + cache_row * p.target[1].width : nullptr;
  T* x = static_cast<T*>(p.target[tensor].x);
  const int64_t width = p.target[tensor].width;
  const int heads = p.target[tensor].heads;
  // Every thread runs the same number of iterations: the interleaved layout needs a barrier
  // between reading a head and writing it back (slot i receives x[2i], read by another thread).
  for (int h0 = hb * int(blockDim.y); h0 < heads; h0 += int(blockDim.y) * p.head_blocks) {
    const int h = h0 + threadIdx.y;
    T* v = x + row * width + int64_t(h) * p.head_stride + p.offset;
    const bool on = active && h < heads;
    float x1 = 0.0f, x2 = 0.0f;
    if (on) {
      x1 = to_float(v[p.interleaved ? 2 * i : i]);
      x2 = to_float(v[p.interleaved ? 2 * i + 1 : i + p.half]);
    }
    if (p.interleaved) __syncthreads();
    if (on) {
      // (x * cos) + (rotate_half(x) * sin), every product and sum rounded as torch's bf16 ops.
      const float a = round_to(__fmul_rn(x1, c), p.act), b = round_to(__fmul_rn(-x2, s), p.act);
      const float d = round_to(__fmul_rn(x2, c), p.act), e = round_to(__fmul_rn(x1, s), p.act);
      const T lo = from_float<T>(round_to(__fadd_rn(a, b), p.act));
      const T hi = from_float<T>(round_to(__fadd_rn(d, e), p.act));
      v[i] = lo;
      v[i + p.half] = hi;
      if (cached) {
        T* cv = cached + int64_t(h) * p.head_stride;
        cv[i] = lo;
        cv[i + p.half] = hi;
      }
    }
    // Threads of a row stay in step so that the next head's reads follow this head's writes
    // only through disjoint addresses; no second barrier is needed.
  }
}

}  // namespace

namespace {

// With kv (rope_kv_append_): b is k, rotated into its cache too, and v is copied to its cache.
void launch_rope(Tensor& a, int64_t heads_a, Tensor* b, int64_t heads_b, int64_t head_stride, int64_t offset,
                 const Rope& rope, RopeLayout layout, const Step& step, DType act, LayerKV* kv = nullptr,
                 const Tensor* v = nullptr) {
  const int64_t rows = step.rows(), half = rope.rotary_dim / 2;
  if (rows == 0 || half == 0) return;
  if (half > kMaxPairs || int64_t(rope.inv_freq.size()) < half)
    throw Unsupported("rope: rotary_dim " + std::to_string(rope.rotary_dim) + " with " +
                      std::to_string(rope.inv_freq.size()) + " frequencies (the CUDA rope takes up to " +
                      std::to_string(2 * kMaxPairs) + " dims)");
  const int64_t heads = std::max(heads_a, b ? heads_b : 0);
  if (heads > 0x7fffffff || rows > 0x7fffffff)
    throw Unsupported("rope: " + std::to_string(rows) + " rows x " + std::to_string(heads) + " heads");
  if (heads == 0) return;
  const Device dev = a.device();
  RopeParams p{};
  for (int64_t i = 0; i < half; ++i) p.inv_freq[i] = float(rope.inv_freq[size_t(i)]);
  p.positions = device_step_data(step, dev, "rope") + device_step_position_offset(step);
  p.target[0] = {a.raw(), a.size(1), int(heads_a)};
  if (b) p.target[1] = {b->raw(), b->size(1), int(heads_b)};
  p.head_stride = head_stride;
  p.offset = offset;
  p.half = int(half);
  p.scale = float(rope.attention_scaling);
  p.act = float_code(act, "rope");
  p.interleaved = layout == RopeLayout::kInterleaved;
  if (kv) {
    p.k_cache = kv->k.raw();
    p.v = v->raw();
    p.v_cache = kv->v.raw();
    p.v_width = v->size(1);
    p.capacity = kv->capacity();
    p.tokens = int(step.tokens);
    p.step = device_step_data(step, dev, "rope_kv_append");
  }

  // x: the pairs, rounded up to whole warps; y: heads side by side up to kThreads threads. Decode
  // rows spread a row's heads over blocks (one head per thread row): a block walking the heads in
  // turn waited for one L2 round trip per head, ~4 us per layer of a batch-1 step on the H200
  // (CUPTI trace, docs/gpu_model.md). Prompts keep one block per row and tensor, which computes
  // each cos / sin once for all heads.
  const int tx = int((half + 31) / 32 * 32);
  const int ty = int(std::min<int64_t>(heads, std::max(1, kThreads / tx)));
  // MOEX_ROPE_SPREAD=0: one block per row and tensor (measuring).
  static const bool spread = moex::cuda::env_int("MOEX_ROPE_SPREAD", 1) != 0;
  p.head_blocks = spread && rows <= kRopeSpreadRows ? int((heads + ty - 1) / ty) : 1;
  const unsigned tensors = kv ? 3u : b ? 2u : 1u;
  moex::cuda::DeviceGuard g(dev.index);
  with_float_type(a.dtype(), "rope", [&](auto t) {
    using T = decltype(t);
    moex::cuda::launch_pdl_here(rope_kernel<T>, dim3(unsigned(rows), tensors * unsigned(p.head_blocks)),
                                dim3(unsigned(tx), unsigned(ty)), 0, moex::cuda::current_stream(), p);
  });
  MOEX_CUDA_CHECK_LAUNCH(rope_kernel);
}

}  // namespace

void rope_(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
           RopeLayout layout, const Step& step, DType act) {
  launch_rope(x, heads, nullptr, 0, head_stride, offset, rope, layout, step, act);
}

void rope2_(Tensor& a, int64_t heads_a, Tensor& b, int64_t heads_b, int64_t head_stride, int64_t offset,
            const Rope& rope, RopeLayout layout, const Step& step, DType act) {
  if (a.dtype() != b.dtype()) {
    launch_rope(a, heads_a, nullptr, 0, head_stride, offset, rope, layout, step, act);
    launch_rope(b, heads_b, nullptr, 0, head_stride, offset, rope, layout, step, act);
    return;
  }
  launch_rope(a, heads_a, &b, heads_b, head_stride, offset, rope, layout, step, act);
}

void rope_kv_append_(Tensor& q, int64_t heads_q, Tensor& k, int64_t heads_k, const Tensor& v, LayerKV& kv,
                     int64_t head_dim, const Rope& rope, RopeLayout layout, const Step& step, DType act) {
  // One launch: q, k, v and the cache of one dtype, whole heads rotated (a partial rotary would
  // leave the rest of k's row to copy), contiguous rows of k and v as wide as the cache's.
  const DType dt = q.dtype();
  const bool same = k.dtype() == dt && v.defined() && v.dtype() == dt && (!kv.k.defined() || kv.k.dtype() == dt) &&
                    (!kv.v.defined() || kv.v.dtype() == dt);
  const bool one = same && rope.rotary_dim == head_dim && k.is_contiguous() && v.is_contiguous() &&
                   k.size(1) == heads_k * head_dim && step.rows() > 0;
  if (!one) {
    cuda::rope2_(q, heads_q, k, heads_k, head_dim, 0, rope, layout, step, act);
    cuda::kv_append(kv, k, v, step);
    return;
  }
  kv_reserve(kv, k, v, step);
  if (kv.k.size(2) != k.size(1) || kv.v.size(2) != v.size(1))
    throw InvalidInput("rope_kv_append: k / v rows of " + std::to_string(k.size(1)) + " / " + std::to_string(v.size(1)) +
                       " values for a cache of " + std::to_string(kv.k.size(2)) + " / " + std::to_string(kv.v.size(2)));
  launch_rope(q, heads_q, &k, heads_k, head_dim, 0, rope, layout, step, act, &kv, &v);
  kv.filled += step.tokens;
}

}  // namespace moex::ops::cuda
