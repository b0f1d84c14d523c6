// The grouped experts computation of the CPU engine (design notes in engine.hpp):
// route (counting sort by expert) -> gather rows -> gate_up GEMM + bias + activation (fused
// epilogue, intermediate rounded to the activation dtype) -> down GEMM + bias, times the routing
// weight, into per-slot fp32 rows -> combine each token's slots in order j = 0..k-1.
// One OpenMP region per call; a phase starts when every item of the previous one is done
// (completion counters, not thread barriers), and items are handed out by guided
// self-scheduling. The result does not depend on which thread did what.
#include <immintrin.h>  // SSE2 streaming stores (baseline x86-64)
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/activation.hpp"
#include "core/env_switch_read.hpp"
#include "cpu/big_alloc.hpp"
#include "cpu/engine.hpp"

namespace moex::cpu {
namespace {

// A grow-only, 64-byte aligned buffer (huge pages from 2 MiB on, big_alloc.hpp): a workspace
// reaches the largest size it has been asked for and then never allocates again.
class GrowBuffer {
 public:
  ~GrowBuffer() { release(); }
  void* get(size_t bytes) {
    if (bytes > cap_) {
      release();
      cap_ = std::max(bytes, cap_ + cap_ / 2);
      ptr_ = big_alloc(cap_);
      // Rows past the last one may be read by whole-tile loads (kernels.hpp); keep them finite.
      std::memset(ptr_, 0, cap_);
    }
    return ptr_;
  }

 private:
  void release() {
    big_free(ptr_, cap_);
    ptr_ = nullptr;
    cap_ = 0;
  }
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

struct Workspace {
  GrowBuffer xa, hb, ybuf, row_slot, row_weight, experts, panels;
};
// One per calling thread: a backend instance serves every layer and thread concurrently.
thread_local Workspace t_ws;

// A panel of at most kPanelRows consecutive rows of one expert: the unit of row blocking. A
// thread walks the column blocks of one panel in a row, so the panel's activations (<= 256 rows
// x K: 1 MiB at K = 2048 bf16) stay in the 2 MiB L2 while the weights stream past; each weight
// block is read from DRAM ceil(m / 256) times (128 rows read Qwen's experts 3x at T = 4096,
// measured 390 vs 1000+ GFLOP/s).
struct ActiveExpert {
  int32_t e;
  int32_t rows;
  int64_t row0;  // first row in the gathered buffers
};
constexpr int64_t kPanelRows = 256;
// Padding of activation rows: a row stride that is a multiple of 4 KiB maps the rows of a
// register block onto one L1 set (thrashing); one extra cache line per row spreads them.
constexpr int64_t kRowPadBytes = 64;
// Slots per token the vectorized combine takes (larger top_k: the scalar combine).
constexpr int64_t kMaxTopK = 64;

// Guided self-scheduling of [0, total): each grab takes a contiguous range of about
// remaining / (2 * threads) items (at least min_grain), so ranges start large (long sequential
// weight streams) and shrink towards the end (no thread idles at the tail). Dynamic rather than
// a precomputed split because the 2-core target is shared: a thread that loses its core for a
// time slice must not hold back half of the phase. The result does not depend on the split.
class WorkQueue {
 public:
  void reset(int64_t total, int64_t min_grain, int threads) {
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    total_ = total;
    min_grain_ = std::max<int64_t>(1, min_grain);
    threads_ = threads;
  }
  // Completion instead of an OpenMP barrier: a phase is over when all its items are done, not
  // when all threads have arrived, so a thread that has not been scheduled yet (the 2 cores are
  // shared) does not hold the others back; the caller then does the whole phase itself.
  void finish(int64_t n) { done_.fetch_add(n, std::memory_order_release); }
  void wait_all() const {
    for (int spins = 0; done_.load(std::memory_order_acquire) < total_; ++spins)
      if (spins > 64) sched_yield();  // let a co-scheduled sibling finish its range
  }
  bool grab(int64_t* begin, int64_t* end) {
    int64_t cur = next_.load(std::memory_order_relaxed);
    for (;;) {
      if (cur >= total_) return false;
      const int64_t g = std::max(min_grain_, (total_ - cur) / (2 * threads_));
      const int64_t to = std::min(total_, cur + g);
      if (next_.compare_exchange_weak(cur, to, std::memory_order_relaxed)) {
        *begin = cur;
        *end = to;
        return true;
      }
    }
  }

 private:
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
  int64_t total_ = 0, min_grain_ = 1;
  int threads_ = 1;
};

template <class T>
inline void store_as(T* dst, float v) {
  if constexpr (sizeof(T) == 2) *dst = float_to_bf16(v);
  else *dst = v;
}

struct CallContext {
  const PreparedCpuExperts* p;
  const ActiveExpert* act;
  int64_t n_act;
  const int32_t* row_slot;
  const float* row_weight;
  void* xa;      // gathered hidden rows [rows + slack, xa_ld]
  int64_t xa_ld;
  void* hb;      // activated intermediate [rows + slack, h_ld]
  int64_t h_ld;
  float* ybuf;   // [T*k, H]
  // Down writes ybuf with non-temporal stores when it is far larger than the L2: the per-row
  // 128-byte pieces otherwise cost a read-for-ownership each (a quarter of the down phase at
  // T = 4096, measured); small (decode) buffers stay cached for the combine.
  bool stream_y;
};
// The phases of a call, in order; each has its work queue, and the profile its time stamp.
enum Phase : int { kGather, kGateUp, kDown, kCombine, kPhases };

// ybuf size from which down streams its stores (and H must be a multiple of 16).
constexpr size_t kStreamYBytes = size_t(16) << 20;

// Scratch for one kernel call's fp32 results (32 x 32).
constexpr int64_t kUnitScratchFloats = kernels::kMaxRows * kernels::kBlockCols;

// Runs the GEMM of one unit (a panel of an expert's rows x one 32-column block) in row chunks and
// hands each fp32 chunk to `epilogue(c, rows, first_row)`. `next_b` (may be null) is the weight
// block of the following unit, prefetched into L2 in pieces over this unit's kernel calls.
// (Slicing K so that the weight slice stays in L1 across the row chunks was tried: no measurable
// gain, docs/cpu.md.)
template <class Epilogue>
void run_unit(const KernelSet& ks, const void* a, int64_t lda, size_t elem, const void* b,
              int64_t panel_stride, int64_t k, const ActiveExpert& ae, float* c,
              const void* next_b, Epilogue&& epilogue) {
  const int64_t chunks = (ae.rows + kernels::kMaxRows - 1) / kernels::kMaxRows;
  const int64_t block_bytes = 2 * panel_stride * int64_t(elem);
  const int64_t piece = (block_bytes / chunks + 63) / 64 * 64;
  // The kernel is chosen by the panel's rows, not the chunk's: the few-row tail of a larger
  // panel (68 rows = 32 + 32 + 4) would cost a VDPBF16PS pass over the whole block, about as
  // long as a 32-row AMX call, while AMX does it with one 16-row tile.
  const kernels::GemmFn fn = ae.rows <= ks.small_max_rows ? ks.small : ks.large;
  for (int64_t r0 = 0, ci = 0; r0 < ae.rows; r0 += kernels::kMaxRows, ++ci) {
    const int m = int(std::min<int64_t>(kernels::kMaxRows, ae.rows - r0));
    kernels::GemmArgs g;
    g.a = static_cast<const char*>(a) + size_t(ae.row0 + r0) * size_t(lda) * elem;
    g.lda = lda;
    g.b = b;
    g.panel_stride = panel_stride;
    g.k = k;
    g.m = m;
    g.c = c;
    g.ldc = kernels::kBlockCols;
    if (next_b && ci * piece < block_bytes) {
      g.prefetch = static_cast<const char*>(next_b) + ci * piece;
      g.prefetch_bytes = std::min(piece, block_bytes - ci * piece);
    }
    fn(g);
    epilogue(c, m, ae.row0 + r0);
  }
}

template <class T>
void gate_up_phase(const CallContext& cx, WorkQueue& q, float* c) {
  const PreparedCpuExperts& p = *cx.p;
  const ExpertsSpec& s = p.spec;
  const PackedMatrices& W = p.gate_up;
  const int64_t blocks = W.n_pad / kernels::kBlockCols, I = s.intermediate;
  T* h = static_cast<T*>(cx.hb);
  const kernels::GatedRowsFn silu_vec = s.act == Activation::kSilu ? p.kernels.gated_silu : nullptr;
  int64_t u0, u1;
  while (q.grab(&u0, &u1)) {
  for (int64_t u = u0; u < u1; ++u) {
    const ActiveExpert& ae = cx.act[u / blocks];
    const int64_t blk = u % blocks;
    const float* bias = s.has_bias ? p.gate_up_bias.data() + ae.e * W.n_pad + blk * kernels::kBlockCols
                                   : nullptr;
    const bool last = blk == blocks - 1;
    const void* next = u + 1 < u1 ? W.block(cx.act[(u + 1) / blocks].e, (u + 1) % blocks) : nullptr;
    run_unit(p.kernels, cx.xa, cx.xa_ld, sizeof(T), W.block(ae.e, blk), W.panel_stride, W.k_pad,
             ae, c, next, [&](const float* cc, int m, int64_t row) {
      if (s.has_gate && silu_vec) {  // all m rows in one vectorized call
        const int64_t c0 = blk * kernels::kPanelCols;
        silu_vec(cc, m, bias, int(std::clamp<int64_t>(I - c0, 0, kernels::kPanelCols)),
                 h + row * cx.h_ld + c0, cx.h_ld);
      }
      for (int r = 0; r < m; ++r) {
        const float* cr = cc + r * kernels::kBlockCols;
        T* hr = h + (row + r) * cx.h_ld;
        if (s.has_gate && silu_vec) {
          // Written above for all m rows at once; only the K padding below remains.
        } else if (s.has_gate) {
          // [16 gate | 16 up] of intermediate columns blk*16 .. blk*16+15
          for (int i = 0; i < kernels::kPanelCols; ++i) {
            const int64_t col = blk * kernels::kPanelCols + i;
            float g = cr[i], up = cr[kernels::kPanelCols + i];
            if (bias) {
              g += bias[i];
              up += bias[kernels::kPanelCols + i];
            }
            float v = 0.f;
            if (col < I) {
              if (s.act == Activation::kSwigluOai) {
                const float lim = s.swiglu_limit;
                g = std::min(g, lim);
                up = std::max(-lim, std::min(up, lim));
                v = (up + 1.f) * (g / (1.f + std::exp(-s.swiglu_alpha * g)));
              } else {
                v = detail::activation_scalar<float>(s.act, g) * up;
              }
            }
            store_as(hr + col, v);
          }
        } else {
          for (int i = 0; i < kernels::kBlockCols; ++i) {
            const int64_t col = blk * kernels::kBlockCols + i;
            const float x = cr[i] + (bias ? bias[i] : 0.f);
            store_as(hr + col, col < I ? detail::activation_scalar<float>(s.act, x) : 0.f);
          }
        }
        // K padding of the down projection beyond the written columns must read as zero.
        if (last)
          for (int64_t col = p.i_cols; col < cx.h_ld; ++col) store_as(hr + col, 0.f);
      }
    });
  }
  q.finish(u1 - u0);
  }
}

template <class T>
void down_phase(const CallContext& cx, WorkQueue& q, float* c) {
  const PreparedCpuExperts& p = *cx.p;
  const PackedMatrices& W = p.down;
  const int64_t H = p.spec.hidden, blocks = W.n_pad / kernels::kBlockCols;
  int64_t u0, u1;
  while (q.grab(&u0, &u1)) {
  for (int64_t u = u0; u < u1; ++u) {
    const ActiveExpert& ae = cx.act[u / blocks];
    const int64_t blk = u % blocks, n0 = blk * kernels::kBlockCols;
    const int ncols = int(std::min<int64_t>(kernels::kBlockCols, H - n0));
    const float* bias = p.spec.has_bias ? p.down_bias.data() + ae.e * W.n_pad + n0 : nullptr;
    const void* next = u + 1 < u1 ? W.block(cx.act[(u + 1) / blocks].e, (u + 1) % blocks) : nullptr;
    run_unit(p.kernels, cx.hb, cx.h_ld, sizeof(T), W.block(ae.e, blk), W.panel_stride, W.k_pad,
             ae, c, next, [&](const float* cc, int m, int64_t row) {
      for (int r = 0; r < m; ++r) {
        const float* cr = cc + r * kernels::kBlockCols;
        const float w = cx.row_weight[row + r];
        float* y = cx.ybuf + int64_t(cx.row_slot[row + r]) * H + n0;
        if (cx.stream_y && ncols == kernels::kBlockCols) {
          // 128 aligned bytes = two whole lines: written without reading them first.
          const __m128 wv = _mm_set1_ps(w);
          for (int i = 0; i < kernels::kBlockCols; i += 4) {
            __m128 v = _mm_loadu_ps(cr + i);
            if (bias) v = _mm_add_ps(v, _mm_loadu_ps(bias + i));
            _mm_stream_ps(y + i, _mm_mul_ps(wv, v));
          }
        } else if (bias) {
          for (int i = 0; i < ncols; ++i) y[i] = w * (cr[i] + bias[i]);
        } else {
          for (int i = 0; i < ncols; ++i) y[i] = w * cr[i];
        }
      }
    });
  }
  if (cx.stream_y) _mm_sfence();  // the streamed rows are visible before the range counts done
  q.finish(u1 - u0);
  }
}

float load_weight(const void* w, DType dt, int64_t i) {
  switch (dt) {
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(w)[i]);
    case DType::kF16: return f16_to_float(static_cast<const uint16_t*>(w)[i]);
    default: return static_cast<const float*>(w)[i];
  }
}

template <class T>
void run_typed(const PreparedCpuExperts& p, const ExpertsProblem& pr, Tensor& out) {
  const ExpertsSpec& s = p.spec;
  const int64_t T_ = pr.tokens(), k = pr.top_k(), E = s.num_experts, H = s.hidden;
  if (T_ == 0) return;
  const int64_t* idx64 = pr.top_k_index.dtype() == DType::kI64 ? pr.top_k_index.data<int64_t>() : nullptr;
  const int32_t* idx32 = idx64 ? nullptr : pr.top_k_index.data<int32_t>();
  auto id_of = [&](int64_t slot) { return idx64 ? idx64[slot] : int64_t(idx32[slot]); };
  Workspace& ws = t_ws;

  // ---- route: stable counting sort of the slots by expert (sentinels dropped) ----
  auto* fill = static_cast<int64_t*>(ws.experts.get(sizeof(int64_t) * size_t(E + 1)));
  ActiveExpert* act = nullptr;
  std::fill(fill, fill + E + 1, 0);
  const int64_t slots = T_ * k;
  for (int64_t sl = 0; sl < slots; ++sl)
    if (int64_t e = id_of(sl); e < E) ++fill[e];
  int64_t n_act = 0, rows = 0;
  for (int64_t e = 0; e < E; ++e) rows += fill[e];
  // Panels: whole 32-row multiples except the last of each expert, so at most rows / 32 + E.
  act = static_cast<ActiveExpert*>(ws.panels.get(sizeof(ActiveExpert) *
                                                 size_t(rows / 32 + E + 1)));
  rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = fill[e];
    // Balanced panels (rounded to whole 32-row tiles): 273 rows -> 160 + 113, not 256 + 17,
    // whose 17-row panel would re-stream every weight block for almost no work.
    const int64_t n_panels = std::max<int64_t>(1, (m + kPanelRows - 1) / kPanelRows);
    const int64_t per = std::min(kPanelRows, ((m + n_panels - 1) / n_panels + 31) / 32 * 32);
    for (int64_t r = 0; r < m; r += per)
      act[n_act++] = ActiveExpert{int32_t(e), int32_t(std::min(per, m - r)), rows + r};
    fill[e] = rows;
    rows += m;
  }
  auto* row_slot = static_cast<int32_t*>(ws.row_slot.get(sizeof(int32_t) * size_t(rows + 1)));
  auto* row_weight = static_cast<float*>(ws.row_weight.get(sizeof(float) * size_t(rows + 1)));
  for (int64_t sl = 0; sl < slots; ++sl) {
    const int64_t e = id_of(sl);
    if (e >= E) continue;
    const int64_t r = fill[e]++;
    row_slot[r] = int32_t(sl);
    const int64_t wi = pr.weights_per_expert ? (sl / k) * E + e : sl;
    row_weight[r] = load_weight(pr.top_k_weights.raw(), pr.top_k_weights.dtype(), wi);
  }

  CallContext cx;
  cx.p = &p;
  cx.act = act;
  cx.n_act = n_act;
  cx.row_slot = row_slot;
  cx.row_weight = row_weight;
  cx.xa_ld = p.gate_up.k_pad + kRowPadBytes / int64_t(sizeof(T));
  const size_t slack_rows = size_t(rows + kernels::kRowSlack);
  cx.xa = ws.xa.get(slack_rows * size_t(cx.xa_ld) * sizeof(T));
  cx.h_ld = p.h_ld + kRowPadBytes / int64_t(sizeof(T));
  cx.hb = ws.hb.get(slack_rows * size_t(cx.h_ld) * sizeof(T));
  cx.ybuf = static_cast<float*>(ws.ybuf.get(sizeof(float) * size_t(slots * H)));
  // Rows must start on a cache line (H % 16 == 0) for the streamed pieces to be whole, aligned
  // lines (movntps also faults on a misaligned address).
  cx.stream_y = sizeof(float) * size_t(slots * H) >= kStreamYBytes && H % 16 == 0;
  const T* hidden = pr.hidden.data<T>();
  T* o = out.data<T>();
  // MOEX_CPU_PROFILE=1 prints the time of each phase (kernel lab use; off by default).
  static const bool profile = env_switch_int("MOEX_CPU_PROFILE", 0) == 1;
  double stamp[kPhases + 1] = {omp_get_wtime()};  // stamp[ph]: phase ph starts

  const int nt_max = omp_get_max_threads();
  WorkQueue queues[kPhases];
  queues[kGather].reset(rows, 64, nt_max);
  queues[kGateUp].reset(n_act * (p.gate_up.n_pad / kernels::kBlockCols), 1, nt_max);
  queues[kDown].reset(n_act * (p.down.n_pad / kernels::kBlockCols), 1, nt_max);
  queues[kCombine].reset(T_, 16, nt_max);
#pragma omp parallel
  {
    const int tid = omp_get_thread_num();
    alignas(64) float c[kUnitScratchFloats];
    // gather: row r <- hidden[token of its slot], K padding zeroed
    int64_t r0, r1;
    while (queues[kGather].grab(&r0, &r1)) {
      T* xa = static_cast<T*>(cx.xa);
      for (int64_t r = r0; r < r1; ++r) {
        T* dst = xa + r * cx.xa_ld;
        std::memcpy(dst, hidden + (row_slot[r] / k) * H, sizeof(T) * size_t(H));
        std::memset(dst + H, 0, sizeof(T) * size_t(cx.xa_ld - H));
      }
      queues[kGather].finish(r1 - r0);
    }
    queues[kGather].wait_all();
    if (tid == 0) stamp[kGateUp] = omp_get_wtime();
    gate_up_phase<T>(cx, queues[kGateUp], c);
    queues[kGateUp].wait_all();
    if (tid == 0) stamp[kDown] = omp_get_wtime();
    down_phase<T>(cx, queues[kDown], c);
    queues[kDown].wait_all();
    if (tid == 0) stamp[kCombine] = omp_get_wtime();
    // combine: a token's valid slots in order j = 0..k-1, fp32, one rounding
    constexpr int64_t kChunk = 256;
    int64_t t0, t1;
    while (queues[kCombine].grab(&t0, &t1))
    for (int64_t t = t0; t < t1; ++t) {
      if (p.kernels.sum_rows && k <= kMaxTopK) {
        const float* src[kMaxTopK];
        int n = 0;
        for (int64_t j = 0; j < k; ++j)
          if (id_of(t * k + j) < E) src[n++] = cx.ybuf + (t * k + j) * H;
        p.kernels.sum_rows(src, n, H, o + t * H);
        continue;
      }
      for (int64_t n0 = 0; n0 < H; n0 += kChunk) {
        const int64_t nc = std::min(kChunk, H - n0);
        float acc[kChunk];
        std::fill(acc, acc + nc, 0.f);
        for (int64_t j = 0; j < k; ++j) {
          if (id_of(t * k + j) >= E) continue;
          const float* y = cx.ybuf + (t * k + j) * H + n0;
          for (int64_t i = 0; i < nc; ++i) acc[i] += y[i];
        }
        for (int64_t i = 0; i < nc; ++i) store_as(o + t * H + n0 + i, acc[i]);
      }
    }
  }
  if (profile) {
    stamp[kPhases] = omp_get_wtime();
    auto ms = [&](Phase ph) { return 1e3 * (stamp[ph + 1] - stamp[ph]); };
    std::fprintf(stderr,
                 "[moex cpu] T=%ld rows=%ld panels=%ld ms: gather %.3f gate_up %.3f down %.3f "
                 "combine %.3f\n",
                 long(T_), long(rows), long(n_act), ms(kGather), ms(kGateUp), ms(kDown),
                 ms(kCombine));
  }
}

}  // namespace

void run_cpu_experts(const PreparedCpuExperts& p, const ExpertsProblem& problem, Tensor& out) {
  if (p.kernels.dtype == DType::kBF16) run_typed<uint16_t>(p, problem, out);
  else run_typed<float>(p, problem, out);
}

}  // namespace moex::cpu
