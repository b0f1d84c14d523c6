// A shared expert folded into its layer's routed experts (LoadOptions::shared_experts_fold,
// model/layers.hpp's SharedFold): the router's fixed slots, the folded model against transformers'
// logits and against the unfolded model on every backend and device, what ModelInfo reports,
// and the refusals. The qwen2_moe fixture's shared expert (96 columns) does not cut into whole
// experts of 64, so these runs also cover the zero-padded last part.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "moex/comm.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "ops/ops.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

const char* kModel = "hf-tiny/qwen2_moe";

std::unique_ptr<CausalLM> load(const std::string& ckpt, DType dt, SharedExpertsFold fold, const std::string& backend,
                               Device dev) {
  LoadOptions o;
  o.dtype = dt;
  o.device = dev;
  o.experts_implementation = {{"", backend}};
  o.shared_experts_fold = fold;
  return from_pretrained(test::data_path(std::string(kModel) + "/" + ckpt), o);
}

std::shared_ptr<SafetensorsFile> reference() {
  return SafetensorsFile::open(test::data_path(std::string(kModel) + "/reference.safetensors"));
}

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu()};
  if (test::cuda_devices() > 0) d.push_back(Device::cuda(0));
  return d;
}

int64_t group_bytes(const ModelInfo& info, const std::string& group) {
  int64_t b = 0;
  for (const WeightGroupInfo& g : info.weight_groups)
    if (g.group == group) b += g.bytes;
  return b;
}

// Slots k .. k + count - 1: the fixed ids and the gate's rounded sigmoid; the routed slots as
// without them. The device's slots equal the host's.
TEST(SharedExpertsFold, RouterFixedSlots) {
  const Tensor logits = Tensor::from_floats({0.1f, 2.0f, -1.0f, 0.7f, 3.0f, 0.2f, -0.5f, 1.5f}, {2, 4});
  const Tensor gate = Tensor::from_floats({0.3f, -2.25f}, {2, 1});
  for (const Device dev : devices()) {
    const Tensor l = logits.to(dev), g = gate.to(dev);
    const ops::FixedSlots fixed{4, 3, &g, DType::kBF16};
    const ops::Routing r = ops::softmax_topk(l, 2, true, DType::kF32, &fixed);
    const ops::Routing plain = ops::softmax_topk(l, 2, true, DType::kF32);
    ASSERT_EQ(r.top_k_index.shape(), (Shape{2, 5}));
    const std::vector<int64_t> idx = r.top_k_index.to(Device::cpu()).to_int_vector();
    const std::vector<float> w = r.top_k_weights.to(Device::cpu()).to_float_vector();
    const std::vector<int64_t> pidx = plain.top_k_index.to(Device::cpu()).to_int_vector();
    const std::vector<float> pw = plain.top_k_weights.to(Device::cpu()).to_float_vector();
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t j = 0; j < 2; ++j) {
        EXPECT_EQ(idx[size_t(t * 5 + j)], pidx[size_t(t * 2 + j)]);
        EXPECT_EQ(w[size_t(t * 5 + j)], pw[size_t(t * 2 + j)]);
      }
      const float z = gate.to_float_vector()[size_t(t)];
      const float want = Tensor::from_floats({1.0f / (1.0f + std::exp(-z))}, {1}).to(DType::kBF16).to_float_vector()[0];
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(idx[size_t(t * 5 + 2 + j)], 4 + j) << dev.str();
        EXPECT_EQ(w[size_t(t * 5 + 2 + j)], want) << dev.str();
      }
    }
    const ops::FixedSlots ones{4, 1, nullptr, DType::kF32};
    const std::vector<float> top1 = ops::softmax_topk(l, 1, false, DType::kF32).top_k_weights.to(Device::cpu()).to_float_vector();
    EXPECT_EQ(ops::softmax_topk(l, 1, false, DType::kF32, &ones).top_k_weights.to(Device::cpu()).to_float_vector(),
              (std::vector<float>{top1[0], 1.0f, top1[1], 1.0f}));
    const Tensor wrong = Tensor::zeros({3, 1}, DType::kF32).to(dev);
    const ops::FixedSlots bad{4, 1, &wrong, DType::kF32};
    EXPECT_THROW(ops::softmax_topk(l, 2, true, DType::kF32, &bad), InvalidInput);
  }
}

// Folded, every backend on every device matches transformers' fp32 logits as the unfolded model
// does, and equals the unfolded model to float32 rounding; greedy tokens are transformers'.
TEST(SharedExpertsFold, Fp32MatchesTransformersAndTheUnfoldedModel) {
  auto ref = reference();
  const Tensor ids = ref->get("input_ids");
  for (const Device dev : devices()) {
    const double bound = dev.is_cuda() ? 1e-4 : 1e-5;
    for (const std::string backend : {"eager", "batched_mm", "grouped_mm"}) {
      auto folded = load("checkpoint_fp32", DType::kF32, SharedExpertsFold::kOn, backend, dev);
      auto plain = load("checkpoint_fp32", DType::kF32, SharedExpertsFold::kOff, backend, dev);
      ASSERT_EQ(folded->info().shared_experts_folded, 2);
      ASSERT_EQ(plain->info().shared_experts_folded, 0);
      const Tensor got = folded->logits(ids), unfolded = plain->logits(ids);
      const std::string what = backend + " on " + dev.str();
      EXPECT_LE(test::rel_l2_error(got, ref->get("logits_fp32_" + backend)), bound) << what;
      EXPECT_LE(test::rel_l2_error(got, unfolded), bound) << what;
      GenerationOptions g;
      g.max_new_tokens = 12;
      for (bool graph : {false, true}) {
        if (graph && !dev.is_cuda()) continue;
        g.cuda_graph = graph;
        const Tensor seq = folded->generate(ids.slice(0, 0, 1).contiguous(), g);
        EXPECT_EQ(seq.to_int_vector(), ref->get("greedy_fp32").to_int_vector()) << what << (graph ? " graph" : "");
      }
    }
  }
}

// bf16: the folded model rounds the shared expert's output once, inside the experts' combine,
// where transformers rounds it three times (its down projection, the gate product, the sum): the
// logits stay within the fixture suite's bf16 tolerance of transformers'.
TEST(SharedExpertsFold, Bf16WithinTolerance) {
  auto ref = reference();
  const Tensor ids = ref->get("input_ids");
  const double tol = 4.0 * std::ldexp(1.0, -8);
  for (const Device dev : devices())
    for (const std::string backend : {"batched_mm", "grouped_mm"}) {
      auto folded = load("checkpoint_bf16", DType::kBF16, SharedExpertsFold::kOn, backend, dev);
      EXPECT_LE(test::rel_l2_error(folded->logits(ids), ref->get("logits_bf16_" + backend)), tol)
          << backend << " on " << dev.str();
      // The float32 checkpoint loaded as bf16: the folded parts are converted at load as the
      // unfolded shared expert's linears are.
      auto converted = load("checkpoint_fp32", DType::kBF16, SharedExpertsFold::kOn, backend, dev);
      auto plain = load("checkpoint_fp32", DType::kBF16, SharedExpertsFold::kOff, backend, dev);
      EXPECT_LE(test::rel_l2_error(converted->logits(ids), plain->logits(ids)), tol) << backend << " on " << dev.str();
    }
}

// What the load reports: the experts gained 2 per layer, whose bytes count as shared experts;
// the routed experts' bytes (the benchmarks' floors use them) are the unfolded model's.
TEST(SharedExpertsFold, InfoCountsTheFoldedExpertsAsShared) {
  auto folded = load("checkpoint_fp32", DType::kF32, SharedExpertsFold::kOn, "grouped_mm", Device::cpu());
  auto plain = load("checkpoint_fp32", DType::kF32, SharedExpertsFold::kOff, "grouped_mm", Device::cpu());
  const ModelInfo &f = folded->info(), &p = plain->info();
  EXPECT_EQ(f.experts_weight_bytes, p.experts_weight_bytes);
  EXPECT_EQ(f.num_experts, p.num_experts);
  EXPECT_EQ(f.experts_per_token, p.experts_per_token);
  EXPECT_EQ(group_bytes(f, "routed_experts"), group_bytes(p, "routed_experts"));
  // Per layer 2 experts beside the 8 routed ones, each (gate + up + down) of 64 x 128 float32,
  // plus the shared gate linear (as the host packs it).
  const int64_t H = 128, I = 64, layers = int64_t(f.moe_layers.size());
  EXPECT_EQ(group_bytes(f, "routed_experts"), layers * 8 * 3 * I * H * 4);
  const int64_t gates = group_bytes(f, "shared_experts") - layers * 2 * 3 * I * H * 4;
  EXPECT_GE(gates, layers * H * 4);
  EXPECT_LT(gates, layers * I * H * 4);
  EXPECT_EQ(f.weight_bytes, p.weight_bytes);  // the checkpoint's tensors, as loaded
}

// kAuto does not fold (no measurement says where it pays yet), on either device.
TEST(SharedExpertsFold, AutoDoesNotFold) {
  for (const Device dev : devices())
    EXPECT_EQ(load("checkpoint_fp32", DType::kF32, SharedExpertsFold::kAuto, "grouped_mm", dev)->info().shared_experts_folded, 0)
        << dev.str();
}

// Where it cannot fold, kOn says why; models without a shared expert ignore it.
TEST(SharedExpertsFold, OnRefusesParallelismAndIgnoresModelsWithoutASharedExpert) {
  LoadOptions o;
  o.dtype = DType::kF32;
  o.shared_experts_fold = SharedExpertsFold::kOn;
  for (const bool tp : {false, true}) {
    auto comms = make_thread_group(2);
    std::vector<std::string> messages(2);
    const auto errors = run_ranks(comms, [&](Communicator& c) {
      LoadOptions ro = o;
      (tp ? ro.tp_comm : ro.ep_comm) = &c;
      try {
        from_pretrained(test::data_path(std::string(kModel) + "/checkpoint_fp32"), ro);
      } catch (const InvalidInput& e) {
        messages[size_t(c.rank())] = e.what();
      }
    });
    test::expect_no_rank_errors(errors);
    for (const std::string& m : messages)
      EXPECT_NE(m.find("cannot be folded into the routed experts: expert or tensor parallelism"), std::string::npos)
          << (tp ? "tp: " : "ep: ") << m;
  }
  auto mixtral = from_pretrained(test::data_path("hf-tiny/mixtral/checkpoint_fp32"), o);
  EXPECT_EQ(mixtral->info().shared_experts_folded, 0);
}

TEST(SharedExpertsFold, CliRejectsAnUnknownMode) {
  const test::CliResult r = test::run_cli("generate --model " + test::data_path(std::string(kModel) + "/checkpoint_fp32") +
                                              " --prompt-ids 1,2,3 --shared-experts-fold maybe",
                                          ::testing::TempDir());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--shared-experts-fold must be auto, on or off, got 'maybe'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moex
