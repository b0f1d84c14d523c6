// Decode steps replayed from one captured CUDA graph against the same steps launched directly:
// every architecture, greedy and sampled (the sampled draw reads every logit of the row, so equal
// sequences at temperature 1 need equal logits to the last bit in practice), the eager backend's
// documented fallback, and long runs that must not grow device memory.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moex/bench.hpp"
#include "moex/model.hpp"
#include "core/device_hooks.hpp"
#include "ops/ops.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

std::unique_ptr<CausalLM> load_gpu(const std::string& model, const std::string& ckpt, DType dtype,
                                   const std::string& backend) {
  LoadOptions o;
  o.dtype = dtype;
  o.device = Device::cuda(0);
  o.experts_implementation = {{"", backend}};
  return from_pretrained(test::data_path("hf-tiny/" + model + "/" + ckpt), o);
}

GenerationOptions options(int64_t n, bool graph, bool sample) {
  GenerationOptions g;
  g.max_new_tokens = n;
  g.eos_token_ids = std::vector<int64_t>{};
  g.cuda_graph = graph;
  g.allow_beyond_max_positions = true;  // the long runs go past the tiny fixture's 256 positions
  g.do_sample = sample;
  g.seed = 7;
  return g;
}

class GraphDecode : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GraphDecode, ReplayEqualsDirectLaunches) {
  const std::string model = GetParam();
  const Tensor prompt = Tensor::from_ints({5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 5, 1}, {2, 6});
  const Tensor mask = Tensor::from_ints({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 6});
  for (const char* ckpt : {"checkpoint_fp32", "checkpoint_bf16"}) {
    const DType dt = std::string(ckpt) == "checkpoint_fp32" ? DType::kF32 : DType::kBF16;
    if (model == "qwen3_vl_moe" && dt == DType::kBF16) continue;  // the fixture has fp32 only
    for (const char* backend : {"grouped_mm", "batched_mm"}) {
      auto lm = load_gpu(model, ckpt, dt, backend);
      for (bool sample : {false, true}) {
        const Tensor direct = lm->generate(prompt, options(16, false, sample), mask);
        EXPECT_FALSE(lm->last_generation_stats().graph);
        const Tensor replay = lm->generate(prompt, options(16, true, sample), mask);
        EXPECT_TRUE(lm->last_generation_stats().graph) << lm->last_generation_stats().graph_note;
        EXPECT_EQ(replay.to_int_vector(), direct.to_int_vector())
            << model << " " << ckpt << " " << backend << (sample ? " sampled" : " greedy");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, GraphDecode,
                         ::testing::Values("qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "gpt_oss",
                                           "qwen3_vl_moe"));

// eager reads its routing counts on the host, which a capture cannot contain: its decode runs
// directly, says so, and still produces the direct result.
TEST(GraphDecodeFallback, EagerRunsDirectlyWithANote) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  auto lm = load_gpu("qwen2_moe", "checkpoint_bf16", DType::kBF16, "eager");
  const Tensor prompt = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
  GenerationOptions g = options(8, true, false);
  g.decode_switch = DecodeSwitch::kOff;  // keep eager in the decode stage
  const Tensor a = lm->generate(prompt, g);
  EXPECT_FALSE(lm->last_generation_stats().graph);
  EXPECT_NE(lm->last_generation_stats().graph_note.find("capture failed"), std::string::npos)
      << lm->last_generation_stats().graph_note;
  EXPECT_EQ(a.to_int_vector(), lm->generate(prompt, options(8, false, false)).to_int_vector());
}

// 10,000 decode steps: the caching allocator's reservation does not move once warm (no
// per-step allocation escapes the graph's pool). The first call runs one step directly, captures
// the next, and drops and captures again when the cache outgrows its plan; later calls replay
// that graph from their first step, with the same peak.
TEST(GraphDecodeLong, TenThousandReplaysKeepMemoryFlat) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  auto lm = load_gpu("qwen2_moe", "checkpoint_bf16", DType::kBF16, "grouped_mm");
  const Tensor prompt = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
  lm->generate(prompt, options(10001, true, false));  // captures; the cache grows past its plan
  lm->generate(prompt, options(10001, true, false));  // replays that graph: the steady state
  const int64_t before = peak_memory_bytes(Device::cuda(0));
  const Tensor seq = lm->generate(prompt, options(10001, true, false));
  const GenerationStats& s = lm->last_generation_stats();
  EXPECT_TRUE(s.graph) << s.graph_note;
  // 10,000 steps after the prefill, all replays of the first call's graph (whose cache grew past
  // its planned 8,192 columns there, so this call fits).
  EXPECT_TRUE(s.graph_reused);
  EXPECT_EQ(s.graph_replays, 10000);
  EXPECT_EQ(s.graph_captures_dropped, 0);
  EXPECT_EQ(peak_memory_bytes(Device::cuda(0)), before);
  EXPECT_EQ(seq.size(1), 4 + 10001);
}

// The graph ends with the token choice, which feeds the next replay on the device while the host
// reads the previous step's ids (generate's decode pipeline). Against direct steps where the
// host loop's logic matters: new-token counts around the capture (1 to 4), rows stopping at
// different steps (stop tokens taken from the direct run), every row stopping (the replay
// enqueued ahead is discarded) and a run right after that one (nothing of it leaks into the next).
TEST(GraphDecodePipeline, StopsAndShortRunsEqualDirectLaunches) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  auto lm = load_gpu("qwen2_moe", "checkpoint_bf16", DType::kBF16, "grouped_mm");
  const Tensor prompt = Tensor::from_ints({5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 5, 1}, {2, 6});
  const Tensor mask = Tensor::from_ints({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 6});
  for (bool sample : {false, true}) {
    const std::string what = sample ? "sampled" : "greedy";
    for (int64_t n : {1, 2, 3, 4})
      EXPECT_EQ(lm->generate(prompt, options(n, true, sample), mask).to_int_vector(),
                lm->generate(prompt, options(n, false, sample), mask).to_int_vector())
          << what << " " << n << " new tokens";
    const std::vector<int64_t> free_run = lm->generate(prompt, options(16, false, sample), mask).to_int_vector();
    const int64_t L = 6 + 16;
    GenerationOptions g = options(16, false, sample);
    g.eos_token_ids = std::vector<int64_t>{free_run[size_t(6 + 4)], free_run[size_t(L + 6 + 8)]};
    const Tensor direct = lm->generate(prompt, g, mask);
    g.cuda_graph = true;
    const Tensor replay = lm->generate(prompt, g, mask);
    EXPECT_TRUE(lm->last_generation_stats().graph) << lm->last_generation_stats().graph_note;
    EXPECT_GE(lm->last_generation_stats().graph_replays, 1);
    EXPECT_EQ(replay.to_int_vector(), direct.to_int_vector()) << what;
    EXPECT_LT(direct.size(1), L) << what << ": every row should have stopped early";
    EXPECT_EQ(lm->generate(prompt, options(16, true, sample), mask).to_int_vector(), free_run) << what;
  }
}

// The graph (and its cache) kept between calls: a call with the same batch, padding or none,
// sampling values, stop tokens and decode-stage backends whose prompt + new tokens fit replays it
// from its first decode step; any other call captures its own. Every call's tokens equal those of
// direct launches on a second model.
TEST(GraphKeptDecodeGraph, LaterCallsReplayTheGraphAndEqualDirectLaunches) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  auto lm = load_gpu("qwen2_moe", "checkpoint_bf16", DType::kBF16, "grouped_mm");
  auto ref = load_gpu("qwen2_moe", "checkpoint_bf16", DType::kBF16, "grouped_mm");
  const Tensor p9 = Tensor::from_ints({5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 5, 1, 7, 7, 3, 9, 8, 4}, {2, 9});
  const Tensor p3 = Tensor::from_ints({3, 1, 4, 1, 5, 9}, {2, 3});
  const Tensor p6 = Tensor::from_ints({5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 5, 1}, {2, 6});
  const Tensor m6 = Tensor::from_ints({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 6});
  struct Call {
    const char* what;
    Tensor prompt, mask;
    int64_t n;
    bool sample;
    DecodeSwitch sw;
    bool reused;
  };
  const Call calls[] = {
      {"first", p9, Tensor(), 16, false, DecodeSwitch::kAuto, false},
      {"shorter prompt", p3, Tensor(), 16, false, DecodeSwitch::kAuto, true},
      {"fewer new tokens", p9, Tensor(), 8, false, DecodeSwitch::kAuto, true},
      {"left padding", p6, m6, 16, false, DecodeSwitch::kAuto, false},
      {"sampled", p6, m6, 16, true, DecodeSwitch::kAuto, false},
      {"sampled again", p6, m6, 12, true, DecodeSwitch::kAuto, true},
      {"longer than the cache", p9, Tensor(), 30, false, DecodeSwitch::kAuto, false},
      {"fits the grown cache", p3, Tensor(), 20, false, DecodeSwitch::kAuto, true},
      {"another decode backend", p3, Tensor(), 20, false, DecodeSwitch::kOff, false},
      {"and back", p9, Tensor(), 16, false, DecodeSwitch::kAuto, false},
  };
  for (const Call& c : calls) {
    GenerationOptions g = options(c.n, true, c.sample);
    g.decode_switch = c.sw;
    const Tensor got = lm->generate(c.prompt, g, c.mask);
    const GenerationStats& s = lm->last_generation_stats();
    EXPECT_TRUE(s.graph) << c.what << ": " << s.graph_note;
    EXPECT_EQ(s.graph_reused, c.reused) << c.what;
    g.cuda_graph = false;
    EXPECT_EQ(got.to_int_vector(), ref->generate(c.prompt, g, c.mask).to_int_vector()) << c.what;
  }
  // Stop tokens are part of what a capture fixes; a row stopping early in a reused graph.
  GenerationOptions g = options(16, true, false);
  const std::vector<int64_t> free_run = lm->generate(p9, g).to_int_vector();
  g.eos_token_ids = std::vector<int64_t>{free_run[size_t(9 + 3)]};
  for (int round = 0; round < 2; ++round) {
    const Tensor got = lm->generate(p9, g);
    EXPECT_EQ(lm->last_generation_stats().graph_reused, round == 1);
    GenerationOptions d = g;
    d.cuda_graph = false;
    EXPECT_EQ(got.to_int_vector(), ref->generate(p9, d).to_int_vector()) << "stop tokens, round " << round;
  }
  lm->release_decode_graph();
  lm->generate(p9, g);
  EXPECT_FALSE(lm->last_generation_stats().graph_reused);
}

// A sampled run past the planned cache: the pipeline ends when the cache must grow (the step
// runs directly, the next one is captured again), and the generator skips the seeds the device
// used, so the draws stay those of direct steps across both graphs.
TEST(GraphDecodeLong, SampledRunAcrossCacheGrowthEqualsDirectLaunches) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  auto lm = load_gpu("qwen2_moe", "checkpoint_bf16", DType::kBF16, "grouped_mm");
  const Tensor prompt = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
  const Tensor direct = lm->generate(prompt, options(8300, false, true));
  lm->release_decode_graph();  // captured in this call
  const Tensor replay = lm->generate(prompt, options(8300, true, true));
  EXPECT_EQ(lm->last_generation_stats().graph_captures_dropped, 1);
  EXPECT_EQ(replay.to_int_vector(), direct.to_int_vector());
}

// Quantized checkpoints capture too: their linears allocate activation codes and scales per call,
// sizes the allocator's cache need not hold a block for when the capture starts (a cudaMalloc
// inside a capture fails); the warm run under the graph's pool provides them
// (detail::capture_graph's rewind).
TEST(GraphDecodeQuantized, ReplayEqualsDirectLaunches) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Tensor prompt = Tensor::from_ints({5, 9, 2, 7, 1, 3, 8, 4}, {1, 8});
  for (const char* model : {"deepseek_v3_fp8_float", "deepseek_v3_fp8_ue8m0", "deepseek_v3_fp4_experts_ue8m0"})
    for (const char* backend : {"grouped_mm", "batched_mm"}) {
      auto lm = load_gpu(model, "checkpoint", DType::kBF16, backend);
      const Tensor direct = lm->generate(prompt, options(12, false, false));
      const Tensor replay = lm->generate(prompt, options(12, true, false));
      EXPECT_TRUE(lm->last_generation_stats().graph) << model << " " << backend << ": "
                                                     << lm->last_generation_stats().graph_note;
      EXPECT_EQ(replay.to_int_vector(), direct.to_int_vector()) << model << " " << backend;
    }
}

// The warm run itself: a temporary of a size no cached block fits is served inside the capture.
TEST(GraphCapture, WarmRunProvidesTheCapturesTemporaries) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  std::vector<float> host(4099);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 97) - 48.f;
  const Tensor src = Tensor::from_floats(host, {1, 4099}).to(dev);
  Tensor out;
  int runs = 0, rewinds = 0;
  auto step = [&] {
    ++runs;
    const Tensor both = ops::concat_columns(src, src, 1);  // an odd-sized temporary
    out = ops::slice_columns(both, 1, 4099, 4099);
  };
  auto graph = detail::capture_graph(dev, step, [&] {
    ++rewinds;
    out = Tensor();
  });
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(rewinds, 1);
  graph->replay();
  EXPECT_EQ(out.to(Device::cpu()).to_float_vector(), host);
}

}  // namespace
}  // namespace moex
