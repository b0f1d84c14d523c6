// `moex bench experts` run as a user would (MOEX_CLI_PATH): it checks every backend before timing
// it and refuses a wrong one (the test plugin examples/wrong_backend_plugin.cpp) with a non-zero
// exit naming the failed check; rows it did not check say so ("unchecked", JSON null) instead of
// showing an error of 0; --cpu-kernel runs grouped_mm on the named CPU kernel path. `moex bench
// generate --device cpu` on a fixture checkpoint: every row's JSON fields present and consistent
// (speeds, floors, the resident sets, load and preparation time), bad input refused with exit 2.
// Plus the public API it is built on (moex/bench.hpp): what is measured, and the errors.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
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
    // A T's rows are printed once every backend of that T has passed its check, so the failed
    // check at the first T leaves stdout empty: no row, not even grouped_mm's (checked before it).
    EXPECT_EQ(r.out, "");
  }
  // The control: without the wrong backend, the same run prints a row per T.
  Result ok = bench("--tokens 1,7 --backends grouped_mm --json", "--plugin " + plugin);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  ASSERT_EQ(lines(ok.out).size(), 2u) << ok.out;
  for (const std::string& l : lines(ok.out)) EXPECT_EQ(nlohmann::json::parse(l)["backend"], "grouped_mm") << l;
}

// --check-tokens below 1 would check an empty sample and print an error of 0: refused.
TEST_F(CliBench, CheckTokensBelowOneIsRefused) {
  for (const char* n : {"0", "-2"}) {
    Result r = bench(std::string("--tokens 3 --check-tokens ") + n);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("--check-tokens must be >= 1"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

// Numbers that would print nonsense or be silently replaced: non-finite values, ceilings and
// budgets <= 0, fewer than one timed run. Refused before anything is measured.
TEST_F(CliBench, NonsenseNumbersAreRefused) {
  const std::string shape = "bench experts --device cpu --experts 4 --top-k 2 --hidden 64 --intermediate 64 --tokens 1 ";
  const std::pair<std::string, std::string> cases[] = {
      {"--bandwidth-gbs nan", "invalid number 'nan' for --bandwidth-gbs (finite values only)"},
      {"--peak-tflops inf", "invalid number 'inf' for --peak-tflops (finite values only)"},
      {"--bandwidth-gbs -5", "--bandwidth-gbs must be > 0, got -5"},
      {"--peak-tflops 0", "--peak-tflops must be > 0, got 0"},
      {"--budget-s -1", "--budget-s must be > 0, got -1"},
      {"--min-iters 0", "--min-iters must be >= 1"},
  };
  for (const auto& [args, needle] : cases) {
    Result r = test::run_cli(shape + args, tmp_);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

// float16 experts run unpacked on the CPU: the row names the portable path and its peak, not the
// packed kernel the CPU would pick for bfloat16.
TEST_F(CliBench, CpuFloat16RowsNameThePortablePath) {
  Result r = bench("--tokens 2 --dtype float16 --backends grouped_mm --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(lines(r.out).at(0));
  EXPECT_EQ(j["kernel"], "portable (float16 experts are not packed)") << j.dump();
}

// --graph on times replays only; a backend that cannot be captured (eager) would get no row, so
// it is refused by name. Needs a GPU (without one the missing device is reported first).
TEST_F(CliBench, GraphOnRefusesABackendThatCannotBeCaptured) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  Result r = test::run_cli("bench experts --device cuda --tokens 1 --backends grouped_mm,eager --graph on", tmp_);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("backend 'eager' cannot be captured in a CUDA graph"), std::string::npos) << r.err;
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

// `bench generate` on the host, on the tiny qwen2_moe fixture (bf16, the dtype the CPU engine is
// benchmarked in). Given ceilings keep the 1 GiB bandwidth pass out of all but one test.
class CliBenchGenerate : public CliBench {
 protected:
  Result bench_generate(const std::string& args) {
    return test::run_cli("bench generate --model " + test::data_path("hf-tiny/qwen2_moe/checkpoint_bf16") +
                             " --device cpu " + args,
                         tmp_);
  }
  static constexpr const char* kGiven = " --bandwidth-gbs 10 --peak-tflops 1";
};

TEST_F(CliBenchGenerate, CpuJsonRowsHaveEveryFieldAndTheyAgree) {
  Result r = bench_generate(std::string("--cases 1x7,2x5 --new-tokens 4 --repeats 2 --json") + kGiven);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = lines(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 7}, {2, 5}};
  for (size_t i = 0; i < rows.size(); ++i) {
    auto j = nlohmann::json::parse(rows[i]);
    SCOPED_TRACE(rows[i]);
    EXPECT_EQ(j["batch"], shapes[i].first);
    EXPECT_EQ(j["prompt_tokens"], shapes[i].second);
    EXPECT_EQ(j["new_tokens"], 4);
    EXPECT_EQ(j["repeats"], 2);
    EXPECT_EQ(j["device"], "cpu");
    EXPECT_EQ(j["dtype"], "bfloat16");
    EXPECT_EQ(j["graph"], false);
    for (const char* key : {"prefill_tokens_per_second", "decode_tokens_per_second", "ms_per_token",
                            "time_to_first_token_ms", "decode_step_bytes", "decode_floor_ms",
                            "decode_fraction_of_floor", "prefill_flops", "prefill_floor_ms",
                            "prefill_fraction_of_floor", "load_seconds"}) {
      ASSERT_TRUE(j[key].is_number()) << key;
      EXPECT_GT(j[key].get<double>(), 0) << key;
      EXPECT_TRUE(std::isfinite(j[key].get<double>())) << key;
    }
    ASSERT_TRUE(j["prepare_seconds"].is_number());
    EXPECT_GE(j["prepare_seconds"].get<double>(), 0);
    // The derived fields follow from the measured ones.
    const double ms = j["ms_per_token"].get<double>();
    EXPECT_NEAR(j["decode_tokens_per_second"].get<double>(), 1e3 * double(shapes[i].first) / ms,
                1e-6 * j["decode_tokens_per_second"].get<double>());
    EXPECT_NEAR(j["decode_fraction_of_floor"].get<double>(), j["decode_floor_ms"].get<double>() / ms, 1e-9);
    EXPECT_NEAR(j["prefill_tokens_per_second"].get<double>(),
                double(shapes[i].first * shapes[i].second) * 1e3 / j["time_to_first_token_ms"].get<double>(),
                1e-6 * j["prefill_tokens_per_second"].get<double>());
    // The given ceilings are the ones the floors divide by.
    EXPECT_EQ(j["bandwidth_gbps"], 10.0);
    EXPECT_EQ(j["peak_tflops"], 1.0);
    EXPECT_EQ(j["ceilings_given"], true);
    EXPECT_NEAR(j["decode_floor_ms"].get<double>(), j["decode_step_bytes"].get<double>() / 10e9 * 1e3, 1e-12);
    EXPECT_NEAR(j["prefill_floor_ms"].get<double>(), j["prefill_flops"].get<double>() / 1e12 * 1e3, 1e-12);
    // Host memory: the resident set after the load holds at least the weights (the CPU engine
    // may keep the mapped checkpoint resident too) and the peak is at least that.
    ASSERT_TRUE(j["rss_after_load_bytes"].is_number_integer());
    ASSERT_TRUE(j["peak_rss_bytes"].is_number_integer());
    ASSERT_TRUE(j["weight_bytes"].is_number_integer());
    EXPECT_GT(j["weight_bytes"].get<int64_t>(), 0);
    EXPECT_GE(j["rss_after_load_bytes"].get<int64_t>(), j["weight_bytes"].get<int64_t>());
    EXPECT_GE(j["peak_rss_bytes"].get<int64_t>(), j["rss_after_load_bytes"].get<int64_t>());
    EXPECT_EQ(j["peak_memory_bytes"], j["peak_rss_bytes"]);
    // Sanity bound: a 1 MB model does not need 8 GB.
    EXPECT_LT(j["peak_rss_bytes"].get<int64_t>(), int64_t(8) << 30);
  }
  // Progress on stderr, one line per timed run.
  EXPECT_NE(r.err.find("run 1 of 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run 2 of 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;
}

TEST_F(CliBenchGenerate, CpuMeasuresItsOwnCeilings) {
  Result r = bench_generate("--cases 1x3 --new-tokens 2 --repeats 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(lines(r.out).at(0));
  EXPECT_EQ(j["ceilings_given"], false);
  EXPECT_GT(j["bandwidth_gbps"].get<double>(), 0);
  EXPECT_GT(j["peak_tflops"].get<double>(), 0);
  EXPECT_EQ(j["kernel_unit"], cpu_kernel_path_name(default_cpu_kernel_path()));
}

TEST_F(CliBenchGenerate, CpuTableHasAHeaderAndOneRowPerCase) {
  Result r = bench_generate(std::string("--batch 1 --prompt-tokens 3,4 --new-tokens 3 --repeats 1") + kGiven);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = lines(r.out);
  ASSERT_EQ(rows.size(), 6u) << r.out;  // two comment lines, header, separator, two rows
  EXPECT_NE(rows[0].find("resident after load"), std::string::npos) << rows[0];
  EXPECT_NE(rows[0].find("(given)"), std::string::npos) << rows[0];
  // The backends of both stages (the CPU never switches at decode).
  EXPECT_EQ(rows[1], "# experts: prefill {\"\":\"grouped_mm\"}, decode {\"\":\"grouped_mm\"}") << rows[1];
  EXPECT_EQ(rows[4].rfind("| 1 | 3 |", 0), 0u) << rows[4];
  EXPECT_EQ(rows[5].rfind("| 1 | 4 |", 0), 0u) << rows[5];
}

// The prefill's flops count weights, not bytes: a checkpoint kept quantized (1 byte per FP8
// weight, half a byte per FP4 one) has the flops of its dequantized load (it had 1/2 and 1/4 of
// them, at bfloat16's and float32's element size).
TEST_F(CliBenchGenerate, QuantizedCheckpointsCountTheirWeightsFlops) {
  for (const char* fixture : {"deepseek_v3_fp8_float", "deepseek_v3_fp4_experts_ue8m0"}) {
    const std::string run = "bench generate --model " + test::data_path(std::string("hf-tiny/") + fixture + "/checkpoint") +
                            " --device cpu --batch 1 --prompt-tokens 4 --new-tokens 2 --repeats 1 --json" + kGiven;
    std::map<std::string, double> flops;
    for (const char* how : {" --dtype bfloat16", " --dtype float32", " --dtype bfloat16 --dequantize"}) {
      Result r = test::run_cli(run + how, tmp_);
      ASSERT_EQ(r.exit_code, 0) << how << "\n" << r.err;
      flops[how] = nlohmann::json::parse(lines(r.out).at(0))["prefill_flops"].get<double>();
    }
    const double want = flops[" --dtype bfloat16 --dequantize"];
    ASSERT_GT(want, 0);
    // Exactly: the weight groups count elements, not bytes, and MLA's absorbed kv_b (a bfloat16
    // copy beside its FP8 codes, the decode form) once.
    EXPECT_EQ(flops[" --dtype bfloat16"], want) << fixture;
    EXPECT_EQ(flops[" --dtype float32"], want) << fixture;
  }
}

TEST_F(CliBenchGenerate, BadInputExitsTwoWithAClearError) {
  const std::pair<std::string, std::string> cases[] = {
      {"--new-tokens 1", "--new-tokens must be >= 2"},
      {"--repeats 0", "--repeats must be >= 1"},
      {"--cases 3", "--cases entries are BATCHxPROMPT"},
      {"--cases 0x4", "batch and prompt >= 1"},
      {"--prompt-tokens 0", "--prompt-tokens entries must be >= 1"},
      {"--cases 1x4 --batch 2", "--cases gives the rows itself"},
  };
  for (const auto& [args, needle] : cases) {
    Result r = bench_generate(args + kGiven);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  }
  // Ceilings that are given are checked before any row runs.
  for (const auto& [args, needle] : {std::pair<std::string, std::string>{" --bandwidth-gbs nan --peak-tflops 1",
                                                                          "(finite values only)"},
                                     {" --bandwidth-gbs 10 --peak-tflops -1", "--peak-tflops must be > 0"}}) {
    Result r = bench_generate(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("warm-up"), std::string::npos) << args << ": a row ran first\n" << r.err;
  }
  Result r = test::run_cli("bench generate --model " + tmp_ + "/missing --device cpu", tmp_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("missing"), std::string::npos) << r.err;
}

// `bench experts --device cuda` without a GPU (or past the last one) names the device and exits 2
// before it touches CUDA, as `generate` does.
TEST(CliBenchExperts, MissingGpuExitsTwoWithAClearError) {
  const std::string tmp = ::testing::TempDir();
  const std::string dev = "cuda:" + std::to_string(test::cuda_devices());
  test::CliResult r = test::run_cli("bench experts --device " + dev + " --tokens 1", tmp);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no CUDA device " + dev), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("use --device cpu"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// moex bench comm: bad flags are named; without two GPUs (CI) the missing device (or CUDA) is, and
// measure_peer_copy_gbps refuses non-CUDA devices and a device paired with itself.
TEST(CliBenchComm, BadInputAndMissingGpusExitTwoWithAClearError) {
  const std::string tmp = ::testing::TempDir();
  const std::pair<std::string, std::string> cases[] = {
      {"", "--ep-size must be between 2 and 64"},
      {"--ep-size 1", "--ep-size must be between 2 and 64"},
      {"--ep-size 2 --rows 3", "--rows entries must be positive multiples of --ep-size"},
      {"--ep-size 2 --iters 0", "--iters must be >= 1"},
  };
  for (const auto& [args, needle] : cases) {
    test::CliResult r = test::run_cli("bench comm " + args, tmp);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  }
  if (test::cuda_devices() < 2) {
    test::CliResult r = test::run_cli("bench comm --ep-size 2 --rows 2", tmp);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    // A CUDA build names the missing device, a build without CUDA says so.
    EXPECT_TRUE(r.err.find("no CUDA device") != std::string::npos ||
                r.err.find("this build of moex has no CUDA") != std::string::npos)
        << r.err;
  }
  EXPECT_THROW(measure_peer_copy_gbps(Device::cpu(), Device::cuda(0)), Unsupported);
  EXPECT_THROW(measure_peer_copy_gbps(Device::cuda(0), Device::cuda(0)), InvalidInput);
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
