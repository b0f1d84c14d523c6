// What a dependency costs in a batch-1 decode step: the same chain of a Qwen1.5-MoE-shaped
// layer's steps (24 layers, 172 MB of bf16 weights each, none shared, so L2 holds none) run as
// one kernel per step (as the library does, with and without programmatic dependent launch) and
// as one persistent kernel whose resident blocks pass a grid barrier between the steps and load
// the next step's first weights before waiting at it.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a lab/cuda/decode_chain_lab.cu -o decode_chain_lab
//   ./decode_chain_lab [REPLAYS]     (default 20)
//
// Measured on an H100 (2026-12-07, docs/gpu_model.md, docs/measurements/h100_2026-12-07_decode_chain_lab.log):
// one kernel per step with PDL 84.9 us per layer (65.7 % of the floor), persistent kernels 96-124 us
// at every residency, with or without the load ahead; on one-block steps alone a barrier costs no
// less than a PDL boundary (3.6-4.1 us against 3.5). The library keeps one kernel per step.
//
// Why: the decode trace (docs/gpu_model.md) puts a layer at ~83 us on the H100 against ~56 us of
// bytes, with almost no time between kernels; what is left is the ramp of each dependent kernel
// (its blocks start, wait, stream, drain) along the layer's chain. A persistent layer keeps the
// blocks resident, so the question this answers before building one is whether a grid barrier
// with the next weights already in flight costs less than a kernel boundary with PDL.
//
// One layer, in order (K of each GEMV = the length of the step before it):
//   qkv GEMV 6144 x 2048 -> tiny (attention's place: one block, 6144 -> 2048)
//   -> o GEMV 2048 x 2048 -> router + shared gate / up GEMV 11328 x 2048
//   -> tiny (top-k's place: one block, 11328 -> 2048) -> experts gate / up GEMV 11264 x 2048
//   -> activation (silu(a) * b, every block, 11264 -> 5632) -> down GEMV 4096 x 5632 (routed and
//   shared) -> tiny (the join's place: one block, 4096 -> 2048)
// The GEMV is the library's one-row form (src/ops/cuda/linear_gemv.cu: 8 warps split K in
// 256-element chunks, 4 columns per group, the next chunk loaded before the current one is used,
// a grid of a few blocks per SM walking the groups). Every variant runs the same arithmetic per
// column group in the same order, so the step's final vector must be bit-identical across
// variants; each prints whether it is.
//
// Variants (all captured in a CUDA graph of one whole step, replayed; us per step, per layer, and
// the fraction of the floor = the step's weight bytes at the measured read bandwidth):
//   launches        one kernel per step, plain stream order;
//   launches+pdl    the same with programmatic dependent launch (weights before griddepcontrol.wait);
//   persistent/N    one kernel for the whole step, N blocks per SM (1, 2, 3), a grid barrier per step,
//                   the block's first chunk of the next GEMV loaded before it waits;
//   persistent/N np the same without that load ahead (what the load ahead is worth);
//   layer/N         one persistent kernel per layer (24 launches with PDL between them).
// Then the same variants on a chain of as many one-block steps and no GEMV: what a boundary costs
// by itself, kernel or barrier.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8, kColumns = 4, kChunk = 256, kThreads = kWarps * 32;

enum Kind : int { kGemv = 0, kTiny = 1, kAct = 2 };

// One step of the chain: y = f(x), x being the previous step's y.
struct Phase {
  int kind;
  int N, K;  // GEMV: y [N] = W [N, K] x [K]; tiny / act: y [N] from x [K]
  const bf16* w;
  const bf16* x;
  bf16* y;
};

__device__ __forceinline__ void widen8(const uint4& v, float* f) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// x is written by another block of the same persistent kernel: read it at L2 (ld.global.cg),
// never through the non-coherent path. The launched variants read it the same way.
__device__ __forceinline__ uint4 load_act(const bf16* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ float act1(const bf16* p) { return __bfloat162float(__ldcg(p)); }

// The column group a block works on, and the load of one chunk of its 4 rows.
struct Group {
  const bf16* w;
  int K, n0, cols;  // cols == 0: none
};
__device__ __forceinline__ Group group_of(const Phase& p, int g) {
  Group r{p.w, p.K, g * kColumns, 0};
  if (p.kind == kGemv && g * kColumns < p.N) r.cols = min(kColumns, p.N - g * kColumns);
  return r;
}
__device__ __forceinline__ void load_w(const Group& g, int k, uint4* wv) {
#pragma unroll
  for (int c = 0; c < kColumns; ++c)
    wv[c] = (c < g.cols && k < g.K) ? __ldcs(reinterpret_cast<const uint4*>(g.w + size_t(g.n0 + c) * g.K + k))
                                    : make_uint4(0, 0, 0, 0);
}

// Groups b, b + stride, ... of a GEMV phase; wv holds the first chunk of the first group on entry
// and, on exit, the first chunk of `after` (the block's first group of the next GEMV phase).
__device__ void gemv_groups(const Phase& p, int b, int stride, uint4* wv, const Group& after) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int k0 = warp * kChunk + lane * 8, step = kWarps * kChunk;
  __shared__ float part[kWarps][kColumns];
  const int groups = (p.N + kColumns - 1) / kColumns;
  if (b >= groups && after.cols) load_w(after, k0, wv);  // a block without a group here
  for (int g = b; g < groups; g += stride) {
    const Group cur = group_of(p, g);
    const Group next = g + stride < groups ? group_of(p, g + stride) : after;
    float acc[kColumns] = {0.f, 0.f, 0.f, 0.f};
    for (int k = k0; k < p.K; k += step) {
      float wf[kColumns][8];
#pragma unroll
      for (int c = 0; c < kColumns; ++c) widen8(wv[c], wf[c]);
      if (k + step < p.K) load_w(cur, k + step, wv);
      else if (next.cols) load_w(next, k0, wv);
      float xf[8];
      widen8(load_act(p.x + k), xf);
#pragma unroll
      for (int c = 0; c < kColumns; ++c)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[c] = fmaf(xf[i], wf[c][i], acc[c]);
    }
    if (k0 >= p.K && next.cols) load_w(next, k0, wv);  // a warp without a chunk of this K
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      float v = acc[c];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][c] = v;
    }
    __syncthreads();
    if (threadIdx.x < cur.cols) {
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) v += part[q][threadIdx.x];
      p.y[cur.n0 + threadIdx.x] = __float2bfloat16_rn(v);
    }
    __syncthreads();
  }
}

// The stand-ins for the latency-bound steps: one block folds x [K] into y [N] (N <= K), a
// dependent chain of a few L2 round trips like rope, the attention combine, top-k or the join.
__device__ void tiny(const Phase& p) {
  for (int i = threadIdx.x; i < p.N; i += blockDim.x) {
    float v = act1(p.x + i);
    for (int j = i + p.N; j < p.K; j += p.N) v = fmaf(0.5f, act1(p.x + j), v);
    p.y[i] = __float2bfloat16_rn(v * 0.5f);
  }
}
// The gated activation: y[i] = silu(x[i]) * x[i + N], spread over every block.
__device__ void activation(const Phase& p, int b, int nb) {
  for (int i = b * blockDim.x + threadIdx.x; i < p.N; i += nb * blockDim.x) {
    const float a = act1(p.x + i), g = act1(p.x + i + p.N);
    p.y[i] = __float2bfloat16_rn(a / (1.f + __expf(-a)) * g);
  }
}

// ---- one kernel per step ----

__global__ void __launch_bounds__(kThreads) gemv_launch(Phase p) {
  uint4 wv[kColumns];
  const int k0 = (threadIdx.x >> 5) * kChunk + (threadIdx.x & 31) * 8;
  load_w(group_of(p, blockIdx.x), k0, wv);  // weights: no kernel writes them (before the wait)
  pdl_wait();
  pdl_trigger();
  gemv_groups(p, blockIdx.x, gridDim.x, wv, Group{nullptr, 0, 0, 0});
}
__global__ void __launch_bounds__(kThreads) tiny_launch(Phase p) {
  pdl_wait();
  pdl_trigger();
  tiny(p);
}
__global__ void __launch_bounds__(kThreads) act_launch(Phase p) {
  pdl_wait();
  pdl_trigger();
  activation(p, blockIdx.x, gridDim.x);
}

// ---- one persistent kernel for phases [first, last) ----

// Every block of the grid arrives once per barrier; `target` = arrivals expected so far. The
// writes before it are published by the fence and the atomic; the reads after it see them (x is
// read at L2).
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count, 1u);
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

// kMinBlocks: the blocks per SM the registers are bounded for (3 needs <= 85 per thread).
template <bool kAhead, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    chain_persistent(const Phase* __restrict__ phases, int first, int last, unsigned* count, int pdl) {
  const int b = blockIdx.x, nb = gridDim.x;
  const int k0 = (threadIdx.x >> 5) * kChunk + (threadIdx.x & 31) * 8;
  auto next_gemv = [&](int from) {
    for (int q = from; q < last; ++q)
      if (phases[q].kind == kGemv) return group_of(phases[q], b);
    return Group{nullptr, 0, 0, 0};
  };
  uint4 wv[kColumns];
  Group first_group = next_gemv(first);
  if (first_group.cols) load_w(first_group, k0, wv);
  if (pdl) {
    pdl_wait();
    pdl_trigger();
  }
  unsigned arrivals = 0;
  for (int q = first; q < last; ++q) {
    const Phase p = phases[q];
    if (p.kind == kGemv) {
      const Group after = kAhead ? next_gemv(q + 1) : Group{nullptr, 0, 0, 0};
      gemv_groups(p, b, nb, wv, after);
    } else if (p.kind == kTiny) {
      if (b == 0) tiny(p);
    } else {
      activation(p, b, nb);
    }
    if (q + 1 < last) {
      arrivals += nb;
      grid_barrier(count, arrivals);
      if (!kAhead && phases[q + 1].kind == kGemv) load_w(group_of(phases[q + 1], b), k0, wv);
    }
  }
}

// The ceiling: read every byte once.
__global__ void read_all(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    s ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (s == 0x12345678u) *sink = s;
}

// How a kernel is launched: plain stream order, as a programmatic dependent of the kernel before
// it (PDL), or cooperatively (every block resident at once: the whole-step persistent kernel,
// whose barrier needs that).
enum class Launch { kPlain, kPdl, kCooperative };
template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), int grid, Launch how, cudaStream_t st, Args... args) {
  cudaLaunchAttribute attr[1];
  if (how == Launch::kPdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
  } else {
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = how == Launch::kPlain ? 0 : 1;
  CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

int main(int argc, char** argv) {
  const int replays = argc > 1 ? std::atoi(argv[1]) : 20;
  constexpr int kLayers = 24;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));

  struct Shape {
    Kind kind;
    int N, K;
  };
  const Shape layer[] = {{kGemv, 6144, 2048},  {kTiny, 2048, 6144}, {kGemv, 2048, 2048},
                         {kGemv, 11328, 2048}, {kTiny, 2048, 11328}, {kGemv, 11264, 2048},
                         {kAct, 5632, 11264},  {kGemv, 4096, 5632},  {kTiny, 2048, 4096}};
  constexpr int kSteps = sizeof(layer) / sizeof(layer[0]);

  // Weights: every layer its own, uniform in +-sqrt(3 / K) (the output keeps x's scale).
  size_t wbytes_layer = 0;
  for (const Shape& s : layer)
    if (s.kind == kGemv) wbytes_layer += size_t(s.N) * s.K * 2;
  const size_t wbytes = wbytes_layer * kLayers;
  bf16* wall;
  CK(cudaMalloc(&wall, wbytes));
  {
    std::vector<bf16> h;
    size_t at = 0;
    unsigned r = 12345;
    for (int l = 0; l < kLayers; ++l)
      for (const Shape& s : layer) {
        if (s.kind != kGemv) continue;
        const size_t n = size_t(s.N) * s.K;
        h.resize(n);
        const float a = std::sqrt(3.f / float(s.K));
        for (auto& v : h) {
          r = r * 1664525u + 1013904223u;
          v = __float2bfloat16(a * (float(r >> 8) / 8388608.f - 1.f));
        }
        CK(cudaMemcpy(wall + at, h.data(), n * 2, cudaMemcpyHostToDevice));
        at += n;
      }
  }
  // Activations: the step's input x0 [2048] and one output per step of the layer (reused by
  // every layer; the next layer's first step reads the last step's output).
  bf16* x0;
  CK(cudaMalloc(&x0, 2048 * 2));
  {
    std::vector<bf16> h(2048);
    for (int i = 0; i < 2048; ++i) h[size_t(i)] = __float2bfloat16(float((i * 37) % 101 - 50) / 50.f);
    CK(cudaMemcpy(x0, h.data(), 2048 * 2, cudaMemcpyHostToDevice));
  }
  std::vector<bf16*> ybuf(kSteps);
  for (int s = 0; s < kSteps; ++s) CK(cudaMalloc(&ybuf[size_t(s)], size_t(layer[s].N) * 2));

  std::vector<Phase> phases;
  {
    size_t at = 0;
    for (int l = 0; l < kLayers; ++l)
      for (int s = 0; s < kSteps; ++s) {
        Phase p{layer[s].kind, layer[s].N, layer[s].K, nullptr, nullptr, ybuf[size_t(s)]};
        p.x = s > 0 ? ybuf[size_t(s - 1)] : l > 0 ? ybuf[kSteps - 1] : x0;
        if (p.kind == kGemv) {
          p.w = wall + at;
          at += size_t(p.N) * p.K;
        }
        phases.push_back(p);
      }
  }
  unsigned *count, *sink;
  CK(cudaMalloc(&count, kLayers * sizeof(unsigned)));
  CK(cudaMalloc(&sink, 4));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  int fit = 0, fit3 = 0, fit_np = 0, fit_gemv = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, chain_persistent<true, 1>, kThreads, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit3, chain_persistent<true, 3>, kThreads, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit_np, chain_persistent<false, 1>, kThreads, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit_gemv, gemv_launch, kThreads, 0));
  std::printf("%s, %d SMs; 24 layers x %.1f MB of weights; blocks per SM that fit: persistent %d (bounded for "
              "3: %d), without the load ahead %d, one-step GEMV %d (the library's grid: min(4, that))\n",
              prop.name, sms, wbytes_layer / 1e6, fit, fit3, fit_np, fit_gemv);

  // The floor: one read of all weights (grid-stride, 4 blocks of 512 per SM), median of 5.
  double read_gbs = 0;
  {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> v;
    for (int i = 0; i < 6; ++i) {
      CK(cudaEventRecord(a, st));
      read_all<<<4 * sms, 512, 0, st>>>(reinterpret_cast<const uint4*>(wall), wbytes / 16, sink);
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (i) v.push_back(wbytes / (ms * 1e-3) / 1e9);
    }
    std::sort(v.begin(), v.end());
    read_gbs = v[v.size() / 2];
  }
  const double floor_us = wbytes / (read_gbs * 1e9) * 1e6;
  std::printf("read of the step's %.2f GB: %.0f GB/s -> floor %.1f us per step (%.2f us per layer)\n\n",
              wbytes / 1e9, read_gbs, floor_us, floor_us / kLayers);

  // A chain of phases on the device, its last output, and the first variant's result.
  struct Chain {
    std::vector<Phase> host;
    Phase* dev = nullptr;
    int layers = 0, steps = 0;
    bf16* out = nullptr;
    int out_n = 0;
    double floor_us = 0;
    std::vector<bf16> ref;
  };
  auto upload = [&](Chain& c) {
    CK(cudaMalloc(&c.dev, c.host.size() * sizeof(Phase)));
    CK(cudaMemcpy(c.dev, c.host.data(), c.host.size() * sizeof(Phase), cudaMemcpyHostToDevice));
  };
  Chain layers_chain;
  layers_chain.host = phases;
  layers_chain.layers = kLayers;
  layers_chain.steps = kSteps;
  layers_chain.out = ybuf[kSteps - 1];
  layers_chain.out_n = 2048;
  layers_chain.floor_us = floor_us;
  upload(layers_chain);

  const int gemv_grid = std::min(4, fit_gemv) * sms;  // the library's one-row grid (gemv_grid)
  auto enqueue_launches = [&](const Chain& c, bool pdl) {
    for (const Phase& p : c.host) {
      const Launch how = pdl ? Launch::kPdl : Launch::kPlain;
      if (p.kind == kGemv) launch(gemv_launch, std::min(gemv_grid, (p.N + kColumns - 1) / kColumns), how, st, p);
      else if (p.kind == kTiny) launch(tiny_launch, 1, how, st, p);
      else launch(act_launch, (p.N + kThreads - 1) / kThreads, how, st, p);
    }
  };
  auto enqueue_persistent = [&](const Chain& c, bool ahead, int per_sm, bool per_layer) {
    CK(cudaMemsetAsync(count, 0, kLayers * sizeof(unsigned), st));
    auto k = !ahead ? chain_persistent<false, 1> : per_sm >= 3 ? chain_persistent<true, 3> : chain_persistent<true, 1>;
    const int grid = per_sm * sms;
    if (!per_layer) {
      launch(k, grid, Launch::kCooperative, st, (const Phase*)c.dev, 0, int(c.host.size()), count, 0);
      return;
    }
    for (int l = 0; l < c.layers; ++l)
      launch(k, grid, l > 0 ? Launch::kPdl : Launch::kPlain, st, (const Phase*)c.dev, l * c.steps, (l + 1) * c.steps,
             count + l, l > 0 ? 1 : 0);
  };

  auto run = [&](Chain& c, const char* name, auto enqueue) {
    std::vector<bf16> got(size_t(c.out_n));
    enqueue();
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    CK(cudaMemcpy(got.data(), c.out, got.size() * 2, cudaMemcpyDeviceToHost));
    bool finite = true;
    for (bf16 v : got) finite = finite && std::isfinite(__bfloat162float(v));
    if (c.ref.empty()) c.ref = got;
    const bool same = std::memcmp(c.ref.data(), got.data(), got.size() * 2) == 0;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    enqueue();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    std::vector<double> us;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int r = 0; r < replays; ++r) {
      CK(cudaEventRecord(a, st));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      us.push_back(ms * 1e3);
    }
    CK(cudaMemcpy(got.data(), c.out, got.size() * 2, cudaMemcpyDeviceToHost));
    const bool same_replay = std::memcmp(c.ref.data(), got.data(), got.size() * 2) == 0;
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    std::printf("%-24s %9.1f us per step (min %.1f)  %6.2f us per layer", name, med, us.front(), med / c.layers);
    if (c.floor_us > 0) std::printf("  %5.1f %% of floor", 100.0 * c.floor_us / med);
    std::printf("  output %s%s\n", same && same_replay ? "bit-identical" : "DIFFERS", finite ? "" : " (NOT FINITE)");
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
  };

  auto variants = [&](Chain& c) {
    run(c, "launches", [&] { enqueue_launches(c, false); });
    run(c, "launches+pdl", [&] { enqueue_launches(c, true); });
    for (int per_sm : {1, 2, 3}) {
      char name[64];
      if (per_sm <= (per_sm >= 3 ? fit3 : fit)) {
        std::snprintf(name, sizeof name, "persistent/%d", per_sm);
        run(c, name, [&] { enqueue_persistent(c, true, per_sm, false); });
      }
      if (per_sm <= fit_np) {
        std::snprintf(name, sizeof name, "persistent/%d np", per_sm);
        run(c, name, [&] { enqueue_persistent(c, false, per_sm, false); });
      }
      if (per_sm <= (per_sm >= 3 ? fit3 : fit)) {
        std::snprintf(name, sizeof name, "layer/%d", per_sm);
        run(c, name, [&] { enqueue_persistent(c, true, per_sm, true); });
      }
    }
    run(c, "launches+pdl (again)", [&] { enqueue_launches(c, true); });
  };
  std::printf("== the layer chain (9 steps per layer, 5 of them GEMVs)\n");
  variants(layers_chain);

  // The boundaries alone: the same number of steps, every one a one-block tiny step (2048 values
  // from 4096: a step's cost is then its dependency plus a few L2 round trips).
  Chain tiny_chain;
  tiny_chain.layers = kLayers;
  tiny_chain.steps = kSteps;
  bf16* tbuf[2];
  for (auto& t : tbuf) {
    CK(cudaMalloc(&t, 4096 * 2));
    CK(cudaMemcpy(t, ybuf[0], 4096 * 2, cudaMemcpyDeviceToDevice));  // any finite values
  }
  for (int i = 0; i < kLayers * kSteps; ++i)
    tiny_chain.host.push_back(Phase{kTiny, 2048, 4096, nullptr, tbuf[i & 1], tbuf[(i + 1) & 1]});
  tiny_chain.out = tbuf[(kLayers * kSteps) & 1];
  tiny_chain.out_n = 2048;
  upload(tiny_chain);
  std::printf("\n== %d one-block steps only (what a boundary costs)\n", kLayers * kSteps);
  variants(tiny_chain);
  return 0;
}
