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
// Below this many multiply-adds one thread is faster than waking the others.
constexpr int64_t kParallelWork = int64_t(1) << 15;

// The host ops' rounding of results (ops/cpu/cpu_ops.hpp round_act): bf16 only.
inline float round_act(float v, DType act) { return act == DType::kBF16 ? round_bf16(v) : v; }

// Grow-only bf16 activation buffer of the calling thread (no allocation per call once the
// largest shape has been seen).
struct ActBuffer {
  uint16_t* p = nullptr;
  size_t cap = 0;  // bytes
  ~ActBuffer() { big_free(p, cap); }
  uint16_t* get(size_t elems) {
    if (elems * 2 > cap) {
      big_free(p, cap);
      cap = std::max(elems * 2, cap + cap / 2);
      p = static_cast<uint16_t*>(big_alloc(cap));
    }
    return p;
  }
};
thread_local ActBuffer t_act;

// Packs panel q (output columns 16q .. 16q+15) of weight w [out, in] of source dtype `src`.
void pack_panel_bf16(const uint16_t* w, int64_t out, int64_t in, int64_t k_pad, int64_t q,
                     uint32_t* dst) {
  const int64_t pairs = k_pad / 2, full = in / 2;
  for (int64_t lane = 0; lane < kernels::kPanelCols; ++lane) {
    const int64_t n = q * kernels::kPanelCols + lane;
    uint32_t* d = dst + lane;
    if (n >= out) {
      for (int64_t p = 0; p < pairs; ++p) d[p * kernels::kPanelCols] = 0;
      continue;
    }
    const uint16_t* row = w + n * in;
    int64_t p = 0;
    for (; p < full; ++p) {
      uint32_t v;
      std::memcpy(&v, row + 2 * p, 4);  // little endian: the even k in the low half (pair layout)
      d[p * kernels::kPanelCols] = v;
    }
    if (in % 2) d[p++ * kernels::kPanelCols] = row[in - 1];
    for (; p < pairs; ++p) d[p * kernels::kPanelCols] = 0;
  }
}

template <class Src>
void pack_panel_f32(const Src* w, DType src, int64_t out, int64_t in, int64_t q, float* dst) {
  for (int64_t lane = 0; lane < kernels::kPanelCols; ++lane) {
    const int64_t n = q * kernels::kPanelCols + lane;
    float* d = dst + lane;
    if (n >= out) {
      for (int64_t k = 0; k < in; ++k) d[k * kernels::kPanelCols] = 0.f;
      continue;
    }
    const Src* row = w + n * in;
    for (int64_t k = 0; k < in; ++k) {
      if constexpr (sizeof(Src) == 4) d[k * kernels::kPanelCols] = row[k];
      else d[k * kernels::kPanelCols] = src == DType::kF16 ? f16_to_float(row[k]) : bf16_to_float(row[k]);
    }
  }
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
  w.k_pad = pd == DType::kBF16 ? round_up(d->in_, kernels::kBf16KMultiple) : d->in_;
  w.panel_stride = w.k_pad * kernels::kPanelCols;
  w.expert_stride = w.n_pad * w.k_pad;
  const size_t bytes = w.bytes();
  w.data = std::shared_ptr<void>(big_alloc(bytes), [bytes](void* p) { big_free(p, bytes); });
  const int64_t panels = w.n_pad / kernels::kPanelCols, out = d->out_, in = d->in_;
  const void* src = t.raw();
  char* base = static_cast<char*>(w.data.get());
  const size_t panel_bytes = size_t(w.panel_stride) * w.elem();
  const DType sd = t.dtype();
  // Every element, padding included, is written (no separate zeroing pass over the buffer).
#pragma omp parallel for schedule(dynamic, 4) if (bytes >= (size_t(1) << 20))
  for (int64_t q = 0; q < panels; ++q) {
    void* dst = base + size_t(q) * panel_bytes;
    if (pd == DType::kBF16)
      pack_panel_bf16(static_cast<const uint16_t*>(src), out, in, w.k_pad, q, static_cast<uint32_t*>(dst));
    else if (sd == DType::kF32)
      pack_panel_f32(static_cast<const float*>(src), sd, out, in, q, static_cast<float*>(dst));
    else
      pack_panel_f32(static_cast<const uint16_t*>(src), sd, out, in, q, static_cast<float*>(dst));
  }
  return d;
}

void DenseLinear::run_scalar(const float* x, int64_t rows, const float* bias, DType act,
                             float* y) const {
  const uint16_t* w = static_cast<const uint16_t*>(w_.data.get());
  const int64_t out = out_, in = in_;
#pragma omp parallel for schedule(static) if (rows * in * out >= kParallelWork)
  for (int64_t n = 0; n < out; ++n) {
    const uint16_t* panel = w + (n / kernels::kPanelCols) * w_.panel_stride + (n % kernels::kPanelCols) * 2;
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * in;
      float acc = 0.f;
      for (int64_t k = 0; k < in; ++k)
        acc += xr[k] * bf16_to_float(panel[(k / 2) * 2 * kernels::kPanelCols + (k & 1)]);
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
  if (bf16 && act != DType::kBF16) {  // activations that bf16 cannot hold exactly
    run_scalar(x, rows, bias, act, y);
    return yt;
  }
  const bool parallel = rows * in * out >= kParallelWork;
  const int threads = parallel ? omp_get_max_threads() : 1;

  // A operand: bf16 rows padded to k_pad with zeros (exact: they hold bf16 values), or x itself.
  const void* a = x;
  int64_t lda = in;
  if (bf16) {
    lda = w_.k_pad + kRowPadBytes / 2;
    uint16_t* buf = t_act.get(size_t(rows * lda));
#pragma omp parallel for schedule(static) if (parallel && rows >= 16)
    for (int64_t r = 0; r < rows; ++r) {
      uint16_t* d = buf + r * lda;
      const float* s = x + r * in;
      for (int64_t k = 0; k < in; ++k) d[k] = float_to_bf16(s[k]);
      for (int64_t k = in; k < w_.k_pad; ++k) d[k] = 0;
    }
    a = buf;
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
    alignas(64) float c[kernels::kMaxRows * kernels::kBlockCols];
    const int64_t panel = u / blocks, blk = u % blocks;
    const int64_t p0 = panel * kPanelRows, prow = std::min(kPanelRows, rows - p0);
    const int64_t col0 = blk * kernels::kBlockCols;
    const int valid = int(std::min<int64_t>(kernels::kBlockCols, out - col0));
    for (int64_t r0 = p0; r0 < p0 + prow; r0 += kernels::kMaxRows) {
      const int m = int(std::min<int64_t>(kernels::kMaxRows, p0 + prow - r0));
      kernels::GemmArgs g;
      g.a = static_cast<const char*>(a) + size_t(r0 * lda) * elem;
      g.lda = lda;
      g.b = w_.block(0, blk);
      g.panel_stride = w_.panel_stride;
      g.k = w_.k_pad;
      g.m = m;
      g.c = c;
      g.ldc = kernels::kBlockCols;
      fn(g);
      for (int r = 0; r < m; ++r) {
        const float* cr = c + r * kernels::kBlockCols;
        float* yr = y + (r0 + r) * out + col0;
        if (bias)
          for (int j = 0; j < valid; ++j) yr[j] = round_act(cr[j] + bias[col0 + j], act);
        else
          for (int j = 0; j < valid; ++j) yr[j] = round_act(cr[j], act);
      }
    }
  }
  return yt;
}

}  // namespace moex::cpu
