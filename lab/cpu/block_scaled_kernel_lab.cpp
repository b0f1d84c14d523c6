// The block-scaled experts kernel, float decode (gemm_block_scaled_avx512) against the bf16
// decode + VDPBF16PS one (gemm_block_scaled_avx512bf16), or on a CPU without AVX512-BF16 the
// AVX2 kernel against the portable one (KERNEL_A / KERNEL_B = portable, avx2, avx512,
// avx512bf16 pick any two), on weights streamed from DRAM: 8 matrices
// of 4096 x 7168 (DeepSeek-V3's gate_up of the 8 experts one token hits; FP8 235 MB, FP4 117 MB
// + 1 x 32 scales), rows split over OpenMP threads in 64-row tasks as grouped_mm does. Prints
// GB/s of codes + scales and the ratio of the two; checks both against each other first.
//
//   g++ -std=c++20 -O2 -fopenmp -Iinclude -Isrc lab/cpu/block_scaled_kernel_lab.cpp -Lbuild -lmoex \
//       -Wl,-rpath,build -o build/block_scaled_kernel_lab && OMP_NUM_THREADS=2 build/block_scaled_kernel_lab
//
// HUGE=1 puts the codes on 2 MiB pages (THP via madvise, faulted in by a copy), COLLAPSE=1 moves
// them there in place as the experts' prepare does (Tensor::collapse_to_huge_pages), to see what
// page walks cost. NOSUB=1 replaces the FP8 codes of exponent 0 (the Gaussian codes below have
// about 1 in 9,000 such codes: 1 in 70 blocks of 128) by the smallest normal, to see what the
// bf16 kernel's handling of them costs. The prefetch
// distance and the weight-row pairing of the kernel were chosen with this lab (docs/cpu.md);
// PAIR_FROM=n sets the pairing threshold (default: the library's for this CPU); FP8_ONLY=1 skips FP4,
// MAX_M=n stops after n activation rows, EACH=1 prints every timed run. LAB_E / LAB_N / LAB_K /
// LAB_ROWS set the matrices, their shape and the rows per task: the default 235 MB fits an L3 of
// several hundred MB (the Intel development VM reports 480 MiB), where only LAB_E=40 or so
// measures DRAM.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/engine.hpp"
#include "cpu/kernels/kernels.hpp"
#include "moex/dtype.hpp"
#include "moex/tensor.hpp"

namespace k = moex::cpu::kernels;

namespace {

struct Problem {
  bool fp4;
  int64_t row_bytes;
  std::vector<uint8_t> w, scale;  // FP8: float scales (bytes), FP4: UE8M0
  uint8_t* huge = nullptr;         // a copy of w in huge pages (HUGE=1), else null
  const uint8_t* codes() const { return huge ? huge : w.data(); }
  std::vector<float> xq_float, xq_bf16src, xs;  // xq_float in the float kernel's order
  std::vector<uint16_t> xb;
};

// N x K of each matrix: LAB_N / LAB_K (default DeepSeek-V3's gate_up, 4096 x 7168; its down is
// 7168 x 2048), both multiples of 128 and N of 64.
int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}
const int64_t E = env_or("LAB_E", 8), N = env_or("LAB_N", 4096), K = env_or("LAB_K", 7168), nb = K / 128, task_rows = env_or("LAB_ROWS", 64), tasks_per_e = N / task_rows;
constexpr int M = 8;

Problem make(bool fp4) {
  Problem p;
  p.fp4 = fp4;
  p.row_bytes = fp4 ? K / 2 : K;
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  p.w.resize(size_t(E * N * p.row_bytes));
  if (std::getenv("HUGE")) {  // the codes in 2 MiB pages (THP via madvise), as a check of TLB cost
    const size_t bytes = (p.w.size() + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    p.huge = static_cast<uint8_t*>(std::aligned_alloc(2u << 20, bytes));
    madvise(p.huge, bytes, MADV_HUGEPAGE);
  }
  // Codes as a checkpoint holds them: FP8 Gaussian weights quantized with amax -> 448 (subnormals
  // rare), FP4 uniform nibbles.
  for (auto& c : p.w) c = fp4 ? uint8_t(rng()) : moex::float_to_f8e4m3(std::clamp(g(rng) * 100.f, -448.f, 448.f));
  if (!fp4 && std::getenv("NOSUB"))
    for (auto& c : p.w)
      if ((c & 0x78) == 0) c = uint8_t((c & 0x80) | 0x08);
  if (!fp4) {
    size_t sub = 0;
    for (const uint8_t c : p.w) sub += (c & 0x78) == 0;
    std::printf("FP8 codes of exponent 0 (zeros, subnormals): %zu of %zu\n", sub, p.w.size());
  }
  if (p.huge) std::memcpy(p.huge, p.w.data(), p.w.size());
  if (std::getenv("COLLAPSE")) {
    const moex::Tensor view = moex::Tensor::from_blob(p.w.data(), moex::DType::kI8, {int64_t(p.w.size())}, {1},
                                                     moex::Device::cpu());
    const auto t0 = std::chrono::steady_clock::now();
    view.collapse_to_huge_pages();
    std::printf("collapsed to huge pages in %.2f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (fp4) {
    p.scale.resize(size_t(E * N * (K / 32)));
    for (auto& c : p.scale) c = uint8_t(120 + rng() % 6);
  } else {
    p.scale.resize(size_t(E * (N / 128) * nb) * 4);
    for (size_t i = 0; i < p.scale.size() / 4; ++i) {
      const float v = 1e-3f * float(1 + rng() % 100);
      std::memcpy(&p.scale[i * 4], &v, 4);
    }
  }
  p.xq_float.resize(size_t(M * K));
  p.xq_bf16src.resize(size_t(M * K));
  p.xs.assign(size_t(M * nb), 1e-2f);
  p.xb.resize(size_t(M * K));
  for (int m = 0; m < M; ++m) {
    float* nat = &p.xq_bf16src[size_t(m * K)];
    // Clamped like the weights: e4m3 has no infinity, a value past 448 would become its NaN code.
    for (int64_t c = 0; c < K; ++c)
      nat[c] = moex::f8e4m3_to_float(moex::float_to_f8e4m3(std::clamp(g(rng) * 100.f, -448.f, 448.f)));
    for (int64_t c = 0; c < K; ++c) {  // the float FP4 kernel reads each 32 block evens, then odds
      const int64_t r = c % 32, pos = fp4 ? c - r + (r % 2 ? 16 + r / 2 : r / 2) : c;
      p.xq_float[size_t(m * K + pos)] = nat[c];
    }
    k::pack_activation_bf16(nat, K, &p.xb[size_t(m * K)]);
  }
  return p;
}

// The library's choice for this CPU, or PAIR_FROM=n (pairs of weight rows from n activation rows).
int pair_from_rows() {
  static const int n = std::getenv("PAIR_FROM") ? std::atoi(std::getenv("PAIR_FROM"))
                                                 : moex::cpu::block_scaled_pair_from_rows(moex::cpu::detect_cpu_features());
  return n;
}

struct Kernel {
  const char* name;
  k::BlockScaledFn fn;
};
Kernel kernel(const char* var, const char* fallback) {
  const char* v = std::getenv(var);
  const std::string n = v && *v ? v : fallback;
  for (const Kernel& c : {Kernel{"portable", k::gemm_block_scaled_portable}, Kernel{"avx2", k::gemm_block_scaled_avx2},
                          Kernel{"avx512", k::gemm_block_scaled_avx512},
                          Kernel{"avx512bf16", k::gemm_block_scaled_avx512bf16}})
    if (n == c.name) return c;
  std::printf("unknown kernel %s\n", n.c_str());
  std::exit(2);
}

void run(const Problem& p, k::BlockScaledFn fn, int m, std::vector<float>& y) {
  const bool bf16 = fn == k::gemm_block_scaled_avx512bf16;
  const int64_t scols = p.fp4 ? K / 32 : nb, srows = p.fp4 ? N : N / 128;
  const size_t sbytes = p.fp4 ? 1 : 4;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < E * tasks_per_e; ++t) {
    const int64_t e = t / tasks_per_e, n0 = (t % tasks_per_e) * task_rows;
    k::BlockScaledArgs a;
    a.fp4 = p.fp4, a.w = p.codes() + e * N * p.row_bytes, a.row_bytes = p.row_bytes, a.k = K;
    a.scale = p.scale.data() + size_t(e * srows * scols) * sbytes;
    a.scale_dtype = p.fp4 ? moex::DType::kF8E8M0 : moex::DType::kF32, a.scale_cols = scols;
    a.fused_rows = N, a.bn = p.fp4 ? 1 : 128;
    a.xq = bf16 ? p.xq_bf16src.data() : p.xq_float.data(), a.xb = bf16 ? p.xb.data() : nullptr;
    a.xs = p.xs.data(), a.x_ld = K, a.nb = nb, a.m = m, a.n0 = n0, a.n1 = n0 + task_rows;
    a.y = y.data() + e * N * m, a.ldy = N;
    a.pair_from_rows = pair_from_rows();
    fn(a);
  }
}

}  // namespace

int main() {
  const bool bf16_cpu = moex::cpu::detect_cpu_features().avx512bf16;
  const Kernel ka = kernel("KERNEL_A", bf16_cpu ? "avx512" : "avx2");
  const Kernel kb = kernel("KERNEL_B", bf16_cpu ? "avx512bf16" : "portable");
  std::printf("%lld matrices of %lld x %lld\n", (long long)E, (long long)N, (long long)K);
  for (bool fp4 : {false, true}) {
    if (fp4 && std::getenv("FP8_ONLY")) break;
    const Problem p = make(fp4);
    std::vector<float> y0(size_t(E * N * M)), y1(y0.size());
    run(p, ka.fn, M, y0);
    run(p, kb.fn, M, y1);
    double num = 0, den = 0;
    for (size_t i = 0; i < y0.size(); ++i) num += double(y0[i] - y1[i]) * (y0[i] - y1[i]), den += double(y0[i]) * y0[i];
    std::printf("%s, threads %d: relative L2 difference %s vs %s kernel %.2e\n", fp4 ? "FP4" : "FP8",
                omp_get_max_threads(), ka.name, kb.name, std::sqrt(num / den));
    const double bytes = double(p.w.size()) + double(p.scale.size());
    for (int m : {1, 2, 4, 8}) {
      if (m > env_or("MAX_M", 8)) break;
      double best[2] = {1e9, 1e9};
      for (int rep = 0; rep < 7; ++rep)
        for (int v = 0; v < 2; ++v) {  // interleaved, so drift on a shared machine hits both
          const auto t0 = std::chrono::steady_clock::now();
          run(p, v ? kb.fn : ka.fn, m, v ? y1 : y0);
          const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (std::getenv("EACH")) std::printf("    %s %.2f ms\n", v ? kb.name : ka.name, dt * 1e3);
          best[v] = std::min(best[v], dt);
        }
      std::printf("  M=%d  %s %6.1f ms %5.1f GB/s   %s %6.1f ms %5.1f GB/s   B over A %.2fx\n", m, ka.name,
                  best[0] * 1e3, bytes / best[0] / 1e9, kb.name, best[1] * 1e3, bytes / best[1] / 1e9,
                  best[0] / best[1]);
    }
  }
}
