// Ceilings that `moex bench experts --device cpu` divides by: DRAM read bandwidth and the
// register-resident peak of the kernel family in use, both measured with all OpenMP threads
// (the experts engine uses all of them too).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "cpu/big_alloc.hpp"
#include "cpu/engine.hpp"
#include "moex/error.hpp"

namespace moex::cpu {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sum of 64-bit words with independent lanes so the loop is bound by loads, not by an add chain.
uint64_t read_words(const uint64_t* p, size_t n) {
  uint64_t s[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[i + j];
  uint64_t t = 0;
  for (uint64_t v : s) t += v;
  return t;
}

// Full-width loads, four cache lines per iteration: the scalar loop above undercounts the DRAM
// bandwidth of one core by ~30% (measured), which would flatter every fraction-of-floor.
__attribute__((target("avx512f"))) uint64_t read_words_avx512(const uint64_t* p, size_t n) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 8));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 16));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 24));
  }
  s0 = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, s0);
  uint64_t t = 0;
  for (uint64_t v : lanes) t += v;
  return t + read_words(p + i, n - i);
}

// Runs f(tid) on every thread, `passes` times; returns the best wall time of one pass.
template <class F>
double best_parallel_time(int passes, F&& f) {
  double best = 1e30;
  for (int pass = 0; pass < passes; ++pass) {
    double t0 = 0, t1 = 0;
#pragma omp parallel
    {
#pragma omp barrier
#pragma omp master
      t0 = now_s();
      f(omp_get_thread_num(), omp_get_num_threads());
#pragma omp barrier
#pragma omp master
      t1 = now_s();
    }
    best = std::min(best, t1 - t0);
  }
  return best;
}

// Portable kernels have no register-resident loop: time them on an L1/L2-resident block.
double portable_peak_gflops(DType dt) {
  const int64_t k = 256;
  const size_t elem = dt == DType::kF32 ? 4 : 2;
  std::vector<char> a(size_t(kernels::kMaxRows + kernels::kRowSlack) * k * elem, 0);
  std::vector<char> b(size_t(2 * k * kernels::kPanelCols) * elem, 0);
  const int reps = 20;
  double flops = 2.0 * kernels::kMaxRows * kernels::kBlockCols * k * reps;
  double t = best_parallel_time(3, [&](int, int) {
    alignas(64) float c[kernels::kMaxRows * kernels::kBlockCols];
    kernels::GemmArgs g;
    g.a = a.data();
    g.lda = k;
    g.b = b.data();
    g.panel_stride = k * kernels::kPanelCols;
    g.k = k;
    g.m = kernels::kMaxRows;
    g.c = c;
    g.ldc = kernels::kBlockCols;
    for (int r = 0; r < reps; ++r) {
      if (dt == DType::kF32) kernels::gemm_f32_portable(g);
      else kernels::gemm_bf16_portable(g);
    }
  });
  return flops * omp_get_max_threads() / t / 1e9;
}

}  // namespace

double measure_dram_read_gbs() {
  // 1 GiB: more than 3x the largest last-level caches of the machines we target (300 MiB L3).
  const size_t bytes = size_t(1) << 30, words = bytes / 8;
  // Huge pages, as the engine's packed weights have (big_alloc.hpp): with 4 KiB pages the page
  // walks made this ceiling read 10-20% below what the engine itself streamed (fractions > 100%).
  auto* buf = static_cast<uint64_t*>(big_alloc(bytes));
  // First touch by the reading threads, so pages sit where they will be read.
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t w0 = words * tid / nt, w1 = words * (tid + 1) / nt;
    std::memset(buf + w0, 1, (w1 - w0) * 8);
  }
  volatile uint64_t sink = 0;
  const bool wide = kernel_path_supported(KernelPath::kAvx512);
  const double t = best_parallel_time(3, [&](int tid, int nt) {
    // 64-byte aligned halves (words is a multiple of 8 * nt for power-of-two thread counts).
    const size_t w0 = words * tid / nt / 8 * 8, w1 = tid == nt - 1 ? words : words * (tid + 1) / nt / 8 * 8;
    sink = sink + (wide ? read_words_avx512(buf + w0, w1 - w0) : read_words(buf + w0, w1 - w0));
  });
  big_free(buf, bytes);
  return double(bytes) / t / 1e9;
}

double measure_kernel_peak_gflops(DType dtype, KernelPath path) {
  if (!kernel_path_supported(path))
    throw Unsupported("CPU kernel path '" + std::string(kernel_path_name(path)) +
                      "' cannot run on this CPU");
  double (*loop)(int64_t) = nullptr;
  int64_t iters = 0;
  const bool bf16 = dtype != DType::kF32;
  switch (path) {
    case KernelPath::kPortable: return portable_peak_gflops(bf16 ? DType::kBF16 : DType::kF32);
    case KernelPath::kAvx2:
      loop = kernels::peak_loop_avx2_f32;
      iters = 4'000'000;
      break;
    case KernelPath::kAvx512:
      loop = kernels::peak_loop_avx512_f32;
      iters = 4'000'000;
      break;
    case KernelPath::kAvx512Bf16:
      loop = bf16 ? kernels::peak_loop_avx512bf16 : kernels::peak_loop_avx512_f32;
      iters = 4'000'000;
      break;
    case KernelPath::kAmx:
      loop = bf16 ? kernels::peak_loop_amx : kernels::peak_loop_avx512_f32;
      iters = bf16 ? 2'000'000 : 4'000'000;
      break;
  }
  double flops_per_thread = 0;
  const double t = best_parallel_time(3, [&](int tid, int) {
    const double f = loop(iters);
    if (tid == 0) flops_per_thread = f;
  });
  return flops_per_thread * omp_get_max_threads() / t / 1e9;
}

}  // namespace moex::cpu
