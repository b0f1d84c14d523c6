// Expert parallelism inside the models (LoadOptions::ep_comm): N in-process ranks (threads of one
// process), each loading only its share of every MoE layer's routed experts, give each
// architecture's single-process fp32 logits and greedy tokens (and so transformers' fixtures),
// quantized experts' too, in both dispatch modes; each rank holds 1 / N of the experts' bytes.
// Refused clearly: an ep size that does not divide the number of experts, a GPU model with a
// communicator that is not on its GPU; a rank that fails to load makes its peers fail fast.
// (GPU models across GPUs: test_cuda_model_expert_parallel.cpp.)
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "moex/comm.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

// The block-quantized DeepSeek-V3 fixtures run with their experts kept as stored (FP8 codes with
// float32 scales; FP4 nibbles with UE8M0 scales).
const std::vector<std::string> kModels = {"qwen2_moe",   "qwen3_moe", "mixtral",      "olmoe",
                                          "deepseek_v3", "gpt_oss",   "qwen3_vl_moe", "deepseek_v3_fp8_float",
                                          "deepseek_v3_fp4_experts_ue8m0"};

std::string checkpoint(const std::string& model) {
  const bool quantized = model.find("_fp8_") != std::string::npos || model.find("_fp4_") != std::string::npos;
  return test::data_path("hf-tiny/" + model + (quantized ? "/checkpoint" : "/checkpoint_fp32"));
}

LoadOptions fp32_options(Communicator* comm, ExpertParallelMode mode) {
  LoadOptions o;
  o.dtype = DType::kF32;
  o.experts_implementation = {{"", "grouped_mm"}};
  o.ep_comm = comm;
  o.ep_mode = mode;
  return o;
}

struct RankRun {
  Tensor logits;
  std::vector<int64_t> greedy;
  int64_t experts_bytes = 0;
  int64_t weight_bytes = 0;
};

RankRun run_model(const std::string& model, Communicator* comm, ExpertParallelMode mode) {
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/" + model + "/reference.safetensors"));
  auto lm = from_pretrained(checkpoint(model), fp32_options(comm, mode));
  RankRun r;
  r.logits = lm->logits(ref->get("input_ids"));
  GenerationOptions g;
  g.max_new_tokens = 8;
  r.greedy = lm->generate(ref->get("input_ids").slice(0, 0, 1).contiguous(), g).to_int_vector();
  r.experts_bytes = lm->info().experts_weight_bytes;
  r.weight_bytes = lm->info().weight_bytes;
  return r;
}

// A rank stopped by its peer's failure: CommError naming what the peer reported.
void expect_stopped_by_peer(const std::exception_ptr& e, const std::string& needle) {
  try {
    std::rethrow_exception(e);
  } catch (const CommError& ex) {
    EXPECT_NE(std::string(ex.what()).find(needle), std::string::npos) << ex.what();
  } catch (const std::exception& ex) {
    ADD_FAILURE() << "not stopped by its peer: " << ex.what();
  }
}

class ModelExpertParallel
    : public ::testing::TestWithParam<std::tuple<std::string, int, ExpertParallelMode>> {};

TEST_P(ModelExpertParallel, RanksGiveTheSingleProcessLogitsAndTokens) {
  const auto& [model, ranks, mode] = GetParam();
  const RankRun one = run_model(model, nullptr, mode);
  auto comms = make_thread_group(ranks, std::chrono::seconds(60));
  std::vector<RankRun> runs(static_cast<size_t>(ranks));
  const auto errors = run_ranks(comms, [&](Communicator& c) { runs[size_t(c.rank())] = run_model(model, &c, mode); });
  test::expect_no_rank_errors(errors);
  if (::testing::Test::HasFailure()) return;
  for (int r = 0; r < ranks; ++r) {
    const RankRun& got = runs[size_t(r)];
    ASSERT_EQ(got.logits.shape(), one.logits.shape());
    // float32 on the host: the ranks' partial sums (or per-slot rows) add in another order.
    EXPECT_LE(test::rel_l2_error(got.logits, one.logits), 1e-5) << model << " rank " << r;
    EXPECT_EQ(got.greedy, one.greedy) << model << " rank " << r;
    EXPECT_EQ(got.experts_bytes * ranks, one.experts_bytes) << model << " rank " << r << ": its share of the experts";
    // The load's byte count (and the GPU's free-memory check) is the rank's share too.
    EXPECT_EQ(got.weight_bytes, one.weight_bytes - (one.experts_bytes - got.experts_bytes)) << model << " rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ModelExpertParallel,
    ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values(2, 4),
                       ::testing::Values(ExpertParallelMode::kReplicated, ExpertParallelMode::kAllToAll)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "_ranks_" +
             (std::get<2>(info.param) == ExpertParallelMode::kReplicated ? "replicated" : "all_to_all");
    });

// The backend is chosen per call on every rank: switching it at run time (as the decode-stage
// switch and ScopedExpertsImplementation do) keeps the ranks' logits equal to one process's.
TEST(ModelExpertParallelBackends, SwitchedAtRunTimeOnEveryRank) {
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/qwen3_moe/reference.safetensors"));
  const Tensor ids = ref->get("input_ids");
  auto comms = make_thread_group(2, std::chrono::seconds(60));
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    auto lm = from_pretrained(checkpoint("qwen3_moe"), fp32_options(&c, ExpertParallelMode::kAllToAll));
    for (const char* backend : {"eager", "batched_mm", "grouped_mm"}) {
      lm->set_experts_implementation(backend);
      const double err = test::rel_l2_error(lm->logits(ids), ref->get(std::string("logits_fp32_") + backend));
      if (err > 1e-5) throw Error("rank " + std::to_string(c.rank()) + " " + backend + ": rel L2 " + std::to_string(err));
    }
  });
  test::expect_no_rank_errors(errors);
}

// A rank that fails in the middle of generation (here: its step callback throws at the third
// token) stops its peer, which is waiting in the next MoE layer, at once and naming it.
TEST(ModelExpertParallelErrors, ARankThatFailsMidRunStopsItsPeers) {
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/mixtral/reference.safetensors"));
  auto comms = make_thread_group(2, std::chrono::seconds(60));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    auto lm = from_pretrained(checkpoint("mixtral"), fp32_options(&c, ExpertParallelMode::kReplicated));
    GenerationOptions g;
    g.max_new_tokens = 16;
    int steps = 0;
    if (c.rank() == 1)
      g.on_step = [&](std::span<const int64_t>) {
        if (++steps == 3) throw InvalidInput("rank 1 stops here");
      };
    lm->generate(ref->get("input_ids").slice(0, 0, 1).contiguous(), g);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  ASSERT_TRUE(errors[0] && errors[1]);
  expect_stopped_by_peer(errors[0], "rank 1 stops here");
}

TEST(ModelExpertParallelErrors, EpSizeMustDivideTheExperts) {
  auto comms = make_thread_group(3, std::chrono::seconds(10));  // mixtral has 8 experts
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    from_pretrained(checkpoint("mixtral"), fp32_options(&c, ExpertParallelMode::kReplicated));
  });
  int named = 0;
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const InvalidInput& ex) {
      ++named;
      EXPECT_NE(std::string(ex.what()).find("ep_size must divide the number of experts"), std::string::npos)
          << ex.what();
    } catch (const std::exception& ex) {
      // A rank may see its peer's abort first.
      EXPECT_TRUE(dynamic_cast<const CommError*>(&ex)) << ex.what();
    }
  }
  EXPECT_GE(named, 1) << "no rank reported the ep_size error itself (only peers' aborts or timeouts)";
}

// A GPU model needs a communicator on its own device: a host thread group is refused (without a
// GPU the missing device is named first).
TEST(ModelExpertParallelErrors, ADeviceModelNeedsACommunicatorOnItsDevice) {
  auto comms = make_thread_group(1, std::chrono::seconds(10));
  LoadOptions o = fp32_options(comms[0].get(), ExpertParallelMode::kReplicated);
  o.device = Device::cuda(0);
  try {
    from_pretrained(checkpoint("mixtral"), o);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("no CUDA device") != std::string::npos ||
                what.find("communicator runs on cpu") != std::string::npos)
        << what;
  }
}

// A rank that cannot load (here: a checkpoint path that does not exist) aborts the group, and its
// peer, already waiting in the first MoE layer's collective, fails at once with the reason
// instead of waiting for the timeout.
TEST(ModelExpertParallelErrors, ARankThatFailsToLoadStopsItsPeers) {
  auto comms = make_thread_group(2, std::chrono::seconds(60));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    const std::string dir = c.rank() == 1 ? test::data_path("hf-tiny/no_such_model") : checkpoint("mixtral");
    auto lm = from_pretrained(dir, fp32_options(&c, ExpertParallelMode::kAllToAll));
    auto ref = SafetensorsFile::open(test::data_path("hf-tiny/mixtral/reference.safetensors"));
    lm->logits(ref->get("input_ids"));
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  ASSERT_TRUE(errors[0] && errors[1]);
  expect_stopped_by_peer(errors[0], "rank 1");
}

}  // namespace
}  // namespace moex
