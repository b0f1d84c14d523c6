// CPU engine: feature detection and the one runtime-to-kernel dispatch table (weight packing:
// engine_pack.cpp).
#include "cpu/engine.hpp"

#include <cpuid.h>

#include <string>

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
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const int base_family = int((a >> 8) & 0xf);
  f.family = base_family == 0xf ? base_family + int((a >> 20) & 0xff) : base_family;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), f16c = c & (1u << 29);
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
  f.f16c = os_avx && f16c;
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

// Measured with lab/cpu's block_scaled_kernel_lab (FP8, 2 threads): on 2 cores of a Zen 5 EPYC
// one weight stream per thread was faster at 1 - 2 activation rows (34 / 28 GB/s against 30 /
// 26 with pairs), so pairs start at 3 there; on 2 cores of an Intel Xeon (AVX512-BF16 + AMX, ~33
// GB/s DRAM read) one stream per thread stayed at ~21 GB/s and pairs reached ~25 at 1 row, and
// `moex bench experts --dtype fp8` (DeepSeek-V3-sized experts, T = 1) went from 20.7 to 17.3 ms
// (53 -> 62 % of the floor), so pairs start at 1 on Intel. On 2 cores of a Zen 4 EPYC (family
// 25, 33-58 GB/s DRAM read) pairs were faster at 1 and 2 rows too (31 / 26 GB/s against 21-26 /
// 16-18), so only Zen 5 keeps one stream per thread below 3 rows. docs/cpu.md keeps the runs.
int block_scaled_pair_from_rows(const CpuFeatures& f) { return !f.intel && f.family == 26 ? 3 : 1; }

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
