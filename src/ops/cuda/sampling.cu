// The next token of every row on CUDA (contract: ops.hpp; host: src/ops/cpu/sampling.cpp).
//
// One block of kBlock threads per row, one launch for all rows, one device->host copy of the B
// ids. Greedy: a block argmax (lowest id on ties, exactly the host's). Sampling follows the host's
// warper order and double arithmetic: l = x / temperature, top-k, p = softmax(l), top-p,
// renormalise, draw by inverse CDF in index order. The uniform number of row b comes from a
// counter-based hash of (seed, b), the seed being one draw from the caller's generator per call.
//
// Nothing is sorted. Both warpers are threshold searches over an order on the row:
// - top-k keeps the values >= the k-th largest: a radix select of that value over order-preserving
//   32-bit keys of the float logits (l is x over a positive constant: same order, no merges).
// - top-p removes the longest prefix of the ascending (p, index) order whose mass is <= 1 - top_p
//   (the host's stable sort ascending, then the running sum). p is a monotone function of x, so
//   that order is (key(x), index): a radix search on the keys finds the value whose tokens carry
//   the crossing, then the same search on the indices of the tokens of that value finds the first
//   kept one (ties in bf16 logits are common; among them the lower ids go first, as in the host's
//   stable sort).
// Each search level histograms the candidates into 16 bins per 4-bit digit. The bins live in
// registers (16 predicated adds per candidate, no atomics) and the masses are fixed-point
// integers (p * 2^62): integer sums do not depend on the reduction order, so the result is the
// same at every run and a level's bins add up exactly to the bin chosen above it. (Per token the
// fixed point is within 2^-63 of p, far below what a top_p threshold resolves.) Only candidates
// matching the digits chosen so far are weighed, so the exp of most tokens is evaluated in the
// first two levels only.
//
// Differences to the host, all in the last bits of double sums: the sums (softmax denominator,
// the mass searches, the renormalisation, the CDF) are accumulated in a fixed parallel order, not
// left to right; a token exactly at a top-p or CDF boundary can therefore go the other way than
// on the host. The host and the device draw from different random streams anyway, so a seed
// reproduces a run on the same device, not across devices.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cuda/pdl.cuh"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/small_ops.cuh"

namespace moex::ops::cuda {

namespace {

constexpr int kBlock = 1024;
constexpr int kWarps = kBlock / 32;
constexpr int kBins = 16;
constexpr unsigned kFull = 0xffffffffu;

struct Shared {
  unsigned long long bins[kWarps][kBins];
  unsigned long long bin_total[kBins];
  double d[kWarps];
  long long ll[kWarps];
  float f[kWarps];
  long long result;
};

struct ChooseParams {
  const void* logits;
  int code;
  int64_t V;
  bool sample;
  double temperature;
  int64_t top_k;
  double top_p;
  unsigned long long seed;
  int64_t* out;
  int64_t* nonfinite;  // [B] counts of NaN / inf logits per row, or null
};

// Order-preserving key of a float (larger float, larger key); -0 counts as +0, as comparisons do.
__device__ __forceinline__ uint32_t order_key(float x) {
  if (x == 0.0f) x = 0.0f;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// splitmix64 of (seed, row) -> a double in [0, 1) from the top 53 bits.
__device__ __forceinline__ double uniform(unsigned long long seed, int64_t row) {
  unsigned long long z = seed + (unsigned long long)(row + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1p-53;
}

__device__ __forceinline__ unsigned long long to_fixed(double p) { return __double2ull_rn(p * 0x1p62); }

// ---- block reductions: fixed trees (xor butterflies, then warps in order), so every thread gets
// the same value at every run. Each starts and ends with a barrier so Shared can be reused.

__device__ double block_sum(double v, Shared& sh) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(kFull, v, m);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.d[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < kWarps; ++w) s += sh.d[w];
  __syncthreads();
  return s;
}

__device__ long long block_max(long long v, Shared& sh) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = max(v, __shfl_xor_sync(kFull, v, m));
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.ll[threadIdx.x / 32] = v;
  __syncthreads();
  long long s = sh.ll[0];
  for (int w = 1; w < kWarps; ++w) s = max(s, sh.ll[w]);
  __syncthreads();
  return s;
}

// (value, index) with the larger value, the lower index on equal values; index < 0 = none.
__device__ __forceinline__ void argmax_combine(float& v, long long& i, float ov, long long oi) {
  if (oi < 0) return;
  if (i < 0 || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ void block_argmax(float& v, long long& i, Shared& sh) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, m);
    const long long oi = __shfl_xor_sync(kFull, i, m);
    argmax_combine(v, i, ov, oi);
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    sh.f[threadIdx.x / 32] = v;
    sh.ll[threadIdx.x / 32] = i;
  }
  __syncthreads();
  v = sh.f[0];
  i = sh.ll[0];
  for (int w = 1; w < kWarps; ++w) argmax_combine(v, i, sh.f[w], sh.ll[w]);
  __syncthreads();
}

// The smallest key K among the candidates with below + W(key <= K) > target, W the sum of
// weight(i) over candidates; on return `below` = below + W(key < K). include(i, key) says whether
// token i is a candidate and gives its key (its significant bits below top_shift + 4). Returns
// false when the candidates' whole weight is <= target - below (then nothing changes).
// Integer weights make every level's bins sum exactly to the bin chosen above it, so only the
// first level can fail.
template <class Include, class Weight>
__device__ bool radix_search(int64_t V, int top_shift, Include include, Weight weight,
                             unsigned long long target, unsigned long long& below, uint32_t& key_out,
                             Shared& sh) {
  uint32_t prefix = 0;
  for (int shift = top_shift; shift >= 0; shift -= 4) {
    unsigned long long acc[kBins];
#pragma unroll
    for (int b = 0; b < kBins; ++b) acc[b] = 0;
    for (int64_t i = threadIdx.x; i < V; i += kBlock) {
      uint32_t key;
      if (!include(i, key)) continue;
      if ((uint64_t(key) >> (shift + 4)) != (uint64_t(prefix) >> (shift + 4))) continue;
      const uint32_t d = (key >> shift) & (kBins - 1);
      const unsigned long long w = weight(i);
#pragma unroll
      for (int b = 0; b < kBins; ++b) acc[b] += d == uint32_t(b) ? w : 0ull;
    }
#pragma unroll
    for (int b = 0; b < kBins; ++b)
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) acc[b] += __shfl_xor_sync(kFull, acc[b], m);
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (int b = 0; b < kBins; ++b) sh.bins[threadIdx.x / 32][b] = acc[b];
    __syncthreads();
    if (threadIdx.x < kBins) {
      unsigned long long t = 0;
      for (int w = 0; w < kWarps; ++w) t += sh.bins[w][threadIdx.x];
      sh.bin_total[threadIdx.x] = t;
    }
    __syncthreads();
    unsigned long long cum = below;
    int digit = -1;
    for (int b = 0; b < kBins; ++b) {
      const unsigned long long m = sh.bin_total[b];
      if (cum + m > target) {
        digit = b;
        break;
      }
      cum += m;
    }
    __syncthreads();  // the bins are rewritten by the next level
    if (digit < 0) return false;
    below = cum;
    prefix |= uint32_t(digit) << shift;
  }
  key_out = prefix;
  return true;
}

__global__ void __launch_bounds__(kBlock) choose_tokens_kernel(const ChooseParams p) {
  moex::cuda::pdl_enter();
  __shared__ Shared sh;
  const int64_t row = blockIdx.x, V = p.V;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  auto load = [&](int64_t i) { return load_float(p.logits, p.code, row * V + i); };

  // ---- argmax over the non-NaN logits, lowest index on ties (each thread's indices increase,
  // so a strict > keeps its lowest); the host's scan returns 0 when x[0] is NaN.
  float best = -INFINITY;
  long long best_i = -1;
  double valid = 0, bad = 0;
  for (int64_t i = threadIdx.x; i < V; i += kBlock) {
    const float x = load(i);
    bad += isfinite(x) ? 0.0 : 1.0;
    if (x != x) continue;
    valid += 1.0;
    if (best_i < 0 || x > best) {
      best = x;
      best_i = i;
    }
  }
  block_argmax(best, best_i, sh);
  if (p.nonfinite) {
    const double n_bad = block_sum(bad, sh);
    if (threadIdx.x == 0) p.nonfinite[row] = int64_t(n_bad);
  }
  const bool x0_nan = load(0) != load(0);
  if (!p.sample) {
    if (threadIdx.x == 0) p.out[row] = (x0_nan || best_i < 0) ? 0 : best_i;
    return;
  }
  const int64_t n_valid = int64_t(block_sum(valid, sh));
  if (best_i < 0) {  // every logit NaN: nothing to draw from
    if (threadIdx.x == 0) p.out[row] = 0;
    return;
  }
  const double mx = double(best) / p.temperature;

  // ---- top-k: the support is key >= the k-th largest key (ties at the k-th value all stay).
  uint32_t kth_key = 0;
  if (p.top_k > 0 && p.top_k < n_valid) {
    unsigned long long below = 0;
    radix_search(
        V, 28,
        [&](int64_t i, uint32_t& key) {
          const float x = load(i);
          if (x != x) return false;
          key = order_key(x);
          return true;
        },
        [](int64_t) { return 1ull; }, (unsigned long long)(n_valid - p.top_k), below, kth_key, sh);
  }
  auto in_support = [&](float x, uint32_t& key) {
    if (x != x) return false;
    key = order_key(x);
    return key >= kth_key;
  };
  auto q_of = [&](float x) { return exp(double(x) / p.temperature - mx); };

  // ---- softmax denominator over the support.
  double s = 0;
  for (int64_t i = threadIdx.x; i < V; i += kBlock) {
    const float x = load(i);
    uint32_t key;
    if (in_support(x, key)) s += q_of(x);
  }
  const double sum = block_sum(s, sh);

  // ---- top-p: tokens before (cut_key, cut_index) in the ascending order are removed.
  const bool top_p = p.top_p < 1.0;
  uint32_t cut_key = 0;
  long long cut_index = 0;
  double sum2 = 1.0;
  if (top_p) {
    const unsigned long long thr = to_fixed(1.0 - p.top_p);
    auto mass = [&](int64_t i) { return to_fixed(q_of(load(i)) / sum); };
    unsigned long long below = 0;
    uint32_t kx = 0, ik = 0;
    const bool found = radix_search(
        V, 28, [&](int64_t i, uint32_t& key) { return in_support(load(i), key); }, mass, thr, below, kx, sh);
    // The most likely value always stays: it is the fallback when everything would go.
    cut_key = found ? kx : order_key(best);
    const int bits = V > 1 ? 64 - __clzll(V - 1) : 1;  // significant bits of the largest index
    const int index_shift = int((bits + 3) / 4 * 4) - 4;
    auto in_group = [&](int64_t i, uint32_t& key) {
      uint32_t k;
      if (!in_support(load(i), k) || k != cut_key) return false;
      key = uint32_t(i);
      return true;
    };
    if (found && radix_search(V, index_shift, in_group, mass, thr, below, ik, sh)) {
      cut_index = ik;
    } else {
      // Keep only the last token of the value (the host's last in its ascending order).
      long long last = -1;
      for (int64_t i = threadIdx.x; i < V; i += kBlock) {
        uint32_t k;
        if (in_group(i, k)) last = i;
      }
      cut_index = block_max(last, sh);
    }
    double s2 = 0;
    for (int64_t i = threadIdx.x; i < V; i += kBlock) {
      const float x = load(i);
      uint32_t key;
      if (in_support(x, key) && (key > cut_key || (key == cut_key && i >= cut_index))) s2 += q_of(x) / sum;
    }
    sum2 = block_sum(s2, sh);
  }
  auto prob = [&](int64_t i) -> double {
    const float x = load(i);
    uint32_t key;
    if (!in_support(x, key)) return 0.0;
    if (top_p && !(key > cut_key || (key == cut_key && i >= cut_index))) return 0.0;
    const double v = q_of(x) / sum;
    return top_p ? v / sum2 : v;
  };

  // ---- the draw: u < cumulative probability in index order. Warp w owns the contiguous chunk
  // [w * chunk, (w + 1) * chunk); the chunk totals give each warp its starting sum, the warp whose
  // interval holds u walks its chunk 32 tokens at a time with a warp scan.
  const double u = uniform(p.seed, row);
  const int64_t chunk = (V + kWarps - 1) / kWarps;
  const int64_t begin = min(V, warp * chunk), end = min(V, begin + chunk);
  double part = 0;
  long long last_nz = -1;
  for (int64_t i = begin + lane; i < end; i += 32) {
    const double q = prob(i);
    if (q > 0) {
      part += q;
      last_nz = i;
    }
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    part += __shfl_xor_sync(kFull, part, m);
    last_nz = max(last_nz, __shfl_xor_sync(kFull, last_nz, m));
  }
  if (lane == 0) {
    sh.d[warp] = part;
    sh.ll[warp] = last_nz;
  }
  if (threadIdx.x == 0) sh.result = -1;
  __syncthreads();
  double base = 0;
  for (int w = 0; w < warp; ++w) base += sh.d[w];
  const double next = base + sh.d[warp];  // the next warp's base, summed the same way
  if (u >= base && (warp == kWarps - 1 || u < next)) {
    double cum = base;
    bool hit = false;
    for (int64_t t0 = begin; t0 < end && !hit; t0 += 32) {
      const int64_t i = t0 + lane;
      const double q = i < end ? prob(i) : 0.0;
      double c = q;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const double o = __shfl_up_sync(kFull, c, off);
        if (lane >= off) c += o;
      }
      c += cum;
      const unsigned crossing = __ballot_sync(kFull, q > 0 && u < c);
      if (crossing) {
        hit = true;
        if (lane == __ffs(crossing) - 1) sh.result = i;
      }
      cum = __shfl_sync(kFull, c, 31);
    }
    if (!hit && lane == 0) {
      // Rounding left u at or past this chunk's end: its last token, else the row's last one.
      long long r = sh.ll[warp];
      for (int w = 0; w < kWarps && r < 0; ++w) r = max(r, sh.ll[kWarps - 1 - w]);
      sh.result = r >= 0 ? r : best_i;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) p.out[row] = sh.result >= 0 ? sh.result : best_i;
}

}  // namespace

std::vector<int64_t> choose_tokens(const Tensor& logits, const SamplingSpec* sampling, std::mt19937_64& rng,
                                   std::vector<int64_t>* nonfinite) {
  const int64_t B = logits.size(0), V = logits.size(1);
  ChooseParams p{};
  if (sampling) {
    if (!(sampling->temperature > 0.0f) || !(sampling->top_p > 0.0f && sampling->top_p <= 1.0f) ||
        sampling->top_k < 0)
      throw InvalidInput("choose_tokens: temperature " + std::to_string(sampling->temperature) + ", top_k " +
                         std::to_string(sampling->top_k) + ", top_p " + std::to_string(sampling->top_p) +
                         " (need temperature > 0, top_k >= 0, 0 < top_p <= 1)");
    p.sample = true;
    p.temperature = double(sampling->temperature);
    p.top_k = sampling->top_k;
    p.top_p = double(sampling->top_p);
    p.seed = rng();  // one draw per call, whatever the batch
  }
  std::vector<int64_t> ids(size_t(B), 0);
  if (B == 0) return ids;
  if (V < 1 || V > std::numeric_limits<int32_t>::max())
    throw Unsupported("choose_tokens: vocabulary of " + std::to_string(V) + " (the CUDA sampler takes 1..2^31-1)");
  if (B > std::numeric_limits<int32_t>::max()) throw Unsupported("choose_tokens: " + std::to_string(B) + " rows");
  p.code = float_code(logits.dtype(), "choose_tokens");
  p.logits = logits.raw();
  p.V = V;
  const Device dev = logits.device();
  moex::cuda::DeviceGuard g(dev.index);
  // ids, then the non-finite counts when asked for: one buffer, one download.
  Tensor out = Tensor::empty({nonfinite ? 2 * B : B}, DType::kI64, dev);
  p.out = out.data<int64_t>();
  p.nonfinite = nonfinite ? p.out + B : nullptr;
  cudaStream_t s = moex::cuda::current_stream();
  moex::cuda::launch_pdl_here(choose_tokens_kernel, dim3(unsigned(B)), dim3(kBlock), 0, s, p);
  MOEX_CUDA_CHECK_LAUNCH(choose_tokens_kernel);
  // The step's one download.
  std::vector<int64_t> all(size_t(nonfinite ? 2 * B : B));
  MOEX_CUDA_CHECK(cudaMemcpyAsync(all.data(), out.raw(), all.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
  MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
  std::copy(all.begin(), all.begin() + B, ids.begin());
  if (nonfinite) nonfinite->assign(all.begin() + B, all.end());
  return ids;
}

}  // namespace moex::ops::cuda
