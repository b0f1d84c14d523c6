// Ops tier of the CUDA experts backends: see experts_ops.hpp.
#include "cuda/experts_ops.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "cuda/runtime.hpp"

namespace moex::cuda {

namespace {

int64_t pairs_of(const ExpertsArgs& a) { return a.tokens * a.top_k; }
int64_t gate_up_rows(const ExpertsArgs& a) {
  return a.gated ? 2 * int64_t(a.intermediate) : a.intermediate;
}
size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// Device workspace carved into the buffers every algorithm uses.
struct Workspace {
  int* offsets;
  int* sorted_pair;
  int* pos_of_pair;
  Tile* tiles;
  int* num_tiles;
  void* h;      // [P, I] elem
  float* y;     // [P, H] fp32
  float* gu;    // eager: [P, R] fp32
  void* xg;     // eager: [P, H] elem
  void* xs;     // grouped on Hopper: hidden rows gathered in sorted order, [P, H] elem
  int max_tiles;
  size_t bytes;
};

int max_tiles_for(const ExpertsArgs& a, Algo algo) {
  int64_t P = pairs_of(a);
  if (algo == Algo::kBatched) return int(std::max<int64_t>(P, 1));
  if (algo == Algo::kEager) return int(std::max<int64_t>(1, std::min<int64_t>(a.experts, P)));
  return int(route_max_tiles(P, a.experts, grouped_tile_rows(a)));
}

Workspace carve(const ExpertsArgs& a, Algo algo, void* base) {
  int64_t P = std::max<int64_t>(pairs_of(a), 1);
  size_t es = elem_size(a.elem);
  Workspace w{};
  w.max_tiles = max_tiles_for(a, algo);
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* q = p ? p + off : nullptr;
    off += align_up(bytes);
    return q;
  };
  w.offsets = reinterpret_cast<int*>(take(sizeof(int) * (a.experts + 1)));
  w.sorted_pair = reinterpret_cast<int*>(take(sizeof(int) * P));
  w.pos_of_pair = reinterpret_cast<int*>(take(sizeof(int) * P));
  w.tiles = reinterpret_cast<Tile*>(take(sizeof(Tile) * w.max_tiles));
  w.num_tiles = reinterpret_cast<int*>(take(sizeof(int)));
  w.h = take(es * P * a.intermediate);
  w.y = reinterpret_cast<float*>(take(sizeof(float) * P * a.hidden));
  if (algo == Algo::kGrouped) w.xs = take(es * P * a.hidden);
  if (algo == Algo::kEager) {
    w.gu = reinterpret_cast<float*>(take(sizeof(float) * P * gate_up_rows(a)));
    w.xg = take(es * P * a.hidden);
  }
  w.bytes = off;
  return w;
}

GroupedGemmArgs gemm_args(const ExpertsArgs& a, const Workspace& w, GemmKind kind) {
  GroupedGemmArgs g;
  g.kind = kind;
  g.elem = a.elem;
  g.sorted_pair = w.sorted_pair;
  g.top_k = a.top_k;
  g.tiles = w.tiles;
  g.num_tiles = w.num_tiles;
  g.max_tiles = w.max_tiles;
  g.transposed = a.transposed;
  g.gated = a.gated;
  g.concatenated = a.concatenated;
  g.act = a.act;
  g.limit = a.limit;
  g.alpha = a.alpha;
  const int64_t H = a.hidden, I = a.intermediate, R = gate_up_rows(a);
  if (kind == GemmKind::kGateUp) {
    g.a = a.hidden_states;
    g.w = a.gate_up;
    g.w_expert_stride = R * H;
    g.ldw = a.transposed ? R : H;
    g.bias = a.has_bias ? a.gate_up_bias : nullptr;
    g.bias_expert_stride = R;
    g.K = int(H);
    g.N = int(I);
    g.out = w.h;
    g.a_sorted = w.xs;
    g.w_rows_total = a.experts * R;
  } else {
    g.a = w.h;
    g.w = a.down;
    g.w_expert_stride = H * I;
    g.ldw = a.transposed ? H : I;
    g.bias = a.has_bias ? a.down_bias : nullptr;
    g.bias_expert_stride = H;
    g.K = int(I);
    g.N = int(H);
    g.out = w.y;
    g.a_sorted = w.h;
    g.w_rows_total = a.experts * H;
  }
  return g;
}

bool mma_ok(const ExpertsArgs& a) {
  // Only the layout matters here; carve the batched plan, whose tile count does not depend on
  // this function (the grouped one does, through grouped_tile_rows).
  Workspace w = carve(a, Algo::kBatched, nullptr);
  // Pointer alignment of the workspace is 256 bytes; check the caller's tensors and strides.
  GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  g2.a = a.hidden_states;  // h lives in the (aligned) workspace; test a real pointer instead
  return grouped_gemm_mma_supported(g1) && grouped_gemm_mma_supported(g2);
}

// The Hopper path serves the 64- and 128-row configurations of grouped_mm; both GEMMs must
// qualify (the gathered A buffer only exists for grouped).
bool wgmma_ok(const ExpertsArgs& a) {
  // The batched carve: its tile count does not depend on grouped_tile_rows, which calls this.
  Workspace w = carve(a, Algo::kBatched, nullptr);
  GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  g1.a = g2.a = a.hidden_states;
  return (a.hidden * elem_size(a.elem)) % 16 == 0 && grouped_gemm_wgmma_supported(g1) &&
         grouped_gemm_wgmma_supported(g2);
}

void run_gemms(const ExpertsArgs& a, const Workspace& w, bool mma, int tile_rows,
               cudaStream_t s) {
  GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  if (mma && (tile_rows == 64 || tile_rows == 128 || tile_rows == 256) && wgmma_ok(a)) {
    const int64_t P = pairs_of(a);
    g1.a_rows = g2.a_rows = P;
    launch_gather_sorted(a.hidden_states, w.sorted_pair, w.offsets + a.experts, a.top_k, P,
                         int(a.hidden), a.elem, w.xs, s);
    launch_grouped_gemm_wgmma(g1, tile_rows, s);
    launch_grouped_gemm_wgmma(g2, tile_rows, s);
  } else if (mma) {
    launch_grouped_gemm_mma(g1, tile_rows, s);
    launch_grouped_gemm_mma(g2, tile_rows, s);
  } else {
    launch_grouped_gemm_simt(g1, s);
    launch_grouped_gemm_simt(g2, s);
  }
}

void run_combine(const ExpertsArgs& a, const Workspace& w, cudaStream_t s) {
  launch_combine(w.y, w.pos_of_pair, a.top_k_index, a.index_i64, a.top_k_weights, a.weights_code,
                 a.weights_per_expert, a.tokens, a.top_k, a.experts, a.hidden, a.elem, a.out, s);
}

void run_eager(const ExpertsArgs& a, const Workspace& w, cudaStream_t s) {
  const int64_t P = pairs_of(a);
  launch_route_by_expert(a.top_k_index, a.index_i64, P, a.experts, int(std::max<int64_t>(P, 1)), 1,
                         w.offsets, w.sorted_pair, w.pos_of_pair, w.tiles, w.max_tiles,
                         w.num_tiles, s);
  std::vector<int> offsets(size_t(a.experts) + 1);
  MOEX_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), w.offsets, sizeof(int) * offsets.size(),
                                  cudaMemcpyDeviceToHost, s));
  MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
  const int64_t H = a.hidden, I = a.intermediate, R = gate_up_rows(a);
  const size_t es = elem_size(a.elem);
  for (int e = 0; e < a.experts; ++e) {
    int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    char* xg = static_cast<char*>(w.xg);
    launch_gather(a.hidden_states, w.sorted_pair + begin, a.top_k, rows, int(H), a.elem, xg, s);
    const char* gu_w = static_cast<const char*>(a.gate_up) + es * size_t(e) * R * H;
    const char* gu_b = a.has_bias ? static_cast<const char*>(a.gate_up_bias) + es * size_t(e) * R
                                  : nullptr;
    launch_dense_linear(xg, rows, int(H), gu_w, a.transposed ? 1 : H, a.transposed ? R : 1, gu_b,
                        int(R), a.elem, w.gu, s);
    char* h = static_cast<char*>(w.h) + es * size_t(begin) * I;
    launch_activation(w.gu, rows, int(I), a.gated, a.concatenated, a.act, a.limit, a.alpha,
                      a.elem, h, s);
    const char* dn_w = static_cast<const char*>(a.down) + es * size_t(e) * H * I;
    const char* dn_b = a.has_bias ? static_cast<const char*>(a.down_bias) + es * size_t(e) * H
                                  : nullptr;
    launch_dense_linear(h, rows, int(I), dn_w, a.transposed ? 1 : I, a.transposed ? H : 1, dn_b,
                        int(H), a.elem, w.y + size_t(begin) * H, s);
  }
  run_combine(a, w, s);
}

}  // namespace

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kEager: return "eager";
    case Algo::kBatched: return "batched_mm";
    case Algo::kGrouped: return "grouped_mm";
  }
  return "?";
}

bool uses_tensor_cores(const ExpertsArgs& a) { return mma_ok(a); }

int grouped_tile_rows(const ExpertsArgs& a) {
  if (!mma_ok(a)) return kSimtTileRows;
  int64_t P = pairs_of(a);
  int64_t active = std::max<int64_t>(1, std::min<int64_t>(a.experts, P));
  // MOEX_CUDA_TILE_ROWS=16|64|128|256 overrides the policy (measuring the switch points).
  static const int forced = [] {
    const char* e = std::getenv("MOEX_CUDA_TILE_ROWS");
    const int v = e ? std::atoi(e) : 0;
    return v == 16 || v == 64 || v == 128 || v == 256 ? v : 0;
  }();
  if (forced == 256) return wgmma_ok(a) ? 256 : 128;  // (cluster pairs exist on Hopper only)
  if (forced) return forced;
  // Measured on the H200 (docs/cuda.md, "Tile rows"): 16-row mma.sync tiles win up to ~20 rows
  // per expert (Qwen T = 256: 0.301 ms vs 0.348 with 64-row wgmma tiles); at ~32 rows 64-row
  // wgmma tiles read each expert's weights once instead of twice (DeepSeek T = 1024: 5.80 ms vs
  // 8.41 with 16-row, 6.06 with 128-row tiles); from ~64 rows the 128-row tiles are fastest.
  const int64_t rows = P / active;
  if (rows <= 24) return 16;
  if (rows <= 48) return wgmma_ok(a) ? 64 : 16;
  // 128-row tiles; on Hopper with MOEX_WGMMA_CLUSTER=1, 256-row route tiles computed by CTA
  // pairs that share each weight tile (as transformers' CUTLASS kernel does; slower here on most
  // rows, docs/cuda.md).
  return wgmma_ok(a) && grouped_gemm_wgmma_clusters() ? 256 : 128;
}

std::string describe_plan(const ExpertsArgs& a, Algo algo) {
  std::string s = algo_name(algo);
  bool mma = mma_ok(a);
  if (algo == Algo::kEager) return s + ": per-expert loop, SIMT fp32 products (synchronises)";
  if (algo == Algo::kBatched)
    return s + (mma ? ": one 16-row mma.sync tile per pair" : ": one SIMT tile per pair");
  const int rows = grouped_tile_rows(a);
  if (mma && rows == 256 && wgmma_ok(a))
    return s + ": TMA + wgmma (sm_90a) tiles of 128 rows in 2-CTA clusters sharing each weight "
               "tile";
  if (mma && rows == 128 && wgmma_ok(a) &&
      grouped_gemm_wgmma_pingpong(GemmKind::kDown, int(a.intermediate)))
    return s + ": TMA + wgmma (sm_90a) tiles of 128 rows, down GEMM on ping-pong warpgroups";
  if (mma && (rows == 64 || rows == 128) && wgmma_ok(a))
    return s + ": TMA + wgmma (sm_90a) tiles of " + std::to_string(rows) + " rows";
  return s + (mma ? ": mma.sync tiles of " : ": SIMT tiles of ") + std::to_string(rows) + " rows";
}

size_t workspace_bytes(const ExpertsArgs& a, Algo algo) { return carve(a, algo, nullptr).bytes; }

void run_experts(const ExpertsArgs& a, Algo algo, void* workspace, cudaStream_t s) {
  if (a.tokens <= 0) return;
  Workspace w = carve(a, algo, workspace);
  const int64_t P = pairs_of(a);
  switch (algo) {
    case Algo::kEager:
      run_eager(a, w, s);
      return;
    case Algo::kBatched: {
      launch_route_per_pair(a.top_k_index, a.index_i64, P, a.experts, w.sorted_pair,
                            w.pos_of_pair, w.tiles, w.num_tiles, s);
      run_gemms(a, w, mma_ok(a), 16, s);
      run_combine(a, w, s);
      return;
    }
    case Algo::kGrouped: {
      int rows = grouped_tile_rows(a);
      launch_route_by_expert(a.top_k_index, a.index_i64, P, a.experts, rows,
                             grouped_gemm_raster_tiles(rows), w.offsets,
                             w.sorted_pair, w.pos_of_pair, w.tiles, w.max_tiles, w.num_tiles, s);
      run_gemms(a, w, mma_ok(a), rows, s);
      run_combine(a, w, s);
      return;
    }
  }
}

}  // namespace moex::cuda
