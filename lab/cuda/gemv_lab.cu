// Decode GEMV shapes (one row of x against a bf16 weight [N, K]) timed for several kernel
// layouts against a plain read of the same bytes, to see how far the projections of a batch-1
// decode step are from the bandwidth and which layout closes the gap.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a lab/cuda/gemv_lab.cu -o gemv_lab && ./gemv_lab
//
// Each shape cycles over enough weight copies (>= 400 MB) that L2 holds none of them, and each
// variant's output is checked against the split-K kernel moex uses (src/ops/cuda/linear_gemv.cu).
// Times: a CUDA graph of 64 back-to-back launches (as in a replayed decode step), per launch.
//
// Measured (H200, 2026-12-01): a plain read of 8 / 25 / 46 MB reaches only 2.4 / 3.4 / 3.7 TB/s
// per launch (the start and drain of a launch cost ~1.7 us), moex's split-K kernel comes within
// 15-20 % of it, and two columns per block beat four by 7-14 % here; inside a decode step
// (lab/cuda/decode_step_profile.sh, where the weights are prefetched before the PDL wait) two
// columns were 7-9 % slower, so the library keeps four. The lever left is fewer, larger launches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void widen8(const uint4& v, float* f) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// A: moex's kernel. Block of W warps owns C columns; warps split K in 256-element chunks.
template <int W, int C>
__global__ void __launch_bounds__(W * 32) splitk(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                 bf16* __restrict__ y, int K, int N) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * C;
  const int cols = min(C, N - n0);
  float acc[C];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.f;
  for (int k = warp * 256 + lane * 8; k < K; k += W * 256) {
    uint4 wv[C];
#pragma unroll
    for (int c = 0; c < C; ++c)
      wv[c] = c < cols ? __ldcs(reinterpret_cast<const uint4*>(w + size_t(n0 + c) * K + k)) : make_uint4(0, 0, 0, 0);
    float xf[8];
    widen8(__ldg(reinterpret_cast<const uint4*>(x + k)), xf);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float wf[8];
      widen8(wv[c], wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[c] = fmaf(xf[i], wf[i], acc[c]);
    }
  }
  __shared__ float part[W][C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float v = acc[c];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) part[warp][c] = v;
  }
  __syncthreads();
  if (threadIdx.x < cols) {
    float v = 0.f;
    for (int q = 0; q < W; ++q) v += part[q][threadIdx.x];
    y[n0 + threadIdx.x] = __float2bfloat16_rn(v);
  }
}

// B: a warp owns C whole columns and walks K with U chunks (512 B per column each) in flight;
// no shared memory, no barrier.
template <int C, int U>
__global__ void __launch_bounds__(128) warp_rows(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                 bf16* __restrict__ y, int K, int N) {
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * C;
  if (n0 >= N) return;
  float acc[C];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.f;
  for (int k0 = lane * 8; k0 < K; k0 += 256 * U) {
    uint4 wv[U][C];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int k = k0 + u * 256;
        wv[u][c] = (k < K && n0 + c < N) ? __ldcs(reinterpret_cast<const uint4*>(w + size_t(n0 + c) * K + k))
                                         : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * 256;
      if (k >= K) break;
      float xf[8];
      widen8(__ldg(reinterpret_cast<const uint4*>(x + k)), xf);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        float wf[8];
        widen8(wv[u][c], wf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[c] = fmaf(xf[i], wf[i], acc[c]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float v = acc[c];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && n0 + c < N) y[n0 + c] = __float2bfloat16_rn(v);
  }
}

// C: persistent split-K: a fixed grid of blocks walks the column groups, loading the next
// group's weights before reducing the current one (K <= 8 warps x 256 only: one chunk per warp).
template <int C>
__global__ void __launch_bounds__(256) persistent(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                  bf16* __restrict__ y, int K, int N) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = (N + C - 1) / C;
  const int k = warp * 256 + lane * 8;
  const bool kin = k < K;
  float xf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (kin) widen8(__ldg(reinterpret_cast<const uint4*>(x + k)), xf);
  __shared__ float part[2][8][C];
  uint4 wv[C];
  auto load = [&](int g) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int n = g * C + c;
      wv[c] = (kin && n < N) ? __ldcs(reinterpret_cast<const uint4*>(w + size_t(n) * K + k)) : make_uint4(0, 0, 0, 0);
    }
  };
  int g = blockIdx.x;
  if (g < groups) load(g);
  for (int it = 0; g < groups; g += gridDim.x, ++it) {
    float acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float wf[8];
      widen8(wv[c], wf);
      acc[c] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[c] = fmaf(xf[i], wf[i], acc[c]);
    }
    if (g + int(gridDim.x) < groups) load(g + gridDim.x);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float v = acc[c];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[it & 1][warp][c] = v;
    }
    __syncthreads();
    if (threadIdx.x < C && g * C + int(threadIdx.x) < N) {
      float v = 0.f;
      for (int q = 0; q < 8; ++q) v += part[it & 1][q][threadIdx.x];
      y[g * C + threadIdx.x] = __float2bfloat16_rn(v);
    }
  }
}

// The ceiling: read every byte once (16 B per thread per step), grid-stride.
__global__ void read_all(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    s ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (s == 0x12345678u) *sink = s;
}

struct Shape {
  const char* what;
  int N, K;
};

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Shape shapes[] = {{"o_proj 2048x2048", 2048, 2048},
                          {"q/k/v 6144x2048", 6144, 2048},
                          {"router+shared gate/up 11325x2048", 11325, 2048},
                          {"shared down 2048x5632", 2048, 5632},
                          {"expert gate_up 2816x2048", 2816, 2048}};
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  std::printf("device SMs %d; GB/s = weight bytes / time per launch (graph of 64 launches)\n", sms);
  for (const Shape& s : shapes) {
    const size_t wbytes = size_t(s.N) * s.K * 2;
    const int copies = int(std::max<size_t>(8, (size_t(400) << 20) / wbytes));
    bf16* w;
    CK(cudaMalloc(&w, wbytes * copies));
    {
      std::vector<bf16> h(size_t(s.N) * s.K);
      unsigned r = 12345;
      for (auto& v : h) {
        r = r * 1664525u + 1013904223u;
        v = __float2bfloat16(float(int(r >> 9) % 2001 - 1000) / 1000.f);
      }
      for (int c = 0; c < copies; ++c) CK(cudaMemcpy(w + size_t(c) * s.N * s.K, h.data(), wbytes, cudaMemcpyHostToDevice));
    }
    bf16 *x, *y, *yref;
    CK(cudaMalloc(&x, size_t(s.K) * 2));
    CK(cudaMalloc(&y, size_t(s.N) * 2));
    CK(cudaMalloc(&yref, size_t(s.N) * 2));
    {
      std::vector<bf16> h(s.K);
      for (int i = 0; i < s.K; ++i) h[size_t(i)] = __float2bfloat16(float((i * 37) % 101 - 50) / 50.f);
      CK(cudaMemcpy(x, h.data(), size_t(s.K) * 2, cudaMemcpyHostToDevice));
    }
    splitk<8, 4><<<(s.N + 3) / 4, 256, 0, st>>>(x, w, yref, s.K, s.N);
    CK(cudaStreamSynchronize(st));
    std::vector<bf16> ref(s.N), got(s.N);
    CK(cudaMemcpy(ref.data(), yref, size_t(s.N) * 2, cudaMemcpyDeviceToHost));

    auto time_it = [&](const char* name, auto launch) {
      launch(w);
      CK(cudaStreamSynchronize(st));
      CK(cudaGetLastError());
      CK(cudaMemcpy(got.data(), y, size_t(s.N) * 2, cudaMemcpyDeviceToHost));
      double maxrel = 0;
      for (int i = 0; i < s.N; ++i) {
        const double a = __bfloat162float(ref[size_t(i)]), b = __bfloat162float(got[size_t(i)]);
        maxrel = std::max(maxrel, std::fabs(a - b) / (std::fabs(a) + 1.0));
      }
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < 64; ++i) launch(w + size_t(i % copies) * s.N * s.K);
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(a, st));
      for (int r = 0; r < 10; ++r) CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      const double us = ms * 1000.0 / 640.0;
      std::printf("  %-28s %8.2f us  %7.0f GB/s  max rel diff vs moex %.1e\n", name, us, wbytes / us / 1e3, maxrel);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    };
    std::printf("%s (%.1f MB)\n", s.what, wbytes / 1e6);
    CK(cudaMemcpy(y, yref, size_t(s.N) * 2, cudaMemcpyDeviceToDevice));  // read_all leaves y alone
    time_it("read only (grid 4 x SMs)", [&](const bf16* wp) {
      read_all<<<4 * sms, 512, 0, st>>>(reinterpret_cast<const uint4*>(wp), wbytes / 16, sink);
    });
    time_it("splitk 8w x 4c (moex)", [&](const bf16* wp) { splitk<8, 4><<<(s.N + 3) / 4, 256, 0, st>>>(x, wp, y, s.K, s.N); });
    time_it("splitk 8w x 8c", [&](const bf16* wp) { splitk<8, 8><<<(s.N + 7) / 8, 256, 0, st>>>(x, wp, y, s.K, s.N); });
    time_it("splitk 4w x 4c", [&](const bf16* wp) { splitk<4, 4><<<(s.N + 3) / 4, 128, 0, st>>>(x, wp, y, s.K, s.N); });
    time_it("splitk 8w x 2c", [&](const bf16* wp) { splitk<8, 2><<<(s.N + 1) / 2, 256, 0, st>>>(x, wp, y, s.K, s.N); });
    time_it("warp rows 1c x 4u", [&](const bf16* wp) { warp_rows<1, 4><<<(s.N + 3) / 4, 128, 0, st>>>(x, wp, y, s.K, s.N); });
    time_it("warp rows 2c x 4u", [&](const bf16* wp) { warp_rows<2, 4><<<(s.N + 7) / 8, 128, 0, st>>>(x, wp, y, s.K, s.N); });
    time_it("warp rows 1c x 8u", [&](const bf16* wp) { warp_rows<1, 8><<<(s.N + 3) / 4, 128, 0, st>>>(x, wp, y, s.K, s.N); });
    if (s.K <= 2048) {
      for (int per_sm : {2, 4, 8}) {
        char name[64];
        std::snprintf(name, sizeof name, "persistent 4c, %d blocks/SM", per_sm);
        time_it(name, [&](const bf16* wp) { persistent<4><<<per_sm * sms, 256, 0, st>>>(x, wp, y, s.K, s.N); });
      }
    }
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(yref));
  }
  return 0;
}
