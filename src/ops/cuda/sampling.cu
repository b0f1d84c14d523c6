// The next token of every row on CUDA (contract: ops.hpp; host: src/ops/cpu/sampling.cpp).
//
// One launch for all rows, one device->host copy of the B ids (choose_tokens) or none
// (choose_and_feed, inside a captured decode step). Greedy: an argmax split over each row
// (argmax_split_kernel; lowest id on ties, exactly the host's). Sampling, one block of kBlock
// threads per row, follows the host's warper order and double arithmetic: l = x / temperature,
// top-k, p = softmax(l), top-p, renormalise, draw by inverse CDF in index order. The uniform
// number of row b comes from a counter-based hash of (seed, b), the seed being one draw from the
// caller's generator per call (choose_and_feed: the feed's seed of that draw).
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
  // Feeding the next step on the device (choose_and_feed), else all null / 0:
  int32_t* step;                // the step's device mirror {past, pad[B], position[B], id[B]}
  int64_t* state;               // {draws made, completion ticket, stop token per row (-1: running)}
  const int64_t* eos;           // [n_eos]
  int64_t n_eos;
  const unsigned long long* seeds;  // [n_seeds]: the seed of draw i (sampling)
  int64_t n_seeds;
  int64_t rows;  // B
  // The split argmax (greedy): [rows * splits] partial results and a ticket per row, zero.
  struct Partial* partial;
  unsigned long long* row_ticket;
};

// One block's share of a row's argmax: its best (value, index) and its count of non-finite logits.
struct Partial {
  float v;
  long long i;
  long long bad;
};
static_assert(sizeof(Partial) == 3 * sizeof(int64_t));

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

// The token of row blockIdx.x (valid in thread 0; every thread returns the same value).
__device__ long long choose_row(const ChooseParams& p, unsigned long long seed, Shared& sh) {
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
  const int64_t n_valid = int64_t(block_sum(valid, sh));
  if (best_i < 0) return 0;  // every logit NaN: nothing to draw from
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
  const double u = uniform(seed, row);
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
  return sh.result >= 0 ? sh.result : best_i;
}

// choose_and_feed's epilogue, thread 0 of each row's block: the stop rule of generate (a row that
// stopped keeps feeding its stop token; a row choosing a stop token stops), the id into the out
// buffer and the mirror, then the last block to finish (a ticket) moves the step one column on.
// Only that block touches past, the positions and the draw counter, after every block has read
// them, so no block sees a half-advanced step.
__device__ void feed_row(const ChooseParams& p, int64_t row, long long id) {
  const int64_t B = p.rows;
  int64_t* stop = p.state + 2;
  if (stop[row] >= 0) {
    id = stop[row];
  } else {
    for (int64_t e = 0; e < p.n_eos; ++e)
      if (p.eos[e] == id) {
        stop[row] = id;
        break;
      }
  }
  p.out[row] = id;
  p.step[1 + 2 * B + row] = int32_t(id);
  __threadfence();
  const unsigned long long ticket = atomicAdd(reinterpret_cast<unsigned long long*>(p.state + 1), 1ull);
  if (ticket != (unsigned long long)(B - 1)) return;
  __threadfence();
  const int32_t past = p.step[0] + 1;  // one token per row: every row's column is `past`
  p.step[0] = past;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t pad = p.step[1 + b];
    p.step[1 + B + b] = past < pad ? 1 : past - pad;  // Step::position
  }
  p.state[0] += 1;
  p.state[1] = 0;
}

__global__ void __launch_bounds__(kBlock) choose_tokens_kernel(const ChooseParams p) {
  moex::cuda::pdl_enter();
  __shared__ Shared sh;
  unsigned long long seed = p.seed;
  if (p.state && p.n_seeds > 0) seed = p.seeds[min(p.state[0], p.n_seeds - 1)];
  const long long id = choose_row(p, seed, sh);
  if (threadIdx.x != 0) return;
  if (p.state) feed_row(p, blockIdx.x, id);
  else p.out[blockIdx.x] = id;
}

// Greedy choice split over the row: block (split, row) takes a contiguous chunk, kArgUnroll
// independent loads in flight per thread (one block per row waited on its loads one at a time:
// 34 us for a 151,936-token bf16 row on the H200, where the row is 0.3 MB), and the block that
// finishes its row last (a ticket) combines the row's partials in split order: the same
// (value, lowest index) and the same non-finite count as the one-block pass, whatever the order
// the blocks ran in.
constexpr int kArgBlock = 256;
constexpr int kArgUnroll = 8;
constexpr int kArgMaxSplits = 64;

int argmax_splits(int64_t V) {
  const int64_t per_block = int64_t(kArgBlock) * kArgUnroll * 2;
  return int(std::clamp<int64_t>((V + per_block - 1) / per_block, 1, kArgMaxSplits));
}

__global__ void __launch_bounds__(kArgBlock) argmax_split_kernel(const ChooseParams p) {
  moex::cuda::pdl_enter();
  __shared__ float sv[kArgBlock / 32];
  __shared__ long long si[kArgBlock / 32], sb[kArgBlock / 32];
  const int64_t row = blockIdx.y, V = p.V, base = row * V;
  const int split = blockIdx.x, S = gridDim.x;
  const int64_t chunk = (V + S - 1) / S;
  const int64_t begin = min(V, split * chunk), end = min(V, begin + chunk);
  float best = -INFINITY;
  long long best_i = -1, bad = 0;
  for (int64_t i0 = begin + threadIdx.x; i0 < end; i0 += int64_t(kArgBlock) * kArgUnroll) {
    float x[kArgUnroll];
#pragma unroll
    for (int u = 0; u < kArgUnroll; ++u) {
      const int64_t i = i0 + int64_t(u) * kArgBlock;
      x[u] = i < end ? load_float(p.logits, p.code, base + i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kArgUnroll; ++u) {  // a thread's indices increase: a strict > keeps its lowest
      const int64_t i = i0 + int64_t(u) * kArgBlock;
      if (i >= end) continue;
      bad += isfinite(x[u]) ? 0 : 1;
      if (x[u] != x[u]) continue;
      if (best_i < 0 || x[u] > best) {
        best = x[u];
        best_i = i;
      }
    }
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const float ov = __shfl_xor_sync(kFull, best, m);
    const long long oi = __shfl_xor_sync(kFull, best_i, m);
    argmax_combine(best, best_i, ov, oi);
    bad += __shfl_xor_sync(kFull, bad, m);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
    sb[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kArgBlock / 32; ++w) {
    argmax_combine(best, best_i, sv[w], si[w]);
    bad += sb[w];
  }
  p.partial[row * S + split] = Partial{best, best_i, bad};
  __threadfence();
  if (atomicAdd(p.row_ticket + row, 1ull) != (unsigned long long)(S - 1)) return;
  __threadfence();
  best = -INFINITY;
  best_i = -1;
  bad = 0;
  for (int k = 0; k < S; ++k) {  // in split order; L2 reads (other blocks wrote them)
    const Partial* q = p.partial + row * S + k;
    argmax_combine(best, best_i, __ldcg(&q->v), __ldcg(&q->i));
    bad += __ldcg(&q->bad);
  }
  p.row_ticket[row] = 0;
  if (p.nonfinite) p.nonfinite[row] = bad;
  const float x0 = load_float(p.logits, p.code, base);
  const long long id = (x0 != x0 || best_i < 0) ? 0 : best_i;  // the host's scan returns 0 when x[0] is NaN
  if (p.state) feed_row(p, row, id);
  else p.out[row] = id;
}

}  // namespace

namespace {

// The kernel's parameters for logits [B, V] (the seed and the outputs are the caller's).
ChooseParams params_for(const Tensor& logits, const SamplingSpec* sampling, const char* what) {
  const int64_t B = logits.size(0), V = logits.size(1);
  ChooseParams p{};
  if (sampling) {
    if (!(sampling->temperature > 0.0f) || !(sampling->top_p > 0.0f && sampling->top_p <= 1.0f) ||
        sampling->top_k < 0)
      throw InvalidInput(std::string(what) + ": temperature " + std::to_string(sampling->temperature) + ", top_k " +
                         std::to_string(sampling->top_k) + ", top_p " + std::to_string(sampling->top_p) +
                         " (need temperature > 0, top_k >= 0, 0 < top_p <= 1)");
    p.sample = true;
    p.temperature = double(sampling->temperature);
    p.top_k = sampling->top_k;
    p.top_p = double(sampling->top_p);
  }
  if (B > 0 && (V < 1 || V > std::numeric_limits<int32_t>::max()))
    throw Unsupported(std::string(what) + ": vocabulary of " + std::to_string(V) +
                      " (the CUDA sampler takes 1..2^31-1)");
  if (B > std::numeric_limits<int32_t>::max()) throw Unsupported(std::string(what) + ": " + std::to_string(B) + " rows");
  p.code = float_code(logits.dtype(), what);
  p.logits = logits.raw();
  p.V = V;
  return p;
}

// Uploads `v` into t (in place when t already holds v.size() int64 on `device`).
void upload_i64(Tensor& t, const std::vector<int64_t>& v, Device device) {
  if (v.empty()) {
    t = Tensor();
    return;
  }
  if (!(t.defined() && t.device() == device && t.numel() == int64_t(v.size())))
    t = Tensor::empty({int64_t(v.size())}, DType::kI64, device);
  // Pageable: staged before the call returns, ordered before the kernels that read it.
  MOEX_CUDA_CHECK(cudaMemcpyAsync(t.raw(), v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                                  moex::cuda::current_stream()));
}

// The greedy choice runs split over each row (argmax_split_kernel: the caller has set
// p.partial and p.row_ticket, argmax_splits(V) partials per row and the tickets at zero), a draw
// one block per row.
void launch_choice(ChooseParams& p, int64_t B, cudaStream_t s) {
  p.rows = B;
  if (p.sample) {
    moex::cuda::launch_pdl_here(choose_tokens_kernel, dim3(unsigned(B)), dim3(kBlock), 0, s, p);
    MOEX_CUDA_CHECK_LAUNCH(choose_tokens_kernel);
    return;
  }
  if (B > 65535) throw Unsupported("choose_tokens: " + std::to_string(B) + " rows (the greedy grid takes 65,535)");
  moex::cuda::launch_pdl_here(argmax_split_kernel, dim3(unsigned(argmax_splits(p.V)), unsigned(B)), dim3(kArgBlock), 0,
                              s, p);
  MOEX_CUDA_CHECK_LAUNCH(argmax_split_kernel);
}

}  // namespace

std::vector<int64_t> choose_tokens(const Tensor& logits, const SamplingSpec* sampling, std::mt19937_64& rng,
                                   std::vector<int64_t>* nonfinite) {
  const int64_t B = logits.size(0);
  ChooseParams p = params_for(logits, sampling, "choose_tokens");
  if (sampling) p.seed = rng();  // one draw per call, whatever the batch
  std::vector<int64_t> ids(size_t(B), 0);
  if (B == 0) return ids;
  const Device dev = logits.device();
  moex::cuda::DeviceGuard g(dev.index);
  // ids, then the non-finite counts when asked for: one buffer, one download.
  Tensor out = Tensor::empty({nonfinite ? 2 * B : B}, DType::kI64, dev);
  p.out = out.data<int64_t>();
  p.nonfinite = nonfinite ? p.out + B : nullptr;
  cudaStream_t s = moex::cuda::current_stream();
  Tensor work;  // the split argmax's partials and row tickets (zeroed); lives until the launch is enqueued
  if (!sampling) {
    const int64_t splits = argmax_splits(p.V);
    work = Tensor::empty({B * (3 * splits + 1)}, DType::kI64, dev);
    MOEX_CUDA_CHECK(cudaMemsetAsync(work.data<int64_t>() + B * 3 * splits, 0, size_t(B) * sizeof(int64_t), s));
    p.partial = reinterpret_cast<Partial*>(work.raw());
    p.row_ticket = reinterpret_cast<unsigned long long*>(work.data<int64_t>() + B * 3 * splits);
  }
  launch_choice(p, B, s);
  // The step's one download.
  std::vector<int64_t> all(size_t(nonfinite ? 2 * B : B));
  MOEX_CUDA_CHECK(cudaMemcpyAsync(all.data(), out.raw(), all.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
  MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
  std::copy(all.begin(), all.begin() + B, ids.begin());
  if (nonfinite) nonfinite->assign(all.begin() + B, all.end());
  return ids;
}

void make_device_feed(DeviceFeed& feed, const std::vector<int64_t>& stop_token, const std::vector<int64_t>& eos,
                      const std::vector<uint64_t>& seeds, Device device) {
  const int64_t B = int64_t(stop_token.size());
  if (B < 1 || B > std::numeric_limits<int32_t>::max())
    throw InvalidInput("make_device_feed: " + std::to_string(B) + " rows");
  moex::cuda::DeviceGuard g(device.index);
  std::vector<int64_t> state(size_t(2 + 2 * B), 0);  // the row tickets of the split argmax at 0
  std::copy(stop_token.begin(), stop_token.end(), state.begin() + 2);
  upload_i64(feed.state, state, device);
  if (!(feed.work.defined() && feed.work.device() == device && feed.work.numel() == B * 3 * kArgMaxSplits))
    feed.work = Tensor::empty({B * 3 * kArgMaxSplits}, DType::kI64, device);
  upload_i64(feed.eos, eos, device);
  upload_i64(feed.seeds, std::vector<int64_t>(seeds.begin(), seeds.end()), device);
  if (!(feed.out.defined() && feed.out.device() == device && feed.out.numel() == 2 * B))
    feed.out = Tensor::empty({2 * B}, DType::kI64, device);
}

void choose_and_feed(const Tensor& logits, const SamplingSpec* sampling, Step& step, DeviceFeed& feed) {
  const int64_t B = logits.size(0);
  const Device dev = logits.device();
  if (step.tokens != 1 || step.batch != B)
    throw InvalidInput("choose_and_feed: a step of " + std::to_string(step.batch) + " x " +
                       std::to_string(step.tokens) + " tokens for " + std::to_string(B) +
                       " rows of logits (it feeds one token per row)");
  if (!step.device.defined() || step.device.device() != dev || step.device.numel() != 1 + 3 * B)
    throw InvalidInput("choose_and_feed: the step has no device mirror on " + dev.str() + " (make_device_step)");
  if (!feed.state.defined() || feed.state.device() != dev || feed.state.numel() != 2 + 2 * B ||
      !feed.out.defined() || feed.out.numel() != 2 * B || !feed.work.defined() ||
      feed.work.numel() != B * 3 * kArgMaxSplits)
    throw InvalidInput("choose_and_feed: the feed was not made for " + std::to_string(B) + " rows on " + dev.str() +
                       " (make_device_feed)");
  if (sampling && !feed.seeds.defined())
    throw InvalidInput("choose_and_feed: sampling needs the feed's seeds");
  ChooseParams p = params_for(logits, sampling, "choose_and_feed");
  p.out = feed.out.data<int64_t>();
  p.nonfinite = p.out + B;
  p.step = step.device.data<int32_t>();
  p.state = feed.state.data<int64_t>();
  p.eos = feed.eos.defined() ? feed.eos.data<int64_t>() : nullptr;
  p.n_eos = feed.eos.defined() ? feed.eos.numel() : 0;
  p.seeds = sampling ? reinterpret_cast<const unsigned long long*>(feed.seeds.raw()) : nullptr;
  p.n_seeds = sampling ? feed.seeds.numel() : 0;
  p.partial = reinterpret_cast<Partial*>(feed.work.raw());  // kArgMaxSplits partials per row
  p.row_ticket = reinterpret_cast<unsigned long long*>(feed.state.data<int64_t>() + 2 + B);
  moex::cuda::DeviceGuard g(dev.index);
  launch_choice(p, B, moex::cuda::current_stream());
}

}  // namespace moex::ops::cuda
