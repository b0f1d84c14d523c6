// The decode-sized quantized experts GEMV (FP8 e4m3 / FP4 e2m1 weights, e4m3 activation codes)
// on DeepSeek-V3-sized experts (H 7168, I 2048, 32 experts, k 8): the library's kernel before
// (one 8-warp block per 4 columns, weights re-read per tile row, scalar decode) against the
// current one (src/cuda/quant_gemv.cuh) in several shapes of its template (warps per block,
// weight rows per warp, tile rows per pass), for T = 1, 4, 16 in both route layouts: "batched"
// (batched_mm: one tile per (token, slot) pair) and "grouped" (grouped_mm: one tile of up to 16
// rows per expert). One step = the gate_up GEMV (SiLU-gated, bf16 out) + the down GEMV (f32 out).
//
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc -Iinclude lab/cuda/quant_gemv_lab.cu -o quant_gemv_lab && ./quant_gemv_lab
//
// Floor: the bytes of the experts the step hits (weights + their scales, each read once) over
// 4270 GB/s (the H200's measured read bandwidth, docs/cuda.md). Every variant is checked against a
// one-thread-per-output float64 reference kernel of the quant.hpp math (the same epilogue) before
// it is timed: "err" is max |out - ref| / max |ref| over both outputs (bf16 gate_up output: ~4e-3
// is its rounding). Times: cudaEvents around kReps steps after a warm-up, per step; the routing
// is fixed per row, so with T = 1 only 8 experts (352 MB FP8) are read, more than L2 holds.
//
// Not yet run on an H200: the library's defaults (4 warps, 4 weight rows, 8-row chunks) are the
// design's first guess; pick the winner from this table.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/quant_gemv.cuh"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace moex::cuda {

// ---- the library's kernel before this lab (verbatim but for its name) ----
constexpr int kOldWarps = 8;
constexpr int kOldColumns = 4;

template <class T, int kKind, int kGroups, bool kFp4, bool kE8M0>
__global__ void __launch_bounds__(kOldWarps * 32) old_gemv_quant_kernel(QuantGemmParams q) {
  pdl_wait();
  pdl_trigger();
  const GemmParams& p = q.g;
  Tile tile{0, 0, q.linear_rows, 0};  // a plain linear: every row in one tile
  if (kKind != kQuantLinear) {
    if (int(blockIdx.x) >= *p.num_tiles) return;
    tile = p.tiles[blockIdx.x];
  }
  if (tile.rows <= 0) return;
  const int j0 = int(blockIdx.y) * kOldColumns;
  if (j0 >= p.N) return;
  const int cols = min(kOldColumns, p.N - j0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = p.K, nb = (K + kQuantBlockK - 1) / kQuantBlockK;
  constexpr int kPerLoad = kFp4 ? 32 : 16;  // weights per 16-byte load
  const int64_t w_row_bytes = kFp4 ? K / 2 : K;
  const int s_cols = kFp4 ? K / kQuantFp4BlockK : nb;
  const uint8_t* w = static_cast<const uint8_t*>(p.w) + tile.expert * p.w_expert_stride;
  const int64_t s_base = tile.expert * q.scale_expert_stride;
  int64_t src[kGroups][kOldColumns];
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
#pragma unroll
    for (int c = 0; c < kOldColumns; ++c)
      src[g][c] = b_source_row<kGroups>(p, j0 + min(c, cols - 1), g);

  __shared__ float part[kOldWarps][kGroups][kOldColumns];
  for (int r = 0; r < tile.rows; ++r) {
    const int pos = tile.row_start + r;
    const int64_t arow = kKind == kQuantGateUp ? p.sorted_pair[pos] / p.top_k : pos;
    const uint8_t* a = q.aq + arow * K;
    float acc[kGroups][kOldColumns] = {};
    for (int k = (warp * 32 + lane) * kPerLoad; k < K; k += kOldWarps * 32 * kPerLoad) {
      uint4 wv[kGroups][kOldColumns];
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int c = 0; c < kOldColumns; ++c)
          wv[g][c] = __ldg(reinterpret_cast<const uint4*>(w + src[g][c] * w_row_bytes + (kFp4 ? k / 2 : k)));
      float xf[kPerLoad];
#pragma unroll
      for (int h = 0; h < kPerLoad / 16; ++h) {
        const uint4 av = __ldg(reinterpret_cast<const uint4*>(a + k + 16 * h));
        const uint8_t* ab = reinterpret_cast<const uint8_t*>(&av);
#pragma unroll
        for (int i = 0; i < 16; ++i) xf[16 * h + i] = e4m3_value(ab[i]);
      }
      const float sa = q.as[arow * nb + k / kQuantBlockK];
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int c = 0; c < kOldColumns; ++c) {
          const uint8_t* wb = reinterpret_cast<const uint8_t*>(&wv[g][c]);
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            if constexpr (kFp4) {
              s = fmaf(xf[2 * i], e2m1_value(wb[i] & 15u), s);
              s = fmaf(xf[2 * i + 1], e2m1_value(wb[i] >> 4), s);
            } else {
              s = fmaf(xf[i], e4m3_value(wb[i]), s);
            }
          }
          const float sw = kFp4 ? scale_at<kE8M0>(q.scale, s_base + src[g][c] * s_cols + k / kQuantFp4BlockK)
                                : scale_at<kE8M0>(q.scale, s_base + fp8_scale_row<kGroups>(q, src[g][c]) * s_cols +
                                                               k / kQuantBlockK);
          acc[g][c] = fmaf(s, sa * sw, acc[g][c]);
        }
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int c = 0; c < kOldColumns; ++c) {
        float v = acc[g][c];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) part[warp][g][c] = v;
      }
    __syncthreads();
    if (threadIdx.x < cols) {
      const int c = threadIdx.x;
      float v[2] = {0.0f, 0.0f};
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int w8 = 0; w8 < kOldWarps; ++w8) v[g] += part[w8][g][c];
      if (kKind == kQuantLinear) {
        float y = v[0];
        if (p.bias) y += to_float(static_cast<const T*>(p.bias)[j0 + c]);
        static_cast<T*>(p.out)[int64_t(pos) * p.N + j0 + c] = from_float<T>(y);
      } else {
        constexpr GemmKind kind = kKind == kQuantGateUp ? GemmKind::kGateUp : GemmKind::kDown;
        epilogue_store<T, kind, kGroups>(p, tile.expert, pos, j0 + c, v[0], v[kGroups - 1]);
      }
    }
    __syncthreads();
  }
}

}  // namespace moex::cuda

using namespace moex::cuda;
using bf16 = __nv_bfloat16;

constexpr int kE = 32, kH = 7168, kI = 2048, kTopK = 8, kReps = 50;
constexpr double kBandwidth = 4270e9;

// ---- reference: one thread per output, float64 sums of the quant.hpp math, same epilogue ----
__device__ double ref_dot(const QuantGemmParams& q, bool fp4, bool e8m0, int expert, int64_t src,
                          int64_t src_scale_row, int64_t arow) {
  const GemmParams& p = q.g;
  const int K = p.K, nb = (K + 127) / 128;
  const uint8_t* w = static_cast<const uint8_t*>(p.w) + expert * p.w_expert_stride;
  const int64_t s_base = expert * q.scale_expert_stride;
  auto sc = [&](int64_t i) {
    return e8m0 ? double(e8m0_value(static_cast<const uint8_t*>(q.scale)[i]))
                : double(static_cast<const float*>(q.scale)[i]);
  };
  double y = 0;
  for (int b = 0; b < nb; ++b) {
    double blk = 0;
    for (int k = b * 128; k < min(K, b * 128 + 128); ++k) {
      const double a = e4m3_value(q.aq[arow * K + k]);
      double wv;
      if (fp4) {
        const uint8_t byte = w[src * (K / 2) + k / 2];
        wv = e2m1_value((k & 1) ? byte >> 4 : byte & 15u) * sc(s_base + src * (K / 32) + k / 32);
      } else {
        wv = e4m3_value(w[src * K + k]) * sc(s_base + src_scale_row * nb + b);
      }
      blk += a * wv;
    }
    y += blk * double(q.as[arow * nb + b]);
  }
  return y;
}

template <int kKind, int kGroups>
__global__ void ref_kernel(QuantGemmParams q, bool fp4, bool e8m0) {
  const GemmParams& p = q.g;
  const int tile_id = blockIdx.y;
  if (tile_id >= *p.num_tiles) return;
  const Tile t = p.tiles[tile_id];
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= p.N) return;
  for (int r = 0; r < t.rows; ++r) {
    const int pos = t.row_start + r;
    const int64_t arow = kKind == kQuantGateUp ? p.sorted_pair[pos] / p.top_k : pos;
    double v[2];
    for (int g = 0; g < kGroups; ++g) {
      const int64_t src = b_source_row<kGroups>(p, j, g);
      v[g] = ref_dot(q, fp4, e8m0, t.expert, src, fp8_scale_row<kGroups>(q, src), arow);
    }
    constexpr GemmKind kind = kKind == kQuantGateUp ? GemmKind::kGateUp : GemmKind::kDown;
    epilogue_store<bf16, kind, kGroups>(p, t.expert, pos, j, float(v[0]), float(v[kGroups - 1]));
  }
}

// ---- data ----
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, int mode) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    uint8_t b = uint8_t(h >> 8);
    if (mode == 0 && (b & 0x7f) == 0x7f) b ^= 1;  // e4m3: no NaN codes
    if (mode == 1) b = uint8_t(119 + (h >> 8) % 6);  // e8m0 scales 2^-8 .. 2^-3
    p[i] = b;
  }
}
__global__ void fill_scales_f32(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    p[i] = (1.0f + float(h % 1000) / 1000.0f) * 1e-3f;
  }
}

template <class V>
V* dalloc(size_t n) {
  V* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(V)));
  return p;
}

struct Format {
  const char* name;
  bool fp4, e8m0;
};

// One projection's quantized weights for all experts.
struct QWeights {
  uint8_t* w = nullptr;
  void* s = nullptr;
  int64_t w_stride = 0, s_stride = 0;  // bytes, elements
  int64_t bytes_per_expert = 0;        // weights + scales
};

QWeights make_weights(const Format& f, int rows, int K, bool gated, uint32_t seed) {
  QWeights q;
  const int64_t row_bytes = f.fp4 ? K / 2 : K;
  q.w_stride = row_bytes * rows;
  q.w = dalloc<uint8_t>(size_t(q.w_stride) * kE);
  fill_bytes<<<1024, 256>>>(q.w, size_t(q.w_stride) * kE, seed, f.fp4 ? 2 : 0);
  const int64_t srows = f.fp4 ? rows : (gated ? 2 * ((rows / 2 + 127) / 128) : (rows + 127) / 128);
  const int64_t scols = f.fp4 ? K / 32 : (K + 127) / 128;
  q.s_stride = srows * scols;
  const size_t sbytes = f.e8m0 ? 1 : 4;
  if (f.e8m0) {
    q.s = dalloc<uint8_t>(size_t(q.s_stride) * kE);
    fill_bytes<<<256, 256>>>(static_cast<uint8_t*>(q.s), size_t(q.s_stride) * kE, seed + 1, 1);
  } else {
    q.s = dalloc<float>(size_t(q.s_stride) * kE);
    fill_scales_f32<<<256, 256>>>(static_cast<float*>(q.s), size_t(q.s_stride) * kE, seed + 1);
  }
  q.bytes_per_expert = q.w_stride + q.s_stride * int64_t(sbytes);
  CK(cudaGetLastError());
  return q;
}

// Routing of T tokens (k distinct experts each), laid out as batched_mm or grouped_mm lays it out.
struct Route {
  int tiles = 0, pairs = 0, experts_hit = 0;
  int* d_sorted = nullptr;
  Tile* d_tiles = nullptr;
  int* d_num = nullptr;
};

Route make_route(int T, bool grouped, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> expert_of(T * kTopK);
  for (int t = 0; t < T; ++t) {
    std::vector<int> e(kE);
    for (int i = 0; i < kE; ++i) e[i] = i;
    std::shuffle(e.begin(), e.end(), rng);
    for (int j = 0; j < kTopK; ++j) expert_of[t * kTopK + j] = e[j];
  }
  Route r;
  r.pairs = T * kTopK;
  std::vector<int> sorted(r.pairs);
  std::vector<Tile> tiles;
  for (int i = 0; i < r.pairs; ++i) sorted[i] = i;
  if (grouped) {
    std::stable_sort(sorted.begin(), sorted.end(), [&](int a, int b) { return expert_of[a] < expert_of[b]; });
    for (int pos = 0; pos < r.pairs;) {
      int end = pos;
      while (end < r.pairs && expert_of[sorted[end]] == expert_of[sorted[pos]] && end - pos < 16) ++end;
      tiles.push_back(Tile{expert_of[sorted[pos]], pos, end - pos, 0});
      pos = end;
    }
  } else {
    for (int pos = 0; pos < r.pairs; ++pos) tiles.push_back(Tile{expert_of[pos], pos, 1, 0});
  }
  std::vector<int> hit(kE, 0);
  for (int e : expert_of) hit[e] = 1;
  for (int h : hit) r.experts_hit += h;
  r.tiles = int(tiles.size());
  r.d_sorted = dalloc<int>(r.pairs);
  r.d_tiles = dalloc<Tile>(tiles.size());
  r.d_num = dalloc<int>(1);
  CK(cudaMemcpy(r.d_sorted, sorted.data(), sorted.size() * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r.d_tiles, tiles.data(), tiles.size() * sizeof(Tile), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r.d_num, &r.tiles, sizeof(int), cudaMemcpyHostToDevice));
  return r;
}

QuantGemmParams params(const QWeights& w, const Route& r, bool down, const uint8_t* aq,
                       const float* as, void* out) {
  QuantGemmParams q{};
  GemmParams& p = q.g;
  p.sorted_pair = r.d_sorted;
  p.top_k = kTopK;
  p.tiles = r.d_tiles;
  p.num_tiles = r.d_num;
  p.w = w.w;
  p.w_expert_stride = w.w_stride;
  p.K = down ? kI : kH;
  p.N = down ? kH : kI;
  p.I = down ? 0 : kI;
  p.concatenated = true;
  p.out = out;
  q.aq = aq;
  q.as = as;
  q.scale = w.s;
  q.scale_expert_stride = w.s_stride;
  q.block_n = 128;
  q.linear_rows = -1;
  return q;
}

using Kernel = void (*)(QuantGemmParams);
struct Variant {
  std::string name;
  Kernel gate_up[3], down[3];  // per format: fp8 f32, fp8 e8m0, fp4
  int threads, cols_gate_up, cols_down;  // block size; output columns per block
};

template <int W, int WR, int RC>
Variant new_variant() {
  Variant v;
  v.name = "new w" + std::to_string(W) + " r" + std::to_string(WR) + " c" + std::to_string(RC);
  v.gate_up[0] = grouped_gemv_quant_kernel<bf16, kQuantGateUp, 2, false, false, W, WR, RC>;
  v.gate_up[1] = grouped_gemv_quant_kernel<bf16, kQuantGateUp, 2, false, true, W, WR, RC>;
  v.gate_up[2] = grouped_gemv_quant_kernel<bf16, kQuantGateUp, 2, true, true, W, WR, RC>;
  v.down[0] = grouped_gemv_quant_kernel<bf16, kQuantDown, 1, false, false, W, WR, RC>;
  v.down[1] = grouped_gemv_quant_kernel<bf16, kQuantDown, 1, false, true, W, WR, RC>;
  v.down[2] = grouped_gemv_quant_kernel<bf16, kQuantDown, 1, true, true, W, WR, RC>;
  v.threads = W * 32;
  v.cols_gate_up = W * WR / 2;
  v.cols_down = W * WR;
  return v;
}

Variant old_variant() {
  Variant v;
  v.name = "old (8 warps, 4 cols)";
  v.gate_up[0] = old_gemv_quant_kernel<bf16, kQuantGateUp, 2, false, false>;
  v.gate_up[1] = old_gemv_quant_kernel<bf16, kQuantGateUp, 2, false, true>;
  v.gate_up[2] = old_gemv_quant_kernel<bf16, kQuantGateUp, 2, true, true>;
  v.down[0] = old_gemv_quant_kernel<bf16, kQuantDown, 1, false, false>;
  v.down[1] = old_gemv_quant_kernel<bf16, kQuantDown, 1, false, true>;
  v.down[2] = old_gemv_quant_kernel<bf16, kQuantDown, 1, true, true>;
  v.threads = kOldWarps * 32;
  v.cols_gate_up = v.cols_down = kOldColumns;
  return v;
}

template <class V>
std::vector<float> to_host_float(const V* d, size_t n) {
  std::vector<V> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(V), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = float(h[i]);
  return f;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - b[i]));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

int main() {
  const Format formats[3] = {{"fp8 f32-scale", false, false}, {"fp8 e8m0", false, true}, {"fp4 e2m1", true, true}};
  // Warps per block, weight rows per warp, tile rows per chunk. Chunk 1 is what one-row tiles
  // (batched_mm, T = 1) launch; the library takes chunk 4 for tiles of several rows.
  std::vector<Variant> variants = {old_variant(),
                                   new_variant<4, 4, 8>(),
                                   new_variant<4, 8, 4>(),
                                   new_variant<4, 4, 4>(),
                                   new_variant<4, 4, 2>(),
                                   new_variant<4, 4, 1>(),
                                   new_variant<4, 2, 1>(),
                                   new_variant<8, 4, 1>(),
                                   new_variant<4, 8, 1>()};
  const int Ts[3] = {1, 4, 16};
  const int max_pairs = 16 * kTopK;
  // Activation codes: tokens x H for gate_up, positions x I for down; random e4m3, scales ~1e-2.
  uint8_t* aq_up = dalloc<uint8_t>(size_t(16) * kH);
  uint8_t* aq_down = dalloc<uint8_t>(size_t(max_pairs) * kI);
  float* as_up = dalloc<float>(size_t(16) * kH / 128);
  float* as_down = dalloc<float>(size_t(max_pairs) * kI / 128);
  fill_bytes<<<256, 256>>>(aq_up, size_t(16) * kH, 11, 0);
  fill_bytes<<<256, 256>>>(aq_down, size_t(max_pairs) * kI, 12, 0);
  fill_scales_f32<<<64, 256>>>(as_up, size_t(16) * kH / 128, 13);
  fill_scales_f32<<<64, 256>>>(as_down, size_t(max_pairs) * kI / 128, 14);
  bf16* h_out = dalloc<bf16>(size_t(max_pairs) * kI);
  float* y_out = dalloc<float>(size_t(max_pairs) * kH);
  bf16* h_ref = dalloc<bf16>(size_t(max_pairs) * kI);
  float* y_ref = dalloc<float>(size_t(max_pairs) * kH);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  std::printf("%-14s %-8s %3s %-22s %10s %9s %9s %8s %9s\n", "format", "layout", "T", "variant", "ms/step",
              "GB/s", "floor ms", "of floor", "err");
  for (int fi = 0; fi < 3; ++fi) {
    const Format& f = formats[fi];
    const QWeights wu = make_weights(f, 2 * kI, kH, true, 100 + fi);
    const QWeights wd = make_weights(f, kH, kI, false, 200 + fi);
    for (int grouped = 0; grouped < 2; ++grouped)
      for (int T : Ts) {
        const Route r = make_route(T, grouped, 1000 + T);
        const QuantGemmParams qu = params(wu, r, false, aq_up, as_up, h_out);
        const QuantGemmParams qd = params(wd, r, true, aq_down, as_down, y_out);
        QuantGemmParams ru = qu, rd = qd;
        ru.g.out = h_ref;
        rd.g.out = y_ref;
        ref_kernel<kQuantGateUp, 2><<<dim3((kI + 127) / 128, r.tiles), 128>>>(ru, f.fp4, f.e8m0);
        ref_kernel<kQuantDown, 1><<<dim3((kH + 127) / 128, r.tiles), 128>>>(rd, f.fp4, f.e8m0);
        CK(cudaDeviceSynchronize());
        const std::vector<float> href = to_host_float(h_ref, size_t(r.pairs) * kI);
        const std::vector<float> yref = to_host_float(y_ref, size_t(r.pairs) * kH);
        const double bytes = double(r.experts_hit) * double(wu.bytes_per_expert + wd.bytes_per_expert);
        const double floor_ms = bytes / kBandwidth * 1e3;
        for (const Variant& v : variants) {
          auto step = [&] {
            v.gate_up[fi]<<<dim3(r.tiles, (kI + v.cols_gate_up - 1) / v.cols_gate_up), v.threads>>>(qu);
            v.down[fi]<<<dim3(r.tiles, (kH + v.cols_down - 1) / v.cols_down), v.threads>>>(qd);
          };
          CK(cudaMemset(h_out, 0, size_t(r.pairs) * kI * sizeof(bf16)));
          CK(cudaMemset(y_out, 0, size_t(r.pairs) * kH * sizeof(float)));
          step();
          CK(cudaGetLastError());
          CK(cudaDeviceSynchronize());
          const double err = std::max(max_rel(to_host_float(h_out, size_t(r.pairs) * kI), href),
                                      max_rel(to_host_float(y_out, size_t(r.pairs) * kH), yref));
          for (int i = 0; i < 5; ++i) step();
          CK(cudaEventRecord(e0));
          for (int i = 0; i < kReps; ++i) step();
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          ms /= kReps;
          std::printf("%-14s %-8s %3d %-22s %10.4f %9.0f %9.4f %7.0f%% %9.2e%s\n", f.name,
                      grouped ? "grouped" : "batched", T, v.name.c_str(), ms, bytes / (ms * 1e-3) / 1e9,
                      floor_ms, 100.0 * floor_ms / ms, err, err > 1e-2 ? "  WRONG" : "");
        }
        CK(cudaFree(r.d_sorted));
        CK(cudaFree(r.d_tiles));
        CK(cudaFree(r.d_num));
      }
    for (const QWeights* w : {&wu, &wd}) {
      CK(cudaFree(w->w));
      CK(cudaFree(w->s));
    }
  }
  return 0;
}
