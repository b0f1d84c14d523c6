// Expert parallelism of GPU models: two ranks on two GPUs (an NCCL group, one thread per rank),
// each model holding half of every MoE layer's routed experts and running its MoE layers as
// stream work (sentinels marked on the device, the rank-order all-reduce enqueued), give the
// single-GPU model's logits and greedy tokens, and transformers' fixtures, in float32 (and the
// quantized DeepSeek-V3 fixtures with their experts kept quantized), with the decode step
// captured as one CUDA graph; so does the all-to-all mode (rows dispatched on the device, planned
// on the host, decode steps without a graph); bfloat16 within its tolerance. Refused clearly: a
// communicator on another GPU. A rank that fails mid-generation stops its peer in bounded time.
// Needs two GPUs and NCCL; skips otherwise.
#include <gtest/gtest.h>

#include <chrono>
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

constexpr int kRanks = 2;

bool ready() { return test::cuda_devices() >= kRanks && nccl_available(); }

std::vector<std::unique_ptr<Communicator>> nccl_group() {
  std::vector<int> devices;
  for (int i = 0; i < kRanks; ++i) devices.push_back(i);
  return make_nccl_group(devices, std::chrono::seconds(60));
}

bool quantized(const std::string& model) {
  return model.find("_fp8_") != std::string::npos || model.find("_fp4_") != std::string::npos;
}

std::string checkpoint(const std::string& model, DType dt) {
  if (quantized(model)) return test::data_path("hf-tiny/" + model + "/checkpoint");
  return test::data_path("hf-tiny/" + model + (dt == DType::kF32 ? "/checkpoint_fp32" : "/checkpoint_bf16"));
}

LoadOptions options(Device dev, DType dt, Communicator* comm,
                    ExpertParallelMode mode = ExpertParallelMode::kReplicated, bool tensor_parallel = false) {
  LoadOptions o;
  o.tp_comm = tensor_parallel ? comm : nullptr;
  o.ep_mode = mode;
  o.dtype = dt;
  o.device = dev;
  o.experts_implementation = {{"", "grouped_mm"}};
  o.ep_comm = comm;
  return o;
}

struct ModelRun {
  Tensor logits;
  std::vector<int64_t> greedy;
  bool graph = false;
  int64_t experts_bytes = 0;
};

ModelRun run_model(const std::string& model, DType dt, Device dev, Communicator* comm,
                   ExpertParallelMode mode = ExpertParallelMode::kReplicated, bool tensor_parallel = false) {
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/" + model + "/reference.safetensors"));
  auto lm = from_pretrained(checkpoint(model, dt), options(dev, dt, comm, mode, tensor_parallel));
  ModelRun r;
  r.logits = lm->logits(ref->get("input_ids"));
  GenerationOptions g;
  g.max_new_tokens = 12;
  r.greedy = lm->generate(ref->get("input_ids").slice(0, 0, 1).contiguous(), g).to_int_vector();
  r.graph = lm->last_generation_stats().graph;
  r.experts_bytes = lm->info().experts_weight_bytes;
  return r;
}

std::vector<ModelRun> run_ranks_of(const std::string& model, DType dt,
                                   ExpertParallelMode mode = ExpertParallelMode::kReplicated,
                                   bool tensor_parallel = false) {
  auto comms = nccl_group();
  std::vector<ModelRun> runs(kRanks);
  test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
    runs[size_t(c.rank())] = run_model(model, dt, c.device(), &c, mode, tensor_parallel);
  }));
  return runs;
}

class CudaModelExpertParallel : public ::testing::TestWithParam<std::tuple<std::string, ExpertParallelMode>> {};

TEST_P(CudaModelExpertParallel, TwoGpusGiveTheOneGpuLogitsAndTokensFp32) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const auto& [model, mode] = GetParam();
  const ModelRun one = run_model(model, DType::kF32, Device::cuda(0), nullptr);
  const std::vector<ModelRun> runs = run_ranks_of(model, DType::kF32, mode);
  if (::testing::Test::HasFailure()) return;
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/" + model + "/reference.safetensors"));
  for (int r = 0; r < kRanks; ++r) {
    const ModelRun& got = runs[size_t(r)];
    ASSERT_EQ(got.logits.shape(), one.logits.shape());
    EXPECT_LE(test::rel_l2_error(got.logits, one.logits), 1e-4) << model << " rank " << r;
    if (!quantized(model)) {
      EXPECT_LE(test::rel_l2_error(got.logits, ref->get("logits_fp32_grouped_mm")), 1e-4) << model << " rank " << r;
      EXPECT_EQ(got.greedy, ref->get("greedy_fp32").to_int_vector()) << model << " rank " << r;
    }
    EXPECT_EQ(got.greedy, one.greedy) << model << " rank " << r;
    // The replicated mode's decode steps are one captured graph; the all-to-all mode's are not.
    EXPECT_EQ(got.graph, mode == ExpertParallelMode::kReplicated) << model << " rank " << r;
    EXPECT_EQ(got.experts_bytes * kRanks, one.experts_bytes) << model << " rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaModelExpertParallel,
    ::testing::Combine(::testing::Values("qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "gpt_oss",
                                         "qwen3_vl_moe", "deepseek_v3_fp8_float", "deepseek_v3_fp4_experts_ue8m0"),
                       ::testing::Values(ExpertParallelMode::kReplicated, ExpertParallelMode::kAllToAll)),
    [](const auto& info) {
      return std::get<0>(info.param) +
             (std::get<1>(info.param) == ExpertParallelMode::kReplicated ? "_replicated" : "_all_to_all");
    });

// A group of one rank on one GPU runs the same device path (sentinels marked, the enqueued
// all-reduce captured in the decode graph; the all-to-all plan and row moves) on any GPU machine.
TEST(CudaModelExpertParallelOneGpu, AGroupOfOneGivesTheModelsLogitsAndTokens) {
  if (test::cuda_devices() < 1 || !nccl_available()) GTEST_SKIP() << "needs a CUDA device and NCCL";
  for (const char* model : {"mixtral", "deepseek_v3", "gpt_oss"}) {
    const ModelRun one = run_model(model, DType::kF32, Device::cuda(0), nullptr);
    for (ExpertParallelMode mode : {ExpertParallelMode::kReplicated, ExpertParallelMode::kAllToAll}) {
      auto comms = make_nccl_group({0}, std::chrono::seconds(60));
      const ModelRun got = run_model(model, DType::kF32, Device::cuda(0), comms[0].get(), mode);
      const char* m = mode == ExpertParallelMode::kReplicated ? " replicated" : " all-to-all";
      EXPECT_LE(test::rel_l2_error(got.logits, one.logits), 1e-6) << model << m;
      EXPECT_EQ(got.greedy, one.greedy) << model << m;
      EXPECT_EQ(got.graph, mode == ExpertParallelMode::kReplicated) << model << m;
    }
  }
}

// Tensor parallelism of attention and dense layers on the same two ranks as the experts: the
// partial sums after o_proj / down are enqueued NCCL work, captured in the decode graph.
TEST(CudaModelTensorParallel, TwoGpusGiveTheOneGpuLogitsAndTokens) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  for (const char* model : {"qwen2_moe", "mixtral", "deepseek_v3", "qwen3_vl_moe", "gpt_oss", "olmoe"}) {
    auto ref = SafetensorsFile::open(test::data_path("hf-tiny/" + std::string(model) + "/reference.safetensors"));
    const ModelRun one = run_model(model, DType::kF32, Device::cuda(0), nullptr);
    const std::vector<ModelRun> runs = run_ranks_of(model, DType::kF32, ExpertParallelMode::kReplicated, true);
    for (int r = 0; r < kRanks && !::testing::Test::HasFailure(); ++r) {
      EXPECT_LE(test::rel_l2_error(runs[size_t(r)].logits, one.logits), 1e-4) << model << " rank " << r;
      EXPECT_EQ(runs[size_t(r)].greedy, ref->get("greedy_fp32").to_int_vector()) << model << " rank " << r;
      EXPECT_TRUE(runs[size_t(r)].graph) << model << " rank " << r;
    }
    const std::vector<ModelRun> bf16 = run_ranks_of(model, DType::kBF16, ExpertParallelMode::kReplicated, true);
    const ModelRun one_bf16 = run_model(model, DType::kBF16, Device::cuda(0), nullptr);
    for (int r = 0; r < kRanks && !::testing::Test::HasFailure(); ++r)
      EXPECT_LE(test::rel_l2_error(bf16[size_t(r)].logits, one_bf16.logits), 2e-2) << model << " bf16 rank " << r;
  }
}

// bfloat16: each rank's partial output is rounded before the sum, once more than on one GPU.
TEST(CudaModelExpertParallelBf16, TwoGpusWithinTheBf16Tolerance) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  for (const char* model : {"qwen2_moe", "deepseek_v3", "gpt_oss"}) {
    const ModelRun one = run_model(model, DType::kBF16, Device::cuda(0), nullptr);
    for (ExpertParallelMode mode : {ExpertParallelMode::kReplicated, ExpertParallelMode::kAllToAll}) {
      const std::vector<ModelRun> runs = run_ranks_of(model, DType::kBF16, mode);
      for (int r = 0; r < kRanks; ++r)
        EXPECT_LE(test::rel_l2_error(runs[size_t(r)].logits, one.logits), 2e-2)
            << model << " rank " << r << (mode == ExpertParallelMode::kReplicated ? " replicated" : " all-to-all");
    }
  }
}

TEST(CudaModelExpertParallelErrors, ACommunicatorOnAnotherGpuIsRefused) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  auto comms = nccl_group();
  std::vector<std::string> what(kRanks);
  test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
    try {
      from_pretrained(checkpoint("mixtral", DType::kF32), options(Device::cuda(1 - c.rank()), DType::kF32, &c));
    } catch (const InvalidInput& e) {
      what[size_t(c.rank())] = e.what();
    }
  }));
  for (const auto& w : what) EXPECT_NE(w.find("communicator runs on cuda:"), std::string::npos) << w;
}

// Rank 1 throws from its step callback at the third token; rank 0, whose next decode step waits
// for rank 1's half of the experts inside NCCL, is stopped by the abort and fails naming it.
TEST(CudaModelExpertParallelErrors, ARankThatFailsMidRunStopsItsPeer) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/mixtral/reference.safetensors"));
  auto comms = nccl_group();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    auto lm = from_pretrained(checkpoint("mixtral", DType::kF32), options(c.device(), DType::kF32, &c));
    GenerationOptions g;
    g.max_new_tokens = 16;
    int steps = 0;
    if (c.rank() == 1)
      g.on_step = [&](std::span<const int64_t>) {
        if (++steps == 3) throw InvalidInput("rank 1 stops here");
      };
    lm->generate(ref->get("input_ids").slice(0, 0, 1).contiguous(), g);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  ASSERT_TRUE(errors[1]);
  // Rank 0 cannot finish without rank 1's half of the experts: it fails (CommError naming rank 1
  // from its communicator, aborted by run_ranks), it does not return tokens.
  ASSERT_TRUE(errors[0]) << "rank 0 returned tokens computed without its peer";
  try {
    std::rethrow_exception(errors[0]);
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not stopped by its communicator: " << e.what();
  }
}

}  // namespace
}  // namespace moex
