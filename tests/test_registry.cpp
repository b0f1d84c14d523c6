// The ExpertsInterface: built-in names, errors for unknown names and unsupported calls, and a
// backend registered from user code, reached through the model-independent call, through an
// Experts module, and through the CLI (as a plugin) by name.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdio>

#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "support/test_support.hpp"

using namespace moex;

namespace {

ExpertsSpec small_spec() {
  ExpertsSpec s;
  s.num_experts = 6;
  s.hidden = 19;
  s.intermediate = 13;
  return s;
}

TEST(Registry, BuiltinsAreRegistered) {
  auto names = experts_backend_names();
  for (const char* n : {"eager", "batched_mm", "grouped_mm"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST(Registry, UnknownNameListsRegisteredOnes) {
  try {
    get_experts_backend("grouped_mmm");
    FAIL() << "no error";
  } catch (const UnknownName& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("grouped_mmm"), std::string::npos) << m;
    EXPECT_NE(m.find("eager, grouped_mm"), std::string::npos) << m;
  }
}

TEST(Registry, UnsupportedDeviceIsAClearError) {
  ExpertsSpec s = small_spec();
  auto w = test::random_experts_weights(s, DType::kF32, 1);
  auto r = test::random_routing(s, 3, 2, DType::kF32, 1, test::RoutingCase::kRandom);
  // A backend that only runs on CUDA, called with CPU tensors.
  struct CudaOnly final : ExpertsBackend {
    BackendCaps caps() const override {
      BackendCaps c;
      c.devices = {DeviceKind::kCUDA};
      c.dtypes = {DType::kBF16};
      return c;
    }
    void forward(const ExpertsProblem&, Tensor&, const ExecContext&) const override { FAIL() << "must not run"; }
  };
  register_experts_backend("test_cuda_only", std::make_shared<CudaOnly>());
  try {
    experts_forward("test_cuda_only", s, w, r.hidden, r.top_k_index, r.top_k_weights);
    FAIL() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("runs on cuda:0, not on cpu"), std::string::npos) << e.what();
  }
}

TEST(Registry, BadInputsAreClearErrors) {
  ExpertsSpec s = small_spec();
  auto w = test::random_experts_weights(s, DType::kF32, 2);
  auto r = test::random_routing(s, 3, 2, DType::kF32, 2, test::RoutingCase::kRandom);
  Tensor neg = Tensor::from_ints({0, 1, 2, -1, 4, 5}, {3, 2});
  EXPECT_THROW(experts_forward("eager", s, w, r.hidden, neg, r.top_k_weights), InvalidInput);
  Tensor bad_w = Tensor::from_floats(std::vector<float>(9, 1.f), {3, 3});
  EXPECT_THROW(experts_forward("eager", s, w, r.hidden, r.top_k_index, bad_w), InvalidInput);
  EXPECT_THROW(experts_forward("eager", s, w, r.hidden.to(DType::kBF16), r.top_k_index,
                               r.top_k_weights), InvalidInput);
  ExpertsWeights wrong = w;
  wrong.down = w.down.slice(1, 0, 18).contiguous();
  try {
    experts_forward("eager", s, wrong, r.hidden, r.top_k_index, r.top_k_weights);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("'down_proj' has shape [6, 18, 13], expected [6, 19, 13]"),
              std::string::npos) << e.what();
  }
}

// A user backend: counts its calls and delegates the maths to grouped_mm.
class CountingBackend final : public ExpertsBackend {
 public:
  BackendCaps caps() const override { return get_experts_backend("grouped_mm")->caps(); }
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext&) const override {
    ++calls;
    ExpertsProblem inner = p;
    inner.prepared = nullptr;  // our prepare() returned nothing for the delegate
    Tensor r = experts_forward("grouped_mm", *p.spec, *p.weights, p.hidden, p.top_k_index,
                               p.top_k_weights);
    std::memcpy(out.raw(), r.raw(), r.nbytes());
  }
  mutable std::atomic<int> calls{0};
};

TEST(Registry, UserBackendRunsByName) {
  auto b = std::make_shared<CountingBackend>();
  register_experts_backend("my_counting", b);
  ExpertsSpec s = small_spec();
  auto w = test::random_experts_weights(s, DType::kBF16, 3);
  auto r = test::random_routing(s, 7, 2, DType::kBF16, 3, test::RoutingCase::kRandom);
  Tensor ref = experts_reference_f64(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  Tensor out = experts_forward("my_counting", s, w, r.hidden, r.top_k_index, r.top_k_weights);
  EXPECT_EQ(b->calls.load(), 1);
  EXPECT_LE(test::rel_l2_error(out, ref), test::experts_tolerance(DType::kBF16, 19));
  Experts module(s, w);
  Tensor out2 = module.forward("my_counting", r.hidden, r.top_k_index, r.top_k_weights);
  EXPECT_EQ(b->calls.load(), 2);
  EXPECT_EQ(test::rel_l2_error(out2, out), 0.0);
}

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  *status = pclose(p);
  return out;
}

TEST(Registry, PluginBackendRunsThroughTheCliBench) {
  int st = 0;
  std::string out = run(std::string(MOEX_CLI_PATH) + " --plugin " + MOEX_PLUGIN_PATH +
                            " bench experts --experts 5 --top-k 2 --hidden 64 --intermediate 48"
                            " --dtype float32 --tokens 1,9 --backends reference,grouped_mm"
                            " --json --min-iters 2 --budget-s 0.01 --bandwidth-gbs 10 --peak-tflops 1",
                        &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("\"backend\":\"reference\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"tokens\":9"), std::string::npos) << out;
  out = run(std::string(MOEX_CLI_PATH) + " --plugin " + MOEX_PLUGIN_PATH + " backends", &st);
  EXPECT_NE(out.find("reference"), std::string::npos) << out;
  // Without the plugin the name is unknown, and the error lists what is registered.
  out = run(std::string(MOEX_CLI_PATH) + " bench experts --backends reference --tokens 1", &st);
  EXPECT_NE(st, 0);
#ifdef MOEX_WITH_CUDA  // (the Hopper-only names are registered by the CUDA build)
  const char* listed = "registered: auto, batched_mm, deepgemm, deepgemm_megamoe, eager, grouped_mm, sonicmoe";
#else
  const char* listed = "registered: auto, batched_mm, eager, grouped_mm";
#endif
  EXPECT_NE(out.find(std::string("unknown experts backend 'reference'; ") + listed), std::string::npos) << out;
}

}  // namespace
