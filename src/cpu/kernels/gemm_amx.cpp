// AMX-BF16 kernel: C (up to 32 x 32 fp32) lives in four tile registers, A arrives as two 16 x 32
// bf16 tiles straight from the row-major activations, B as two 16-pair x 16-column tiles, which
// are exactly 1 KiB of consecutive pair rows of a packed panel (no re-layout at run time).
// 2 x 2 blocking is the most the 8 tile registers allow: 4 TDPBF16PS per 4 tile loads.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "cpu/kernels/kernels.hpp"

#define MOEX_TARGET_AMX __attribute__((target("avx512f,avx512bf16,amx-tile,amx-bf16")))

namespace moex::cpu::kernels {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tile configuration is per-thread architectural state: every thread that runs the kernel loads
// it once (the same config for all calls: 8 tiles of 16 rows x 64 bytes).
thread_local bool t_tiles_configured = false;

MOEX_TARGET_AMX void configure_tiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  t_tiles_configured = true;
}

}  // namespace

bool amx_request_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
#else
  return false;
#endif
}

MOEX_TARGET_AMX void gemm_bf16_amx(const GemmArgs& g) {
  if (!t_tiles_configured) configure_tiles();
  const auto* a = static_cast<const uint16_t*>(g.a);
  const auto* b0 = static_cast<const uint16_t*>(g.b);
  const auto* b1 = b0 + g.panel_stride;
  const int64_t sa = g.lda * 2;
  const int64_t sc = g.ldc * 4;
  // Spread the prefetch of the next weight block over the k loop (a few lines per k step).
  const char* pf = static_cast<const char*>(g.prefetch);
  const int64_t steps = g.k / 32;
  const int64_t pf_per_step = g.prefetch ? (g.prefetch_bytes / 64 + steps - 1) / steps : 0;
  const char* pf_end = pf + g.prefetch_bytes;
  _tile_zero(0);
  _tile_zero(1);
  if (g.m > 16) {
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* a1 = a + 16 * g.lda;
    for (int64_t kk = 0; kk < g.k; kk += 32) {
      // Each load is placed right before its first use so that loads overlap the previous
      // products (tile registers are not renamed like vector registers).
      _tile_loadd(4, a + kk, sa);
      _tile_loadd(6, b0 + kk * kPanelCols, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b1 + kk * kPanelCols, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a1 + kk, sa);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
      for (int64_t i = 0; i < pf_per_step && pf < pf_end; ++i, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
    }
    _tile_stored(2, g.c + 16 * g.ldc, sc);
    _tile_stored(3, g.c + 16 * g.ldc + kPanelCols, sc);
  } else {
    for (int64_t kk = 0; kk < g.k; kk += 32) {
      _tile_loadd(6, b0 + kk * kPanelCols, 64);
      _tile_loadd(7, b1 + kk * kPanelCols, 64);
      _tile_loadd(4, a + kk, sa);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      for (int64_t i = 0; i < pf_per_step && pf < pf_end; ++i, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
    }
  }
  _tile_stored(0, g.c, sc);
  _tile_stored(1, g.c + kPanelCols, sc);
}

MOEX_TARGET_AMX double peak_loop_amx(int64_t iters) {
  if (!t_tiles_configured) configure_tiles();
  alignas(64) static thread_local uint16_t ones[16 * 32];
  for (auto& v : ones) v = 0x3800;  // small bf16 so sums stay finite
  alignas(64) static thread_local float sink[16 * 16];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, sink, 64);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return double(iters) * 4 * 16 * 16 * 32 * 2;
}

}  // namespace moex::cpu::kernels
