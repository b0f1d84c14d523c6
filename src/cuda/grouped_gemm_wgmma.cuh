// Grouped GEMM for Hopper: TMA loads into a STAGES-deep shared-memory ring, warpgroup MMA
// (wgmma, bf16 / f16 or block-scaled FP8 e4m3 in, fp32 accumulate), one warp-specialised block
// per output tile.
//
// Why: the mma.sync kernel (grouped_gemm_mma.cuh) tops out at 160-285 TFLOP/s on the H200
// because every operand passes through registers (ldmatrix) and every thread issues its own
// loads; wgmma reads both operands straight from shared memory and TMA moves a whole tile per
// instruction, so the math warps only issue MMAs (docs/cuda.md has the measurements).
//
// Block = 1 producer + kConsumers (1 or 2) consumer warpgroups; the tile has 64 * kConsumers
// rows (64- or 128-row tiles of route_by_expert). Warpgroup 0 is the producer: one thread waits
// for a free stage, arms the stage's "full" barrier with the bytes to expect and issues the TMA
// loads of the A tile (tile rows x 64 k) and the B tile (kBRows weight rows x 64 k). The consumers
// each own 64 of the rows, wait for "full", issue four m64nBNBk16 wgmmas, and free the stage of
// the *previous* k step once its MMAs have retired (wgmma.wait_group 1), so one MMA batch is
// always in flight while the next stage is being loaded. (kPingPong: the two consumers take whole
// items in turn instead, see the kernel.)
//
// Work decomposition: the work items are (tile of the device-side tile table) x (column block);
// the kernel is persistent (one CTA per SM, items handed out round-robin, see work_item for the
// order) and reads the number of tiles on the device, so nothing depends on the host knowing the
// routing and the kernel replays in CUDA graphs. Being
// persistent lets the producer load the next item's first stages during the epilogue.
//
// Operands. A is contiguous in sorted order (gate_up: the hidden rows gathered by
// gather_sorted_kernel, or read in place with kGatherA, see the kernel; down: the intermediate
// h), so its tile is one 2D TMA box; rows past the
// tile's own (the next expert's, or past the end: zero-filled) are computed and never stored.
// B is the [E * N_rows, K] weight tensor (non-transposed layouts only); for gated concatenated
// gate_up the stage holds BN gate rows followed by the BN matching up rows (two boxes), so a
// thread's accumulator chunk i (gate) and chunk i + BN/8 (up) are the same output column and the
// activation runs in the epilogue, as in the mma kernel. Rows of B past the expert's own are read
// but only feed columns >= N, which are not stored.
//
// FP8 (T = WgmmaFp8<Out, kE8M0>, the quantized experts of include/moex/quant.hpp): A holds the
// e4m3 codes of the activations in sorted order (quantize_act over the gathered rows) with f32
// scales [rows, ceil(K/128)], B the e4m3 weights [E * N_rows, K] with one scale per 128 x 128
// block. A stage is 128 k (one 128-byte row, one scale block) of 128 or 256 weight rows, taken in
// parts of 128 rows: four m64n128k32 wgmmas each. As in DeepGEMM, the tensor core's sum of FP8
// products keeps fewer mantissa bits than fp32, so each part's products go into a separate
// fragment (`part`, 64 registers), which after wgmma.wait_group 0 is multiplied by (activation
// scale of its row) x (weight scale of its 128-row block) and added into the fp32 accumulator:
// the quant.hpp math, per K block, with the block sums from the tensor core. 128-row stages:
// gated gate_up 64 gate + 64 up rows (64 output columns), down 128 rows; 256-row stages: 128
// gate + 128 up (128 columns), down 256 rows (two scale blocks). Each group's rows of a part lie
// inside one 128-row scale block. The consumers are cooperative; the accumulator is 64 or 128
// registers per thread, plus the 64 of `part`. Why 256 rows where experts have rows enough
// (ExpertsPlan::b_rows): a 128 x 128 x 128 block of MMAs reads a 16 KB A stage and a 16 KB B
// stage, and at that ratio of bytes to MMAs the kernel was held well below the tensor cores'
// rate; 128 x 256 reads 48 KB for twice the MMAs (docs/cuda.md has the measurements).
#pragma once

#include "cuda/gemm_common.cuh"
#include "cuda/hopper.cuh"
#include "cuda/quant_gemm.cuh"

#include <type_traits>

namespace moex::cuda {

// Operand formats. bf16 / f16: T in, T out. WgmmaFp8<Out, kE8M0>: e4m3 operands with block
// scales (f32, or UE8M0 bytes for the weights when kE8M0), Out (bf16 / f16) out.
template <class Out, bool kE8M0>
struct WgmmaFp8 {};
template <class T>
struct WgmmaFormat {
  using Out = T;
  static constexpr int kElemBytes = 2;
  static constexpr bool kScaled = false, kE8M0 = false;
};
template <class O, bool kE8>
struct WgmmaFormat<WgmmaFp8<O, kE8>> {
  using Out = O;
  static constexpr int kElemBytes = 1;
  static constexpr bool kScaled = true, kE8M0 = kE8;
};

// A stage row is one 128-byte swizzled row of K: 64 bf16 / f16, or 128 e4m3 (one scale block).
constexpr int kWgmmaRowBytes = 128;
template <class T>
constexpr int wgmma_bk() {
  return kWgmmaRowBytes / WgmmaFormat<T>::kElemBytes;
}

// The FP8 format's block scales (unused otherwise).
struct WgmmaScales {
  const float* a = nullptr;     // A's scales [kb, a_rows]: by K block, then A's (sorted) rows
  int64_t a_rows = 0;           // (so a warp's scale loads of one stage are contiguous)
  const void* b = nullptr;      // weight scales [E, scale rows, kb]: f32, or UE8M0 bytes
  int64_t b_expert_stride = 0;  // elements
  int kb = 0;                   // ceil(K / 128)
  int up_row0 = 0;              // gated gate_up: scale row of up's first row, ceil(I / 128)
};
// A's maps with boxes of 8, 16 and 32 rows (the same tensor as the kernel's A map), for tiles of
// few rows (decode): such a tile loads only the rows it has, rounded up to 8, instead of a whole
// 64 * kConsumers-row box whose other rows (the next experts', or the masked layout's free
// positions) are computed and never stored. At decode sizes the A boxes otherwise add half the
// weights' traffic again between L2 and the SMs (FP8: 8 KB of A per 16 KB weight stage). The rows
// of the stage past the box keep stale data, which feeds only rows that are not stored (a wgmma
// output row reads only its own A row). Measured on an H100 (docs/cuda.md): FP8 deepgemm T = 1 /
// 4 / 16 6 / 3 / 3 % faster, bf16 level to 1 % faster.
struct WgmmaSmallA {
  static constexpr int kBoxes = 3;
  __host__ __device__ static constexpr int rows(int b) { return 8 << b; }  // 8, 16, 32
  CUtensorMap box[kBoxes];
  int on = 1;  // 0: every tile loads the whole stage (MOEX_WGMMA_SMALL_A=0, measuring)
};

// kConsumers consumer warpgroups of 64 rows each: the tile has 64 * kConsumers rows (= the route
// tile rows), the block 128 * (kConsumers + 1) threads.
constexpr int wgmma_threads(int consumers) { return 128 * (consumers + 1); }

// The gated gate_up epilogue and the FP8 down GEMM's (2-byte y) go through shared memory (see
// the kernel's epilogue): each consumer warpgroup has a block of its rows x BN output columns of
// Out there, after the ring. Other kernels (bf16 / f16 down: fp32 output; ungated gate_up: 256
// columns, which would cost a stage) store straight from the accumulators.
template <class T>
__host__ __device__ constexpr bool wgmma_staged_epilogue(GemmKind kind, int groups) {
  return (kind == GemmKind::kGateUp && groups == 2) ||
         (kind == GemmKind::kDown && WgmmaFormat<T>::kScaled);
}

// Output columns the staged epilogue holds in shared memory at once: an item's BN, at most 128
// (the FP8 down GEMM's 256-column items go through in two passes, so their block costs no
// stage of the ring).
__host__ __device__ constexpr int staged_epilogue_cols(int bn) { return bn > 128 ? 128 : bn; }

// Shared memory of one kernel instance: the ring (STAGES x (A stage + B stage)), the staged
// epilogue's blocks (one per consumer warpgroup, its rows x BN columns of T; none where the
// epilogue stores straight from the accumulators), the full / empty barriers. The kernel and
// its launcher both take the layout from here.
template <class T, GemmKind kKind, int kGroups, int kBRows, int STAGES, int kConsumers,
          bool kPingPong, bool kStagedOut = false>
struct WgmmaSmem {
  static constexpr int kBM = 64 * kConsumers;
  static constexpr int kAStage = kBM * kWgmmaRowBytes;
  static constexpr int kBStage = kBRows * kWgmmaRowBytes;
  static constexpr int kEpiOffset = STAGES * (kAStage + kBStage);
  static constexpr int kEpiWgBytes =
      wgmma_staged_epilogue<T>(kKind, kGroups) || kStagedOut
          ? 64 * (kPingPong ? 2 : 1) * staged_epilogue_cols(kBRows / kGroups) *
                int(sizeof(typename WgmmaFormat<T>::Out))
          : 0;
  static constexpr int kBarOffset = kEpiOffset + kConsumers * kEpiWgBytes;
  // The dynamic schedule's ring of claimed items (see the kernel): full / empty barriers, slots.
  static constexpr int kItemRing = 4;
  static constexpr int kItemBarOffset = kBarOffset + 2 * STAGES * int(sizeof(uint64_t));
  static constexpr int kItemSlotOffset = kItemBarOffset + 2 * kItemRing * int(sizeof(uint64_t));
  // + 1 KiB to align the dynamic shared memory base to 1024 bytes (128B swizzle).
  static constexpr size_t kBytes = size_t(kItemSlotOffset) + kItemRing * sizeof(int) + 1024;
  static_assert(kBytes <= 227 * 1024, "wgmma: shared memory over the 227 KB a block may use");
};

// Work item -> (tile, column block). Items run through raster groups in tile order: a group is
// about 8 (4 to 12) consecutive 128-row tiles of *one* expert (route_by_expert cuts each
// expert's tiles into groups of about equal size, Tile::group), and within a group the tile
// index runs fastest, then the column block. The CTAs resident at one time then cover the
// group's few tiles (their A rows stay in L2) times many column blocks, and each weight block of
// the expert is read by all of the group's tiles at about the same time, so it comes from DRAM
// once per group. (A plain tile-fastest order re-reads A from HBM once per column block when A
// exceeds L2; a plain column-fastest order re-reads the weights once per tile; fixed groups of 8
// tiles straddle experts, so an expert with 9 tiles would have its weights read twice.)
// Group g covers items [first_tile(g) * nblocks, (first_tile(g) + size(g)) * nblocks), so the
// group of an item is the group of tile item / nblocks.
struct WorkItem {
  int tile, nb;
};
__device__ __forceinline__ WorkItem work_item(int item, int nblocks, const Tile* tiles) {
  const int t0 = item / nblocks;
  const int g = tiles[t0].group;
  const int first = t0 - (g & 0xffff), size = max(1, g >> 16);
  const int local = item - first * nblocks;
  return {first + local % size, local / size};
}

// The staged epilogue (gated gate_up, kGroups == 2; or the FP8 down GEMM's element-type y,
// kGroups == 1; N a multiple of 8), run by one consumer warpgroup on its kHalves x 64 rows of the
// item: activation (gate_up) or bias (down), rounding to T, stmatrix of the
// rows x BN block into `epi` (this warpgroup's part of the shared memory past the ring), then
// row-contiguous 16-byte global stores of the rows inside the tile.
// Why: storing straight from the accumulators (the kernel's other epilogue) writes 4 bytes per
// thread to 8 rows per warp instruction (half-used sectors), with bounds checks and activation
// dispatch per output; ncu put 16 % of the consumers' time in it at Mixtral T = 4096
// (docs/cuda.md), time in which the tensor cores idle. The 16-byte chunks of a row are
// XOR-swizzled by (row % 8), so the 8 rows of each stmatrix matrix land in 8 different bank
// groups. Named barrier `bar` (128 threads) brackets the writes: the previous item's copy-out
// must have read the block, and the copy-out reads what the other warps wrote. Rows at or past
// tile_rows (the next expert's, or none) are computed but not stored. Same values as the
// direct epilogue. (The FP8 down GEMM's items have 16 K blocks at DeepSeek-V3's K = 2048, so its
// epilogue is a larger share of an item than gate_up's 56.)
template <class T, GemmKind kKind, int kGroups, int BN, int kHalves, int NACC>
__device__ __forceinline__ void staged_epilogue(const float (&acc)[kHalves][NACC],
                                                const GemmParams& p, int expert, int n0,
                                                int row_start, int tile_rows, int wg_row0,
                                                unsigned char* epi, int bar, int warp, int lane,
                                                int tid_wg) {
  constexpr int kCols = staged_epilogue_cols(BN);  // columns of one pass
  static_assert(BN % kCols == 0 && (kGroups == 1 || kCols == BN), "passes of whole columns");
  constexpr int kRowBytes = kCols * int(sizeof(T));
  constexpr int kChunks = kCols / 8;   // 16-byte chunks per row of a pass
  constexpr int kRows = 64 * kHalves;  // rows of this warpgroup's block
  const uint32_t epi_u32 = smem_u32(epi);
  T* out = static_cast<T*>(p.out);
  // SiLU without bias (every gated model but gpt-oss), or down without bias, skips the
  // per-output dispatch.
  const bool fast_values = (kGroups == 1 || p.ap.act == 0) && p.bias == nullptr;
#pragma unroll
  for (int pass = 0; pass < BN / kCols; ++pass) {
    sm90::named_bar_sync(bar, 128);
    auto stage = [&](auto fast) {
#pragma unroll
      for (int m = 0; m < kHalves; ++m) {
        // stmatrix row address of this lane: matrix lane / 8 = (8 rows h, chunk 2 q + s).
        const int lrow = m * 64 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int q = 0; q < kCols / 16; ++q) {
          uint32_t r[4];
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            // i: the 8-column chunk of the item (accumulator registers 4 i .. 4 i + 3).
            const int i = pass * kChunks + 2 * q + (s >> 1), h = s & 1;
            const float ga = acc[m][4 * i + 2 * h], gb = acc[m][4 * i + 2 * h + 1];
            const float ua = kGroups == 2 ? acc[m][(4 * (i + BN / 8) + 2 * h) % NACC] : 0.f;
            const float ub = kGroups == 2 ? acc[m][(4 * (i + BN / 8) + 2 * h + 1) % NACC] : 0.f;
            float va, vb;
            if constexpr (decltype(fast)::value) {
              va = kGroups == 2 ? silu(ga) * ua : ga;
              vb = kGroups == 2 ? silu(gb) * ub : gb;
            } else {
              const int j = n0 + 8 * i + 2 * (lane % 4);
              va = j < p.N ? epilogue_value<T, kKind, kGroups>(p, expert, j, ga, ua) : 0.f;
              vb = j + 1 < p.N ? epilogue_value<T, kKind, kGroups>(p, expert, j + 1, gb, ub)
                               : 0.f;
            }
            r[s] = pack2<T>(va, vb);
          }
          const int ch = 2 * q + (lane >> 4);
          sm90::stmatrix_x4(epi_u32 + lrow * kRowBytes + ((ch ^ (lrow & 7)) << 4), r[0], r[1],
                            r[2], r[3]);
        }
      }
    };
    if (fast_values) stage(std::true_type{});
    else stage(std::false_type{});
    sm90::named_bar_sync(bar, 128);
#pragma unroll
    for (int s = 0; s < kRows * kChunks / 128; ++s) {
      const int idx = s * 128 + tid_wg, row = idx / kChunks, ch = idx % kChunks;
      const int col = n0 + pass * kCols + 8 * ch;
      if (wg_row0 + row < tile_rows && col < p.N) {
        const unsigned char* src = epi + row * kRowBytes + ((ch ^ (row & 7)) << 4);
        const uint4 v = *reinterpret_cast<const uint4*>(src);
        *reinterpret_cast<uint4*>(out + int64_t(row_start + wg_row0 + row) * p.N + col) = v;
      }
    }
  }
}

// Two ways to use the two consumer warpgroups of a 128-row tile (kConsumers == 2):
//  - cooperative (kPingPong false): both work on the same item, each on 64 of its rows, with one
//    m64nBNBk16 per 16 k; the tensor cores idle while both run the epilogue.
//  - ping-pong (kPingPong true, kBRows 128): the CTA's items alternate between the warpgroups, each
//    doing all 128 rows of its item (two m64n128k16 per 16 k, the same 128 accumulators per
//    thread). The ring holds the items' k steps in order, so warpgroup B's main loop starts when
//    A's has issued its last MMAs and runs while A does its epilogue: the epilogue (activation,
//    stores) leaves the critical path. A named barrier hands the turn over (see below).
//
// Clusters (kCluster == 2, cooperative 128-row CTAs only): the route table has 256-row tiles
// (one expert each) and the two CTAs of a cluster take the same work item, rank r computing rows
// [128 r, 128 r + 128) of it against the same weight column block. Each CTA loads its own A
// rows and one half of the B stage (gated: the gate rows or the up rows; otherwise 128 of the
// 256 weight rows) and multicasts that half to both CTAs, so every weight tile crosses L2 once
// per pair instead of once per CTA (transformers' CUTLASS kernel does the same; ncu numbers in
// docs/cuda.md). A stage is free again only when the consumers of *both* CTAs are done with it,
// since the partner's producer writes into this CTA's ring: the empty barriers count both CTAs'
// consumer warps, and each consumer warp arrives on its own CTA's barrier and the partner's.
// A tile of at most 128 rows is split by column blocks between the two CTAs instead (see the
// consumers). A rank whose part of an item has no rows or columns still loads, multiplies
// (nothing stored) and releases every stage, keeping the pair in step.
//
// Gathered A (kGatherA, gate_up of bf16 / f16 experts; the "sonicmoe" backend): A's rows are read
// straight from the hidden states, row r of a tile being token sorted_pair[row_start + r] / top_k,
// instead of from a gathered copy in sorted order (no [P, H] copy written and read back). TMA
// cannot gather rows on Hopper, so the whole producer warpgroup loads A with cp.async, each
// warp instruction four whole rows (16 bytes per lane), into the stage's 128-byte swizzle (chunk
// c of row r at r * 128 + ((c ^ r % 8) << 4), the layout the TMA box writes); rows past the
// tile's own and K past its end are zero-filled (one TMA box per row was measured 3-4x slower:
// lab/cuda/sonicmoe_gather_variants.patch). Each thread's
// cp.async.mbarrier.arrive.noinc completes its share of the stage's "full" barrier once its copies
// have landed (the barrier counts 128 such arrivals + the B load's expect_tx arrival), so the
// producer never blocks on its own copies; the consumers fence the async proxy after the wait,
// since wgmma reads through it what cp.async wrote through the generic proxy.
template <class T, GemmKind kKind, int kGroups, int kBRows, int STAGES, int kConsumers,
          bool kPingPong, int kCluster = 1, bool kGatherA = false, bool kStagedOut = false>
__global__ void __launch_bounds__(wgmma_threads(kConsumers), 1)
    grouped_gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tma_a,
                              const __grid_constant__ CUtensorMap tma_b,
                              const __grid_constant__ WgmmaSmallA small_a, GemmParams p,
                              int b_rows_per_expert, WgmmaScales sc) {
  using F = WgmmaFormat<T>;
  using Out = typename F::Out;
  constexpr bool kScaled = F::kScaled;
  constexpr int BK = wgmma_bk<T>();
  constexpr int BN = kBRows / kGroups;  // output columns of the tile
  constexpr bool kStaged = wgmma_staged_epilogue<T>(kKind, kGroups) || kStagedOut;
  using S = WgmmaSmem<T, kKind, kGroups, kBRows, STAGES, kConsumers, kPingPong, kStagedOut>;
  static_assert(!kStagedOut || (kKind == GemmKind::kDown && !kScaled && !kPingPong && kCluster == 1),
                "staged element-type y: bf16 / f16 down GEMMs on cooperative single CTAs");
  static_assert(!kPingPong || (kConsumers == 2 && kBRows == 128),
                "ping-pong: two warpgroups, m64n128");
  static_assert(kCluster == 1 || (kCluster == 2 && !kPingPong && kConsumers == 2),
                "clusters: cooperative 128-row CTAs");
  static_assert(!kScaled || ((kBRows == 128 || kBRows == 256) && !kPingPong && kCluster == 1 &&
                             kConsumers == 2),
                "FP8: 128 or 256 weight rows per stage; cooperative, two consumers, no clusters");
  // FP8: parts of 128 weight rows in a stage, each multiplied and promoted on its own; the
  // weight scales of an item: per group, one per 128-row block of its BN columns.
  [[maybe_unused]] constexpr int kFp8Parts = kBRows / 128;
  constexpr int kSbPerGroup = BN > 128 ? BN / 128 : 1;
  [[maybe_unused]] constexpr int kFp8Sb = kGroups * kSbPerGroup;
  static_assert(!kGatherA || (!kScaled && kKind == GemmKind::kGateUp && kCluster == 1 && !kPingPong),
                "gathered A: bf16 / f16 gate_up on cooperative single CTAs");
  constexpr int kHalves = kPingPong ? 2 : 1;  // 64-row halves of the tile one warpgroup computes
  constexpr int kBM = 64 * kConsumers;    // rows of this CTA's part of a tile

  // Persistent: CTA (cluster) b takes items b, b + grid, ... of num_tiles x nblocks (static), or
  // (dynamic, p.item_claims; cooperative single CTAs only) whichever item is next when its
  // producer is ready for one: see claim_item below.
  const int num_tiles = *p.num_tiles;
  const int nblocks = (p.N + BN - 1) / BN;
  const int items = num_tiles * nblocks;
  const int first = int(blockIdx.x) / kCluster, stride = int(gridDim.x) / kCluster;
  const bool dyn = kCluster == 1 && !kPingPong && p.item_claims != nullptr;
  // (Both CTAs of a cluster leave together. Dynamic: every CTA claims, to count itself done.)
  if (!dyn && first >= items) return;
  const int rank = kCluster == 2 ? int(sm90::cluster_ctarank()) : 0;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* a_smem = smem;
  unsigned char* b_smem = smem + STAGES * S::kAStage;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBarOffset);
  uint64_t* empty = full + STAGES;
  uint64_t* item_full = reinterpret_cast<uint64_t*>(smem + S::kItemBarOffset);
  uint64_t* item_empty = item_full + S::kItemRing;
  volatile int* item_slot = reinterpret_cast<volatile int*>(smem + S::kItemSlotOffset);

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    sm90::tma_prefetch_desc(&tma_a);
    sm90::tma_prefetch_desc(&tma_b);
    for (int s = 0; s < STAGES; ++s) {
      // The producer's expect_tx arrival (+ one cp.async arrival per producer thread, gathered A).
      sm90::mbar_init(&full[s], kGatherA ? 1 + 128 : 1);
      // One arrival per warp of the warpgroup(s) that consume the stage, in every CTA of the
      // cluster that the stage's loads write to.
      sm90::mbar_init(&empty[s], (kPingPong ? 4 : 4 * kConsumers) * kCluster);
    }
    // Claimed items: published by the producer's thread 0, read by every consumer warp (and
    // every producer warp when A is gathered), each warp arriving once.
    for (int r = 0; r < S::kItemRing; ++r) {
      sm90::mbar_init(&item_full[r], 1);
      sm90::mbar_init(&item_empty[r], 4 * kConsumers + (kGatherA ? 4 : 0));
    }
    sm90::fence_mbar_init();
  }
  // The partner's first multicast must not reach this CTA's barriers before they exist.
  if constexpr (kCluster == 2) sm90::cluster_sync();
  else __syncthreads();

  const int KT = (p.K + BK - 1) / BK;

  // The dynamic schedule. Why: with the static one, CTA b's items are fixed in advance, so a CTA
  // that runs slower (its loads miss the L2 more often) drifts behind the others, and the items
  // resident at one time spread over more tiles and column blocks than the raster group keeps
  // in L2; the misses then feed the drift. Claimed in order from one counter, the items in
  // flight stay a window of about one wave. The producer's thread 0 claims the CTA's j-th item
  // (atomicAdd on item_claims[0]) when it is ready to load it and publishes it in ring slot
  // j % kItemRing; the readers wait on the slot's full barrier and release it. A claim past the
  // last item ends the CTA's loop; the CTA whose such claim is the grid's last (item_claims[1]
  // counts them) zeroes both counters for the next launch.
  auto claim_item = [&](int j) {
    const int item = atomicAdd(p.item_claims, 1);
    if (item >= items) {
      __threadfence();  // (this CTA's last claim is made before it counts itself done)
      if (atomicAdd(p.item_claims + 1, 1) == int(gridDim.x) - 1) {
        atomicExch(p.item_claims, 0);
        atomicExch(p.item_claims + 1, 0);
      }
    }
    const int r = j % S::kItemRing;
    if (j >= S::kItemRing) sm90::mbar_wait(&item_empty[r], ((j / S::kItemRing) - 1) & 1);
    item_slot[r] = item;
    sm90::mbar_arrive(&item_full[r]);
    return item;
  };
  auto read_item = [&](int j) {
    const int r = j % S::kItemRing;
    sm90::mbar_wait(&item_full[r], (j / S::kItemRing) & 1);
    return int(item_slot[r]);
  };
  auto release_item = [&](int j) {  // once per reading warp, after its lanes have read
    __syncwarp();
    if (tid % 32 == 0) sm90::mbar_arrive(&item_empty[j % S::kItemRing]);
  };

  // Three warpgroups share 168 registers a thread: the producer keeps 40, the consumers get 232
  // (40 * 128 + 232 * 256 = 168 * 384), as CUTLASS's warp-specialised kernels do. Without it the
  // gated kernels spilled (ptxas: 12-156 bytes). The gathering producer (128 threads, each
  // holding its rows' tokens and forming eight addresses per stage) keeps 56 and its consumers
  // 224 (56 * 128 + 224 * 256 <= 168 * 384): at 40 it spilled three values to local memory and
  // reloaded them every k step (ncu's source page: LDL / STL in the copy loop, each waiting on
  // the L1TEX scoreboard), which delayed the ring's fill. H100, Mixtral-8x7B, T = 1024 / 4096 /
  // 16384: sonicmoe 1.52 / 4.65 / 18.00 -> 1.43 / 4.52 / 17.75 ms (two runs each, alternated).
  constexpr bool kRealloc = kConsumers == 2;
  constexpr int kProducerRegs = kGatherA ? 56 : 40, kConsumerRegs = kGatherA ? 224 : 232;
  if (wg == 0) {
    if constexpr (kRealloc) sm90::setmaxnreg_dec<kProducerRegs>();
    // ---- producer: runs up to STAGES k steps ahead, across items (it fills the ring for the
    // next item while the consumers run the epilogue of this one) ----
    if constexpr (kGatherA) {
      // Lane l loads chunk l % 8 of rows tid / 8 + 16 i: one warp instruction reads four whole
      // 128-byte rows (full lines). (One row per thread, 16 bytes from each of 32 rows, was
      // measured 1.6x slower at Mixtral T = 4096: 32 half-used sectors per instruction.)
      constexpr int kRows = kBM / 16;  // rows per thread
      const int c = tid % 8, r0 = tid / 8;
      const T* x = static_cast<const T*>(p.a);
      int it = 0;
      for (int j = 0;; ++j) {
        int item = first + j * stride;
        if (dyn) {
          item = tid == 0 ? claim_item(j) : read_item(j);
          release_item(j);
        }
        if (item >= items) break;
        const WorkItem w = work_item(item, nblocks, p.tiles);
        const Tile tile = p.tiles[w.tile];
        if (tile.rows <= 0) continue;  // (as the consumers)
        const int brow = tile.expert * b_rows_per_expert + w.nb * BN;
        int token[kRows];  // -1: a row past the tile's own (zero-filled)
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          const int r = r0 + 16 * i;
          token[i] = r < tile.rows ? int(token_at(p, tile.row_start + r)) : -1;
        }
        for (int kb = 0; kb < KT; ++kb, ++it) {
          const int s = it % STAGES;
          if (it >= STAGES) sm90::mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
          if (tid == 0) {
            sm90::mbar_arrive_expect_tx(&full[s], S::kBStage);
            unsigned char* b = b_smem + s * S::kBStage;
            sm90::tma_load_2d(b, &tma_b, &full[s], kb * BK, brow);
            if constexpr (kGroups == 2)
              sm90::tma_load_2d(b + BN * kWgmmaRowBytes, &tma_b, &full[s], kb * BK, brow + p.I);
          }
          const int k = kb * BK + c * 8;
          // Chunk c of row r sits at r * 128 + ((c ^ r % 8) << 4); r % 8 = r0 % 8 for every i.
          const uint32_t dst =
              smem_u32(a_smem + s * S::kAStage) + r0 * kWgmmaRowBytes + ((c ^ (r0 & 7)) << 4);
#pragma unroll
          for (int i = 0; i < kRows; ++i) {
            const bool in = token[i] >= 0 && k < p.K;
            cp_async_16(dst + 16 * i * kWgmmaRowBytes, in ? x + int64_t(token[i]) * p.K + k : x,
                        in ? 16 : 0);
          }
          sm90::mbar_arrive_cp_async(&full[s]);
        }
      }
      cp_async_wait<0>();  // (no copy outlives its thread)
    } else if (tid == 0) {
      int it = 0;  // k steps issued by this CTA so far: stage = it % STAGES, pass = it / STAGES
      for (int j = 0;; ++j) {
        const int item = dyn ? claim_item(j) : first + j * stride;
        if (item >= items) break;
        const WorkItem w = work_item(item, nblocks, p.tiles);
        const Tile tile = p.tiles[w.tile];
        if (kCluster == 1 && !kPingPong && tile.rows <= 0) continue;  // (see the consumers)
        const bool split = kCluster == 2 && tile.rows <= kBM;  // (see the consumers)
        if (split && 2 * w.nb >= nblocks) continue;
        const int n0 = (split ? 2 * w.nb + rank : w.nb) * BN;
        const int brow = tile.expert * b_rows_per_expert + n0;
        const int arow = tile.row_start + (split ? 0 : rank * kBM);
        // A's box: the smallest of WgmmaSmallA's that holds the tile's rows, else the whole
        // stage (clusters: always the whole stage, each CTA its 128 rows).
        const CUtensorMap* amap = &tma_a;
        int a_bytes = S::kAStage;
        if (kCluster == 1 && small_a.on) {
#pragma unroll
          for (int b = WgmmaSmallA::kBoxes - 1; b >= 0; --b)
            if (tile.rows <= WgmmaSmallA::rows(b) && WgmmaSmallA::rows(b) < kBM) {
              amap = &small_a.box[b];
              a_bytes = WgmmaSmallA::rows(b) * kWgmmaRowBytes;
            }
        }
        for (int kb = 0; kb < KT; ++kb, ++it) {
          const int s = it % STAGES;
          if (it >= STAGES) sm90::mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
          sm90::mbar_arrive_expect_tx(&full[s], a_bytes + S::kBStage);
          sm90::tma_load_2d(a_smem + s * S::kAStage, amap, &full[s], kb * BK, arow);
          unsigned char* b = b_smem + s * S::kBStage;
          if constexpr (kCluster == 2) {
            // Halves of the stage (gated: gate rows / up rows; else 128 of kBRows rows): this
            // rank's, multicast to the pair, or (split) both, for this CTA alone.
            constexpr int half_rows = kBRows / 2;
            for (int h = split ? 0 : rank; h < (split ? 2 : rank + 1); ++h) {
              unsigned char* dst = b + h * half_rows * kWgmmaRowBytes;
              const int row = kGroups == 2 ? brow + h * p.I : brow + h * half_rows;
              if (split) sm90::tma_load_2d(dst, &tma_b, &full[s], kb * BK, row);
              else sm90::tma_load_2d_multicast(dst, &tma_b, &full[s], kb * BK, row, uint16_t(0x3));
            }
          } else if constexpr (kGroups == 2) {
            sm90::tma_load_2d(b, &tma_b, &full[s], kb * BK, brow);
            sm90::tma_load_2d(b + BN * kWgmmaRowBytes, &tma_b, &full[s], kb * BK,
                              brow + p.I);
          } else {
            sm90::tma_load_2d(b, &tma_b, &full[s], kb * BK, brow);
          }
        }
      }
    }
  } else {
    if constexpr (kRealloc) sm90::setmaxnreg_inc<kConsumerRegs>();
    // ---- consumers ----
    // Ping-pong: warpgroup c takes the CTA's items n = c, c + 2, ... (n counts this CTA's
    // items; none is skipped, so both warpgroups and the producer agree on the ring index of
    // every k step). Before its first full-barrier wait on item n >= 1, a warpgroup waits on
    // named barrier 1 + c until the other has *issued* every MMA of item n - 1: only then is
    // the ring at most one phase behind item n's first stage (a parity wait further ahead could
    // pass on an old phase), and it keeps the two main loops from interleaving (each item
    // finishes as early as possible).
    const int c = wg - 1;
    const int lane = tid % 32, warp = (tid % 128) / 32;
    constexpr int NACC = kBRows / 2;
    float acc[kHalves][NACC];
    // FP8: the current part's block sums (128 weight rows of the stage), before their scales
    // (see the file's top note).
    constexpr int NPART = kScaled ? 64 : 1;
    [[maybe_unused]] float part[NPART];
    int it = 0;
    const int my_items = (items - first + stride - 1) / stride;
    // Releases stage `st` (its MMAs have retired): in this CTA, and in the partner's whose
    // producer multicasts into this CTA's copy of the stage.
    auto release = [&](int st) {
      __syncwarp();
      if (lane == 0) {
        if constexpr (kCluster == 2) {
          sm90::mbar_arrive_cluster(&empty[st], 0);
          sm90::mbar_arrive_cluster(&empty[st], 1);
        } else {
          sm90::mbar_arrive(&empty[st]);
        }
      }
    };
    for (int n = 0; dyn || n < my_items; ++n) {
      int item = first + n * stride;
      if (dyn) {
        item = read_item(n);
        release_item(n);
        if (item >= items) break;
      }
      if (kPingPong && (n & 1) != c) {
        it += KT;  // the other warpgroup's item
        continue;
      }
      const WorkItem w = work_item(item, nblocks, p.tiles);
      const Tile tile = p.tiles[w.tile];
      if (kCluster == 1 && !kPingPong && tile.rows <= 0) continue;
      // Clusters: rank r takes rows [kBM r, kBM r + kBM) of the tile against column block nb,
      // except on a tile of at most kBM rows (an expert's last), which the pair splits by
      // columns instead: rank r takes all its rows against column block 2 nb + r (its own A
      // and B loads, no multicast), and items with 2 nb >= nblocks have no work. (Rows would
      // leave rank 1 idle: on Mixtral T = 4096 a third of the experts end in such a tile.)
      const bool split = kCluster == 2 && tile.rows <= kBM;
      if (split && 2 * w.nb >= nblocks) continue;
      const int n0 = (split ? 2 * w.nb + rank : w.nb) * BN;
      const int row_start = tile.row_start + (split ? 0 : rank * kBM);
      const int tile_rows = split ? tile.rows : min(tile.rows - rank * kBM, kBM);
      if (kPingPong && n > 0) sm90::named_bar_sync(1 + c, 256);
#pragma unroll
      for (int m = 0; m < kHalves; ++m)
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc[m][i] = 0.f;
      // FP8: the K blocks' scales, one block ahead: sa[m][h] = activation scale of the thread's
      // row (h: + 8; 0 past the tile's rows), sb[g * kSbPerGroup + b] = weight scale of group
      // g's (gated: gate, up) b-th 128-row block of the item (0 past N). Block kb + 1's are
      // loaded once block kb's MMAs are issued, so their latency hides behind a whole stage.
      // (Loaded at the top of their own block, ncu showed the promotion stalled on them, and the
      // FP8 call was 5-7 % slower: docs/cuda.md.)
      [[maybe_unused]] float sa[kHalves][2], sb[kFp8Sb];
      auto load_scales = [&](int kb) {
        if constexpr (kScaled) {
#pragma unroll
          for (int g = 0; g < kGroups; ++g)
#pragma unroll
            for (int b = 0; b < kSbPerGroup; ++b) {
              const int64_t srow = (g ? sc.up_row0 : 0) + n0 / 128 + b;
              const int64_t at = tile.expert * sc.b_expert_stride + srow * sc.kb + kb;
              sb[g * kSbPerGroup + b] = n0 + 128 * b < p.N ? scale_at<F::kE8M0>(sc.b, at) : 0.f;
            }
#pragma unroll
          for (int m = 0; m < kHalves; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = (kPingPong ? m : c) * 64 + warp * 16 + lane / 4 + 8 * h;
              sa[m][h] =
                  r < tile_rows ? __ldg(sc.a + int64_t(kb) * sc.a_rows + row_start + r) : 0.f;
            }
        }
      };
      load_scales(0);
      for (int kb = 0; kb < KT; ++kb, ++it) {
        const int s = it % STAGES;
        sm90::mbar_wait(&full[s], (it / STAGES) & 1);
        if constexpr (kGatherA) sm90::fence_proxy_async_shared();  // (A came through cp.async)
        if constexpr (kScaled) {
          // FP8 (cooperative, kHalves == 1): the stage's weight rows in parts of 128 (one scale
          // block each; kBRows 256 = gated gate_up with 128 gate + 128 up rows, 128 output
          // columns). Per part: four m64n128k32 wgmmas into `part`, wait, promotion into the
          // part's 64 accumulators (part q's are acc[64 q, 64 q + 64), the m64n256 fragment's
          // layout, so the epilogue is the bf16 kernel's). With two parts a block's sums need
          // only one 64-register fragment, and an item of 128 output columns reads its A tile
          // once for twice the MMAs of a 64-column item.
          const uint64_t da =
              sm90::desc_k_major_sw128(a_smem + s * S::kAStage + c * 64 * kWgmmaRowBytes);
          // This K block's scale products, scale[h][j] = sa[0][h] x sb[j], formed once its first
          // MMAs are issued: an item's first block's scales were requested just before its
          // full-barrier wait, and their latency (a DRAM miss at a new tile or expert) passes
          // behind the MMAs instead of before them.
          float scale[2][kFp8Sb];
#pragma unroll
          for (int q = 0; q < kFp8Parts; ++q) {
            const uint64_t db = sm90::desc_k_major_sw128(b_smem + s * S::kBStage +
                                                         q * 128 * kWgmmaRowBytes);
            sm90::fence_accumulators<NPART>(part);
            sm90::wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
              sm90::wgmma_m64n128k32_e4m3(part, da + 2 * ks, db + 2 * ks, ks > 0);
            sm90::wgmma_commit();
            sm90::fence_accumulators<NPART>(part);
            if (q == 0) {
#pragma unroll
              for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < kFp8Sb; ++j) scale[h][j] = sa[0][h] * sb[j];
              if (kb + 1 < KT) load_scales(kb + 1);
            }
            // Promotion: the part's MMAs must retire before their sums are scaled, so no batch
            // of this warpgroup stays in flight here; the other consumer warpgroup's MMAs keep
            // the tensor cores busy.
            sm90::wgmma_wait<0>();
            sm90::fence_accumulators<NPART>(part);
            if (q == kFp8Parts - 1) release(s);
#pragma unroll
            for (int i = 0; i < NPART; ++i) {
              // Scale block of register i: its weight row r in the stage, group r / BN, 128-row
              // block (r % BN) / 128 of the group.
              constexpr int kPartRows = 128;
              const int r = q * kPartRows + 8 * (i / 4);
              const int j = (r / BN) * kSbPerGroup + (r % BN) / 128;
              float& o = acc[0][q * NPART + i];
              o = fmaf(part[i], scale[(i >> 1) & 1][j], o);
            }
          }
        } else {
          const uint64_t db = sm90::desc_k_major_sw128(b_smem + s * S::kBStage);
#pragma unroll
          for (int m = 0; m < kHalves; ++m) sm90::fence_accumulators<NACC>(acc[m]);
          sm90::wgmma_fence();
#pragma unroll
          for (int m = 0; m < kHalves; ++m) {
            const uint64_t da = sm90::desc_k_major_sw128(
                a_smem + s * S::kAStage + (kPingPong ? m : c) * 64 * kWgmmaRowBytes);
            // Four steps of 32 bytes of K (k16 bf16 / f16).
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
              sm90::wgmma_k16<T, kBRows>(acc[m], da + 2 * ks, db + 2 * ks);
          }
          sm90::wgmma_commit();
#pragma unroll
          for (int m = 0; m < kHalves; ++m) sm90::fence_accumulators<NACC>(acc[m]);
          sm90::wgmma_wait<1>();
#pragma unroll
          for (int m = 0; m < kHalves; ++m) sm90::fence_accumulators<NACC>(acc[m]);
          // The MMAs of the previous k step have retired: its stage may be overwritten.
          if (kb > 0) release((it - 1) % STAGES);
        }
      }
      // Every MMA of this item is issued: the other warpgroup may start its next item (if any).
      if (kPingPong && n + 1 < my_items) sm90::named_bar_arrive(1 + (1 - c), 256);
      if constexpr (!kScaled) {
        sm90::wgmma_wait<0>();
#pragma unroll
        for (int m = 0; m < kHalves; ++m) sm90::fence_accumulators<NACC>(acc[m]);
        release((it - 1) % STAGES);
      }

      // ---- epilogue, gated gate_up and FP8 down: through shared memory (staged_epilogue) ----
      if constexpr (kStaged) {
        if (p.N % 8 == 0 && (kKind != GemmKind::kDown || p.out_elem)) {
          staged_epilogue<Out, kKind, kGroups, BN>(
              acc, p, tile.expert, n0, row_start, tile_rows, kPingPong ? 0 : c * 64,
              smem + S::kEpiOffset + c * S::kEpiWgBytes, 3 + c, warp, lane, tid % 128);
          continue;
        }
      }
      // ---- epilogue: bias, activation (gate_up) or fp32 (down), two columns per store ----
      const bool pairs = (p.N % 2) == 0;
#pragma unroll
      for (int m = 0; m < kHalves; ++m) {
        const int r0 = (kPingPong ? m : c) * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
          const int j = n0 + 8 * i + 2 * (lane % 4);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = r0 + h * 8;
            if (r >= tile_rows || j >= p.N) continue;
            const float g0a = acc[m][4 * i + 2 * h], g0b = acc[m][4 * i + 2 * h + 1];
            const float g1a = kGroups == 2 ? acc[m][4 * (i + BN / 8) + 2 * h] : 0.f;
            const float g1b = kGroups == 2 ? acc[m][4 * (i + BN / 8) + 2 * h + 1] : 0.f;
            const int pos = row_start + r;
            if (pairs && j + 1 < p.N) {
              epilogue_store_pair<Out, kKind, kGroups>(p, tile.expert, pos, j, g0a, g1a, g0b, g1b);
            } else {
              epilogue_store<Out, kKind, kGroups>(p, tile.expert, pos, j, g0a, g1a);
              if (j + 1 < p.N)
                epilogue_store<Out, kKind, kGroups>(p, tile.expert, pos, j + 1, g0b, g1b);
            }
          }
        }
      }
    }
  }
  // Neither CTA of a pair may exit while the other can still arrive on its barriers.
  if constexpr (kCluster == 2) {
    __syncwarp();  // (the producer warp diverged around its loop; .aligned needs it converged)
    sm90::cluster_sync();
  }
}

// Gathers the hidden row of every valid sorted position into a contiguous [rows, cols] matrix,
// 16 bytes per thread step. Valid: r < *valid (the contiguous layout: positions >= offsets[E]
// are unused), or with valid null sorted_pair[r] >= 0 (the masked layout).
template <class T>
__global__ void gather_sorted_kernel(const T* __restrict__ src, const int* __restrict__ sorted_pair,
                                     const int* __restrict__ valid, int top_k, int cols,
                                     T* __restrict__ dst) {
  const int64_t r = blockIdx.x;
  if (valid ? r >= *valid : sorted_pair[r] < 0) return;
  const int64_t token = sorted_pair[r] / top_k;
  const uint4* s = reinterpret_cast<const uint4*>(src + token * cols);
  uint4* d = reinterpret_cast<uint4*>(dst + r * cols);
  const int chunks = cols * int(sizeof(T)) / 16;
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) d[i] = s[i];
}

}  // namespace moex::cuda
