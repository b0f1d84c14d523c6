// The decode-stage switch: the pure policy (decode_stage_experts_implementation), and generate()
// end to end with recording backends, the switch forced on (DecodeSwitch::kOn, what a CUDA model
// does by default) so that it runs on the CPU: prefill runs the chosen backends, the one-token
// decode steps run batched_mm where grouped_mm was chosen, eager is never touched, a CPU model
// with the default kAuto never switches, and the caller's map is back after success and after an
// exception. test_model_cuda_experts checks the default on a real GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/model.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

TEST(DecodeStagePolicy, CpuNeverSwitches) {
  ExpertsImplementation m{{"", "grouped_mm"}, {"text_config", "grouped_mm"}, {"vision_config", "eager"}};
  EXPECT_EQ(decode_stage_experts_implementation(m, Device::cpu()), m);
}

TEST(DecodeStagePolicy, GpuOrForcedFlipsOnlyGroupedMm) {
  ExpertsImplementation m{{"", "grouped_mm"}, {"text_config", "eager"}, {"vision_config", "batched_mm"},
                          {"audio_config", "my_plugin"}};
  ExpertsImplementation want{{"", "batched_mm"}, {"text_config", "eager"}, {"vision_config", "batched_mm"},
                             {"audio_config", "my_plugin"}};
  EXPECT_EQ(decode_stage_experts_implementation(m, Device::cuda(0)), want);
  EXPECT_EQ(decode_stage_experts_implementation(m, Device::cpu(), DecodeSwitch::kOn), want);
  EXPECT_EQ(decode_stage_experts_implementation(m, Device::cuda(1), DecodeSwitch::kOff), m);
  EXPECT_EQ(decode_stage_experts_implementation({}, Device::cuda(0)), ExpertsImplementation{});
}

// ---- end to end with recording backends ----

struct Call {
  std::string backend;
  int64_t tokens;
  ExpertsImplementation map;  // the model's map while the call ran
};

struct Recorder {
  std::vector<Call> calls;
  const CausalLM* model = nullptr;
  int64_t throw_at_decode_call = -1;  // throw on this decode call (T == 1), counted from 0
  int64_t decode_calls = 0;
  bool refuse_batched_mm = false;  // batched_mm says it cannot serve the experts
  std::vector<std::string> prepares;        // backend name of every prepare() call
  int64_t prepares_at_first_forward = -1;   // prepares.size() when the first forward ran
};

// Delegates to the real backend and records which name ran on how many tokens.
class RecordingBackend final : public ExpertsBackend {
 public:
  RecordingBackend(std::string name, std::shared_ptr<const ExpertsBackend> inner, Recorder* rec)
      : name_(std::move(name)), inner_(std::move(inner)), rec_(rec) {}
  BackendCaps caps() const override { return inner_->caps(); }
  std::string unsupported_reason(const ExpertsSpec& s, DType d, Device dev) const override {
    if (rec_->refuse_batched_mm && name_ == "batched_mm") return "is refused by this test";
    return inner_->unsupported_reason(s, d, dev);
  }
  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& s, const ExpertsWeights& w) const override {
    rec_->prepares.push_back(name_);
    return inner_->prepare(s, w);
  }
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext& ctx) const override {
    if (rec_->prepares_at_first_forward < 0)
      rec_->prepares_at_first_forward = int64_t(rec_->prepares.size());
    rec_->calls.push_back({name_, p.tokens(), rec_->model ? rec_->model->get_experts_implementation()
                                                          : ExpertsImplementation{}});
    if (p.tokens() == 1 && rec_->decode_calls++ == rec_->throw_at_decode_call)
      throw Error("injected failure in decode step");
    inner_->forward(p, out, ctx);
  }

 private:
  std::string name_;
  std::shared_ptr<const ExpertsBackend> inner_;
  Recorder* rec_;
};

class DecodeSwitchGenerate : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* n : {"eager", "batched_mm", "grouped_mm"}) {
      originals_[n] = get_experts_backend(n);
      register_experts_backend(n, std::make_shared<RecordingBackend>(n, originals_[n], &rec_));
    }
  }
  void TearDown() override {
    for (auto& [n, b] : originals_) register_experts_backend(n, b);
  }
  std::unique_ptr<CausalLM> load(Device device, const ExpertsImplementation& impl) {
    LoadOptions o;
    o.device = device;
    o.experts_implementation = impl;
    auto lm = from_pretrained(test::data_path("hf-tiny/qwen3_vl_moe/checkpoint_fp32"), o);
    rec_.model = lm.get();
    return lm;
  }
  Tensor prompt() const { return Tensor::from_ints({5, 17, 300, 42, 8, 9, 77}, {1, 7}); }
  // The switch forced on, as on a GPU (kAuto: the default, which never switches on the CPU).
  GenerationOptions options(int64_t n, DecodeSwitch sw = DecodeSwitch::kOn) const {
    GenerationOptions g;
    g.max_new_tokens = n;
    g.eos_token_ids = std::vector<int64_t>{};
    g.decode_switch = sw;
    return g;
  }

  Recorder rec_;
  std::map<std::string, std::shared_ptr<const ExpertsBackend>> originals_;
};

TEST_F(DecodeSwitchGenerate, FlipsGroupedMmForDecodeOnlyAndRestores) {
  const ExpertsImplementation chosen{{"", "eager"}, {"text_config", "grouped_mm"}, {"vision_config", "grouped_mm"}};
  auto lm = load(Device::cpu(), chosen);
  Tensor seq = lm->generate(prompt(), options(4));
  ASSERT_EQ(seq.size(1), 7 + 4);
  const int64_t layers = int64_t(lm->info().moe_layers.size());
  ASSERT_EQ(int64_t(rec_.calls.size()), layers * 4);  // prefill + 3 decode steps
  for (const auto& c : rec_.calls) {
    if (c.tokens == 7) {
      EXPECT_EQ(c.backend, "grouped_mm");
      EXPECT_EQ(c.map, chosen);
    } else {
      EXPECT_EQ(c.tokens, 1);
      EXPECT_EQ(c.backend, "batched_mm");
      EXPECT_EQ(c.map, (ExpertsImplementation{{"", "eager"}, {"text_config", "batched_mm"},
                                               {"vision_config", "batched_mm"}}));
    }
  }
  EXPECT_EQ(lm->get_experts_implementation(), chosen);
}

// generate prepares both stages' backends before the prefill clock starts (packing used to be
// counted as prefill time), once: a second generate prepares nothing.
TEST_F(DecodeSwitchGenerate, PreparesBothStagesBeforeThePrefillOnce) {
  auto lm = load(Device::cpu(), {{"", "grouped_mm"}});
  const int64_t modules = int64_t(lm->info().moe_layers.size());
  (void)lm->generate(prompt(), options(3));
  ASSERT_EQ(int64_t(rec_.prepares.size()), 2 * modules);
  EXPECT_EQ(rec_.prepares_at_first_forward, 2 * modules);
  EXPECT_EQ(std::count(rec_.prepares.begin(), rec_.prepares.end(), "grouped_mm"), modules);
  EXPECT_EQ(std::count(rec_.prepares.begin(), rec_.prepares.end(), "batched_mm"), modules);
  EXPECT_GT(lm->last_generation_stats().prepare_seconds, 0.0);
  (void)lm->generate(prompt(), options(3));
  EXPECT_EQ(int64_t(rec_.prepares.size()), 2 * modules);
}

TEST_F(DecodeSwitchGenerate, SwitchedDecodeGivesTheSameTokens) {
  auto switched = load(Device::cpu(), {{"", "grouped_mm"}});
  Tensor a = switched->generate(prompt(), options(6));
  // The stats name the decode stage's map (the caller's map is what get_experts_implementation
  // returns after the call).
  EXPECT_EQ(switched->last_generation_stats().decode_experts_implementation.at("text_config"), "batched_mm");
  EXPECT_EQ(switched->last_generation_stats().decode_switch_note, "");
  auto plain = load(Device::cpu(), {{"", "grouped_mm"}});
  Tensor b = plain->generate(prompt(), options(6, DecodeSwitch::kOff));
  EXPECT_EQ(a.to_int_vector(), b.to_int_vector());
}

TEST_F(DecodeSwitchGenerate, RestoredAfterAnExceptionInDecode) {
  auto lm = load(Device::cpu(), {{"", "grouped_mm"}});
  const ExpertsImplementation chosen = lm->get_experts_implementation();
  EXPECT_EQ(chosen.at("text_config"), "grouped_mm");
  rec_.throw_at_decode_call = 3;  // second decode step (2 MoE layers per step)
  EXPECT_THROW(lm->generate(prompt(), options(5)), Error);
  EXPECT_EQ(rec_.calls.back().backend, "batched_mm");
  EXPECT_EQ(lm->get_experts_implementation(), chosen);
  // And the model still works, with the switch applied again.
  rec_.throw_at_decode_call = -1;
  rec_.calls.clear();
  EXPECT_EQ(lm->generate(prompt(), options(3)).size(1), 7 + 3);
  EXPECT_EQ(rec_.calls.back().backend, "batched_mm");
  EXPECT_EQ(lm->get_experts_implementation(), chosen);
}

TEST_F(DecodeSwitchGenerate, FallsBackToTheCallersMapWhenBatchedMmCannotServe) {
  auto lm = load(Device::cpu(), {{"", "grouped_mm"}});
  rec_.refuse_batched_mm = true;
  EXPECT_EQ(lm->generate(prompt(), options(3)).size(1), 7 + 3);
  ASSERT_FALSE(rec_.calls.empty());
  for (const auto& c : rec_.calls) EXPECT_EQ(c.backend, "grouped_mm") << "tokens " << c.tokens;
  EXPECT_EQ(lm->get_experts_implementation().at("text_config"), "grouped_mm");
  // The stats say what decode ran and why the switch was not applied.
  const GenerationStats& st = lm->last_generation_stats();
  EXPECT_EQ(st.decode_experts_implementation.at("text_config"), "grouped_mm");
  EXPECT_NE(st.decode_switch_note.find("is refused by this test"), std::string::npos) << st.decode_switch_note;
}

TEST_F(DecodeSwitchGenerate, CpuNeverSwitchesByDefault) {
  auto lm = load(Device::cpu(), {{"", "grouped_mm"}});
  lm->generate(prompt(), options(4, DecodeSwitch::kAuto));
  ASSERT_FALSE(rec_.calls.empty());
  for (const auto& c : rec_.calls) EXPECT_EQ(c.backend, "grouped_mm") << "tokens " << c.tokens;
}

TEST_F(DecodeSwitchGenerate, EagerIsNeverSwitched) {
  auto lm = load(Device::cpu(), {{"", "eager"}});
  lm->generate(prompt(), options(4));
  ASSERT_FALSE(rec_.calls.empty());
  for (const auto& c : rec_.calls) EXPECT_EQ(c.backend, "eager") << "tokens " << c.tokens;
}

TEST_F(DecodeSwitchGenerate, ScopedGuardRestoresOnException) {
  auto lm = load(Device::cpu(), {{"", "eager"}});
  struct LeaveTheScope {};  // only this test's throw is caught: a failing guard is not swallowed
  bool left = false;
  try {
    ScopedExpertsImplementation guard(*lm, {{"", "batched_mm"}});
    EXPECT_EQ(lm->get_experts_implementation().at("text_config"), "batched_mm");
    throw LeaveTheScope{};
  } catch (const LeaveTheScope&) {
    left = true;
  }
  EXPECT_TRUE(left);
  EXPECT_EQ(lm->get_experts_implementation().at("text_config"), "eager");
}

}  // namespace
}  // namespace moex
