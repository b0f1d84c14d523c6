// CPU engine: feature detection, the one runtime-to-kernel dispatch table, and weight packing.
#include "cpu/engine.hpp"

#include <cpuid.h>

#include <cstring>
#include <new>
#include <string>

#include "cpu/big_alloc.hpp"
#include "moex/error.hpp"

namespace moex::cpu {
namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures read_cpu_features() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27);
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;              // XMM + YMM state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;         // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG + XTILEDATA
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  __cpuid_count(7, 1, a, b, c, d);
  const bool avx512_bf16 = a & (1u << 5);
  f.avx2_fma = os_avx && avx2 && fma;
  f.avx512 = f.avx2_fma && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl;
  f.avx512bf16 = f.avx512 && avx512_bf16;
  // AMX also needs the kernel to grant this process the large tile-data state.
  f.amx = f.avx512bf16 && os_amx && amx_bf16 && amx_tile && kernels::amx_request_permission();
  return f;
}

// Below this many rows an AMX call wastes most of a 16-row tile and streams B no faster than
// VDPBF16PS; measured crossover in docs/cpu.md.
constexpr int kAmxMinRows = 5;

}  // namespace

const CpuFeatures& detect_cpu_features() {
  static const CpuFeatures f = read_cpu_features();
  return f;
}

bool kernel_path_supported(KernelPath p, const CpuFeatures& f) {
  switch (p) {
    case KernelPath::kPortable: return true;
    case KernelPath::kAvx2: return f.avx2_fma;
    case KernelPath::kAvx512: return f.avx512;
    case KernelPath::kAvx512Bf16: return f.avx512bf16;
    case KernelPath::kAmx: return f.amx;
  }
  return false;
}

KernelPath best_kernel_path(const CpuFeatures& f) {
  for (KernelPath p : {KernelPath::kAmx, KernelPath::kAvx512Bf16, KernelPath::kAvx512,
                       KernelPath::kAvx2})
    if (kernel_path_supported(p, f)) return p;
  return KernelPath::kPortable;
}

bool kernel_path_supported(KernelPath p) { return kernel_path_supported(p, detect_cpu_features()); }
KernelPath best_kernel_path() { return best_kernel_path(detect_cpu_features()); }
KernelPath selected_kernel_path() { return best_kernel_path(); }

KernelSet plan_kernels(DType dt, const CpuFeatures& f, std::optional<KernelPath> force) {
  if (dt != DType::kBF16 && dt != DType::kF32)
    throw Unsupported("the CPU engine packs bfloat16 and float32 weights, not " +
                      std::string(dtype_name(dt)));
  const KernelPath path = force.value_or(best_kernel_path(f));
  if (!kernel_path_supported(path, f))
    throw Unsupported("CPU kernel path '" + std::string(kernel_path_name(path)) +
                      "' cannot run on this CPU; it runs " +
                      std::string(kernel_path_name(best_kernel_path(f))) + " and below");
  return kernel_set(path, dt);
}

KernelSet kernel_set(KernelPath path, DType dt) {
  KernelSet s;
  s.path = path;
  s.dtype = dt;
  auto one = [&](kernels::GemmFn fn, std::string_view name) {
    s.small = s.large = fn;
    s.small_max_rows = kernels::kMaxRows;
    s.name = name;
  };
  if (dt == DType::kF32) {
    // No bf16 unit may touch fp32 data: amx / avx512bf16 run the fp32 FMA kernel.
    switch (path) {
      case KernelPath::kPortable: one(kernels::gemm_f32_portable, "portable"); break;
      case KernelPath::kAvx2: one(kernels::gemm_f32_avx2, "avx2"); break;
      default:
        one(kernels::gemm_f32_avx512, "avx512");
        s.gated_silu = kernels::gated_silu_rows_f32_avx512;
        s.sum_rows = kernels::sum_rows_f32_avx512;
        break;
    }
    return s;
  }
  switch (path) {
    case KernelPath::kPortable: one(kernels::gemm_bf16_portable, "portable"); break;
    case KernelPath::kAvx2: one(kernels::gemm_bf16_avx2, "avx2"); break;
    case KernelPath::kAvx512: one(kernels::gemm_bf16_avx512, "avx512"); break;
    case KernelPath::kAvx512Bf16: one(kernels::gemm_bf16_avx512bf16, "avx512bf16"); break;
    case KernelPath::kAmx:
      s.small = kernels::gemm_bf16_avx512bf16;
      s.large = kernels::gemm_bf16_amx;
      s.small_max_rows = kAmxMinRows - 1;
      s.name = "amx+avx512bf16";
      break;
  }
  if (path == KernelPath::kAvx512 || path == KernelPath::kAvx512Bf16 || path == KernelPath::kAmx) {
    s.gated_silu = kernels::gated_silu_rows_bf16_avx512;
    s.sum_rows = kernels::sum_rows_bf16_avx512;
  }
  return s;
}

std::string cpu_engine_unsupported_reason(const ExpertsSpec& spec, DType act, DType weight) {
  if (spec.quant.quantized()) return "quantized weights are not packed by the CPU engine yet";
  if (weight != DType::kBF16 && weight != DType::kF32)
    return "the CPU engine packs bfloat16 and float32 weights, not " +
           std::string(dtype_name(weight));
  if (act != weight) return "the CPU engine needs hidden and weights of one dtype";
  return {};
}

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

std::shared_ptr<void> aligned_zeroed(size_t bytes) {
  void* p = big_alloc(bytes);
  std::memset(p, 0, bytes);
  return std::shared_ptr<void>(p, [bytes](void* q) { big_free(q, bytes); });
}

// One logical weight matrix of an expert: value(n, c) for n < N rows (output columns of y) and
// c < K; `row_of(packed column)` maps packed columns to logical rows (-1: zero padding).
struct Source {
  const char* base;
  size_t elem;
  int64_t sn, sk;  // element strides of row n and column c for expert 0
  int64_t se;      // element stride between experts
};

template <class T, class RowOf>
void pack_one(const Source& src, int64_t e, int64_t K, const PackedMatrices& pm, RowOf row_of) {
  const T* w = reinterpret_cast<const T*>(src.base) + e * src.se;
  T* dst = static_cast<T*>(pm.data.get()) + e * pm.expert_stride;
  const bool pairs = pm.dtype == DType::kBF16;
  for (int64_t col = 0; col < pm.n_pad; ++col) {
    const int64_t n = row_of(col);
    if (n < 0) continue;  // padding stays zero
    T* panel = dst + (col / kernels::kPanelCols) * pm.panel_stride;
    const int64_t lane = col % kernels::kPanelCols;
    for (int64_t c = 0; c < K; ++c) {
      const T v = w[n * src.sn + c * src.sk];
      // pair layout [K/2][16][2]; panel layout [K][16]
      const int64_t at = pairs ? (c / 2) * 2 * kernels::kPanelCols + lane * 2 + (c & 1)
                               : c * kernels::kPanelCols + lane;
      panel[at] = v;
    }
  }
}

template <class RowOf>
PackedMatrices pack_all(const Tensor& t, int64_t E, int64_t N, int64_t K, int64_t n_pad,
                        bool transposed, RowOf row_of) {
  PackedMatrices pm;
  pm.dtype = t.dtype();
  pm.experts = E;
  pm.n_pad = n_pad;
  pm.k_pad = pm.dtype == DType::kBF16 ? round_up(K, kernels::kBf16KMultiple) : K;
  pm.panel_stride = pm.k_pad * kernels::kPanelCols;
  pm.expert_stride = pm.n_pad * pm.k_pad;
  pm.data = aligned_zeroed(pm.bytes());
  Source src{static_cast<const char*>(t.raw()), dtype_size(t.dtype()), transposed ? 1 : K,
             transposed ? N : 1, N * K};
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    if (pm.dtype == DType::kBF16) pack_one<uint16_t>(src, e, K, pm, row_of);
    else pack_one<float>(src, e, K, pm, row_of);
  }
  return pm;
}

}  // namespace

std::unique_ptr<PreparedCpuExperts> prepare_cpu_experts(const ExpertsSpec& s,
                                                        const ExpertsWeights& w, KernelPath path) {
  const DType dt = w.gate_up.dtype();
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
  p->gate_up = pack_all(w.gate_up, E, R, H, gu_n_pad, s.is_transposed, gate_up_row);
  p->down = pack_all(w.down, E, H, I, round_up(H, kernels::kBlockCols), s.is_transposed,
                     [H](int64_t col) -> int64_t { return col < H ? col : -1; });
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

// ---- the public names (moex/cpu_kernels.hpp) ----
namespace moex {

std::string_view cpu_kernel_path_name(CpuKernelPath p) {
  switch (p) {
    case CpuKernelPath::kPortable: return "portable";
    case CpuKernelPath::kAvx2: return "avx2";
    case CpuKernelPath::kAvx512: return "avx512";
    case CpuKernelPath::kAvx512Bf16: return "avx512bf16";
    case CpuKernelPath::kAmx: return "amx";
  }
  return "?";
}

CpuKernelPath parse_cpu_kernel_path(std::string_view name) {
  for (CpuKernelPath p : kAllCpuKernelPaths)
    if (cpu_kernel_path_name(p) == name) return p;
  throw InvalidInput("unknown CPU kernel path '" + std::string(name) +
                     "'; valid: amx, avx512bf16, avx512, avx2, portable");
}

bool cpu_kernel_path_supported(CpuKernelPath p) { return cpu::kernel_path_supported(p); }
CpuKernelPath default_cpu_kernel_path() { return cpu::selected_kernel_path(); }

}  // namespace moex
