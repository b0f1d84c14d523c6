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

#include "cuda/experts_backend.hpp"
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

// ---- grouped_mm under the plans its policy does not pick on this machine ----
// Each is a CUDA-only backend defined here (one class + one registration line), running the
// library's grouped_mm op with the default plan edited as named, so that every kernel
// configuration stays under the same consistency and graph tests. check_plan rejects an edit
// the device cannot run; an edit that does not apply to a shape leaves that shape's plan alone.
using moex::cuda::ExpertsPlan;
using moex::cuda::GemmPath;

template <void (*kEdit)(ExpertsPlan&, const moex::cuda::ExpertsShape&, const moex::cuda::DeviceTraits&)>
class PlannedGroupedMm final : public moex::cuda::CudaExpertsBackend {
 protected:
  std::string description() const override { return "grouped_mm with an edited plan (tests)"; }
  ExpertsPlan plan(const moex::cuda::ExpertsArgs& a, const moex::cuda::DeviceTraits& d) const override {
    const moex::cuda::ExpertsShape s = moex::cuda::shape_of(a);
    ExpertsPlan p = moex::cuda::plan_grouped_mm(s, d);
    kEdit(p, s, d);
    moex::cuda::check_plan(p, s, d);
    return p;
  }
  size_t workspace_bytes(const moex::cuda::ExpertsArgs& a, const ExpertsPlan& p) const override {
    return moex::cuda::grouped_mm_workspace_bytes(a, p);
  }
  void run(const moex::cuda::ExpertsArgs& a, const ExpertsPlan& p, void* ws,
           cudaStream_t st) const override {
    moex::cuda::grouped_mm_experts(a, p, ws, st);
  }
};

using Shape_ = moex::cuda::ExpertsShape;
using Traits_ = moex::cuda::DeviceTraits;
// mma.sync where the policy picks wgmma (what other GPUs run).
void mma_only(ExpertsPlan& p, const Shape_&, const Traits_&) {
  if (p.gemm == GemmPath::kWgmma) p = {GemmPath::kMmaSync, p.tile_rows, 256, false, false, p.raster_tiles};
}
// 64-row wgmma tiles for every grouped call wgmma serves.
void wgmma_64_rows(ExpertsPlan& p, const Shape_& s, const Traits_& d) {
  if (moex::cuda::wgmma_applies(s, d))
    p = {GemmPath::kWgmma, 64, 256, false, false, 16};
}
// Both GEMMs on ping-pong warpgroups wherever 128-row wgmma tiles run.
void pingpong_both(ExpertsPlan& p, const Shape_&, const Traits_&) {
  if (p.gemm == GemmPath::kWgmma && p.tile_rows == 128) p.pingpong_gate_up = p.pingpong_down = true;
}
// 128 weight rows per stage (64-column gate_up tiles; the 6- and 8-stage rings).
void narrow_stages(ExpertsPlan& p, const Shape_&, const Traits_&) {
  if (p.gemm == GemmPath::kWgmma) {
    p.b_rows = 128;
    p.pingpong_gate_up = p.pingpong_down = false;
  }
}
// 2-CTA cluster pairs where 128-row wgmma tiles run.
void cluster_pairs(ExpertsPlan& p, const Shape_&, const Traits_&) {
  if (p.gemm == GemmPath::kWgmma && p.tile_rows == 128) p = {GemmPath::kWgmma, 256, 256, false, false, 4};
}
// Cluster pairs for every grouped call wgmma serves, small T included (many pairs with an empty
// second half).
void cluster_pairs_everywhere(ExpertsPlan& p, const Shape_& s, const Traits_& d) {
  if (moex::cuda::wgmma_applies(s, d)) p = {GemmPath::kWgmma, 256, 256, false, false, 4};
}

MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_plan_mma_only", PlannedGroupedMm<mma_only>);
MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_plan_wgmma_64_rows", PlannedGroupedMm<wgmma_64_rows>);
MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_plan_pingpong_both", PlannedGroupedMm<pingpong_both>);
MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_plan_narrow_stages", PlannedGroupedMm<narrow_stages>);
MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_plan_cluster_pairs", PlannedGroupedMm<cluster_pairs>);
MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm_plan_cluster_pairs_everywhere",
                              PlannedGroupedMm<cluster_pairs_everywhere>);

INSTANTIATE_TEST_SUITE_P(Cuda, CudaConsistency,
                         ::testing::Values("eager", "batched_mm", "grouped_mm", "auto",
                                           "grouped_mm_plan_mma_only",
                                           "grouped_mm_plan_wgmma_64_rows",
                                           "grouped_mm_plan_pingpong_both",
                                           "grouped_mm_plan_narrow_stages",
                                           "grouped_mm_plan_cluster_pairs",
                                           "grouped_mm_plan_cluster_pairs_everywhere"),
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
  // variant 0: bf16 tensor cores, small T; 1: bf16 large tiles; 2: fp32 SIMT, ugly sizes, bias;
  // 3: one token (batched_mm's GEMV).
  DType dt = variant == 2 ? DType::kF32 : DType::kBF16;
  ExpertsSpec s = variant == 2 ? make_experts_spec({true, true, true, false}, 7, 19, 13, Activation::kGelu)
                               : make_experts_spec({true, false, false, true}, 8, 128, 64, Activation::kSilu);
  int64_t T = variant == 1 ? 700 : variant == 3 ? 1 : 9, k = 3;
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
                         ::testing::Combine(::testing::Values("batched_mm", "grouped_mm",
                                                              "grouped_mm_plan_mma_only",
                                                              "grouped_mm_plan_wgmma_64_rows",
                                                              "grouped_mm_plan_pingpong_both",
                                                              "grouped_mm_plan_narrow_stages",
                                                              "grouped_mm_plan_cluster_pairs"),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The plan the backends compute on this device: on Hopper, grouped_mm's compute-bound
// configuration must be wgmma (a silent fallback would pass every accuracy test). The policy
// itself is tested on fixed traits in test_cuda_plan.cpp.
TEST(CudaPlan, ThisDeviceTraits) {
  SKIP_WITHOUT_GPU();
  const auto& d = moex::cuda::device_info(moex::cuda::current_device());
  const moex::cuda::DeviceTraits t = moex::cuda::traits_of(moex::cuda::current_device());
  EXPECT_EQ(t.cc_major, d.major);
  EXPECT_EQ(t.cc_minor, d.minor);
  EXPECT_EQ(t.sm_count, d.sm_count);
  moex::cuda::ExpertsShape qwen;
  qwen.elem = moex::cuda::Elem::kBF16;
  qwen.pairs = 4096 * 4;
  qwen.experts = 60;
  qwen.hidden = 2048;
  qwen.intermediate = 1408;
  const ExpertsPlan p = moex::cuda::plan_grouped_mm(qwen, t);
  EXPECT_EQ(p.gemm, d.major == 9 && d.minor == 0 ? GemmPath::kWgmma : GemmPath::kMmaSync)
      << p.describe();
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

// Each built-in name has exactly one CUDA implementation, registered from src/cuda, beside the
// CPU one; the registry dispatches between them.
TEST(CudaRuntime, CapsAndRegistry) {
  for (const char* name : {"eager", "batched_mm", "grouped_mm"}) {
    int cuda_impls = 0;
    for (const auto& b : experts_backend_implementations(name)) {
      BackendCaps c = b->caps();
      if (c.devices != std::vector<DeviceKind>{DeviceKind::kCUDA}) continue;
      ++cuda_impls;
      EXPECT_EQ(c.dtypes.size(), 3u) << name;
      EXPECT_EQ(c.graph_capturable, std::string(name) != "eager") << name;
    }
    EXPECT_EQ(cuda_impls, 1) << name;
    EXPECT_EQ(experts_backend_implementations(name).size(), 2u) << name;
  }
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

// A tensor larger than the GPU: one DeviceError with the sizes a user can act on, and the
// allocator still works after it.
TEST(CudaRuntime, OutOfMemoryNamesTheSizes) {
  SKIP_WITHOUT_GPU();
  try {
    Tensor t = Tensor::empty({int64_t(1) << 38, 16}, DType::kF32, Device::cuda());  // 16 TiB
    FAIL() << "no error thrown";
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of device memory on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("asked for 16384.00 GiB at once"), std::string::npos) << m;
    EXPECT_NE(m.find(" free; the model, the batch"), std::string::npos) << m;
  }
  Tensor small = Tensor::empty({1000}, DType::kF32, Device::cuda());
  EXPECT_NE(small.raw(), nullptr);
}

// device_count() is the runtime's count, or 0 where the runtime has no device or no driver.
TEST(CudaRuntime, DeviceCountMatchesTheRuntime) {
  int n = -1;
  const cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  EXPECT_EQ(moex::cuda::device_count(), e == cudaSuccess ? n : 0) << cudaGetErrorString(e);
}

}  // namespace

#endif  // MOEX_WITH_CUDA
