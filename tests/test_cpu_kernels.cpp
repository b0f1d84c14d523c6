// The CPU experts engine on every kernel path (forced one by one, the portable one included)
// against the float64 reference of the consistency harness: all layouts and activations, ugly
// sizes, every routing case, enough rows per expert to reach the AMX 2 x 2 tile path, [T, E]
// weights and int32 ids. Plus the micro-kernels alone for every row count 1..32 (the
// register-blocking remainders), path selection on fixed feature sets, and thread-count
// independence. Every path is instantiated on every machine; a path this CPU cannot run is
// reported as skipped with the reason, never left out of the list.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "cpu/engine.hpp"
#include "moex/error.hpp"
#include "support/test_support.hpp"

using namespace moex;
using namespace moex::test;
using moex::cpu::KernelPath;

namespace moex {
// Test names and messages show the path's name, not its byte value.
void PrintTo(CpuKernelPath p, std::ostream* os) { *os << cpu_kernel_path_name(p); }
}  // namespace moex

namespace {

// Skips the current test when this CPU cannot run `path`.
#define SKIP_UNLESS_SUPPORTED(path)                                                         \
  if (!cpu::kernel_path_supported(path))                                                  \
  GTEST_SKIP() << "this CPU cannot run the " << cpu::kernel_path_name(path)               \
               << " kernel path (it runs " << cpu::kernel_path_name(cpu::best_kernel_path()) \
               << " and below)"

Tensor run_engine(const cpu::PreparedCpuExperts& p, const ExpertsSpec& s, const ExpertsWeights& w,
                  const Routing& r) {
  ExpertsProblem pr;
  pr.spec = &s;
  pr.weights = &w;
  pr.prepared = &p;
  pr.hidden = r.hidden;
  pr.top_k_index = r.top_k_index;
  pr.top_k_weights = r.top_k_weights;
  pr.weights_per_expert = r.top_k_weights.size(1) != r.top_k_index.size(1);
  Tensor out = Tensor::empty({r.hidden.size(0), s.hidden}, r.hidden.dtype());
  cpu::run_cpu_experts(p, pr, out);
  return out;
}

struct Case {
  bool gate = true, bias = false, transposed = false, concat = true;
  Activation act = Activation::kSilu;
  int64_t E = 9, H = 111, I = 13, T = 7, k = 3;
  RoutingCase routing = RoutingCase::kRandom;
  bool per_expert = false;
  DType idx = DType::kI64;
};

void check(KernelPath path, const Case& c, DType dt, uint64_t seed) {
  ExpertsSpec s;
  s.num_experts = c.E;
  s.hidden = c.H;
  s.intermediate = c.I;
  s.has_gate = c.gate;
  s.has_bias = c.bias;
  s.is_transposed = c.transposed;
  s.is_concatenated = c.concat;
  s.act = c.act;
  s.swiglu_limit = 1.5f;
  ExpertsWeights w = random_experts_weights(s, dt, seed);
  Routing r = random_routing(s, c.T, c.k, dt, seed, c.routing, c.per_expert, c.idx);
  auto p = cpu::prepare_cpu_experts(s, w, path);
  Tensor out = run_engine(*p, s, w, r);
  Tensor ref = experts_reference_f64(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  const double err = rel_l2_error(out, ref);
  const double tol = experts_tolerance(dt, std::max(s.hidden, s.intermediate));
  EXPECT_LE(err, tol) << "path=" << cpu::kernel_path_name(path) << " spec=" << s.str()
                      << " dtype=" << dtype_name(dt) << " T=" << c.T << " k=" << c.k
                      << " routing=" << routing_case_name(c.routing)
                      << " per_expert=" << c.per_expert << " seed=" << seed;
}

class EnginePath : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override { SKIP_UNLESS_SUPPORTED(GetParam()); }
};

TEST_P(EnginePath, AllLayoutsAndTokenCounts) {
  uint64_t seed = 7000;
  for (bool bias : {false, true})
    for (bool tr : {false, true})
      for (int layout = 0; layout < 3; ++layout)
        for (DType dt : {DType::kF32, DType::kBF16})
          for (int64_t T : {0, 1, 7, 64, 300}) {
            Case c;
            c.gate = layout != 2;
            c.concat = layout != 1;
            c.bias = bias;
            c.transposed = tr;
            c.T = T;
            c.H = T == 300 ? 19 : 111;
            check(GetParam(), c, dt, ++seed);
          }
}

TEST_P(EnginePath, Activations) {
  uint64_t seed = 7500;
  for (Activation a : {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh,
                       Activation::kRelu, Activation::kSwigluOai})
    for (bool gate : {true, false})
      for (DType dt : {DType::kF32, DType::kBF16}) {
        if (a == Activation::kSwigluOai && !gate) continue;
        Case c;
        c.act = a;
        c.gate = gate;
        c.bias = true;
        c.T = 33;
        check(GetParam(), c, dt, ++seed);
      }
}

TEST_P(EnginePath, RoutingCasesAndIndexForms) {
  uint64_t seed = 7800;
  for (RoutingCase rc : {RoutingCase::kRandom, RoutingCase::kEveryExpert,
                         RoutingCase::kEmptyExperts, RoutingCase::kDuplicates,
                         RoutingCase::kSentinels})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (bool per_expert : {false, true}) {
        Case c;
        c.routing = rc;
        c.per_expert = per_expert;
        c.idx = per_expert ? DType::kI32 : DType::kI64;
        c.T = 64;
        check(GetParam(), c, dt, ++seed);
      }
}

// ~130 rows per expert: full 32-row chunks (AMX 2 x 2 tiles), 17..31-row and tiny remainders;
// I = 40 is not a multiple of 32, so the zeroed K padding of the intermediate is exercised.
TEST_P(EnginePath, ManyRowsPerExpertAndPaddedIntermediate) {
  uint64_t seed = 7900;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (bool tr : {false, true}) {
      Case c;
      c.E = 3;
      c.k = 2;
      c.T = 200;
      c.H = 72;
      c.I = 40;
      c.transposed = tr;
      c.bias = tr;
      check(GetParam(), c, dt, ++seed);
    }
}

// Long reductions (gate_up K = 300 -> 320 padded, down K = 264 -> 288) with several 32-row
// chunks per expert and biases.
TEST_P(EnginePath, LongReductionManyRows) {
  uint64_t seed = 7950;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Case c;
    c.E = 2;
    c.k = 2;
    c.T = 90;
    c.H = 300;
    c.I = 264;
    c.bias = true;
    check(GetParam(), c, dt, ++seed);
  }
}

// A per-slot result buffer above the engine's streaming threshold (16 MiB: T * k * H * 4 bytes),
// so down writes it with non-temporal stores; H = 1008 also leaves a partial last column block
// (written with ordinary stores), H = 1001 (rows not line-aligned) must fall back to ordinary
// stores.
TEST_P(EnginePath, LargeBatchStreamedSlotRows) {
  uint64_t seed = 7980;
  for (int64_t H : {1008, 1001})
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Case c;
    c.E = 4;
    c.k = 4;
    c.T = 1100;
    c.H = H;
    c.I = 40;
    c.bias = dt == DType::kF32;
    check(GetParam(), c, dt, ++seed);
  }
}

std::string path_param_name(const ::testing::TestParamInfo<KernelPath>& info) {
  return std::string(cpu::kernel_path_name(info.param));
}
INSTANTIATE_TEST_SUITE_P(Cpu, EnginePath, ::testing::ValuesIn(cpu::kAllKernelPaths),
                         path_param_name);

class KernelsOfPath : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override { SKIP_UNLESS_SUPPORTED(GetParam()); }
};

// Each micro-kernel of a path against a double reference on random packed panels, for every row
// count 1..32 (so every register-blocking remainder and both AMX tile shapes run).
TEST_P(KernelsOfPath, EveryRowCountMatchesDoubleReference) {
  namespace kn = moex::cpu::kernels;
  const uint64_t seed = 8100;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Fn {
    const char* name;
    kn::GemmFn fn;
    KernelPath need;
  };
  int ran = 0;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const bool bf = dt == DType::kBF16;
    const int64_t K = bf ? 96 : 77;
    const int64_t rows = kn::kMaxRows + kn::kRowSlack;
    std::vector<float> a(size_t(rows * K)), w(size_t(kn::kBlockCols * K));
    for (auto& v : a) v = bf ? round_bf16(u(rng)) : u(rng);
    for (auto& v : w) v = bf ? round_bf16(u(rng)) : u(rng);
    // Pack W [32, K] into two panels (pair layout for bf16, panel layout for fp32).
    const int64_t ps = K * kn::kPanelCols;
    std::vector<uint16_t> a16(a.size()), b16(size_t(2 * ps));
    std::vector<float> b32(size_t(2 * ps));
    for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bf16(a[i]);
    for (int64_t n = 0; n < kn::kBlockCols; ++n)
      for (int64_t c = 0; c < K; ++c) {
        const int64_t panel = n / kn::kPanelCols, lane = n % kn::kPanelCols;
        const float v = w[size_t(n * K + c)];
        if (bf)  // the pair layout needs an even K
          b16[size_t(panel * ps + (c / 2) * 2 * kn::kPanelCols + lane * 2 + (c & 1))] = float_to_bf16(v);
        else
          b32[size_t(panel * ps + c * kn::kPanelCols + lane)] = v;
      }
    std::vector<Fn> fns = bf ? std::vector<Fn>{{"portable", kn::gemm_bf16_portable, KernelPath::kPortable},
                                                {"avx2", kn::gemm_bf16_avx2, KernelPath::kAvx2},
                                                {"avx512", kn::gemm_bf16_avx512, KernelPath::kAvx512},
                                                {"avx512bf16", kn::gemm_bf16_avx512bf16, KernelPath::kAvx512Bf16},
                                                {"amx", kn::gemm_bf16_amx, KernelPath::kAmx}}
                             : std::vector<Fn>{{"portable", kn::gemm_f32_portable, KernelPath::kPortable},
                                                {"avx2", kn::gemm_f32_avx2, KernelPath::kAvx2},
                                                {"avx512", kn::gemm_f32_avx512, KernelPath::kAvx512}};
    for (const Fn& f : fns) {
      if (f.need != GetParam()) continue;
      ++ran;
      for (int m = 1; m <= kn::kMaxRows; ++m) {
        std::vector<float> c(size_t(kn::kMaxRows * kn::kBlockCols), -12345.f);
        kn::GemmArgs g;
        g.a = bf ? static_cast<const void*>(a16.data()) : a.data();
        g.lda = K;
        g.b = bf ? static_cast<const void*>(b16.data()) : b32.data();
        g.panel_stride = ps;
        g.k = K;
        g.m = m;
        g.c = c.data();
        g.ldc = kn::kBlockCols;
        f.fn(g);
        for (int r = 0; r < m; ++r)
          for (int n = 0; n < kn::kBlockCols; ++n) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < K; ++q) {
              ref += double(a[size_t(r * K + q)]) * w[size_t(n * K + q)];
              mag += std::abs(double(a[size_t(r * K + q)]) * w[size_t(n * K + q)]);
            }
            ASSERT_NEAR(c[size_t(r * kn::kBlockCols + n)], ref, 1e-5 * mag + 1e-30)
                << f.name << " " << dtype_name(dt) << " m=" << m << " row=" << r << " col=" << n
                << " seed=" << seed;
          }
      }
    }
  }
  EXPECT_GT(ran, 0) << "no micro-kernel listed for " << cpu::kernel_path_name(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Cpu, KernelsOfPath, ::testing::ValuesIn(cpu::kAllKernelPaths),
                         path_param_name);

// The vendor read from cpuid agrees with the compiler's own check, and the vendor and family
// pick the block-scaled kernel's weight-row pairing measured for them (docs/cpu.md).
TEST(CpuEngine, VendorAndBlockScaledPairing) {
  const cpu::CpuFeatures& here = cpu::detect_cpu_features();
  EXPECT_EQ(here.intel, bool(__builtin_cpu_is("intel")));
  if (__builtin_cpu_is("amd")) EXPECT_GE(here.family, 0x10) << "AMD families use the extended field";
  cpu::CpuFeatures f;
  f.intel = true;
  f.family = 6;
  EXPECT_EQ(cpu::block_scaled_pair_from_rows(f), 1);
  f.intel = false;
  f.family = 25;  // Zen 4
  EXPECT_EQ(cpu::block_scaled_pair_from_rows(f), 1);
  f.family = 26;  // Zen 5
  EXPECT_EQ(cpu::block_scaled_pair_from_rows(f), 3);
}

// The kernel choice is a pure function of (weight dtype, CPU features, forced path): checked here
// on fixed feature sets, so the AMX and AVX-512 choices are tested on any machine.
TEST(CpuEngine, PlanOnFixedFeatureSets) {
  namespace kn = moex::cpu::kernels;
  using F = cpu::CpuFeatures;
  const F none{}, avx2{true, false, false, false}, avx512{true, true, false, false},
      bf16{true, true, true, false}, amx{true, true, true, true};
  struct Want {
    F f;
    DType dt;
    kn::GemmFn small, large;
    int small_max_rows;
    bool vector_epilogue;
    std::string_view name;
  };
  const Want wants[] = {
      {none, DType::kBF16, kn::gemm_bf16_portable, kn::gemm_bf16_portable, kn::kMaxRows, false, "portable"},
      {none, DType::kF32, kn::gemm_f32_portable, kn::gemm_f32_portable, kn::kMaxRows, false, "portable"},
      {avx2, DType::kBF16, kn::gemm_bf16_avx2, kn::gemm_bf16_avx2, kn::kMaxRows, false, "avx2"},
      {avx2, DType::kF32, kn::gemm_f32_avx2, kn::gemm_f32_avx2, kn::kMaxRows, false, "avx2"},
      {avx512, DType::kBF16, kn::gemm_bf16_avx512, kn::gemm_bf16_avx512, kn::kMaxRows, true, "avx512"},
      {avx512, DType::kF32, kn::gemm_f32_avx512, kn::gemm_f32_avx512, kn::kMaxRows, true, "avx512"},
      {bf16, DType::kBF16, kn::gemm_bf16_avx512bf16, kn::gemm_bf16_avx512bf16, kn::kMaxRows, true,
       "avx512bf16"},
      // fp32 data never runs on a bf16 unit.
      {bf16, DType::kF32, kn::gemm_f32_avx512, kn::gemm_f32_avx512, kn::kMaxRows, true, "avx512"},
      {amx, DType::kBF16, kn::gemm_bf16_avx512bf16, kn::gemm_bf16_amx, 4, true, "amx+avx512bf16"},
      {amx, DType::kF32, kn::gemm_f32_avx512, kn::gemm_f32_avx512, kn::kMaxRows, true, "avx512"},
  };
  for (const Want& w : wants) {
    const cpu::KernelSet s = cpu::plan_kernels(w.dt, w.f);
    SCOPED_TRACE(std::string(w.name) + " " + std::string(dtype_name(w.dt)));
    EXPECT_EQ(s.path, cpu::best_kernel_path(w.f));
    EXPECT_EQ(s.dtype, w.dt);
    EXPECT_EQ(s.small, w.small);
    EXPECT_EQ(s.large, w.large);
    EXPECT_EQ(s.small_max_rows, w.small_max_rows);
    EXPECT_EQ(s.gated_silu != nullptr, w.vector_epilogue);
    EXPECT_EQ(s.sum_rows != nullptr, w.vector_epilogue);
    EXPECT_EQ(s.name, w.name);
  }
  EXPECT_EQ(cpu::best_kernel_path(none), KernelPath::kPortable);
  EXPECT_EQ(cpu::best_kernel_path(amx), KernelPath::kAmx);
  // A forced path: honoured when the features have it, an Unsupported error naming it when not.
  EXPECT_EQ(cpu::plan_kernels(DType::kBF16, amx, KernelPath::kAvx2).large, kn::gemm_bf16_avx2);
  EXPECT_EQ(cpu::plan_kernels(DType::kBF16, amx, KernelPath::kPortable).name, "portable");
  try {
    (void)cpu::plan_kernels(DType::kBF16, avx512, KernelPath::kAmx);
    ADD_FAILURE() << "forcing amx on an AVX-512 CPU must throw";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("'amx'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("avx512"), std::string::npos) << e.what();
  }
  // Weights the engine does not pack.
  EXPECT_THROW((void)cpu::plan_kernels(DType::kF16, amx), Unsupported);
  // The same on this machine's features as grouped_mm uses by default.
  EXPECT_EQ(cpu::selected_kernel_path(), cpu::best_kernel_path(cpu::detect_cpu_features()));
}

TEST(CpuEngine, PathNamesAndErrors) {
  EXPECT_TRUE(cpu::kernel_path_supported(KernelPath::kPortable));
  for (KernelPath p : cpu::kAllKernelPaths)
    EXPECT_EQ(parse_cpu_kernel_path(cpu_kernel_path_name(p)), p);
  EXPECT_EQ(cpu::parse_kernel_path("avx512bf16"), KernelPath::kAvx512Bf16);
  EXPECT_THROW(cpu::parse_kernel_path("sse9"), InvalidInput);
  // Unpackable dtypes are refused with a reason.
  ExpertsSpec s;
  EXPECT_FALSE(cpu::cpu_engine_unsupported_reason(s, DType::kF16, DType::kF16).empty());
  EXPECT_TRUE(cpu::cpu_engine_unsupported_reason(s, DType::kBF16, DType::kBF16).empty());
}

// grouped_mm on a forced path (what `moex bench experts --cpu-kernel` registers) computes exactly
// what the engine computes on that path, and says why when this CPU lacks the path.
TEST(CpuEngine, GroupedMmOnForcedPath) {
  const uint64_t seed = 8300;
  ExpertsSpec s;
  s.num_experts = 5;
  s.hidden = 40;
  s.intermediate = 24;
  for (KernelPath path : cpu::kAllKernelPaths) {
    auto backend = make_cpu_grouped_mm_backend(path);
    const std::string reason = backend->unsupported_reason(s, DType::kBF16, Device::cpu());
    if (!cpu::kernel_path_supported(path)) {
      EXPECT_NE(reason.find(std::string(cpu::kernel_path_name(path))), std::string::npos) << reason;
      continue;
    }
    EXPECT_EQ(reason, "");
    EXPECT_FALSE(backend->unsupported_reason(s, DType::kF16, Device::cpu()).empty());
    for (DType dt : {DType::kBF16, DType::kF32}) {
      ExpertsWeights w = random_experts_weights(s, dt, seed);
      Routing r = random_routing(s, 19, 2, dt, seed, RoutingCase::kRandom);
      const std::string name = "grouped_mm_on_" + std::string(cpu::kernel_path_name(path));
      register_experts_backend(name, backend);
      Tensor got = experts_forward(name, s, w, r.hidden, r.top_k_index, r.top_k_weights);
      Tensor want = run_engine(*cpu::prepare_cpu_experts(s, w, path), s, w, r);
      ASSERT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0)
          << cpu::kernel_path_name(path) << " " << dtype_name(dt) << " seed=" << seed;
    }
  }
}

// The split of work over threads must not change a single bit (slot-ordered combine).
// The second shape is large enough for the streamed per-slot rows (T * k * H * 4 >= 16 MiB).
TEST(CpuEngine, ResultIndependentOfThreadCount) {
  const uint64_t seed = 8200;
  for (int64_t T : {100, 1100})
  for (DType dt : {DType::kBF16, DType::kF32}) {
    ExpertsSpec s;
    s.num_experts = 8;
    s.hidden = T > 100 ? 1008 : 64;
    s.intermediate = 48;
    ExpertsWeights w = random_experts_weights(s, dt, seed);
    Routing r = random_routing(s, T, 4, dt, seed, RoutingCase::kDuplicates);
    auto p = cpu::prepare_cpu_experts(s, w, cpu::best_kernel_path());
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    Tensor one = run_engine(*p, s, w, r);
    omp_set_num_threads(std::max(2, saved));
    Tensor many = run_engine(*p, s, w, r);
    omp_set_num_threads(saved);
    ASSERT_EQ(std::memcmp(one.raw(), many.raw(), one.nbytes()), 0)
        << dtype_name(dt) << " seed=" << seed;
  }
}

}  // namespace
