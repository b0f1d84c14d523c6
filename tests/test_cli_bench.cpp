// `moex bench experts` run as a user would (MOEX_CLI_PATH): it checks every backend before timing
// it and refuses a wrong one (the test plugin examples/wrong_backend_plugin.cpp) with a non-zero
// exit naming the failed check; rows it did not check say so ("unchecked", JSON null) instead of
// showing an error of 0; --cpu-kernel runs grouped_mm on the named CPU kernel path. Plus the
// public API it is built on (moex/bench.hpp): what is measured, and the errors.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moex/bench.hpp"
#include "moex/cpu_kernels.hpp"
#include "moex/error.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

// examples/wrong_backend_plugin.cpp, built by CMakeLists.txt as moex_wrong_backend_plugin.
std::string wrong_plugin_path() { return MOEX_WRONG_PLUGIN_PATH; }

using Result = test::CliResult;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::stringstream s(text);
  for (std::string l; std::getline(s, l);)
    if (!l.empty()) v.push_back(l);
  return v;
}

class CliBench : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_cli_bench_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }

  // Runs `moex PRE bench experts <small shape, given ceilings> ARGS`; given ceilings keep the
  // 1 GiB bandwidth pass and the peak loops out of the test.
  Result bench(const std::string& args, const std::string& pre = "") {
    return test::run_cli(pre + " bench experts --device cpu --experts 6 --top-k 2 --hidden 64"
                               " --intermediate 40 --min-iters 1 --budget-s 0.01"
                               " --bandwidth-gbs 10 --peak-tflops 1 " + args,
                         tmp_);
  }

  std::string tmp_;
};

TEST_F(CliBench, WrongBackendFailsTheCheckAndIsNotTimed) {
  const std::string plugin = wrong_plugin_path();
  ASSERT_TRUE(std::filesystem::exists(plugin))
      << plugin << " is missing: build the moex_wrong_backend_plugin target";
  for (const char* tokens : {"1", "7"}) {
    Result r = bench(std::string("--tokens ") + tokens + " --backends grouped_mm,wrong --json",
                     "--plugin " + plugin);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("check failed"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("backend 'wrong'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("differs from eager"), std::string::npos) << r.err;
    // grouped_mm (before it) was checked and timed; no row of the wrong backend was printed.
    for (const std::string& l : lines(r.out)) {
      auto j = nlohmann::json::parse(l);
      EXPECT_EQ(j["backend"], "grouped_mm") << l;
    }
  }
}

// The control: a right backend from a plugin passes the same check.
TEST_F(CliBench, ExactPluginBackendPasses) {
  Result r = bench("--tokens 5 --backends reference --json",
                   std::string("--plugin ") + MOEX_PLUGIN_PATH);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(lines(r.out).at(0));
  EXPECT_EQ(j["backend"], "reference");
  ASSERT_TRUE(j["check_rel_err"].is_number()) << j.dump();
}

TEST_F(CliBench, UncheckedRowsSayUnchecked) {
  // JSON: T = 0 is never checked (nothing to compare), --no-check checks nothing; T = 3 is.
  Result r = bench("--tokens 0,3 --backends grouped_mm,eager --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int checked = 0, unchecked = 0;
  for (const std::string& l : lines(r.out)) {
    auto j = nlohmann::json::parse(l);
    ASSERT_TRUE(j.contains("check_rel_err")) << l;
    if (j["tokens"] == 0) {
      EXPECT_TRUE(j["check_rel_err"].is_null()) << l;
      ++unchecked;
    } else {
      EXPECT_TRUE(j["check_rel_err"].is_number()) << l;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
  EXPECT_EQ(unchecked, 2);

  r = bench("--tokens 3 --backends grouped_mm --json --no-check");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& l : lines(r.out))
    EXPECT_TRUE(nlohmann::json::parse(l)["check_rel_err"].is_null()) << l;

  // Table: the check column reads "unchecked", never a number that looks exact.
  r = bench("--tokens 3 --backends grouped_mm --no-check");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = lines(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;  // comment line, header, one row
  EXPECT_NE(rows[2].find("unchecked"), std::string::npos) << rows[2];
}

TEST_F(CliBench, CpuKernelFlagRunsThatPath) {
  Result r = bench("--tokens 4 --backends grouped_mm --json --cpu-kernel portable");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(lines(r.out).at(0));
  EXPECT_EQ(j["kernel"], "portable");
  EXPECT_TRUE(j["check_rel_err"].is_number());

  r = bench("--tokens 4 --backends grouped_mm --cpu-kernel sse9");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown CPU kernel path 'sse9'"), std::string::npos) << r.err;

  for (CpuKernelPath p : kAllCpuKernelPaths) {
    if (cpu_kernel_path_supported(p)) continue;
    const std::string name(cpu_kernel_path_name(p));
    r = bench("--tokens 4 --backends grouped_mm --cpu-kernel " + name);
    EXPECT_EQ(r.exit_code, 2) << name;
    EXPECT_NE(r.err.find("cannot run"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
  }
}

TEST(BenchApi, CeilingsMeasureWhatIsAskedAndNameTheUnit) {
  CeilingsOptions none;
  none.bandwidth = none.peak = false;
  Ceilings c = measure_ceilings(Device::cpu(), DType::kBF16, none);
  EXPECT_EQ(c.unit, cpu_kernel_path_name(default_cpu_kernel_path()));
  EXPECT_EQ(c.read_gbps, 0);
  EXPECT_EQ(c.copy_gbps, 0);
  EXPECT_EQ(c.peak_tflops, 0);

  CeilingsOptions peak = none;
  peak.peak = true;
  peak.cpu_kernel = CpuKernelPath::kPortable;
  c = measure_ceilings(Device::cpu(), DType::kF32, peak);
  EXPECT_EQ(c.unit, "portable");
  EXPECT_GT(c.peak_tflops, 0);
  EXPECT_EQ(c.read_gbps, 0);

  for (CpuKernelPath p : kAllCpuKernelPaths) {
    if (cpu_kernel_path_supported(p)) continue;
    CeilingsOptions forced = none;
    forced.cpu_kernel = p;
    EXPECT_THROW(measure_ceilings(Device::cpu(), DType::kBF16, forced), Unsupported)
        << cpu_kernel_path_name(p);
  }
  EXPECT_THROW(time_cuda_ms(Device::cpu(), [] {}, false, 1, 1), Unsupported);
  EXPECT_THROW(graph_replay_output(Device::cpu(), [] { return Tensor(); }), Unsupported);
#ifndef MOEX_WITH_CUDA
  EXPECT_THROW(measure_ceilings(Device::cuda(0), DType::kBF16, none), Unsupported);
#endif
}

}  // namespace
}  // namespace moex
