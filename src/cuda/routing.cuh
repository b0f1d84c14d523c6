// Routing kernels: group the (token, slot) pairs by expert on the device.
//
// One block does everything (count, prefix sums, scatter, tiles) in shared memory: for the
// routing sizes of one MoE layer (P = T*k up to ~10^5 pairs, E up to a few thousand experts) a
// single launch of 1024 threads costs a few microseconds, and it avoids the launch latency and
// global-memory round trips of separate count / scan / scatter kernels, which dominate at small T.
// The order of pairs inside one expert's group is not deterministic (shared-memory atomics), and
// need not be: each sorted row is computed independently and the combine sums in slot order.
#pragma once

#include <cub/block/block_scan.cuh>

#include "cuda/common.cuh"
#include "cuda/launchers.hpp"
#include "cuda/pdl.cuh"

namespace moex::cuda {

constexpr int kRouteThreads = 1024;

// Tile j of an expert's n tiles: its raster group's (size << 16) | index within the group
// (Tile::group). The n tiles are cut into G = max(1, round(n / raster_tiles)) groups whose sizes
// differ by at most one (the first n % G have one tile more).
__device__ __forceinline__ int raster_group(int j, int n, int raster_tiles) {
  const int groups = max(1, (n + raster_tiles / 2) / raster_tiles);
  const int q = n / groups, big = n % groups;  // sizes: q + 1 (the first `big`), then q
  const int jb = j - big * (q + 1);
  const int size = jb < 0 ? q + 1 : q, within = jb < 0 ? j % (q + 1) : jb % q;
  return (size << 16) | within;
}

// The tile table of one weight matrix over `rows` rows in order (a linear layer run by the
// grouped kernels as one expert): tiles of tile_rows rows, raster groups as route_by_expert's.
// (static: the header's only non-template kernel, so a second includer gets its own copy.)
static __global__ void linear_tiles_kernel(int rows, int tile_rows, int raster_tiles, Tile* tiles,
                                    int* num_tiles) {
  const int n = (rows + tile_rows - 1) / tile_rows;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    tiles[j] = Tile{0, j * tile_rows, min(tile_rows, rows - j * tile_rows),
                    raster_group(j, n, raster_tiles)};
  if (threadIdx.x == 0) *num_tiles = n;
}

template <class Index>
__device__ __forceinline__ int load_expert(const Index* idx, int64_t p, int experts) {
  int64_t id = int64_t(idx[p]);
  // Negative ids cannot be rejected on the device without a host sync; treat them as sentinels.
  return (id >= 0 && id < experts) ? int(id) : -1;
}

// Masked layout (masked_rows > 0, DeepGEMM's [E, max_m, .] with per-expert counts): expert e's
// rows are positions [e * masked_rows, e * masked_rows + count_e), every other position of the
// [E * masked_rows] table holds sorted_pair = -1, and offsets[e] = e * masked_rows (offsets[E]
// is still the number of valid pairs). Each expert's place depends on no other expert's count,
// which is what lets an expert-parallel dispatch or a fixed decode buffer write rows in place.
// A token that names one expert twice can give it more than masked_rows (= T) rows; such a call
// is laid out contiguously in the same table instead (E * T >= P whenever E >= k), with the
// same tiles and results, never dropped.
template <class Index>
__global__ void __launch_bounds__(kRouteThreads)
    route_by_expert_kernel(const Index* __restrict__ idx, int64_t pairs, int experts,
                           int tile_rows, int raster_tiles, int masked_rows,
                           int* __restrict__ offsets, int* __restrict__ sorted_pair,
                           int* __restrict__ pos_of_pair, Tile* __restrict__ tiles,
                           int max_tiles, int* __restrict__ num_tiles) {
  pdl_enter();
  extern __shared__ int smem[];
  int* cursor = smem;             // [E]: counts, then running write positions
  int* tile_first = smem + experts;  // [E]: first tile of each expert
  int* count = smem + 2 * experts;   // [E]: pairs of each expert
  using Scan = cub::BlockScan<int, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int carry[2];
  __shared__ int masked;  // 1: the masked placement (no expert over masked_rows)
  const int tid = threadIdx.x;

  for (int e = tid; e < experts; e += kRouteThreads) cursor[e] = 0;
  if (tid == 0) masked = masked_rows > 0;
  if (masked_rows > 0)  // (rows no pair takes stay -1; the scatter below comes after a barrier)
    for (int64_t r = tid; r < int64_t(experts) * masked_rows; r += kRouteThreads) sorted_pair[r] = -1;
  __syncthreads();
  for (int64_t p = tid; p < pairs; p += kRouteThreads) {
    int e = load_expert(idx, p, experts);
    if (e >= 0) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();
  if (masked_rows > 0)
    for (int e = tid; e < experts; e += kRouteThreads)
      if (cursor[e] > masked_rows) masked = 0;
  __syncthreads();

  // Exclusive scans of counts and of tiles per expert, in chunks of kRouteThreads experts.
  if (tid == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  for (int base = 0; base < experts; base += kRouteThreads) {
    int e = base + tid;
    int c = e < experts ? cursor[e] : 0;
    int nt = (c + tile_rows - 1) / tile_rows;
    int c_ex, nt_ex, c_tot, nt_tot;
    Scan(scan_tmp).ExclusiveSum(c, c_ex, c_tot);
    __syncthreads();
    Scan(scan_tmp).ExclusiveSum(nt, nt_ex, nt_tot);
    int c0 = carry[0], t0 = carry[1];
    __syncthreads();
    if (e < experts) {
      const int start = masked ? e * masked_rows : c0 + c_ex;
      count[e] = c;
      offsets[e] = start;
      cursor[e] = start;
      tile_first[e] = t0 + nt_ex;
    }
    if (tid == 0) {
      carry[0] = c0 + c_tot;
      carry[1] = t0 + nt_tot;
    }
    __syncthreads();
  }
  if (tid == 0) {
    offsets[experts] = carry[0];
    *num_tiles = min(carry[1], max_tiles);
  }

  __syncthreads();
  // Each expert's tile list, from its start and its count, cut
  // into G = max(1, round(n / raster_tiles)) raster groups whose sizes differ by at most one
  // (the first n % G have one tile more), so between raster_tiles / 2 and 1.5 raster_tiles
  // tiles (an expert of 9 tiles stays one group: two of 5 and 4 would put twice as many weight
  // blocks in flight at once). A group never spans two experts: the wgmma kernel reads each of
  // an expert's weight blocks while all of the group's A rows are in L2.
  for (int e = tid; e < experts; e += kRouteThreads) {
    int start = cursor[e];
    int t = tile_first[e];
    const int count_e = count[e];
    const int n = (count_e + tile_rows - 1) / tile_rows;
    for (int j = 0, r = 0; r < count_e && t < max_tiles; r += tile_rows, ++t, ++j)
      tiles[t] = Tile{e, start + r, min(tile_rows, count_e - r), raster_group(j, n, raster_tiles)};
  }
  __syncthreads();

  for (int64_t p = tid; p < pairs; p += kRouteThreads) {
    int e = load_expert(idx, p, experts);
    int pos = -1;
    if (e >= 0) {
      pos = atomicAdd(&cursor[e], 1);
      sorted_pair[pos] = int(p);
    }
    pos_of_pair[p] = pos;
  }
}

}  // namespace moex::cuda
