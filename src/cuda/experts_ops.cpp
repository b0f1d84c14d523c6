// Ops tier of the CUDA experts backends: see experts_ops.hpp.
#include "cuda/experts_ops.hpp"

#include <algorithm>
#include <cstdint>
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
  int* claims_buffer;         // int[2], room for the dynamic schedule's counters
  int* item_claims = nullptr;  // GroupedGemmArgs::item_claims: the buffer, when the plan claims
  void* h;      // [P, I] elem
  void* y;      // [P, H] fp32, or elem when y_elem (the fused and the FP8 wgmma paths)
  bool y_elem = false;
  float* gu;    // eager: [P, R] fp32
  void* xg;     // eager: [P, H] elem
  void* xs;     // grouped on Hopper: hidden rows gathered in sorted order, [P, H] elem
  uint8_t* xq;  // quantized: hidden codes [T, H] and scales [T, ceil(H/128)] (FP8 wgmma: [P, .]
                //   of the hidden rows in sorted order)
  float* xqs;
  uint8_t* hq;  // quantized: intermediate codes [P, I] and scales [P, ceil(I/128)]
  float* hqs;
  int max_tiles;
  int64_t rows;  // positions of the sorted buffers: P, or E * T (masked layout)
  bool masked = false;
  size_t bytes;
};

// The FP8 wgmma path's down projection writes y in the element type, as transformers' FP8
// experts do (their block-scaled matmul returns the activation dtype, which the routing weights
// then scale): half the bytes of fp32 y written by the GEMM's epilogue and read by the combine.
// MOEX_FP8_Y_FP32=1 keeps fp32 y (measuring only).
bool fp8_y_in_elem() {
  static const bool elem = env_int("MOEX_FP8_Y_FP32", 0) == 0;
  return elem;
}

// The buffers each backend needs beyond the common ones. kFused (sonicmoe): no gathered copy of
// the hidden rows, and y in the element type (half the bytes of fp32 y).
enum class Extra : unsigned char { kNone, kSortedA, kEagerProducts, kFused };

// max_tiles: the route table's size for the backend (batched: one tile per pair; eager: one per
// expert; grouped: route_max_tiles of the plan's tile rows). sorted_rows: positions of the sorted
// buffers (P, or E * T in the masked layout; 0: P).
Workspace carve(const ExpertsArgs& a, int max_tiles, Extra extra, void* base,
                int64_t sorted_rows = 0) {
  int64_t P = std::max<int64_t>({pairs_of(a), sorted_rows, 1});
  size_t es = elem_size(a.elem);
  Workspace w{};
  w.max_tiles = max_tiles;
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* q = p ? p + off : nullptr;
    off += align_up(bytes);
    return q;
  };
  w.offsets = reinterpret_cast<int*>(take(sizeof(int) * (a.experts + 1)));
  w.sorted_pair = reinterpret_cast<int*>(take(sizeof(int) * P));
  w.pos_of_pair = reinterpret_cast<int*>(take(sizeof(int) * std::max<int64_t>(pairs_of(a), 1)));
  w.rows = P;
  w.tiles = reinterpret_cast<Tile*>(take(sizeof(Tile) * w.max_tiles));
  w.num_tiles = reinterpret_cast<int*>(take(sizeof(int)));
  w.claims_buffer = reinterpret_cast<int*>(take(2 * sizeof(int)));
  w.h = take(es * P * a.intermediate);
  const bool fp8_wgmma = extra == Extra::kSortedA && a.quantized;
  w.y_elem = (extra == Extra::kFused || (fp8_wgmma && fp8_y_in_elem())) && a.elem != Elem::kF32;
  w.y = take((w.y_elem ? es : sizeof(float)) * P * a.hidden);
  // (Quantized experts gather into their codes instead: xq below.)
  if (extra == Extra::kSortedA && !a.quantized) w.xs = take(es * P * a.hidden);
  if (extra == Extra::kEagerProducts && !a.quantized) {
    w.gu = reinterpret_cast<float*>(take(sizeof(float) * P * gate_up_rows(a)));
    w.xg = take(es * P * a.hidden);
  }
  if (a.quantized) {
    // Rows of the quantized hidden states: one per token, or (FP8 wgmma) per sorted pair.
    const int64_t T = extra == Extra::kSortedA ? P : std::max<int64_t>(a.tokens, 1);
    const int64_t nbh = (a.hidden + 127) / 128, nbi = (int64_t(a.intermediate) + 127) / 128;
    w.xq = reinterpret_cast<uint8_t*>(take(size_t(T) * a.hidden));
    w.xqs = reinterpret_cast<float*>(take(sizeof(float) * T * nbh));
    w.hq = reinterpret_cast<uint8_t*>(take(size_t(P) * a.intermediate));
    w.hqs = reinterpret_cast<float*>(take(sizeof(float) * P * nbi));
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
  g.item_claims = w.item_claims;
  g.transposed = a.transposed;
  g.gated = a.gated;
  g.concatenated = a.concatenated;
  g.act = int(a.act);
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
    g.out_elem = w.y_elem;
    g.a_sorted = w.h;
    g.w_rows_total = a.experts * H;
  }
  if (!w.tiles) {  // batched_mm: the pairs' experts read by the GEMMs (block_tile)
    g.pair_expert = a.top_k_index;
    g.pair_i64 = a.index_i64;
    g.experts = a.experts;
  }
  if (a.quantized) {  // weights are bytes (FP8) or nibble pairs (FP4)
    const auto& q = kind == GemmKind::kGateUp ? a.gate_up_q : a.down_q;
    g.w_expert_stride = (kind == GemmKind::kGateUp ? R * H : H * I) / (q.fp4 ? 2 : 1);
  }
  return g;
}

// Quantized FP8 experts on Hopper tensor cores: the hidden rows quantized per 1 x 128 block
// straight into sorted order (one pass reads a row and writes its codes; TMA then reads A
// contiguous; scales by K block), the FP8 wgmma gate_up (activation fused, the intermediate h
// rounded to the element type), h quantized, the FP8 wgmma down. Positions past
// the valid pairs (offsets[E]) are neither gathered nor quantized; their rows of a tile are
// computed from stale codes and never stored.
// (Masked layout: no row bound; free positions are the ones whose sorted_pair is -1.)
void run_quant_gemms_wgmma(const ExpertsArgs& a, const Workspace& w, const ExpertsPlan& plan,
                           cudaStream_t s) {
  GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  const int64_t R = w.rows;
  const int* valid = w.masked ? nullptr : w.offsets + a.experts;
  g1.a_rows = g2.a_rows = R;
  launch_quantize_act_gathered(a.hidden_states, a.elem, w.sorted_pair, a.top_k, R, int(a.hidden),
                               valid, w.xq, w.xqs, /*scales_by_block=*/true, s);
  launch_grouped_gemm_wgmma_fp8(g1, a.gate_up_q, w.xq, w.xqs, plan.b_rows, s);
  launch_quantize_act_gathered(w.h, a.elem, w.masked ? w.sorted_pair : nullptr, 0, R,
                               a.intermediate, valid, w.hq, w.hqs, /*scales_by_block=*/true, s);
  launch_grouped_gemm_wgmma_fp8(g2, a.down_q, w.hq, w.hqs, plan.b_rows, s);
}

// Quantized experts: each A operand quantized per 1 x 128 block, then the CUDA-core products.
void run_quant_gemms(const ExpertsArgs& a, const Workspace& w, const ExpertsPlan& plan,
                     cudaStream_t s) {
  if (plan.gemm == GemmPath::kWgmmaFp8) return run_quant_gemms_wgmma(a, w, plan, s);
  const GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  const GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  const bool gemv = plan.gemm == GemmPath::kGemv;
  // The most rows one route tile holds: one token cannot fill more than one row of any tile.
  const int tile_rows = a.tokens <= 1 ? 1 : plan.tile_rows;
  launch_quantize_act(a.hidden_states, a.elem, a.tokens, a.hidden, nullptr, w.xq, w.xqs, s);
  if (gemv) launch_grouped_gemv_quant(g1, a.gate_up_q, w.xq, w.xqs, tile_rows, s);
  else launch_grouped_gemm_quant(g1, a.gate_up_q, w.xq, w.xqs, s);
  // Positions that hold no pair (sentinels) are quantized too but never read.
  launch_quantize_act(w.h, a.elem, pairs_of(a), a.intermediate, nullptr, w.hq, w.hqs, s);
  if (gemv) launch_grouped_gemv_quant(g2, a.down_q, w.hq, w.hqs, tile_rows, s);
  else launch_grouped_gemm_quant(g2, a.down_q, w.hq, w.hqs, s);
}

void run_gemms(const ExpertsArgs& a, const Workspace& w, const ExpertsPlan& plan, cudaStream_t s) {
  if (a.quantized) return run_quant_gemms(a, w, plan, s);
  GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  switch (plan.gemm) {
    case GemmPath::kWgmma: {
      g1.a_rows = g2.a_rows = w.rows;
      launch_gather_sorted(a.hidden_states, w.sorted_pair, w.masked ? nullptr : w.offsets + a.experts,
                           a.top_k, w.rows, int(a.hidden), a.elem, w.xs, s);
      WgmmaConfig c{plan.tile_rows, plan.b_rows, plan.pingpong_gate_up};
      launch_grouped_gemm_wgmma(g1, c, s);
      c.pingpong = plan.pingpong_down;
      launch_grouped_gemm_wgmma(g2, c, s);
      return;
    }
    case GemmPath::kMmaSync:
      launch_grouped_gemm_mma(g1, plan.tile_rows, s);
      launch_grouped_gemm_mma(g2, plan.tile_rows, s);
      return;
    case GemmPath::kSimt:
      launch_grouped_gemm_simt(g1, s);
      launch_grouped_gemm_simt(g2, s);
      return;
    case GemmPath::kGemv:
      launch_grouped_gemv(g1, s);
      launch_grouped_gemv(g2, s);
      return;
    case GemmPath::kWgmmaFp8:  // (quantized experts only: check_plan)
      throw Error("the FP8 wgmma path runs quantized FP8 experts only");
  }
}

void run_combine(const ExpertsArgs& a, const Workspace& w, cudaStream_t s) {
  // (With y in elem the routing weights are rounded to it too, as transformers' sonicmoe and
  // FP8 experts multiply them in the hidden dtype.)
  launch_combine(w.y, w.y_elem, w.pos_of_pair, a.top_k_index, a.index_i64, a.top_k_weights,
                 a.weights_elem, a.weights_per_expert, /*round_weights=*/w.y_elem, a.tokens, a.top_k,
                 a.experts, a.hidden, a.elem, a.out, s);
}

// Eager over quantized experts: one launch per expert that received tokens, each over that
// expert's whole group (the route table holds one tile per non-empty expert, in expert order).
void run_eager_quant(const ExpertsArgs& a, const Workspace& w, const std::vector<int>& offsets,
                     cudaStream_t s) {
  launch_quantize_act(a.hidden_states, a.elem, a.tokens, a.hidden, nullptr, w.xq, w.xqs, s);
  GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  g1.max_tiles = g2.max_tiles = 1;
  int tile = 0;
  for (int e = 0; e < a.experts; ++e) {
    if (offsets[e + 1] <= offsets[e]) continue;
    g1.tiles = g2.tiles = w.tiles + tile++;
    launch_grouped_gemm_quant(g1, a.gate_up_q, w.xq, w.xqs, s);
  }
  launch_quantize_act(w.h, a.elem, pairs_of(a), a.intermediate, w.offsets + a.experts, w.hq,
                      w.hqs, s);
  tile = 0;
  for (int e = 0; e < a.experts; ++e) {
    if (offsets[e + 1] <= offsets[e]) continue;
    g1.tiles = g2.tiles = w.tiles + tile++;
    launch_grouped_gemm_quant(g2, a.down_q, w.hq, w.hqs, s);
  }
  run_combine(a, w, s);
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
  if (a.quantized) return run_eager_quant(a, w, offsets, s);
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
    launch_activation(w.gu, rows, int(I), a.gated, a.concatenated, int(a.act), a.limit, a.alpha,
                      a.elem, h, s);
    const char* dn_w = static_cast<const char*>(a.down) + es * size_t(e) * H * I;
    const char* dn_b = a.has_bias ? static_cast<const char*>(a.down_bias) + es * size_t(e) * H
                                  : nullptr;
    launch_dense_linear(h, rows, int(I), dn_w, a.transposed ? 1 : I, a.transposed ? H : 1, dn_b,
                        int(H), a.elem, static_cast<float*>(w.y) + size_t(begin) * H, s);
  }
  run_combine(a, w, s);
}

}  // namespace

// The kernels take the activation as its Activation value.
static_assert(int(Activation::kSilu) == 0 && int(Activation::kGelu) == 1 &&
              int(Activation::kGeluTanh) == 2 && int(Activation::kRelu) == 3 &&
              int(Activation::kSwigluOai) == 4);

ExpertsShape shape_of(const ExpertsArgs& a) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  ExpertsShape s;
  s.elem = a.elem;
  s.tokens = a.tokens;
  s.pairs = pairs_of(a);
  s.experts = a.experts;
  s.hidden = a.hidden;
  s.intermediate = a.intermediate;
  s.gated = a.gated;
  s.concatenated = a.concatenated;
  s.transposed = a.transposed;
  s.aligned16 = aligned(a.hidden_states) && aligned(a.gate_up) && aligned(a.down);
  s.quantized = a.quantized;
  s.fp4 = a.quantized && a.gate_up_q.fp4;
  return s;
}

DeviceTraits traits_of(int device) {
  const DeviceInfo& d = device_info(device);
  return DeviceTraits{d.major, d.minor, d.sm_count};
}

size_t eager_workspace_bytes(const ExpertsArgs& a) {
  const int tiles = int(std::max<int64_t>(1, std::min<int64_t>(a.experts, pairs_of(a))));
  return carve(a, tiles, Extra::kEagerProducts, nullptr).bytes;
}

void eager_experts(const ExpertsArgs& a, void* workspace, cudaStream_t s) {
  if (a.tokens <= 0) return;
  const int tiles = int(std::max<int64_t>(1, std::min<int64_t>(a.experts, pairs_of(a))));
  run_eager(a, carve(a, tiles, Extra::kEagerProducts, workspace), s);
}

size_t batched_mm_workspace_bytes(const ExpertsArgs& a, const ExpertsPlan&) {
  return carve(a, int(std::max<int64_t>(pairs_of(a), 1)), Extra::kNone, nullptr).bytes;
}

void batched_mm_experts(const ExpertsArgs& a, const ExpertsPlan& plan, void* workspace,
                        cudaStream_t s) {
  if (a.tokens <= 0) return;
  const int64_t P = pairs_of(a);
  Workspace w = carve(a, int(std::max<int64_t>(P, 1)), Extra::kNone, workspace);
  // No routing kernel: pair p is its own tile and output row p, the GEMMs read each pair's expert
  // from top_k_index and the combine skips sentinel ids itself (one launch fewer on the decode
  // chain from the router to the experts).
  w.sorted_pair = w.pos_of_pair = nullptr;
  w.tiles = nullptr;
  w.num_tiles = nullptr;
  run_gemms(a, w, plan, s);
  run_combine(a, w, s);
}

namespace {
// The masked layout's rows: E * T (T rows per expert, the most a token's distinct choices give).
int64_t masked_rows_of(const ExpertsArgs& a) { return a.tokens; }

Workspace carve_grouped(const ExpertsArgs& a, const ExpertsPlan& plan, void* base) {
  Workspace w = carve(a, int(route_max_tiles(pairs_of(a), a.experts, plan.tile_rows)),
                      plan.gemm == GemmPath::kWgmma || plan.gemm == GemmPath::kWgmmaFp8
                          ? Extra::kSortedA
                          : Extra::kNone,
                      base, plan.masked ? int64_t(a.experts) * masked_rows_of(a) : 0);
  w.masked = plan.masked;
  return w;
}
}  // namespace

namespace {
// The dynamic schedule's counters start at zero (the kernel leaves them so, but the workspace
// may have held anything before), else no claims: the GEMMs keep the static schedule.
void prepare_item_claims(Workspace& w, const ExpertsPlan& plan, cudaStream_t s) {
  if (!plan.dynamic_items) return;
  w.item_claims = w.claims_buffer;
  MOEX_CUDA_CHECK(cudaMemsetAsync(w.item_claims, 0, 2 * sizeof(int), s));
}
}  // namespace

size_t sonicmoe_workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& plan) {
  return carve(a, int(route_max_tiles(pairs_of(a), a.experts, plan.tile_rows)), Extra::kFused,
               nullptr)
      .bytes;
}

void sonicmoe_experts(const ExpertsArgs& a, const ExpertsPlan& plan, void* workspace,
                      cudaStream_t s) {
  if (a.tokens <= 0) return;
  if (!plan.fused || plan.gemm != GemmPath::kWgmma)
    throw Error("sonicmoe_experts: needs a fused wgmma plan (plan_sonicmoe)");
  const int64_t P = pairs_of(a);
  Workspace w = carve(a, int(route_max_tiles(P, a.experts, plan.tile_rows)), Extra::kFused,
                      workspace);
  prepare_item_claims(w, plan, s);
  launch_route_by_expert(a.top_k_index, a.index_i64, P, a.experts, plan.tile_rows,
                         plan.raster_tiles, w.offsets, w.sorted_pair, w.pos_of_pair, w.tiles,
                         w.max_tiles, w.num_tiles, s);
  // gate_up reads its A rows from the hidden states itself (no gathered copy); the activation
  // runs in its epilogue, h rounded to the element type.
  GroupedGemmArgs g1 = gemm_args(a, w, GemmKind::kGateUp);
  launch_grouped_gemm_wgmma(g1, WgmmaConfig{plan.tile_rows, 256, false, /*gather_a=*/true}, s);
  // down writes each pair's row rounded to the element type; the combine gathers and sums them
  // per token in slot order (deterministic, no atomics).
  GroupedGemmArgs g2 = gemm_args(a, w, GemmKind::kDown);
  g2.a_rows = P;
  // Cooperative tiles (the plan's) stage those rows through shared memory and store whole-row
  // 16-byte pieces; a ping-pong plan (set by hand) stores them from the accumulators.
  WgmmaConfig down{plan.tile_rows, plan.b_rows, plan.pingpong_down};
  if (!plan.pingpong_down) {
    down.b_rows = 256;
    down.staged_out = true;
  }
  launch_grouped_gemm_wgmma(g2, down, s);
  run_combine(a, w, s);
}

size_t grouped_mm_workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& plan) {
  return carve_grouped(a, plan, nullptr).bytes;
}

void grouped_mm_experts(const ExpertsArgs& a, const ExpertsPlan& plan, void* workspace,
                        cudaStream_t s) {
  if (a.tokens <= 0) return;
  const int64_t P = pairs_of(a);
  Workspace w = carve_grouped(a, plan, workspace);
  prepare_item_claims(w, plan, s);
  if (plan.masked)
    launch_route_masked(a.top_k_index, a.index_i64, P, a.experts, int(masked_rows_of(a)),
                        plan.tile_rows, plan.raster_tiles, w.offsets, w.sorted_pair, w.pos_of_pair,
                        w.tiles, w.max_tiles, w.num_tiles, s);
  else
    launch_route_by_expert(a.top_k_index, a.index_i64, P, a.experts, plan.tile_rows,
                           plan.raster_tiles, w.offsets, w.sorted_pair, w.pos_of_pair, w.tiles,
                           w.max_tiles, w.num_tiles, s);
  run_gemms(a, w, plan, s);
  run_combine(a, w, s);
}

}  // namespace moex::cuda
