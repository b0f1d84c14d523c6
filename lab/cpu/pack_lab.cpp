// Packing rate of the experts engine's weight packing (prepare time), old against new.
//
//   element: the loop prepare_cpu_experts used before: zero the whole destination, then write
//            every element into its packed place (each 64-byte packed row written lane by lane).
//   panel:   kernels::pack_panel_avx512: 16 source rows read 64 bytes at a time, a 16 x 16
//            dword transpose in registers, whole packed rows written with non-temporal stores.
// Both pack E bf16 matrices [N, K] (Qwen1.5-MoE-A2.7B gate_up by default: E = 60, N = 2816,
// K = 2048, 692 MB) over all OpenMP threads into a fresh allocation of 2 MiB pages, one of 4 KiB
// pages (as prepare does: its page faults are part of the cost) and into an already-faulted one;
// the results are compared byte for byte. GB/s = bf16 source bytes / wall seconds, best of reps.
//
//   lab/cpu/build.sh && OMP_NUM_THREADS=2 build-cpu/pack_lab [E N K reps]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <vector>

#include "cpu/big_alloc.hpp"
#include "cpu/kernels/kernels.hpp"

using namespace moex::cpu;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int kPanel = kernels::kPanelCols;

// The previous prepare loop (engine.cpp before this lab), non-transposed bf16 source.
void pack_element(const uint16_t* w, int64_t E, int64_t N, int64_t K, int64_t k_pad, uint16_t* out) {
  const int64_t n_pad = (N + 31) / 32 * 32, panel_stride = k_pad * kPanel;
  std::memset(out, 0, size_t(E * n_pad * k_pad) * 2);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    uint16_t* dst = out + e * n_pad * k_pad;
    for (int64_t col = 0; col < N; ++col) {
      uint16_t* panel = dst + (col / kPanel) * panel_stride;
      const int64_t lane = col % kPanel;
      const uint16_t* row = w + (e * N + col) * K;
      for (int64_t c = 0; c < K; ++c) panel[(c / 2) * 2 * kPanel + lane * 2 + (c & 1)] = row[c];
    }
  }
}

void pack_panels(const uint16_t* w, int64_t E, int64_t N, int64_t K, int64_t k_pad, uint16_t* out,
                 kernels::PackPanelFn fn) {
  const int64_t n_pad = (N + 31) / 32 * 32, panels = n_pad / kPanel;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t u = 0; u < E * panels; ++u) {
    const int64_t e = u / panels, q = u % panels;
    const void* rows[kPanel];
    for (int l = 0; l < kPanel; ++l) {
      const int64_t n = q * kPanel + l;
      rows[l] = n < N ? w + (e * N + n) * K : nullptr;
    }
    fn(rows, K, k_pad, 2, out + (e * n_pad + q * kPanel) * k_pad);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t E = argc > 1 ? atoll(argv[1]) : 60, N = argc > 2 ? atoll(argv[2]) : 2816,
                K = argc > 3 ? atoll(argv[3]) : 2048;
  const int reps = argc > 4 ? atoi(argv[4]) : 3;
  const int64_t k_pad = (K + 31) / 32 * 32, n_pad = (N + 31) / 32 * 32;
  const size_t src_bytes = size_t(E * N * K) * 2, dst_bytes = size_t(E * n_pad * k_pad) * 2;
  std::vector<uint16_t> w(size_t(E * N * K));
  uint32_t s = 12345;
  for (auto& v : w) v = uint16_t((s = s * 1664525u + 1013904223u) >> 16);
  std::printf("E=%lld N=%lld K=%lld: %.0f MB bf16, %d threads\n", (long long)E, (long long)N,
              (long long)K, src_bytes / 1e6, omp_get_max_threads());

  auto fresh = [&](auto&& pack, bool huge) {  // best wall time with a fresh destination each time
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      void* d = big_alloc(dst_bytes, huge);
      const double t0 = now();
      pack(static_cast<uint16_t*>(d));
      best = std::min(best, now() - t0);
      big_free(d, dst_bytes);
    }
    return best;
  };
  auto warm = [&](auto&& pack, uint16_t* d) {
    pack(d);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const double t0 = now();
      pack(d);
      best = std::min(best, now() - t0);
    }
    return best;
  };
  auto element = [&](uint16_t* d) { pack_element(w.data(), E, N, K, k_pad, d); };
  auto panel = [&](uint16_t* d) { pack_panels(w.data(), E, N, K, k_pad, d, kernels::pack_panel_avx512); };
  auto portable = [&](uint16_t* d) { pack_panels(w.data(), E, N, K, k_pad, d, kernels::pack_panel_portable); };

  // Check: all three layouts byte-identical.
  // (64-byte aligned destinations, as prepare's: the non-temporal stores need it)
  auto buffer = [&] { return static_cast<uint16_t*>(big_alloc(dst_bytes)); };
  uint16_t *a = buffer(), *b = buffer(), *c = buffer();
  element(a);
  panel(b);
  portable(c);
  const bool same = std::memcmp(a, b, dst_bytes) == 0 && std::memcmp(a, c, dst_bytes) == 0;
  std::printf("packed layouts identical: %s\n", same ? "yes" : "NO");
  if (!same) return 1;

  const double gb = src_bytes / 1e9;
  std::printf("%-10s %14s %14s %12s\n", "variant", "fresh 2M GB/s", "fresh 4K GB/s", "warm GB/s");
  for (auto [name, fn, buf] : {std::tuple<const char*, std::function<void(uint16_t*)>, uint16_t*>{
                                   "element", element, a},
                               {"portable", portable, c},
                               {"panel", panel, b}})
    std::printf("%-10s %14.2f %14.2f %12.2f\n", name, gb / fresh(fn, true), gb / fresh(fn, false),
                gb / warm(fn, buf));
  for (uint16_t* p : {a, b, c}) big_free(p, dst_bytes);
  return 0;
}
