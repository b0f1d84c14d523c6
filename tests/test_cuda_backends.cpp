// The CUDA experts backends against the float64 reference (same harness as the CPU backends):
// all layout flags, activations, T = 0/1/7/64/1000, routing cases (duplicates, empty experts,
// sentinels), [T,k] and [T,E] weights, int32/int64 ids, bf16/f16/f32, ugly sizes (H = 19, 111;
// I = 13: the SIMT path) and tile-friendly sizes (the tensor-core path, both tile configs), plus
// CUDA-graph capture and replay with new routing, the allocator and the error check.
// fp32 runs on fp32 CUDA-core FMA (no tf32), so the fp32 tolerance is float32's.
// Every test skips cleanly where no GPU exists (CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "moex/experts.hpp"
#include "support/test_support.hpp"

#ifndef MOEX_WITH_CUDA

// A CPU-only build has no CUDA runtime to link against: one test that says so.
TEST(CudaBackends, SkippedInCpuOnlyBuild) { GTEST_SKIP() << "built without CUDA (MOEX_CUDA=OFF)"; }

#else

#include "cuda/backends.hpp"
#include "cuda/experts_ops.hpp"
#include "cuda/launchers.hpp"
#include "cuda/runtime.hpp"

using namespace moex;
using namespace moex::test;

namespace {

#define SKIP_WITHOUT_GPU() \
  if (moex::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"


Tensor on_gpu(const Tensor& t) { return t.defined() ? t.to(Device::cuda()) : t; }
ExpertsWeights weights_on_gpu(const ExpertsWeights& w) { return experts_weights_to(w, Device::cuda()); }

void check_case(const std::string& backend, const ExpertsSpec& s, DType dt, int64_t T, int64_t k,
                RoutingCase rc, uint64_t seed, bool per_expert = false,
                DType idx_dt = DType::kI64) {
  check_experts_case(Device::cuda(), backend, s, dt, T, k, rc, seed, per_expert, idx_dt);
}

class CudaConsistency : public ::testing::TestWithParam<std::string> {};

// Ugly sizes: K and N are not multiples of 8, so every dtype takes the SIMT kernel.
TEST_P(CudaConsistency, AllLayoutsUglySizes) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 11000;
  for (const ExpertsLayout& l : all_experts_layouts())
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t T : {0, 1, 7, 64, 1000}) {
        ExpertsSpec s = make_experts_spec(l, 9, T == 1000 ? 19 : 111, 13, Activation::kSilu);
        check_case(GetParam(), s, dt, T, 3, RoutingCase::kRandom, ++seed);
      }
}

// Tile-friendly sizes: bf16/f16 take the tensor-core kernel (16-row tiles at small T, 128-row
// tiles at T = 1000 with few experts), except transposed + interleaved (SIMT).
TEST_P(CudaConsistency, AllLayoutsTensorCoreSizes) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 12000;
  for (const ExpertsLayout& l : all_experts_layouts())
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
      for (int64_t T : {1, 7, 64, 1000}) {
        ExpertsSpec s = make_experts_spec(l, T == 1000 ? 3 : 9, 136, 72, Activation::kSilu);
        check_case(GetParam(), s, dt, T, 2, RoutingCase::kRandom, ++seed);
      }
}

// Experts with many large tiles: more than one raster group per expert (Tile::group), and on
// Hopper an expert's last tile of at most 128 rows, which a 2-CTA cluster splits by column
// blocks; gate_up has an odd number of column blocks (I = 300: 3 of 128), so rank 1 of the last
// pair has no columns there.
TEST_P(CudaConsistency, ManyTilesPerExpert) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 12500;
  for (auto [E, dt] : {std::pair{3, DType::kF16}, std::pair{5, DType::kBF16}}) {
    ExpertsSpec s = make_experts_spec({true, false, false, true}, E, 264, 300, Activation::kSilu);
    check_case(GetParam(), s, dt, 2400, 2, RoutingCase::kRandom, ++seed);
  }
}

TEST_P(CudaConsistency, RoutingCases) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 13000;
  for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kEveryExpert,
                         RoutingCase::kEmptyExperts, RoutingCase::kDuplicates,
                         RoutingCase::kSentinels})
    for (int64_t T : {1, 7, 64, 1000})
      for (int64_t H : {111, 128}) {
        ExpertsSpec s = make_experts_spec({true, false, false, true}, 11, H, H == 128 ? 64 : 13,
                                  Activation::kSilu);
        check_case(GetParam(), s, DType::kF32, T, 4, rc, ++seed);
        check_case(GetParam(), s, DType::kBF16, T, 4, rc, ++seed, /*per_expert=*/true);
        check_case(GetParam(), s, DType::kF16, T, 4, rc, ++seed, false, DType::kI32);
      }
}

TEST_P(CudaConsistency, Activations) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 14000;
  for (Activation a : {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh,
                       Activation::kRelu, Activation::kSwigluOai})
    for (const ExpertsLayout& l : all_experts_layouts()) {
      if (a == Activation::kSwigluOai && !l.gate) continue;
      check_case(GetParam(), make_experts_spec(l, 5, 19, 13, a), DType::kF32, 7, 2,
                 RoutingCase::kRandom, ++seed);
      check_case(GetParam(), make_experts_spec(l, 5, 64, 40, a), DType::kBF16, 33, 2,
                 RoutingCase::kRandom, ++seed);
      // T = 700 on 3 experts: 128-row tiles, so gated gate_up takes the wgmma kernel's staged
      // epilogue with the per-output activation / bias dispatch (not only SiLU's fast path), on
      // a partial column block (I = 40) and each expert's partial last tile.
      check_case(GetParam(), make_experts_spec(l, 3, 64, 40, a), DType::kBF16, 700, 2,
                 RoutingCase::kRandom, ++seed);
    }
}

// A wrong kernel must fail the same check: perturb one weight of the backend's input only.
TEST_P(CudaConsistency, HarnessDetectsAPerturbedWeight) {
  SKIP_WITHOUT_GPU();
  ExpertsSpec s = make_experts_spec({true, false, false, true}, 4, 64, 32, Activation::kSilu);
  ExpertsWeights w = random_experts_weights(s, DType::kBF16, 15001);
  Routing r = random_routing(s, 16, 2, DType::kBF16, 15001, RoutingCase::kEveryExpert);
  Tensor ref = experts_reference_f64(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  ExpertsWeights bad = w;
  bad.down = Tensor::from_floats([&] {
    auto v = w.down.to_float_vector();
    v[7] += 0.5f;
    return v;
  }(), w.down.shape(), DType::kBF16);
  Tensor out = experts_forward(GetParam(), s, weights_on_gpu(bad), on_gpu(r.hidden),
                               on_gpu(r.top_k_index), on_gpu(r.top_k_weights));
  EXPECT_GT(rel_l2_error(out.to(Device::cpu()), ref), experts_tolerance(DType::kBF16, 64));
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaConsistency,
                         ::testing::Values("eager", "batched_mm", "grouped_mm"),
                         [](const auto& info) { return info.param; });

// ---- graph capture: replay with new routing written into the same device tensors ----

void copy_into(const Tensor& dst, const Tensor& host_src) {
  ASSERT_EQ(dst.nbytes(), host_src.nbytes());
  moex::cuda::copy_bytes(dst.raw(), dst.device(), host_src.raw(), Device::cpu(), dst.nbytes());
}

class CudaGraph : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CudaGraph, ReplaysWithNewRouting) {
  SKIP_WITHOUT_GPU();
  const auto& [backend, variant] = GetParam();
  // variant 0: bf16 tensor cores, small T; 1: bf16 large tiles; 2: fp32 SIMT, ugly sizes, bias.
  DType dt = variant == 2 ? DType::kF32 : DType::kBF16;
  ExpertsSpec s = variant == 2 ? make_experts_spec({true, true, true, false}, 7, 19, 13, Activation::kGelu)
                               : make_experts_spec({true, false, false, true}, 8, 128, 64, Activation::kSilu);
  int64_t T = variant == 1 ? 700 : 9, k = 3;
  uint64_t seed = 16000 + 10 * variant;
  ExpertsWeights w = random_experts_weights(s, dt, seed);
  Experts experts(s, weights_on_gpu(w));
  Routing r0 = random_routing(s, T, k, dt, seed + 1, RoutingCase::kRandom);
  Tensor hidden = on_gpu(r0.hidden), idx = on_gpu(r0.top_k_index), tw = on_gpu(r0.top_k_weights);
  (void)experts.forward(backend, hidden, idx, tw);  // warm: workspace and output block cached
  moex::cuda::synchronize();

  cudaStream_t stream = moex::cuda::current_stream();
  size_t mallocs_before = moex::cuda::allocator_stats().cuda_mallocs;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  Tensor out = experts.forward(backend, hidden, idx, tw);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(moex::cuda::allocator_stats().cuda_mallocs, mallocs_before)
      << "a warm forward allocated device memory";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (int round = 0; round < 3; ++round) {
    RoutingCase rc = round == 0 ? RoutingCase::kRandom
                                : (round == 1 ? RoutingCase::kSentinels : RoutingCase::kDuplicates);
    Routing r = random_routing(s, T, k, dt, seed + 2 + round, rc);
    copy_into(hidden, r.hidden);
    copy_into(idx, r.top_k_index);
    copy_into(tw, r.top_k_weights);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    moex::cuda::synchronize();
    Tensor ref = experts_reference_f64(s, w, r.hidden, r.top_k_index, r.top_k_weights);
    double err = rel_l2_error(out.to(Device::cpu()), ref);
    EXPECT_LE(err, experts_tolerance(dt, std::max(s.hidden, s.intermediate)))
        << backend << " variant " << variant << " replay " << round << " routing "
        << routing_case_name(rc) << " seed " << seed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaGraph,
                         ::testing::Combine(::testing::Values("batched_mm", "grouped_mm"),
                                            ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// On Hopper, grouped_mm's compute-bound configuration must run the TMA + wgmma kernel (the
// consistency tests above then check its results); elsewhere, or when switched off with
// MOEX_CUDA_GEMM=mma, the mma.sync kernel. A silent fallback would pass every accuracy test.
TEST(CudaPlan, GroupedUsesWgmmaOnHopper) {
  SKIP_WITHOUT_GPU();
  moex::cuda::ExpertsArgs a;
  a.elem = moex::cuda::Elem::kBF16;
  a.tokens = 4096;
  a.top_k = 4;
  a.experts = 60;
  a.hidden = 2048;
  a.intermediate = 1408;
  alignas(16) static unsigned char dummy[64];
  a.hidden_states = a.top_k_index = a.top_k_weights = a.gate_up = a.down = dummy;
  a.out = dummy;
  const std::string plan = moex::cuda::describe_plan(a, moex::cuda::Algo::kGrouped);
  const auto& d = moex::cuda::device_info(moex::cuda::current_device());
  const char* env = std::getenv("MOEX_CUDA_GEMM");
  const bool off = env && std::string(env) == "mma";
  if (d.major == 9 && d.minor == 0 && !off) EXPECT_NE(plan.find("wgmma"), std::string::npos) << plan;
  else EXPECT_EQ(plan.find("wgmma"), std::string::npos) << plan;
  // 273 rows per expert: 2-CTA cluster pairs on Hopper only when asked for (MOEX_WGMMA_CLUSTER=1
  // or MOEX_CUDA_TILE_ROWS=256).
  const char* cl = std::getenv("MOEX_WGMMA_CLUSTER");
  const char* forced = std::getenv("MOEX_CUDA_TILE_ROWS");
  const bool no_cluster = forced ? std::string(forced) != "256" : !(cl && std::string(cl) == "1");
  if (d.major == 9 && d.minor == 0 && !off && !no_cluster)
    EXPECT_NE(plan.find("2-CTA clusters"), std::string::npos) << plan;
  else EXPECT_EQ(plan.find("2-CTA clusters"), std::string::npos) << plan;
  // The down GEMM of short K (1408 here) on ping-pong warpgroups, of long K (Mixtral's 14336)
  // cooperative, unless MOEX_WGMMA_PINGPONG says otherwise.
  if (d.major == 9 && d.minor == 0 && !off && no_cluster && !forced &&
      !std::getenv("MOEX_WGMMA_PINGPONG")) {
    EXPECT_NE(plan.find("down GEMM on ping-pong"), std::string::npos) << plan;
    moex::cuda::ExpertsArgs m = a;
    m.experts = 8;
    m.top_k = 2;
    m.hidden = 4096;
    m.intermediate = 14336;
    const std::string mp = moex::cuda::describe_plan(m, moex::cuda::Algo::kGrouped);
    EXPECT_NE(mp.find("wgmma (sm_90a) tiles of 128 rows"), std::string::npos) << mp;
    EXPECT_EQ(mp.find("ping-pong"), std::string::npos) << mp;
  }
  // 32 rows per expert: 64-row wgmma tiles on Hopper (one pass over each expert's weights),
  // 16-row mma.sync tiles elsewhere.
  a.tokens = 480;
  const std::string mid = moex::cuda::describe_plan(a, moex::cuda::Algo::kGrouped);
  if (d.major == 9 && d.minor == 0 && !off)
    EXPECT_NE(mid.find("wgmma (sm_90a) tiles of 64 rows"), std::string::npos) << mid;
  else EXPECT_NE(mid.find("mma.sync tiles of 16"), std::string::npos) << mid;
  a.tokens = 2;  // decode: 16-row mma.sync tiles
  EXPECT_NE(moex::cuda::describe_plan(a, moex::cuda::Algo::kGrouped).find("mma.sync tiles of 16"),
            std::string::npos);
  a.transposed = true;  // no wgmma path for transposed weights yet
  a.tokens = 4096;
  EXPECT_EQ(moex::cuda::describe_plan(a, moex::cuda::Algo::kGrouped).find("wgmma"),
            std::string::npos);
}

// route_by_expert's tile table: each expert's tiles in order, cut into round(n / raster_tiles)
// raster groups of about equal size that never span two experts (the wgmma kernel's work order
// depends on it: a wrong group would compute some tiles twice and others never).
TEST(CudaRoute, TilesAndRasterGroups) {
  SKIP_WITHOUT_GPU();
  using moex::cuda::Tile;
  const int experts = 7, top_k = 1;
  std::vector<int64_t> ids;
  // Expert e gets counts[e] pairs: 0, 1, a tile, a tile + 1, 9 tiles, 17 tiles - 1, 300.
  const std::vector<int> counts = {0, 1, 128, 129, 9 * 128, 17 * 128 - 1, 300};
  for (int e = experts - 1; e >= 0; --e)
    for (int i = 0; i < counts[e]; ++i) ids.push_back(e);
  const int64_t pairs = int64_t(ids.size());
  for (int tile_rows : {64, 128, 256})
    for (int raster : {1, 4, 8}) {
      const int max_tiles = int(moex::cuda::route_max_tiles(pairs, experts, tile_rows));
      Tensor idx = Tensor::from_ints(ids, {pairs / top_k, top_k}).to(Device::cuda());
      Tensor ints = Tensor::zeros({int64_t(experts) + 1 + 2 * pairs + 1}, DType::kI32, Device::cuda());
      Tensor tiles = Tensor::zeros({int64_t(max_tiles) * 4}, DType::kI32, Device::cuda());
      int* base = static_cast<int*>(ints.raw());
      moex::cuda::launch_route_by_expert(idx.raw(), true, pairs, experts, tile_rows, raster, base,
                                         base + experts + 1, base + experts + 1 + pairs,
                                         static_cast<Tile*>(tiles.raw()), max_tiles,
                                         base + experts + 1 + 2 * pairs,
                                         moex::cuda::current_stream());
      moex::cuda::synchronize();
      const std::vector<float> all = ints.to(Device::cpu()).to_float_vector();
      const int num_tiles = int(all.back());
      std::vector<Tile> t(static_cast<size_t>(max_tiles));
      moex::cuda::copy_bytes(t.data(), Device::cpu(), tiles.raw(), Device::cuda(),
                             t.size() * sizeof(Tile));
      int expect_tiles = 0;
      for (int c : counts) expect_tiles += (c + tile_rows - 1) / tile_rows;
      ASSERT_EQ(num_tiles, expect_tiles) << tile_rows;
      int i = 0, row = 0;
      for (int e = 0; e < experts; ++e) {
        const int n = (counts[e] + tile_rows - 1) / tile_rows;
        const int groups = std::max(1, (n + raster / 2) / raster);  // round(n / raster)
        for (int j = 0; j < n; ++j, ++i) {
          SCOPED_TRACE("tile_rows " + std::to_string(tile_rows) + " raster " +
                       std::to_string(raster) + " expert " + std::to_string(e) + " tile " +
                       std::to_string(j));
          EXPECT_EQ(t[i].expert, e);
          EXPECT_EQ(t[i].row_start, row + j * tile_rows);
          EXPECT_EQ(t[i].rows, std::min(tile_rows, counts[e] - j * tile_rows));
          const int size = t[i].group >> 16, within = t[i].group & 0xffff;
          ASSERT_GE(size, 1);
          ASSERT_LT(within, size);
          EXPECT_LE(size, raster + (raster + 1) / 2);
          // Sizes differ by at most one within the expert, and the groups cover it exactly:
          EXPECT_GE(size, n / groups);
          EXPECT_LE(size, (n + groups - 1) / groups);
          const int first = j - within;
          ASSERT_GE(first, 0);
          ASSERT_LE(first + size, n);  // never into the next expert
          for (int q = first; q < first + size; ++q)
            EXPECT_EQ(t[i - j + q].group, (size << 16) | (q - first));
        }
        row += counts[e];
      }
    }
}

TEST(CudaRuntime, CapsAndRegistry) {
  for (auto b : {moex::cuda::make_eager_backend(), moex::cuda::make_batched_mm_backend(),
                 moex::cuda::make_grouped_mm_backend()}) {
    BackendCaps c = b->caps();
    ASSERT_EQ(c.devices.size(), 1u);
    EXPECT_EQ(c.devices[0], DeviceKind::kCUDA);
    EXPECT_EQ(c.dtypes.size(), 3u);
  }
  EXPECT_FALSE(moex::cuda::make_eager_backend()->caps().graph_capturable);
  EXPECT_TRUE(moex::cuda::make_batched_mm_backend()->caps().graph_capturable);
  EXPECT_TRUE(moex::cuda::make_grouped_mm_backend()->caps().graph_capturable);
}

TEST(CudaRuntime, ErrorCheckNamesCallFileAndDevice) {
  SKIP_WITHOUT_GPU();
  try {
    MOEX_CUDA_CHECK(cudaMemcpy(nullptr, reinterpret_cast<void*>(16), 64, cudaMemcpyDeviceToDevice));
    FAIL() << "no error thrown";
  } catch (const DeviceError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cudaMemcpy"), std::string::npos) << m;
    EXPECT_NE(m.find("test_cuda_backends.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda:"), std::string::npos) << m;
  }
}

TEST(CudaRuntime, AllocatorReusesBlocks) {
  SKIP_WITHOUT_GPU();
  void* p = nullptr;
  {
    Tensor t = Tensor::empty({1000, 1000}, DType::kF32, Device::cuda());
    p = t.raw();
  }
  size_t before = moex::cuda::allocator_stats().cuda_mallocs;
  Tensor t2 = Tensor::empty({1000, 999}, DType::kF32, Device::cuda());
  EXPECT_EQ(t2.raw(), p);
  EXPECT_EQ(moex::cuda::allocator_stats().cuda_mallocs, before);
}

TEST(CudaRuntime, DeviceCountNeverThrows) { EXPECT_GE(moex::cuda::device_count(), 0); }

}  // namespace

#endif  // MOEX_WITH_CUDA
