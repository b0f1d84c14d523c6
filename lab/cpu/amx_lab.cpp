// AMX kernel-structure lab: one core, one panel of M activation rows x an expert's gate_up
// weights [K=2048, N=2816] bf16, several loop structures of the same TDPBF16PS kernel. Decides
// how the engine's AMX kernel is blocked (docs/cpu.md). Standalone:
//   g++ -O2 -std=c++20 lab/cpu/amx_lab.cpp -o build-cpuh/amx_lab
//   amx_lab M                 cache-hot variants (weights 11.5 MB: L3, A panel: L2)
//   amx_lab M stream [kb]     40 experts' weights streamed from DRAM, next block prefetched into
//                             L2 as the engine does (kb: also the K-blocked variants)
//   LAB_HUGE=1: 2 MiB pages for the buffers.
// Findings, 2026-11-29 (1 core, GFLOP/s, best of 7; the machine's host was shared, +-10%):
//   v0 (engine kernel: A strided, 2x2 tiles, full K per 32x32 block): M=64 890, M=256 1300.
//   v6 same instruction sequence, operands L1-resident: 2200-2300 (= the TDPBF16PS peak), both
//      operands L2-resident: 1680. So the sequence is fine; L2 -> tile bandwidth and L3/DRAM
//      misses of B decide.
//   No gain (all within noise or slower): A packed into 1 KiB tiles (v1, 970), software prefetch
//   of the next k steps into L1 (v0p, v1 pf), K blocking with the B chunk in L1 and C spilled
//   (v3, 1150-1270), 1x4 tiles (v4, 1090), 48-row chunks with 6 C tiles (v5, +3%), 2 MiB pages
//   cache-hot (+3%).
//   Streaming (stream): M=68 640 GFLOP/s at 9.4 GB/s, M=160 1140 at 7.1 GB/s; K blocking no
//   better. One core reads DRAM at ~14.7 GB/s alone, so at M ~ 68 (T = 1024) a core is
//   bandwidth-bound before it is tile-bound.
#include <immintrin.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define TGT __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))

namespace {

constexpr int K = 2048, N = 2816;

struct alignas(64) TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
TGT void configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  __asm__ volatile("" : : "r"(&cfg) : "memory");  // GCC drops the stores otherwise
  _tile_loadconfig(&cfg);
}

// B: blocks of 32 columns, each two panels [K/2][16][2] (panel stride K*16).
// A row-major: lda elements. Ap (packed): per 16-row tile t, per k step s: 1 KiB [16][32].
bool g_huge = false;  // LAB_HUGE=1: 2 MiB-aligned buffers with madvise(MADV_HUGEPAGE)
uint16_t* alloc(size_t n) {
  const size_t bytes = (n * 2 + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  auto* p = static_cast<uint16_t*>(std::aligned_alloc(2 << 20, bytes));
  if (g_huge) madvise(p, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < n; ++i) p[i] = 0x3c00 + (i * 7 % 13);
  return p;
}

// V0: the engine's kernel: A strided from the row-major activations, full K per 32x32 block.
TGT void v0(const uint16_t* a, int64_t lda, const uint16_t* b, int M, float* c) {
  for (int blk = 0; blk < N / 32; ++blk) {
    const uint16_t* b0 = b + int64_t(blk) * 2 * K * 16;
    const uint16_t* b1 = b0 + K * 16;
    for (int r = 0; r < M; r += 32) {
      const uint16_t* a0 = a + r * lda;
      const uint16_t* a1 = a0 + 16 * lda;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int kk = 0; kk < K; kk += 32) {
        _tile_loadd(4, a0 + kk, lda * 2);
        _tile_loadd(6, b0 + kk * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + kk * 16, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + kk, lda * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
      _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
    }
  }
}

// V0p: v0 plus software prefetch (T0) of the A and B lines kDist k steps ahead (only A when
// kOnlyA): tile loads that miss L1 are the suspected limit.
template <int kDist, bool kOnlyA>
TGT void v0p(const uint16_t* a, int64_t lda, const uint16_t* b, int M, float* c) {
  for (int blk = 0; blk < N / 32; ++blk) {
    const uint16_t* b0 = b + int64_t(blk) * 2 * K * 16;
    const uint16_t* b1 = b0 + K * 16;
    for (int r = 0; r < M; r += 32) {
      const uint16_t* a0 = a + r * lda;
      const uint16_t* a1 = a0 + 16 * lda;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int kk = 0; kk < K; kk += 32) {
        const int kp = kk + 32 * kDist;
        for (int i = 0; i < 16; ++i) {
          _mm_prefetch(reinterpret_cast<const char*>(a0 + i * lda + kp), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(a1 + i * lda + kp), _MM_HINT_T0);
          if (!kOnlyA) {
            _mm_prefetch(reinterpret_cast<const char*>(b0 + kp * 16 + i * 32), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(b1 + kp * 16 + i * 32), _MM_HINT_T0);
          }
        }
        _tile_loadd(4, a0 + kk, lda * 2);
        _tile_loadd(6, b0 + kk * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + kk * 16, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + kk, lda * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
      _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
    }
  }
}

// V5: 48-row chunks, C in 6 tiles (3 row tiles x 2 panels), one A and one B register: per k
// step 2 B + 6 A tile loads (the second load of each A tile hits L1) for 6 products; B streams
// from L2 once per 48 rows instead of once per 32. Rows past M: the last chunk may be 2x2/1x2.
TGT void v5_chunk48(const uint16_t* a0, int64_t lda, const uint16_t* b0, const uint16_t* b1,
                    float* c) {
  const uint16_t* a1 = a0 + 16 * lda;
  const uint16_t* a2 = a0 + 32 * lda;
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(4); _tile_zero(5);
  for (int kk = 0; kk < K; kk += 32) {
    _tile_loadd(7, b0 + kk * 16, 64);
    _tile_loadd(6, a0 + kk, lda * 2);
    _tile_dpbf16ps(0, 6, 7);
    _tile_loadd(6, a1 + kk, lda * 2);
    _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(6, a2 + kk, lda * 2);
    _tile_dpbf16ps(4, 6, 7);
    _tile_loadd(7, b1 + kk * 16, 64);
    _tile_dpbf16ps(5, 6, 7);
    _tile_loadd(6, a1 + kk, lda * 2);
    _tile_dpbf16ps(3, 6, 7);
    _tile_loadd(6, a0 + kk, lda * 2);
    _tile_dpbf16ps(1, 6, 7);
  }
  _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
  _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
  _tile_stored(4, c + 1024, 128); _tile_stored(5, c + 1040, 128);
}
TGT void v5(const uint16_t* a, int64_t lda, const uint16_t* b, int M, float* c) {
  for (int blk = 0; blk < N / 32; ++blk) {
    const uint16_t* b0 = b + int64_t(blk) * 2 * K * 16;
    const uint16_t* b1 = b0 + K * 16;
    for (int r = 0; r < M; r += 48) v5_chunk48(a + r * lda, lda, b0, b1, c);
  }
}

// V6: v0 with the k index wrapped to kWrap elements: A and B stay L1-resident (upper bound of
// the load + product sequence itself). Results are meaningless.
template <int kWrap>
TGT void v6(const uint16_t* a, int64_t lda, const uint16_t* b, int M, float* c) {
  for (int blk = 0; blk < N / 32; ++blk) {
    const uint16_t* b0 = b;
    const uint16_t* b1 = b0 + kWrap * 16;
    for (int r = 0; r < M; r += 32) {
      const uint16_t* a0 = a;
      const uint16_t* a1 = a0 + 16 * lda;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int kk0 = 0; kk0 < K; kk0 += 32) {
        const int kk = kk0 % kWrap;
        _tile_loadd(4, a0 + kk, lda * 2);
        _tile_loadd(6, b0 + kk * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + kk * 16, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + kk, lda * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
      _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
    }
  }
}

// V1: A packed in 1 KiB tiles (k-step major within a 16-row tile), else as v0. pf: software
// prefetch (T0) of the A and B tiles `dist` k steps ahead.
template <int kDist>
TGT void v1(const uint16_t* ap, const uint16_t* b, int M, float* c) {
  const int steps = K / 32;
  for (int blk = 0; blk < N / 32; ++blk) {
    const uint16_t* b0 = b + int64_t(blk) * 2 * K * 16;
    const uint16_t* b1 = b0 + K * 16;
    for (int r = 0; r < M; r += 32) {
      const uint16_t* a0 = ap + int64_t(r / 16) * steps * 512;
      const uint16_t* a1 = a0 + steps * 512;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int s = 0; s < steps; ++s) {
        if (kDist > 0) {
          const char* pa0 = reinterpret_cast<const char*>(a0 + (s + kDist) * 512);
          const char* pa1 = reinterpret_cast<const char*>(a1 + (s + kDist) * 512);
          const char* pb0 = reinterpret_cast<const char*>(b0 + (s + kDist) * 512);
          const char* pb1 = reinterpret_cast<const char*>(b1 + (s + kDist) * 512);
          for (int l = 0; l < 1024; l += 64) {
            _mm_prefetch(pa0 + l, _MM_HINT_T0);
            _mm_prefetch(pa1 + l, _MM_HINT_T0);
            _mm_prefetch(pb0 + l, _MM_HINT_T0);
            _mm_prefetch(pb1 + l, _MM_HINT_T0);
          }
        }
        _tile_loadd(4, a0 + s * 512, 64);
        _tile_loadd(6, b0 + s * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + s * 512, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + s * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
      _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
    }
  }
}

// V3: K blocked by kKb: the B chunk (kKb x 32 cols) stays in L1 while all row chunks of the
// panel pass it; C of the whole panel (M x 32 fp32) is accumulated in a buffer via tile loads.
template <int kKb>
TGT void v3(const uint16_t* ap, const uint16_t* b, int M, float* cbuf) {
  const int steps = K / 32;
  for (int blk = 0; blk < N / 32; ++blk) {
    const uint16_t* b0 = b + int64_t(blk) * 2 * K * 16;
    const uint16_t* b1 = b0 + K * 16;
    for (int k0 = 0; k0 < K; k0 += kKb) {
      for (int r = 0; r < M; r += 32) {
        const uint16_t* a0 = ap + int64_t(r / 16) * steps * 512;
        const uint16_t* a1 = a0 + steps * 512;
        float* c = cbuf + r * 32;
        if (k0 == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
        else {
          _tile_loadd(0, c, 128); _tile_loadd(1, c + 16, 128);
          _tile_loadd(2, c + 512, 128); _tile_loadd(3, c + 528, 128);
        }
        for (int s = k0 / 32; s < (k0 + kKb) / 32; ++s) {
          _tile_loadd(4, a0 + s * 512, 64);
          _tile_loadd(6, b0 + s * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(7, b1 + s * 512, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_loadd(5, a1 + s * 512, 64);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
        _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
      }
    }
  }
}

// V4: like v1 but two column blocks share each A tile pair per k step: 1x4? No: 8 tiles allow
// only 4 accumulators; here 1 A row tile x 4 B tiles (C 16 x 64): A reused 4x, B 1x per load,
// 5 loads per 4 products (v1: 4 per 4). Measures whether A-reuse matters more than load count.
TGT void v4(const uint16_t* ap, const uint16_t* b, int M, float* c) {
  const int steps = K / 32;
  for (int blk = 0; blk < N / 64; ++blk) {
    const uint16_t* bb[4];
    for (int j = 0; j < 4; ++j) bb[j] = b + int64_t(blk) * 4 * K * 16 + int64_t(j) * K * 16;
    for (int r = 0; r < M; r += 16) {
      const uint16_t* a0 = ap + int64_t(r / 16) * steps * 512;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int s = 0; s < steps; ++s) {
        _tile_loadd(4, a0 + s * 512, 64);
        _tile_loadd(5, bb[0] + s * 512, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, bb[1] + s * 512, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, bb[2] + s * 512, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, bb[3] + s * 512, 64);
        _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(0, c, 256); _tile_stored(1, c + 16, 256);
      _tile_stored(2, c + 32, 256); _tile_stored(3, c + 48, 256);
    }
  }
}

// Streaming variants: the B panel set of `experts` experts (DRAM-resident), M rows each, the
// next 32-column block prefetched into L2 (T1) over the current one as in the engine.
// kKb == 0: full K per 32-row chunk (the engine's kernel); else K blocked so the B chunk stays in
// L1 across the row chunks, C of all rows accumulated through a buffer.
int g_hint = 1, g_dist = 1, g_front = 1;  // LAB_HINT, LAB_DIST (blocks ahead), LAB_FRONT
int g_stride = 64;  // LAB_PFSTRIDE: bytes between prefetched lines (the L2 streamer fills the rest)
template <int kKb>
TGT void stream_unit(const uint16_t* a, int64_t lda, const uint16_t* b0, int M, float* cbuf,
                     const char* pf, int64_t pf_bytes) {
  const uint16_t* b1 = b0 + K * 16;
  const int steps_total = kKb ? (K / kKb) * ((M + 31) / 32) * (kKb / 32) : ((M + 31) / 32) * (K / 32);
  const int64_t pf_per_step = g_front * (pf_bytes / g_stride + steps_total - 1) / steps_total;
  const char* pf_end = pf + pf_bytes;
  const int kb = kKb ? kKb : K;
  for (int k0 = 0; k0 < K; k0 += kb) {
    for (int r = 0; r < M; r += 32) {
      const uint16_t* a0 = a + r * lda;
      const uint16_t* a1 = a0 + 16 * lda;
      float* c = cbuf + r * 32;
      if (k0 == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
      else {
        _tile_loadd(0, c, 128); _tile_loadd(1, c + 16, 128);
        _tile_loadd(2, c + 512, 128); _tile_loadd(3, c + 528, 128);
      }
      for (int kk = k0; kk < k0 + kb; kk += 32) {
        _tile_loadd(4, a0 + kk, lda * 2);
        _tile_loadd(6, b0 + kk * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + kk * 16, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + kk, lda * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        if (g_hint == 0)
          for (int64_t i = 0; i < pf_per_step && pf < pf_end; ++i, pf += g_stride) _mm_prefetch(pf, _MM_HINT_T0);
        else if (g_hint == 2)
          for (int64_t i = 0; i < pf_per_step && pf < pf_end; ++i, pf += g_stride) _mm_prefetch(pf, _MM_HINT_T2);
        else
          for (int64_t i = 0; i < pf_per_step && pf < pf_end; ++i, pf += g_stride) _mm_prefetch(pf, _MM_HINT_T1);
      }
      _tile_stored(0, c, 128); _tile_stored(1, c + 16, 128);
      _tile_stored(2, c + 512, 128); _tile_stored(3, c + 528, 128);
    }
  }
}

template <int kKb>
void stream_pass(const uint16_t* a, int64_t lda, const uint16_t* ball, int experts, int M, float* c) {
  const int blocks = N / 32;
  const int64_t block_elems = 2 * K * 16;
  const int64_t total = int64_t(experts) * blocks;
  for (int64_t u = 0; u < total; ++u) {
    const uint16_t* b = ball + u * block_elems;
    const char* next = u + g_dist < total ? reinterpret_cast<const char*>(b + g_dist * block_elems) : nullptr;
    stream_unit<kKb>(a, lda, b, M, c, next, next ? block_elems * 2 : 0);
  }
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
void time_it(const char* name, int M, F&& f) {
  f();
  std::vector<double> ts;
  for (int i = 0; i < 7; ++i) {
    double t0 = now();
    f();
    ts.push_back(now() - t0);
  }
  std::sort(ts.begin(), ts.end());
  const double fl = 2.0 * M * N * K;
  std::printf("M=%3d %-24s best %7.1f  median %7.1f GFLOP/s\n", M, name, fl / ts[0] / 1e9,
              fl / ts[3] / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 1;
  configure();
  const int M = argc > 1 ? std::atoi(argv[1]) : 256;
  g_huge = std::getenv("LAB_HUGE") != nullptr;
  const int64_t lda = K + 32;
  uint16_t* a = alloc(size_t(M + 64) * lda);
  uint16_t* ap = alloc(size_t(M + 32) * K);
  uint16_t* b = alloc(size_t(N) * K);
  std::vector<float> c(size_t(M + 64) * 64 + 256 * 32);
  if (FILE* f = std::fopen("/proc/self/smaps_rollup", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "AnonHugePages", 13) == 0) std::printf("%s", line);
    std::fclose(f);
  }
  if (argc > 2 && std::string(argv[2]) == "stream") {
    const int experts = 40;
    if (const char* e = std::getenv("LAB_HINT")) g_hint = std::atoi(e);
    if (const char* e = std::getenv("LAB_DIST")) g_dist = std::atoi(e);
    if (const char* e = std::getenv("LAB_FRONT")) g_front = std::atoi(e);
    if (const char* e = std::getenv("LAB_PFSTRIDE")) g_stride = std::atoi(e);
    uint16_t* ball = alloc(size_t(experts) * N * K);
    static std::vector<uint64_t> junk(size_t(512) << 17);
    auto run = [&](const char* name, auto fn) {
      std::vector<double> ts;
      for (int rep = 0; rep < 5; ++rep) {
        for (size_t i = 0; i < junk.size(); i += 8) junk[i]++;
        double t0 = now();
        fn();
        ts.push_back(now() - t0);
      }
      std::sort(ts.begin(), ts.end());
      const double fl = 2.0 * M * N * K * experts, by = 2.0 * N * K * experts;
      std::printf("M=%3d %-18s best %7.1f GFLOP/s %5.1f GB/s  median %7.1f GFLOP/s\n", M, name,
                  fl / ts[0] / 1e9, by / ts[0] / 1e9, fl / ts[2] / 1e9);
    };
    run("stream full K", [&] { stream_pass<0>(a, lda, ball, experts, M, c.data()); });
    if (argc > 3) {
      run("stream Kb=512", [&] { stream_pass<512>(a, lda, ball, experts, M, c.data()); });
      run("stream Kb=256", [&] { stream_pass<256>(a, lda, ball, experts, M, c.data()); });
      run("stream Kb=1024", [&] { stream_pass<1024>(a, lda, ball, experts, M, c.data()); });
    }
    return 0;
  }
  time_it("v0 strided A", M, [&] { v0(a, lda, b, M, c.data()); });
  time_it("v6 L1-resident wrap 128", M, [&] { v6<128>(a, lda, b, M, c.data()); });
  time_it("v6 L1-resident wrap 256", M, [&] { v6<256>(a, lda, b, M, c.data()); });
  time_it("v6 L2 wrap 2048 (B L2)", M, [&] { v6<2048>(a, lda, b, M, c.data()); });
  time_it("v5 48-row chunks", M, [&] { v5(a, lda, b, M, c.data()); });
  time_it("v0p strided A pf1", M, [&] { v0p<1, false>(a, lda, b, M, c.data()); });
  time_it("v0p strided A pf2", M, [&] { v0p<2, false>(a, lda, b, M, c.data()); });
  time_it("v0p strided A pf2 A only", M, [&] { v0p<2, true>(a, lda, b, M, c.data()); });
  time_it("v0p strided A pf4", M, [&] { v0p<4, false>(a, lda, b, M, c.data()); });
  time_it("v1 packed A", M, [&] { v1<0>(ap, b, M, c.data()); });
  time_it("v1 packed A pf2", M, [&] { v1<2>(ap, b, M, c.data()); });
  time_it("v1 packed A pf4", M, [&] { v1<4>(ap, b, M, c.data()); });
  time_it("v3 Kb=256", M, [&] { v3<256>(ap, b, M, c.data()); });
  time_it("v3 Kb=512", M, [&] { v3<512>(ap, b, M, c.data()); });
  time_it("v3 Kb=1024", M, [&] { v3<1024>(ap, b, M, c.data()); });
  time_it("v4 1x4", M, [&] { v4(ap, b, M, c.data()); });
  return 0;
}
