// The kernel paths of the CPU experts engine (grouped_mm on the CPU; docs/cpu.md), and a grouped_mm
// that runs one path of the caller's choosing.
//
// By default the engine picks, when a layer's experts are prepared, the best path this CPU runs:
// amx > avx512bf16 > avx512 > avx2 > portable, a deterministic function of the weight dtype and
// the CPU's features. Nothing else (no environment variable) changes that choice; a caller who
// wants another path (a benchmark, a test) asks for it explicitly with make_cpu_grouped_mm_backend.
#pragma once

#include <memory>
#include <string_view>

#include "moex/experts.hpp"

namespace moex {

enum class CpuKernelPath : unsigned char {
  kPortable,    // plain C++
  kAvx2,        // AVX2 + FMA; bf16 widened to fp32 in registers
  kAvx512,      // AVX-512 FMA; bf16 widened to fp32 in registers
  kAvx512Bf16,  // bf16: VDPBF16PS; fp32: AVX-512 FMA
  kAmx,         // bf16: AMX tiles (VDPBF16PS for panels of <= 4 rows); fp32: AVX-512 FMA
};
inline constexpr CpuKernelPath kAllCpuKernelPaths[] = {
    CpuKernelPath::kPortable, CpuKernelPath::kAvx2, CpuKernelPath::kAvx512,
    CpuKernelPath::kAvx512Bf16, CpuKernelPath::kAmx};

// "portable", "avx2", "avx512", "avx512bf16", "amx".
std::string_view cpu_kernel_path_name(CpuKernelPath path);
// Throws InvalidInput naming the valid paths.
CpuKernelPath parse_cpu_kernel_path(std::string_view name);
// Whether this CPU (and OS, for AMX) runs `path`.
bool cpu_kernel_path_supported(CpuKernelPath path);
// The path grouped_mm runs on this machine unless told otherwise.
CpuKernelPath default_cpu_kernel_path();

// A CPU implementation of grouped_mm that always runs `path`; register it to replace the default
// one, e.g. register_experts_backend("grouped_mm", make_cpu_grouped_mm_backend(path)). It serves
// bfloat16 and float32 weights on the CPU (unsupported_reason says why not otherwise, including
// when this CPU lacks `path`) and computes exactly what grouped_mm computes on that path.
std::shared_ptr<const ExpertsBackend> make_cpu_grouped_mm_backend(CpuKernelPath path);

}  // namespace moex
