// Experts backends that run grouped_mm's / deepgemm's kernels on a plan the policy does not pick,
// so `moex bench experts` times the policy's choice and its alternative in one run, each checked
// against the float64 reference like every backend (the plan fields are the library's; only the
// choice differs). Loaded as a plugin:
//
//   g++ -std=c++20 -O2 -shared -fPIC -Iinclude -Isrc -I/usr/local/cuda/include \
//       lab/cuda/experts_plan_variants.cpp -Lbuild -lmoex -Wl,-rpath,$PWD/build \
//       -o build/libexperts_plan_variants.so
//   build/moex --plugin build/libexperts_plan_variants.so bench experts --device cuda \
//       --experts 32 --top-k 8 --hidden 7168 --intermediate 2048 --dtype fp8 \
//       --backends deepgemm,deepgemm_contiguous,deepgemm_tiles128 --tokens 1,16,64 --graph on
//
// Backends: deepgemm_contiguous / deepgemm_masked (the layout forced, tiles as the policy's;
// the policy runs the contiguous one), deepgemm_tiles128 and grouped_mm_tiles128 (128-row tiles
// where the policy takes 64; layout as the policy's), deepgemm_b256 (FP8 stages of 256 weight
// rows where the policy takes 128), sonicmoe_rasterN and grouped_mm_rasterN
// (raster groups of about N = 4 / 16 / 32 128-row tiles where the policy takes 8), and
// grouped_mm_dyn / deepgemm_dyn (work items claimed at run time, where the policy keeps the
// static schedule), sonicmoe_static (the reverse) and sonicmoe_pingpong_down (the fused path's
// earlier down GEMM). Measured with
// it: docs/cuda.md, "The two layouts, measured" and "sonicmoe: the fused path", and
// docs/measurements/h100_2026-12-05_deepgemm_layouts_and_fp8_tiles.log,
// h100_2026-12-06_sonicmoe_dynamic_items_three_shapes.log.
#include <functional>
#include <memory>
#include <string>

#include "cuda/experts_backend.hpp"
#include "cuda/experts_ops.hpp"
#include "moex/experts.hpp"

namespace {

using namespace moex::cuda;

class PlanVariant final : public CudaExpertsBackend {
 public:
  using Planner = std::function<ExpertsPlan(const ExpertsShape&, const DeviceTraits&)>;
  PlanVariant(std::string what, Planner planner, bool fused = false)
      : what_(std::move(what)), planner_(planner), fused_(fused) {}

 protected:
  std::string description() const override { return what_; }
  ExpertsPlan plan(const ExpertsArgs& a, const DeviceTraits& d) const override {
    const ExpertsShape s = shape_of(a);
    ExpertsPlan p = planner_(s, d);
    check_plan(p, s, d);
    return p;
  }
  size_t workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& p) const override {
    return fused_ ? sonicmoe_workspace_bytes(a, p) : grouped_mm_workspace_bytes(a, p);
  }
  void run(const ExpertsArgs& a, const ExpertsPlan& p, void* ws, cudaStream_t s) const override {
    if (fused_)
      sonicmoe_experts(a, p, ws, s);
    else
      grouped_mm_experts(a, p, ws, s);
  }

 private:
  std::string what_;
  Planner planner_;
  bool fused_;
};

bool masked_fits(const ExpertsShape& s) { return int64_t(s.experts) * s.tokens >= s.pairs; }

// 128-row tiles where a plan has 64 (raster groups of ~1024 rows, as the policy sets them).
ExpertsPlan tiles128(ExpertsPlan p) {
  if ((p.gemm == GemmPath::kWgmma || p.gemm == GemmPath::kWgmmaFp8) && p.tile_rows == 64) {
    p.tile_rows = 128;
    p.raster_tiles = 8;
  }
  return p;
}

// Raster groups of about `tiles` 128-row tiles (the policy's are 8 = ~1024 rows of one expert).
ExpertsPlan raster(ExpertsPlan p, int tiles) {
  if (p.tile_rows == 128) p.raster_tiles = tiles;
  return p;
}

void register_all() {
  auto reg = [](const std::string& name, const std::string& what, PlanVariant::Planner f,
                bool fused = false) {
    moex::register_experts_backend(name, std::make_shared<PlanVariant>(what, std::move(f), fused));
  };
  reg("deepgemm_contiguous", "deepgemm, contiguous layout at every size (lab)",
      [](const ExpertsShape& s, const DeviceTraits& d) {
        ExpertsPlan p = plan_deepgemm(s, d);
        p.masked = false;
        return p;
      });
  reg("deepgemm_masked", "deepgemm, masked layout at every size where it fits (lab)",
      [](const ExpertsShape& s, const DeviceTraits& d) {
        ExpertsPlan p = plan_deepgemm(s, d);
        p.masked = masked_fits(s);
        return p;
      });
  reg("deepgemm_tiles128", "deepgemm, 128-row tiles at every size (lab)",
      [](const ExpertsShape& s, const DeviceTraits& d) { return tiles128(plan_deepgemm(s, d)); });
  reg("grouped_mm_tiles128", "grouped_mm, 128-row wgmma tiles where it takes 64 (lab)",
      [](const ExpertsShape& s, const DeviceTraits& d) { return tiles128(plan_grouped_mm(s, d)); });
  reg("deepgemm_b256", "deepgemm, FP8 stages of 256 weight rows at every size (lab)",
      [](const ExpertsShape& s, const DeviceTraits& d) {
        ExpertsPlan p = plan_deepgemm(s, d);
        if (p.gemm == GemmPath::kWgmmaFp8) p.b_rows = 256;
        return p;
      });
  // The wgmma kernels' schedule flipped: work items claimed at run time where the policy keeps
  // the static round-robin share (grouped_mm, deepgemm), and the static share where it claims
  // them (sonicmoe).
  auto flipped = [](ExpertsPlan p) {
    if (p.gemm == GemmPath::kWgmma || p.gemm == GemmPath::kWgmmaFp8)
      p.dynamic_items = !p.dynamic_items;
    return p;
  };
  reg("sonicmoe_static", "sonicmoe, static round-robin work items (lab)",
      [flipped](const ExpertsShape& s, const DeviceTraits& d) {
        return flipped(plan_sonicmoe(s, d));
      },
      true);
  reg("sonicmoe_pingpong_down",
      "sonicmoe, down GEMM on ping-pong warpgroups where I <= 2048, rows stored from the "
      "accumulators (lab)",
      [](const ExpertsShape& s, const DeviceTraits& d) {
        ExpertsPlan p = plan_sonicmoe(s, d);
        p.pingpong_down = p.tile_rows == 128 && s.intermediate <= 2048;
        return p;
      },
      true);
  reg("grouped_mm_dyn", "grouped_mm, work items claimed at run time (lab)",
      [flipped](const ExpertsShape& s, const DeviceTraits& d) {
        return flipped(plan_grouped_mm(s, d));
      });
  reg("deepgemm_dyn", "deepgemm, work items claimed at run time (lab)",
      [flipped](const ExpertsShape& s, const DeviceTraits& d) {
        return flipped(plan_deepgemm(s, d));
      });
  // Raster groups of 4 / 16 / 32 tiles for the fused path (A read in place) and grouped_mm.
  for (int t : {4, 16, 32}) {
    const std::string n = std::to_string(t);
    reg("sonicmoe_raster" + n, "sonicmoe, raster groups of ~" + n + " tiles (lab)",
        [t](const ExpertsShape& s, const DeviceTraits& d) {
          return raster(plan_sonicmoe(s, d), t);
        },
        true);
    reg("grouped_mm_raster" + n, "grouped_mm, raster groups of ~" + n + " tiles (lab)",
        [t](const ExpertsShape& s, const DeviceTraits& d) {
          return raster(plan_grouped_mm(s, d), t);
        });
  }
}

const bool registered = (register_all(), true);

}  // namespace
