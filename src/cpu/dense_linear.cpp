// See dense_linear.hpp.
#include "cpu/dense_linear.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/big_alloc.hpp"
#include "moex/error.hpp"

namespace moex::cpu {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Rows of one panel: the unit of row blocking (as the experts engine, engine_grouped.cpp): 256
// rows x K = 2048 bf16 activations are 1 MiB, which stays in the 2 MiB L2 while weights stream.
constexpr int64_t kPanelRows = 256;
// Activation rows are padded by one cache line: a row stride that is a multiple of 4 KiB would map
// the rows of a register block onto one L1 set.
constexpr int64_t kRowPadBytes = 64;
// k classes of the plain loop (ops/cpu/cpu_ops.hpp dot: eight accumulators over k mod 8).
constexpr int64_t kSlices = 8;
// Below this many multiply-adds one thread is faster than waking the others.
constexpr int64_t kParallelWork = int64_t(1) << 15;

// The host ops' rounding of results (ops/cpu/cpu_ops.hpp round_act): bf16 only.
inline float round_act(float v, DType act) { return act == DType::kBF16 ? round_bf16(v) : v; }

// Grow-only activation buffer of the calling thread (no allocation per call once the largest
// shape has been seen).
struct ActBuffer {
  void* p = nullptr;
  size_t cap = 0;  // bytes
  ~ActBuffer() { big_free(p, cap); }
  void* get(size_t bytes) {
    if (bytes > cap) {
      big_free(p, cap);
      cap = std::max(bytes, cap + cap / 2);
      p = big_alloc(cap);
    }
    return p;
  }
};
thread_local ActBuffer t_act;

// Packs panel q (output columns 16q .. 16q+15) of weight w [out, in] in the permuted k order
// (header: class j = k j, j + 8, ... at slice j, then the tail; zeros in the padding). Each
// packed k row (16 lanes, 64 bytes) is written whole, and the 16 source rows are walked in
// chunks of kPackChunk classes' steps that stay in L1: writing lane by lane instead touched
// every destination line 16 times (measured 2-3x slower). `zero`: a row of zeros for lanes past
// `out`. bf16: each 32-bit pair holds the earlier k in the half the kernel adds first
// (swap_pairs: the odd, high half).
constexpr int64_t kPackChunk = 64;

template <class Src, class Dst>
void pack_panel(const Src* w, DType src, int64_t out, int64_t in, int64_t slice, int64_t k_pad,
                bool swap_pairs, int64_t q, const Src* zero, Dst* dst) {
  const int64_t per = in / 8, tail = in - 8 * per;
  const Src* rows[kernels::kPanelCols];
  for (int64_t lane = 0; lane < kernels::kPanelCols; ++lane) {
    const int64_t n = q * kernels::kPanelCols + lane;
    rows[lane] = n < out ? w + n * in : zero;
  }
  // value(lane, k) for k < in, 0 for k = -1
  auto conv = [src](Src v) -> Dst {
    if constexpr (sizeof(Dst) == 2 || sizeof(Src) == 4) return Dst(v);
    else return src == DType::kF16 ? f16_to_float(v) : bf16_to_float(v);
  };
  // Writes packed k rows kk, kk + 1 (one pair row for bf16) from source columns k0, k1 (-1: 0).
  auto put2 = [&](int64_t kk, int64_t k0, int64_t k1) {
    if constexpr (sizeof(Dst) == 2) {
      uint32_t* d = reinterpret_cast<uint32_t*>(dst) + (kk / 2) * kernels::kPanelCols;
      const int first = swap_pairs ? 16 : 0, second = 16 - first;
      for (int lane = 0; lane < kernels::kPanelCols; ++lane) {
        const uint32_t a = k0 < 0 ? 0 : rows[lane][k0], b = k1 < 0 ? 0 : rows[lane][k1];
        d[lane] = a << first | b << second;
      }
    } else {
      Dst* d = dst + kk * kernels::kPanelCols;
      for (int lane = 0; lane < kernels::kPanelCols; ++lane) {
        d[lane] = k0 < 0 ? Dst(0) : conv(rows[lane][k0]);
        d[kernels::kPanelCols + lane] = k1 < 0 ? Dst(0) : conv(rows[lane][k1]);
      }
    }
  };
  for (int64_t t0 = 0; t0 < slice; t0 += kPackChunk)
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t t = t0; t < std::min(t0 + kPackChunk, slice); t += 2)
        put2(j * slice + t, t < per ? j + 8 * t : -1, t + 1 < per ? j + 8 * t + 8 : -1);
  for (int64_t t = 0; t < k_pad - 8 * slice; t += 2)
    put2(8 * slice + t, t < tail ? 8 * per + t : -1, t + 1 < tail ? 8 * per + t + 1 : -1);
}

}  // namespace

KernelSet plan_dense_kernels(DType packed_dtype, const CpuFeatures& f,
                             std::optional<KernelPath> force) {
  KernelPath path = force.value_or(best_kernel_path(f));
  if (path == KernelPath::kAmx) path = KernelPath::kAvx512Bf16;  // row independence (header)
  return plan_kernels(packed_dtype, f, path);
}

bool DenseLinear::packable(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

std::shared_ptr<const DenseLinear> DenseLinear::pack(const Tensor& weight,
                                                     std::optional<KernelPath> force) {
  if (!packable(weight.dtype()) || weight.dim() != 2)
    throw Unsupported("dense linears pack 2-D bfloat16, float16 or float32 weights, not " +
                      weight.str());
  const Tensor t = weight.contiguous();
  auto d = std::make_shared<DenseLinear>();
  d->out_ = t.size(0);
  d->in_ = t.size(1);
  d->source_ = t.dtype();
  const DType pd = t.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
  d->kernels_ = plan_dense_kernels(pd, detect_cpu_features(), force);
  PackedMatrices& w = d->w_;
  w.dtype = pd;
  w.experts = 1;
  w.n_pad = round_up(std::max<int64_t>(d->out_, 1), kernels::kBlockCols);
  // The plain loop's k order: class j (k = j, j + 8, ...) in slice j, then the tail (header).
  const int64_t in = d->in_, per = in / kSlices;
  d->slice_ = round_up(per, 2);
  d->tail_ = round_up(in - per * kSlices, 2);
  w.k_pad = kSlices * d->slice_ + d->tail_;
  // VDPBF16PS adds the odd element of a pair before the even one; the widening kernels the even
  // one first. Each pair holds the earlier k in the slot added first.
  const bool odd_first = d->kernels_.small == kernels::gemm_bf16_avx512bf16;
  d->order_.assign(size_t(w.k_pad), -1);
  auto place = [&](int64_t kk, int64_t k) {
    d->order_[size_t(pd == DType::kBF16 && odd_first ? kk ^ 1 : kk)] = int32_t(k);
  };
  for (int64_t j = 0; j < kSlices; ++j)
    for (int64_t t = 0; t < per; ++t) place(j * d->slice_ + t, j + kSlices * t);
  for (int64_t t = 0; t < in - per * kSlices; ++t) place(kSlices * d->slice_ + t, per * kSlices + t);
  w.panel_stride = w.k_pad * kernels::kPanelCols;
  w.expert_stride = w.n_pad * w.k_pad;
  const size_t bytes = w.bytes();
  w.data = std::shared_ptr<void>(big_alloc(bytes), [bytes](void* p) { big_free(p, bytes); });
  const int64_t panels = w.n_pad / kernels::kPanelCols, out = d->out_;
  const void* src = t.raw();
  char* base = static_cast<char*>(w.data.get());
  const size_t panel_bytes = size_t(w.panel_stride) * w.elem();
  const DType sd = t.dtype();
  // Every element, padding included, is written (no separate zeroing pass over the buffer).
  const std::vector<float> zero(size_t(in), 0.f);  // read as any source element type
#pragma omp parallel for schedule(dynamic, 4) if (bytes >= (size_t(1) << 20))
  for (int64_t q = 0; q < panels; ++q) {
    void* dst = base + size_t(q) * panel_bytes;
    const int64_t sl = d->slice_, kp = w.k_pad;
    if (pd == DType::kBF16)
      pack_panel(static_cast<const uint16_t*>(src), sd, out, in, sl, kp, odd_first, q,
                 reinterpret_cast<const uint16_t*>(zero.data()), static_cast<uint16_t*>(dst));
    else if (sd == DType::kF32)
      pack_panel(static_cast<const float*>(src), sd, out, in, sl, kp, false, q, zero.data(),
                 static_cast<float*>(dst));
    else
      pack_panel(static_cast<const uint16_t*>(src), sd, out, in, sl, kp, false, q,
                 reinterpret_cast<const uint16_t*>(zero.data()), static_cast<float*>(dst));
  }
  return d;
}

void DenseLinear::run_scalar(const float* x, int64_t rows, const float* bias, DType act,
                             float* y) const {
  const uint16_t* w = static_cast<const uint16_t*>(w_.data.get());
  const int64_t out = out_, in = in_;
  std::vector<int64_t> pos(static_cast<size_t>(in));  // packed position of source column k
  for (int64_t kk = 0; kk < w_.k_pad; ++kk)
    if (order_[size_t(kk)] >= 0) pos[size_t(order_[size_t(kk)])] = kk;
#pragma omp parallel for schedule(static) if (rows * in * out >= kParallelWork)
  for (int64_t n = 0; n < out; ++n) {
    const uint16_t* panel = w + (n / kernels::kPanelCols) * w_.panel_stride + (n % kernels::kPanelCols) * 2;
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * in;
      float acc = 0.f;
      for (int64_t k = 0; k < in; ++k)
        acc += xr[k] * bf16_to_float(panel[(pos[size_t(k)] / 2) * 2 * kernels::kPanelCols + (pos[size_t(k)] & 1)]);
      y[r * out + n] = round_act(acc + (bias ? bias[n] : 0.f), act);
    }
  }
}

Tensor DenseLinear::run(const Tensor& xt, const Tensor& bias_t, DType act) const {
  const int64_t rows = xt.size(0), out = out_, in = in_;
  Tensor yt = Tensor::empty({rows, out}, DType::kF32);
  if (rows == 0 || out == 0) return yt;
  const Tensor xc = xt.contiguous();
  const float* x = xc.data<float>();
  const float* bias = bias_t.defined() ? bias_t.data<float>() : nullptr;
  float* y = yt.data<float>();
  const bool bf16 = w_.dtype == DType::kBF16;
  auto bf16_values = [&] {
    for (int64_t i = 0; i < rows * in; ++i)
      if (round_bf16(x[i]) != x[i]) return false;
    return true;
  };
  if (bf16 && act != DType::kBF16 && !bf16_values()) {  // values bf16 cannot hold exactly
    run_scalar(x, rows, bias, act, y);
    return yt;
  }
  const bool parallel = rows * in * out >= kParallelWork;
  const int threads = parallel ? omp_get_max_threads() : 1;

  // A operand: x's rows gathered into the packed k order (zeros at padding), as bf16 (exact:
  // they hold bf16 values) or float32.
  const int64_t lda = w_.k_pad + kRowPadBytes / int64_t(w_.elem());
  void* a = t_act.get(size_t(rows * lda) * w_.elem());
  const int32_t* order = order_.data();
#pragma omp parallel for schedule(static) if (parallel && rows >= 16)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    if (bf16) {
      uint16_t* d = static_cast<uint16_t*>(a) + r * lda;
      for (int64_t kk = 0; kk < w_.k_pad; ++kk) d[kk] = order[kk] < 0 ? 0 : float_to_bf16(xr[order[kk]]);
    } else {
      float* d = static_cast<float*>(a) + r * lda;
      for (int64_t kk = 0; kk < w_.k_pad; ++kk) d[kk] = order[kk] < 0 ? 0.f : xr[order[kk]];
    }
  }
  const size_t elem = w_.elem();
  const int64_t blocks = w_.n_pad / kernels::kBlockCols;
  const int64_t panels = (rows + kPanelRows - 1) / kPanelRows;
  const int64_t units = panels * blocks;
  // Contiguous ranges of column blocks: long sequential weight streams per thread; dynamic, so a
  // thread that loses its (shared) core does not hold back the call. The split does not change
  // any result.
  const int64_t grain = std::max<int64_t>(1, blocks / (4 * threads));
  const kernels::GemmFn fn = kernels_.small;
#pragma omp parallel for schedule(dynamic, grain) num_threads(threads)
  for (int64_t u = 0; u < units; ++u) {
    // One fp32 result per k slice (the tail last), combined as the plain loop combines its
    // accumulators: ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)) + tail.
    alignas(64) float c[kSlices + 1][kernels::kMaxRows * kernels::kBlockCols];
    const int64_t panel = u / blocks, blk = u % blocks;
    const int64_t p0 = panel * kPanelRows, prow = std::min(kPanelRows, rows - p0);
    const int64_t col0 = blk * kernels::kBlockCols;
    const int valid = int(std::min<int64_t>(kernels::kBlockCols, out - col0));
    const char* b = static_cast<const char*>(w_.block(0, blk));
    for (int64_t r0 = p0; r0 < p0 + prow; r0 += kernels::kMaxRows) {
      const int m = int(std::min<int64_t>(kernels::kMaxRows, p0 + prow - r0));
      for (int64_t j = 0; j <= kSlices; ++j) {
        const int64_t k0 = j * slice_, len = j < kSlices ? slice_ : tail_;
        if (len == 0) {
          std::fill(c[j], c[j] + m * kernels::kBlockCols, 0.f);
          continue;
        }
        kernels::GemmArgs g;
        g.a = static_cast<const char*>(a) + size_t(r0 * lda + k0) * elem;
        g.lda = lda;
        g.b = b + size_t(k0 * kernels::kPanelCols) * elem;  // both layouts: 16 elements per k
        g.panel_stride = w_.panel_stride;
        g.k = len;
        g.m = m;
        g.c = c[j];
        g.ldc = kernels::kBlockCols;
        fn(g);
      }
      for (int r = 0; r < m; ++r) {
        float* yr = y + (r0 + r) * out + col0;
        for (int i = 0; i < valid; ++i) {
          const int e = r * kernels::kBlockCols + i;
          float v = ((c[0][e] + c[4][e]) + (c[1][e] + c[5][e])) + ((c[2][e] + c[6][e]) + (c[3][e] + c[7][e])) +
                    c[kSlices][e];
          if (bias) v += bias[col0 + i];
          yr[i] = round_act(v, act);
        }
      }
    }
  }
  return yt;
}

}  // namespace moex::cpu
