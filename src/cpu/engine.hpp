// The CPU experts engine: launcher and op tiers over the micro-kernels of src/cpu/kernels.
//
// Design (measurements in docs/cpu.md):
// - Weights are packed once, at prepare time, into 16-column panels (kernels.hpp) in the order
//   the fused epilogue wants: for gated experts every 32-column block is [16 gate columns | the
//   16 up columns of the same intermediate indices], whatever the checkpoint layout (concatenated
//   or interleaved, [N, K] or transposed [K, N], fused or one tensor per expert). So gate, up and
//   the activation fuse into one pass that writes the activated intermediate, already rounded to
//   the activation dtype. Packing reads the checkpoint's per-expert tensors straight from the
//   memory map when the model holds them so: one copy of the weights in memory
//   (engine_pack.cpp).
// - One kernel path is chosen when experts are prepared, by a pure function (plan_kernels) of the
//   weight dtype and the CPU's features (cpuid and, for AMX, the Linux permission to use tile
//   data): amx > avx512bf16 > avx512 > avx2 > portable. Only an explicit argument forces another
//   path (tests, the bench); no environment variable does. fp32 weights never use the bf16
//   units: amx / avx512bf16 run fp32 with the avx512 kernel.
// - grouped: tokens are sorted by expert (counting sort, stable: deterministic), each expert's
//   rows are one GEMM, in panels of <= 256 rows that stay in L2; the work of a phase is the list
//   of (panel, 32-column block) units, handed out by guided self-scheduling (large contiguous
//   ranges first: long sequential weight streams; small ones at the end: no tail idling; a
//   thread that loses its core to another process does not hold back half the phase).
//   Few rows (decode) use the vector kernel, which streams weights with software prefetch;
//   larger row counts use AMX tiles, which prefetch the next unit's weights into L2.
// - Contributions of the k slots of a token land in a per-slot fp32 buffer and are summed in slot
//   order j = 0..k-1 at the end, so results do not depend on threads or grouping.
// - Scratch lives in a per-calling-thread workspace that only grows: no allocation per call once
//   the largest shape has been seen. Packed weights and large scratch use 2 MiB pages
//   (big_alloc.hpp); a large per-slot buffer is written with non-temporal stores.
// - Epilogues (gated SiLU, combine) are vectorized and write the activation dtype directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "cpu/kernels/kernels.hpp"
#include "moex/cpu_kernels.hpp"
#include "moex/experts.hpp"

namespace moex::cpu {

using KernelPath = CpuKernelPath;  // the public names (moex/cpu_kernels.hpp)
inline constexpr const auto& kAllKernelPaths = kAllCpuKernelPaths;

inline std::string_view kernel_path_name(KernelPath p) { return cpu_kernel_path_name(p); }
inline KernelPath parse_kernel_path(std::string_view name) { return parse_cpu_kernel_path(name); }

// What a CPU and its OS offer the engine (cpuid, xgetbv and, for AMX, the Linux permission to use
// tile data). Each flag implies the ones before it.
struct CpuFeatures {
  bool avx2_fma = false, avx512 = false, avx512bf16 = false, amx = false;
  bool f16c = false;   // VCVTPH2PS (the AVX2 block-scaled kernels decode through fp16)
  bool intel = false;  // vendor "GenuineIntel" (a measured kernel choice differs by vendor)
  int family = 0;      // cpuid's display family (base + extended): AMD Zen 4 = 25, Zen 5 = 26
};
// This machine's, read once per process (the AMX permission request is the only side effect).
const CpuFeatures& detect_cpu_features();
bool kernel_path_supported(KernelPath p, const CpuFeatures& f);
// The block-scaled kernel's kernels::BlockScaledArgs::pair_from_rows for these features.
int block_scaled_pair_from_rows(const CpuFeatures& f);
// Preference order amx > avx512bf16 > avx512 > avx2 > portable.
KernelPath best_kernel_path(const CpuFeatures& f);
// The same two on this machine.
bool kernel_path_supported(KernelPath p);
KernelPath best_kernel_path();
// The path grouped_mm packs for by default: best_kernel_path(). Only a caller's explicit
// argument chooses another (prepare_cpu_experts, make_cpu_grouped_mm_backend).
KernelPath selected_kernel_path();

// The kernels a path runs for one weight dtype (kBF16 or kF32).
struct KernelSet {
  KernelPath path = KernelPath::kPortable;  // as requested
  DType dtype = DType::kF32;
  kernels::GemmFn small = nullptr;  // panels of at most small_max_rows rows
  kernels::GemmFn large = nullptr;  // larger panels
  int small_max_rows = 0;
  kernels::GatedRowsFn gated_silu = nullptr;  // vectorized SiLU epilogue (writes the
                                              // activation dtype), null: scalar
  kernels::SumRowsFn sum_rows = nullptr;      // vectorized combine, null: scalar
  std::string_view name;            // e.g. "amx+avx512bf16", "avx512"
};
// The kernels of `path` for `weight_dtype` (kBF16 or kF32); fp32 data never runs on a bf16 unit.
KernelSet kernel_set(KernelPath path, DType weight_dtype);

// The kernel choice of one experts layer, a pure function of the weight dtype, the CPU's features
// and an optional forced path (tests, `moex bench experts --cpu-kernel`): kernel_set(force or
// best_kernel_path(f), weight_dtype). It does not depend on the layer's shape: per call, the
// engine runs `small` or `large` by the rows of each panel (small_max_rows). Throws Unsupported
// for weights other than bf16 / fp32, and when `f` lacks the forced path.
KernelSet plan_kernels(DType weight_dtype, const CpuFeatures& f,
                       std::optional<KernelPath> force = std::nullopt);

// E matrices of logical shape [N, K] (y = x W^T), packed as kernels.hpp describes: n_pad is a
// multiple of 32, k_pad of 32 (bf16) or K (fp32); padding is zero.
struct PackedMatrices {
  DType dtype = DType::kF32;
  int64_t n_pad = 0, k_pad = 0;
  int64_t panel_stride = 0;   // elements: k_pad * 16
  int64_t expert_stride = 0;  // elements: n_pad * k_pad
  int64_t experts = 0;
  std::shared_ptr<void> data;  // 64-byte aligned
  size_t bytes() const { return size_t(experts) * size_t(expert_stride) * elem(); }
  size_t elem() const { return dtype == DType::kBF16 ? 2 : 4; }
  // First of the two panels of 32-column block `block` of expert e.
  const void* block(int64_t e, int64_t block) const {
    return static_cast<const char*>(data.get()) +
           (size_t(e) * expert_stride + size_t(block) * 2 * panel_stride) * elem();
  }
};

class PreparedCpuExperts : public PreparedExperts {
 public:
  ExpertsSpec spec;
  KernelSet kernels;
  PackedMatrices gate_up;   // gated: N = 2 * i_cols in [gate16 | up16] blocks; else N = i_cols
  PackedMatrices down;      // N = H (padded), K = I (padded)
  std::vector<float> gate_up_bias;  // [E, gate_up.n_pad] in packed column order (has_bias)
  std::vector<float> down_bias;     // [E, down.n_pad]
  int64_t i_cols = 0;       // intermediate columns the gate_up epilogue writes (>= I, padded)
  int64_t h_ld = 0;         // row stride of the intermediate buffer: max(i_cols, down.k_pad)
};

// Packs the weights for `path` (bf16 or fp32 weights), fused or per expert (engine_pack.cpp),
// and gives back the resident pages of the memory-mapped source tensors it packed (they stay
// mapped and valid). Throws Unsupported for other dtypes or quantized weights, and when this
// machine cannot run `path`.
std::unique_ptr<PreparedCpuExperts> prepare_cpu_experts(const ExpertsSpec& spec,
                                                        const ExpertsWeights& weights,
                                                        KernelPath path);
// Empty when run_cpu_experts serves (spec, activation dtype, weight dtype); else the reason.
std::string cpu_engine_unsupported_reason(const ExpertsSpec& spec, DType act, DType weight);

// The grouped computation (see the file comment). `problem` is validated by the caller; hidden
// must have the weights' dtype; out is [T, H] of hidden's dtype.
void run_cpu_experts(const PreparedCpuExperts& prepared, const ExpertsProblem& problem,
                     Tensor& out);

// ---- ceilings for `moex bench experts --device cpu` (engine_ceilings.cpp) ----
// Read bandwidth of a buffer far larger than the last-level cache, all OpenMP threads, GB/s
// (1e9 bytes per second); best of a few passes.
double measure_dram_read_gbs();
// Peak of the kernel family `path` runs for weights of `dtype` (kBF16: AMX tiles / VDPBF16PS /
// widened FMA; kF32: FMA), register-resident, all OpenMP threads, GFLOP/s. Throws Unsupported
// when this machine cannot run `path`.
double measure_kernel_peak_gflops(DType dtype, KernelPath path);

}  // namespace moex::cpu
