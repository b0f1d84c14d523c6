// The "auto" experts backend: registered like any backend; on the CPU it is grouped_mm (same
// bits); on a GPU it runs, per call, the backend its table chose for the call's size (same bits
// as that backend), measures the table once per shape and keeps it in the cache file, reads a
// table from that file instead of measuring, and serves a model's generate (graphs included).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/experts_auto.hpp"
#include "moex/model.hpp"
#include "support/test_support.hpp"

using namespace moex;

namespace {

ExpertsSpec spec_of(int64_t E, int64_t H, int64_t I) {
  ExpertsSpec s;
  s.num_experts = E;
  s.hidden = H;
  s.intermediate = I;
  return s;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  const auto x = a.to(Device::cpu()).to_float_vector(), y = b.to(Device::cpu()).to_float_vector();
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) {
      ADD_FAILURE() << what << ": element " << i << " " << x[i] << " vs " << y[i];
      return;
    }
}

// Sets an environment variable for a scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const std::string& v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    ::setenv(n, v.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

TEST(ExpertsAuto, RegisteredForBothDevices) {
  const auto names = experts_backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "auto"), names.end());
  const BackendCaps c = get_experts_backend("auto")->caps();
  EXPECT_NE(std::find(c.devices.begin(), c.devices.end(), DeviceKind::kCPU), c.devices.end());
  EXPECT_TRUE(c.graph_capturable);
  EXPECT_TRUE(c.quantized_weights);
}

TEST(ExpertsAuto, TableChoosesTheSmallestBucketHoldingTheCall) {
  ExpertsAutoTable t;
  t.rows = {{1, 1, 0.5, "batched_mm"}, {4, 1, 0.9, "batched_mm"}, {16, 1, 3, "grouped_mm"}};
  EXPECT_EQ(t.choose(0), "batched_mm");
  EXPECT_EQ(t.choose(1), "batched_mm");
  EXPECT_EQ(t.choose(3), "batched_mm");
  EXPECT_EQ(t.choose(5), "grouped_mm");
  EXPECT_EQ(t.choose(100000), "grouped_mm");  // past the last bucket: its choice
}

TEST(ExpertsAuto, CacheFileFollowsTheEnvironment) {
  ScopedEnv a("MOEX_CACHE_DIR", "/tmp/a"), x("XDG_CACHE_HOME", "/tmp/x"), h("HOME", "/tmp/h");
  EXPECT_EQ(experts_auto_cache_file(), "/tmp/a/experts_auto.json");
  ::unsetenv("MOEX_CACHE_DIR");
  EXPECT_EQ(experts_auto_cache_file(), "/tmp/x/moex/experts_auto.json");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(experts_auto_cache_file(), "/tmp/h/.cache/moex/experts_auto.json");
  ::unsetenv("HOME");
  EXPECT_EQ(experts_auto_cache_file(), "");
}

// On the CPU auto is grouped_mm at every size (a rule, nothing measured): the same bits.
TEST(ExpertsAuto, CpuRunsGroupedMm) {
  const ExpertsSpec s = spec_of(7, 45, 23);  // ugly sizes
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t T : {1, 3, 67}) {
      const auto w = test::random_experts_weights(s, dt, 11);
      const auto r = test::random_routing(s, T, 3, dt, 12, test::RoutingCase::kRandom);
      const Tensor a = experts_forward("auto", s, w, r.hidden, r.top_k_index, r.top_k_weights);
      const Tensor g = experts_forward("grouped_mm", s, w, r.hidden, r.top_k_index, r.top_k_weights);
      expect_same_bits(a, g, std::string(dtype_name(dt)) + " T " + std::to_string(T));
    }
  bool found = false;
  for (const auto& t : experts_auto_tables())
    if (t.key.rfind("cpu | ", 0) == 0) {
      found = true;
      EXPECT_EQ(t.source, "rule");
      EXPECT_EQ(t.choose(1), "grouped_mm");
    }
  EXPECT_TRUE(found);
}

TEST(ExpertsAuto, ModelGeneratesAsGroupedMmOnCpu) {
  LoadOptions o;
  o.experts_implementation = {{"", "auto"}};
  auto lm = from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), o);
  LoadOptions g;
  g.experts_implementation = {{"", "grouped_mm"}};
  auto ref = from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), g);
  const Tensor ids = Tensor::from_ints({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_same_bits(lm->logits(ids), ref->logits(ids), "logits");
  GenerationOptions go;
  go.max_new_tokens = 5;
  go.eos_token_ids = std::vector<int64_t>{};
  EXPECT_EQ(lm->generate(ids, go).to_int_vector(), ref->generate(ids, go).to_int_vector());
}

#define MOEX_REQUIRE_CUDA() \
  if (moex::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device"

// A table read from the cache file, choosing batched_mm up to 2 tokens and grouped_mm above:
// each call then gives the bits of the backend its size chose, and nothing is measured.
TEST(ExpertsAuto, CudaReadsTheCacheFileAndRunsItsChoice) {
  MOEX_REQUIRE_CUDA();
  const std::string dir = ::testing::TempDir() + "moex_auto_cache_read";
  std::filesystem::create_directories(dir);
  ScopedEnv env("MOEX_CACHE_DIR", dir);
  const ExpertsSpec s = spec_of(9, 72, 40);
  const Device dev = Device::cuda(0);
  const auto w = test::random_experts_weights(s, DType::kBF16, 21);
  const ExpertsWeights dw = test::experts_weights_to(w, dev);
  // The key auto forms: "DEVICE | SPEC | top-K | DTYPE".
  std::string name;
  {
    // The device part of the key: ask auto once for an unrelated shape (measured) and read it.
    const ExpertsSpec probe = spec_of(3, 16, 8);
    const auto pw = test::experts_weights_to(test::random_experts_weights(probe, DType::kBF16, 1), dev);
    const auto pr = test::random_routing(probe, 1, 1, DType::kBF16, 2, test::RoutingCase::kRandom);
    (void)experts_forward("auto", probe, pw, pr.hidden.to(dev), pr.top_k_index.to(dev), pr.top_k_weights.to(dev));
    for (const auto& t : experts_auto_tables())
      if (t.key.find(probe.str()) != std::string::npos) name = t.key.substr(0, t.key.find(" | "));
  }
  ASSERT_FALSE(name.empty());
  const std::string key = name + " | " + s.str() + " | top-2 | bfloat16";
  nlohmann::json rows = nlohmann::json::array();
  rows.push_back({{"tokens", 2}, {"grouped_mm_ms", 1.0}, {"batched_mm_ms", 0.5}, {"choice", "batched_mm"}});
  rows.push_back({{"tokens", 8192}, {"grouped_mm_ms", 1.0}, {"batched_mm_ms", 2.0}, {"choice", "grouped_mm"}});
  nlohmann::json file = nlohmann::json::parse(std::ifstream(experts_auto_cache_file()));
  file[key] = rows;
  std::ofstream(experts_auto_cache_file()) << file.dump();
  for (int64_t T : {1, 2, 3, 40}) {
    const auto r = test::random_routing(s, T, 2, DType::kBF16, 30 + T, test::RoutingCase::kRandom);
    const Tensor h = r.hidden.to(dev), idx = r.top_k_index.to(dev), tw = r.top_k_weights.to(dev);
    const Tensor a = experts_forward("auto", s, dw, h, idx, tw);
    const Tensor want = experts_forward(T <= 2 ? "batched_mm" : "grouped_mm", s, dw, h, idx, tw);
    expect_same_bits(a, want, "T " + std::to_string(T));
  }
  bool found = false;
  for (const auto& t : experts_auto_tables())
    if (t.key == key) {
      found = true;
      EXPECT_EQ(t.source, "cache " + experts_auto_cache_file());
    }
  EXPECT_TRUE(found);
}

// A table measured on the device: every bucket timed for grouped_mm, the choice the faster of the
// two where both were timed, written to the cache file under its key.
TEST(ExpertsAuto, CudaMeasuresOnceAndWritesTheCacheFile) {
  MOEX_REQUIRE_CUDA();
  const std::string dir = ::testing::TempDir() + "moex_auto_cache_write";
  std::filesystem::remove_all(dir);
  ScopedEnv env("MOEX_CACHE_DIR", dir);
  const ExpertsSpec s = spec_of(16, 256, 128);
  const Device dev = Device::cuda(0);
  const auto dw = test::experts_weights_to(test::random_experts_weights(s, DType::kBF16, 41), dev);
  const auto r = test::random_routing(s, 5, 4, DType::kBF16, 42, test::RoutingCase::kRandom);
  (void)experts_forward("auto", s, dw, r.hidden.to(dev), r.top_k_index.to(dev), r.top_k_weights.to(dev));
  const ExpertsAutoTable* t = nullptr;
  const auto all = experts_auto_tables();
  for (const auto& x : all)
    if (x.key.find(s.str()) != std::string::npos && x.key.find("top-4") != std::string::npos) t = &x;
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source, "measured");
  ASSERT_FALSE(t->rows.empty());
  EXPECT_EQ(t->rows.front().tokens, 1);
  for (const auto& row : t->rows) {
    EXPECT_GT(row.grouped_mm_ms, 0) << row.tokens;
    if (row.batched_mm_ms > 0)
      EXPECT_EQ(row.choice, row.batched_mm_ms < row.grouped_mm_ms ? "batched_mm" : "grouped_mm") << row.tokens;
    else
      EXPECT_EQ(row.choice, "grouped_mm") << row.tokens;
  }
  const nlohmann::json file = nlohmann::json::parse(std::ifstream(experts_auto_cache_file()));
  ASSERT_TRUE(file.contains(t->key));
  EXPECT_EQ(file[t->key].size(), t->rows.size());
}

// A model on the GPU with auto: generate (graphs on) gives the tokens of the same model with
// each call's chosen backend, i.e. of grouped_mm / batched_mm, which agree on these fixtures.
TEST(ExpertsAuto, CudaModelGeneratesWithGraphs) {
  MOEX_REQUIRE_CUDA();
  const std::string dir = ::testing::TempDir() + "moex_auto_cache_model";
  ScopedEnv env("MOEX_CACHE_DIR", dir);
  LoadOptions o;
  o.device = Device::cuda(0);
  o.experts_implementation = {{"", "auto"}};
  auto lm = from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), o);
  LoadOptions g = o;
  g.experts_implementation = {{"", "grouped_mm"}};
  auto ref = from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), g);
  const Tensor ids = Tensor::from_ints({1, 2, 3, 4, 5, 6}, {2, 3});
  GenerationOptions go;
  go.max_new_tokens = 6;
  go.eos_token_ids = std::vector<int64_t>{};
  EXPECT_EQ(lm->generate(ids, go).to_int_vector(), ref->generate(ids, go).to_int_vector());
  EXPECT_TRUE(lm->last_generation_stats().graph) << lm->last_generation_stats().graph_note;
  EXPECT_EQ(lm->get_experts_implementation().at(""), "auto");
}

}  // namespace
