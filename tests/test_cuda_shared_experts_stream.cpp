// Shared experts on a second stream (LoadOptions::shared_experts_stream): the same bits as in
// line, in prompts, direct decode steps and replayed graphs; the allocator rule that makes two
// streams safe (frees held until the join); and the choice itself, which the host never takes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/device_hooks.hpp"
#include "model/layers.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "support/test_support.hpp"
#ifdef MOEX_WITH_CUDA
#include "cuda/runtime.hpp"
#endif

namespace moex {
namespace {

TEST(SharedExpertsStream, NeverOnTheHost) {
  model::GatedMlp mlp;
  const Tensor x = Tensor::zeros({1, 8}, DType::kF32);
  for (auto mode : {SharedExpertsStream::kAuto, SharedExpertsStream::kOn, SharedExpertsStream::kOff})
    EXPECT_FALSE(model::shared_experts_beside(mode, x, mlp));
  EXPECT_THROW(detail::open_stream_branch(Device::cpu()), Unsupported);
}

TEST(SharedExpertsStream, CliRejectsAnUnknownMode) {
  const test::CliResult r =
      test::run_cli("generate --model " + test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32") +
                        " --prompt-ids 1,2,3 --shared-experts-stream sometimes",
                    ::testing::TempDir());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--shared-experts-stream must be auto, on or off, got 'sometimes'"), std::string::npos) << r.err;
}

class SharedExpertsStreamGpu : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

std::unique_ptr<CausalLM> load(const std::string& model, const std::string& ckpt, DType dt, SharedExpertsStream mode,
                               const std::string& backend) {
  LoadOptions o;
  o.dtype = dt;
  o.device = Device::cuda(0);
  o.experts_implementation = {{"", backend}};
  o.shared_experts_stream = mode;
  return from_pretrained(test::data_path("hf-tiny/" + model + "/" + ckpt), o);
}

GenerationOptions options(bool graph, bool sample) {
  GenerationOptions g;
  g.max_new_tokens = 12;
  g.eos_token_ids = std::vector<int64_t>{};
  g.cuda_graph = graph;
  g.do_sample = sample;
  g.seed = 3;
  return g;
}

// kOn puts every call on the branch (prompts of 2 x 70 rows too), kAuto the decode steps; each
// gives exactly kOff's logits and tokens, with and without the graph, greedy and sampled. The
// branch count says each mode forked where it should (kOff never), so equal bits cannot come
// from a mode that silently ran in line.
TEST_P(SharedExpertsStreamGpu, SameBitsAsInLine) {
  const std::string model = GetParam();
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 140; ++i) ids.push_back((i * 7 + 3) % 50);
  const Tensor prompt = Tensor::from_ints(ids, {2, 70});
  const Tensor short_prompt = Tensor::from_ints({5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 5, 1}, {2, 6});
  for (const char* ckpt : {"checkpoint_fp32", "checkpoint_bf16"}) {
    const DType dt = std::string(ckpt) == "checkpoint_fp32" ? DType::kF32 : DType::kBF16;
    for (const char* backend : {"grouped_mm", "batched_mm"}) {
      const int64_t before_off = detail::stream_branches_opened();
      auto off = load(model, ckpt, dt, SharedExpertsStream::kOff, backend);
      const Tensor want = off->logits(prompt);
      std::vector<std::vector<int64_t>> want_tokens;
      for (bool graph : {false, true})
        for (bool sample : {false, true})
          want_tokens.push_back(off->generate(short_prompt, options(graph, sample)).to_int_vector());
      off.reset();
      EXPECT_EQ(detail::stream_branches_opened(), before_off) << model << " " << ckpt << " " << backend << " off";
      for (auto mode : {SharedExpertsStream::kOn, SharedExpertsStream::kAuto}) {
        const std::string what = model + " " + ckpt + " " + backend +
                                 (mode == SharedExpertsStream::kOn ? " on" : " auto");
        auto lm = load(model, ckpt, dt, mode, backend);
        const int64_t before_prompt = detail::stream_branches_opened();
        const Tensor got = lm->logits(prompt);
        // The prompt's 140 rows fork under kOn only (kAuto forks up to kSharedExpertsBesideRows).
        if (mode == SharedExpertsStream::kOn) EXPECT_GT(detail::stream_branches_opened(), before_prompt) << what;
        else EXPECT_EQ(detail::stream_branches_opened(), before_prompt) << what;
        EXPECT_EQ(got.to(Device::cpu()).to_float_vector(), want.to(Device::cpu()).to_float_vector()) << what;
        size_t i = 0;
        for (bool graph : {false, true})
          for (bool sample : {false, true}) {
            const int64_t before = detail::stream_branches_opened();
            EXPECT_EQ(lm->generate(short_prompt, options(graph, sample)).to_int_vector(), want_tokens[i++])
                << what << (graph ? " graph" : " direct") << (sample ? " sampled" : " greedy");
            EXPECT_EQ(lm->last_generation_stats().graph, graph) << lm->last_generation_stats().graph_note;
            // The 2 x 6 prompt and the decode steps fork in both modes (a kept graph's replays
            // open none, but its prompt still runs directly).
            EXPECT_GT(detail::stream_branches_opened(), before) << what << (graph ? " graph" : " direct");
          }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SharedExpertModels, SharedExpertsStreamGpu, ::testing::Values("qwen2_moe", "deepseek_v3"));

#ifdef MOEX_WITH_CUDA
// While a branch is open a freed block is not handed out again (the other stream may still read
// it); after the join it is. Persistent grids launched on the side are capped, elsewhere not.
TEST(SharedExpertsStreamAllocator, FreesAreHeldUntilTheJoin) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const size_t bytes = size_t(3) << 20;
  void* warm = cuda::cache_alloc(bytes, 0);
  cuda::cache_free(warm, 0);
  void* held = nullptr;
  {
    auto branch = detail::open_stream_branch(Device::cuda(0));
    EXPECT_EQ(cuda::side_blocks_per_sm(), 0) << "persistent grids are capped on the side only";
    {
      detail::StreamBranch::Side side(*branch);
      held = cuda::cache_alloc(bytes, 0);
      EXPECT_EQ(cuda::current_stream(), cuda::side_stream());
      if (std::getenv("MOEX_SIDE_BLOCKS_PER_SM") == nullptr) EXPECT_GT(cuda::side_blocks_per_sm(), 0);
    }
    EXPECT_NE(cuda::current_stream(), cuda::side_stream());
    EXPECT_EQ(cuda::side_blocks_per_sm(), 0);
    cuda::cache_free(held, 0);
    void* other = cuda::cache_alloc(bytes, 0);
    EXPECT_NE(other, held);
    cuda::cache_free(other, 0);
    branch->join();
  }
  void* again = cuda::cache_alloc(bytes, 0);
  void* again2 = cuda::cache_alloc(bytes, 0);
  EXPECT_TRUE(again == held || again2 == held);
  cuda::cache_free(again, 0);
  cuda::cache_free(again2, 0);
  cuda::synchronize();
}
#endif

}  // namespace
}  // namespace moex
