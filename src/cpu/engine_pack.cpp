// Weight packing of the CPU experts engine (prepare_cpu_experts): the packed layout is the one
// kernels.hpp describes; this file says where each packed column's source row is and splits the
// work over the threads.
//
// Why it reads source rows and not whole matrices: hub checkpoints hold one tensor per expert
// and projection (ExpertsWeights' per-expert form: views into the checkpoint's memory map), and
// packing straight from them keeps a single copy of the weights in memory, the packed one. Once
// an expert's tensors are packed their mapped pages are given back (Tensor::release_file_pages,
// as the dense linears do; they refault from the file if a backend reads them later), so the
// resident set grows by the packed bytes only. Fused weights are read the same way, row by row.
//
// Rate: contiguous rows (every layout but the transposed one) go through kernels::pack_panel
// (AVX-512: 16 rows read 64 bytes at a time, a 16 x 16 dword transpose in registers, whole
// packed rows written with non-temporal stores, and no zeroing pass: the kernel writes the
// padding too); the threads share each expert's panels, and one expert's pages are released as
// soon as its panels are written. Transposed weights (gpt-oss, always fused) keep the element
// loop: their rows are strided. Rates in docs/cpu.md (lab/cpu/pack_lab.cpp).
#include <cstring>

#include "cpu/big_alloc.hpp"
#include "cpu/engine.hpp"
#include "moex/error.hpp"

namespace moex::cpu {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// E packed matrices of logical shape [N, K] (N padded to n_pad), uninitialised. In 4 KiB pages:
// first touching fresh huge pages is what bounded packing on the development VM (the kernel
// zeroing them: 0.2-0.5 GB/s there, 4 KiB pages 1.2-1.5 GB/s; big_alloc.hpp, docs/cpu.md).
PackedMatrices packed_matrices(DType dt, int64_t E, int64_t K, int64_t n_pad) {
  PackedMatrices pm;
  pm.dtype = dt;
  pm.experts = E;
  pm.n_pad = n_pad;
  pm.k_pad = dt == DType::kBF16 ? round_up(K, kernels::kBf16KMultiple) : K;
  pm.panel_stride = pm.k_pad * kernels::kPanelCols;
  pm.expert_stride = pm.n_pad * pm.k_pad;
  const size_t bytes = pm.bytes();
  pm.data = std::shared_ptr<void>(big_alloc(bytes, /*huge=*/false),
                                  [bytes](void* q) { big_free(q, bytes); });
  return pm;
}

// Packs matrices whose rows are contiguous: `row(e, n)` points at the K elements of logical row
// n of expert e; `row_of(packed column)` gives the logical row of a packed column (-1: zero
// padding); `done(e)` runs once every panel of expert e is written.
template <class RowOf, class Row, class Done>
void pack_rows(PackedMatrices& pm, int64_t K, RowOf row_of, Row row, Done done) {
  const kernels::PackPanelFn pack = detect_cpu_features().avx512 ? kernels::pack_panel_avx512
                                                                 : kernels::pack_panel_portable;
  const int64_t panels = pm.n_pad / kernels::kPanelCols;
  const int elem = int(pm.elem());
  char* base = static_cast<char*>(pm.data.get());
#pragma omp parallel
  for (int64_t e = 0; e < pm.experts; ++e) {
#pragma omp for schedule(dynamic, 4)
    for (int64_t q = 0; q < panels; ++q) {
      const void* rows[kernels::kPanelCols];
      for (int lane = 0; lane < kernels::kPanelCols; ++lane) {
        const int64_t n = row_of(q * kernels::kPanelCols + lane);
        rows[lane] = n < 0 ? nullptr : row(e, n);
      }
      pack(rows, K, pm.k_pad, elem,
           base + (size_t(e) * size_t(pm.expert_stride) + size_t(q) * size_t(pm.panel_stride)) * pm.elem());
    }
    // After the loop's barrier: expert e is packed.
#pragma omp single nowait
    done(e);
  }
}

// Transposed storage: W(n, c) = base[e * se + n + c * N] (strided rows), element by element into
// a zeroed buffer.
template <class T, class RowOf>
void pack_transposed(const Tensor& t, int64_t N, int64_t K, PackedMatrices& pm, RowOf row_of) {
  std::memset(pm.data.get(), 0, pm.bytes());
  const bool pairs = pm.dtype == DType::kBF16;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < pm.experts; ++e) {
    const T* w = static_cast<const T*>(t.raw()) + e * N * K;
    T* dst = static_cast<T*>(pm.data.get()) + e * pm.expert_stride;
    for (int64_t col = 0; col < pm.n_pad; ++col) {
      const int64_t n = row_of(col);
      if (n < 0) continue;  // padding stays zero
      T* panel = dst + (col / kernels::kPanelCols) * pm.panel_stride;
      const int64_t lane = col % kernels::kPanelCols;
      for (int64_t c = 0; c < K; ++c) {
        // pair layout [K/2][16][2]; panel layout [K][16]
        const int64_t at = pairs ? (c / 2) * 2 * kernels::kPanelCols + lane * 2 + (c & 1)
                                 : c * kernels::kPanelCols + lane;
        panel[at] = w[n + c * N];
      }
    }
  }
}

// One weight of every expert: `fused` [E, N, K] (or transposed [E, K, N]) or, when null, the
// per-expert tensors through `per_row` / `per_done`.
template <class RowOf, class PerRow, class PerDone>
PackedMatrices pack_weight(DType dt, int64_t E, int64_t N, int64_t K, int64_t n_pad,
                           bool transposed, const Tensor* fused, RowOf row_of, PerRow per_row,
                           PerDone per_done) {
  PackedMatrices pm = packed_matrices(dt, E, K, n_pad);
  if (fused == nullptr) {
    pack_rows(pm, K, row_of, per_row, per_done);
    return pm;
  }
  if (transposed) {
    if (dt == DType::kBF16) pack_transposed<uint16_t>(*fused, N, K, pm, row_of);
    else pack_transposed<float>(*fused, N, K, pm, row_of);
  } else {
    const char* base = static_cast<const char*>(fused->raw());
    const size_t row_bytes = size_t(K) * dtype_size(dt);
    pack_rows(pm, K, row_of,
              [&](int64_t e, int64_t n) -> const void* { return base + size_t(e * N + n) * row_bytes; },
              [](int64_t) {});
  }
  fused->release_file_pages();
  return pm;
}

}  // namespace

std::unique_ptr<PreparedCpuExperts> prepare_cpu_experts(const ExpertsSpec& s,
                                                        const ExpertsWeights& w, KernelPath path) {
  const DType dt = w.dtype();
  if (std::string why = cpu_engine_unsupported_reason(s, dt, dt); !why.empty())
    throw Unsupported(why);
  auto p = std::make_unique<PreparedCpuExperts>();
  p->spec = s;
  p->kernels = plan_kernels(dt, detect_cpu_features(), path);
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  // Packed gate_up columns: gated -> blocks of [gate i0..i0+15 | up i0..i0+15]; else up columns.
  p->i_cols = s.has_gate ? round_up(I, kernels::kPanelCols) : round_up(I, kernels::kBlockCols);
  const int64_t gu_n_pad = s.has_gate ? 2 * p->i_cols : p->i_cols;
  auto gate_up_row = [&s, I](int64_t col) -> int64_t {
    if (!s.has_gate) return col < I ? col : -1;
    const int64_t block = col / kernels::kBlockCols, in = col % kernels::kBlockCols;
    const bool up = in >= kernels::kPanelCols;
    const int64_t i = block * kernels::kPanelCols + (in % kernels::kPanelCols);
    if (i >= I) return -1;
    if (s.is_concatenated) return up ? I + i : i;
    return up ? 2 * i + 1 : 2 * i;
  };
  // The per-expert form (validated: gated, concatenated, not transposed): gate_up row n < I is
  // row n of gate_e, the others rows of up_e.
  const PerExpertWeights* pe = w.fused() ? nullptr : w.per_expert.get();
  const size_t es = dtype_size(dt);
  p->gate_up = pack_weight(
      dt, E, R, H, gu_n_pad, s.is_transposed, pe ? nullptr : &w.gate_up, gate_up_row,
      [&](int64_t e, int64_t n) -> const void* {
        const Tensor& t = n < I ? pe->gate[size_t(e)] : pe->up[size_t(e)];
        return static_cast<const char*>(t.raw()) + size_t((n < I ? n : n - I) * H) * es;
      },
      [&](int64_t e) {
        pe->gate[size_t(e)].release_file_pages();
        pe->up[size_t(e)].release_file_pages();
      });
  p->down = pack_weight(
      dt, E, H, I, round_up(H, kernels::kBlockCols), s.is_transposed, pe ? nullptr : &w.down,
      [H](int64_t col) -> int64_t { return col < H ? col : -1; },
      [&](int64_t e, int64_t n) -> const void* {
        return static_cast<const char*>(pe->down[size_t(e)].raw()) + size_t(n * I) * es;
      },
      [&](int64_t e) { pe->down[size_t(e)].release_file_pages(); });
  p->h_ld = std::max(p->i_cols, p->down.k_pad);
  if (s.has_bias) {
    std::vector<float> gub = w.gate_up_bias.to_float_vector(), dnb = w.down_bias.to_float_vector();
    p->gate_up_bias.assign(size_t(E * gu_n_pad), 0.f);
    p->down_bias.assign(size_t(E * p->down.n_pad), 0.f);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t col = 0; col < gu_n_pad; ++col)
        if (int64_t r = gate_up_row(col); r >= 0)
          p->gate_up_bias[size_t(e * gu_n_pad + col)] = gub[size_t(e * R + r)];
      for (int64_t n = 0; n < H; ++n)
        p->down_bias[size_t(e * p->down.n_pad + n)] = dnb[size_t(e * H + n)];
    }
  }
  return p;
}

}  // namespace moex::cpu
