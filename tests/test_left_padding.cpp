// Left-padded batches with an attention mask (transformers' padding_side="left"): for every
// architecture fixture, fp32 and bf16, the real positions of a padded batch compute exactly what
// each sequence computes alone (logits and greedy tokens); three models against transformers'
// own padded batches; bad masks are rejected naming the problem.
//
// The batch has ugly lengths on purpose: 13 (no padding), 9 (past gpt_oss's sliding window of 8,
// so the window and the padding both cut the keys), 1 (a one-token prompt under 12 padding
// columns) and 5, each padded with a different in-vocabulary id (padding content must not matter).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

const std::vector<std::string> kModels = {"qwen2_moe", "qwen3_moe", "mixtral",     "olmoe",
                                          "deepseek_v3", "gpt_oss",  "qwen3_vl_moe"};

std::unique_ptr<CausalLM> load(const std::string& model, const std::string& checkpoint,
                               Device device = Device::cpu()) {
  LoadOptions o;
  o.device = device;
  o.experts_implementation = {{"", "grouped_mm"}};
  return from_pretrained(test::data_path("hf-tiny/" + model + "/" + checkpoint), o);
}

// Deterministic prompts of the lengths above with ids spread over the fixtures' 256-token vocab.
std::vector<std::vector<int64_t>> prompts() {
  std::vector<std::vector<int64_t>> p;
  uint64_t x = 12345;
  for (int64_t len : {13, 9, 1, 5}) {
    std::vector<int64_t> s;
    for (int64_t i = 0; i < len; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      s.push_back(int64_t((x >> 33) % 256));
    }
    p.push_back(s);
  }
  return p;
}

struct Padded {
  Tensor ids, mask;
  std::vector<int64_t> pad;
  int64_t width = 0;
};

Padded left_pad(const std::vector<std::vector<int64_t>>& seqs) {
  Padded out;
  for (const auto& s : seqs) out.width = std::max(out.width, int64_t(s.size()));
  std::vector<int64_t> ids, mask;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t n = out.width - int64_t(seqs[b].size());
    out.pad.push_back(n);
    const int64_t pad_id = int64_t(b * 67 % 256);  // 0, 67, 134, 201
    ids.insert(ids.end(), size_t(n), pad_id);
    ids.insert(ids.end(), seqs[b].begin(), seqs[b].end());
    mask.insert(mask.end(), size_t(n), 0);
    mask.insert(mask.end(), seqs[b].size(), 1);
  }
  const int64_t B = int64_t(seqs.size());
  out.ids = Tensor::from_ints(ids, {B, out.width});
  out.mask = Tensor::from_ints(mask, {B, out.width});
  return out;
}

GenerationOptions greedy(int64_t n) {
  GenerationOptions g;
  g.max_new_tokens = n;
  g.eos_token_ids = std::vector<int64_t>{};  // run every step
  return g;
}

class LeftPadding : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// The real positions of each padded row against the row run alone. On the host a padded row
// performs the same arithmetic in the same order as the unpadded run (attention only narrows its
// key range; every other op works row by row), so the logits are compared bit for bit, in fp32
// and bf16 alike, with every experts backend.
void check_real_positions(CausalLM& lm, const std::string& what) {
  const auto seqs = prompts();
  const Padded p = left_pad(seqs);
  const Tensor batch = lm.logits(p.ids, p.mask);
  const int64_t V = batch.size(2);
  ASSERT_EQ(batch.shape(), (Shape{int64_t(seqs.size()), p.width, V}));
  const auto all = batch.to_float_vector();
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t n = int64_t(seqs[b].size());
    const auto alone = lm.logits(Tensor::from_ints(seqs[b], {1, n})).to_float_vector();
    const float* got = all.data() + (int64_t(b) * p.width + p.pad[b]) * V;
    int64_t differ = 0;
    for (int64_t i = 0; i < n * V; ++i) differ += got[i] != alone[size_t(i)];
    EXPECT_EQ(differ, 0) << what << " row " << b << " (" << n << " tokens, " << p.pad[b]
                         << " padding): " << differ << " of " << n * V << " logits differ";
  }
  // The mask is what makes this hold: without it the padded rows read their padding and differ.
  const auto unmasked = lm.logits(p.ids).to_float_vector();
  for (size_t b = 0; b < seqs.size(); ++b) {
    if (p.pad[b] == 0) continue;
    const int64_t at = (int64_t(b) * p.width + p.width - 1) * V;  // the row's last position
    EXPECT_FALSE(std::equal(all.begin() + at, all.begin() + at + V, unmasked.begin() + at))
        << what << " row " << b << ": the mask changed nothing";
  }
}

TEST_P(LeftPadding, RealPositionsEqualTheSequenceAlone) {
  const auto& [model, checkpoint] = GetParam();
  auto lm = load(model, checkpoint);
  for (const char* backend : {"eager", "batched_mm", "grouped_mm"}) {
    lm->set_experts_implementation(backend);
    check_real_positions(*lm, model + " " + checkpoint + " " + backend);
  }
}

// Greedy continuation of the padded batch: each row is its prompt's own continuation, with the
// padding kept in front (transformers' layout), through decode steps past the sliding window.
TEST_P(LeftPadding, GreedyEqualsEachPromptAlone) {
  const auto& [model, checkpoint] = GetParam();
  auto lm = load(model, checkpoint);
  const auto seqs = prompts();
  const Padded p = left_pad(seqs);
  constexpr int64_t kNew = 7;
  const Tensor out = lm->generate(p.ids, greedy(kNew), p.mask);
  ASSERT_EQ(out.shape(), (Shape{int64_t(seqs.size()), p.width + kNew}));
  const auto all = out.to_int_vector();
  const auto ids = p.ids.to_int_vector();
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t L = p.width + kNew;
    const std::vector<int64_t> row(all.begin() + int64_t(b) * L, all.begin() + int64_t(b + 1) * L);
    // The prompt as given, padding included.
    EXPECT_EQ(std::vector<int64_t>(row.begin(), row.begin() + p.width),
              std::vector<int64_t>(ids.begin() + int64_t(b) * p.width, ids.begin() + int64_t(b + 1) * p.width));
    const auto alone =
        lm->generate(Tensor::from_ints(seqs[b], {1, int64_t(seqs[b].size())}), greedy(kNew)).to_int_vector();
    EXPECT_EQ(std::vector<int64_t>(row.begin() + p.pad[b], row.end()), alone)
        << model << " " << checkpoint << " row " << b;
  }
}

// Every fixture checkpoint: each model in fp32 and, where the fixture has one, bf16.
std::vector<std::tuple<std::string, std::string>> checkpoints() {
  std::vector<std::tuple<std::string, std::string>> v;
  for (const auto& m : kModels)
    for (const char* c : {"checkpoint_fp32", "checkpoint_bf16"})
      if (std::filesystem::exists(test::data_path("hf-tiny/" + m + "/" + c))) v.emplace_back(m, c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllModels, LeftPadding, ::testing::ValuesIn(checkpoints()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param).substr(11);
                         });

// Against transformers itself: the padded batches of padded_reference.safetensors (made by
// tests/data/hf-tiny/make_padded_references.py) for qwen2_moe (sdpa), gpt_oss (eager, sinks,
// sliding window 8 < 13 columns) and deepseek_v3 (MLA). Only real positions are compared:
// transformers' values at padding positions are its own. On the host and, where a GPU is
// visible, with the whole model on CUDA (fp32 bound 1e-4 there: other summation orders).
class LeftPaddingTransformers : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    if (std::get<1>(GetParam()) == "cuda" && test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// The rows of logits [B, T, V] where mask [B, T] is 1, as one [rows, V] tensor.
Tensor real_rows(const Tensor& logits, const Tensor& mask) {
  const int64_t V = logits.size(2);
  const auto f = logits.contiguous().to_float_vector();
  const auto m = mask.to_int_vector();
  std::vector<float> out;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i] == 1) out.insert(out.end(), f.begin() + int64_t(i) * V, f.begin() + int64_t(i + 1) * V);
  return Tensor::from_floats(out, {int64_t(out.size()) / V, V});
}

TEST_P(LeftPaddingTransformers, LogitsAndGreedyMatch) {
  const std::string model = std::get<0>(GetParam());
  const Device dev = std::get<1>(GetParam()) == "cuda" ? Device::cuda(0) : Device::cpu();
  const double fp32_bound = dev.is_cuda() ? 1e-4 : 1e-5;
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/" + model + "/padded_reference.safetensors"));
  const Tensor ids = ref->get("input_ids"), mask = ref->get("attention_mask");
  auto lm = load(model, "checkpoint_fp32", dev);
  for (const char* backend : {"eager", "batched_mm", "grouped_mm"}) {
    lm->set_experts_implementation(backend);
    const double err = test::rel_l2_error(real_rows(lm->logits(ids, mask), mask),
                                          real_rows(ref->get("logits_fp32"), mask));
    std::printf("%s %s %s padded fp32 rel L2 %.3g\n", model.c_str(), backend, dev.str().c_str(), err);
    // The unpadded fixtures' bound: float32 summation order, not a wrong mask or position.
    EXPECT_LE(err, fp32_bound) << model << " with " << backend;
  }
  // Stop tokens off, as the reference was made: every row runs all 8 steps.
  lm->set_experts_implementation("grouped_mm");
  const Tensor want = ref->get("greedy_fp32");
  EXPECT_EQ(lm->generate(ids, greedy(want.size(1) - ids.size(1)), mask).to_int_vector(), want.to_int_vector())
      << model;

  auto bf16 = load(model, "checkpoint_bf16", dev);
  const double err = test::rel_l2_error(real_rows(bf16->logits(ids, mask), mask),
                                        real_rows(ref->get("logits_bf16"), mask));
  // The bf16 bound of test_model_fixtures.cpp (a few bf16 roundings amplified through layers).
  const double tol = 4.0 * std::ldexp(1.0, -8);
  std::printf("%s padded bf16 rel L2 %.3g (tolerance %.3g)\n", model.c_str(), err, tol);
  EXPECT_LE(err, tol) << model;
}

INSTANTIATE_TEST_SUITE_P(ThreeModels, LeftPaddingTransformers,
                         ::testing::Combine(::testing::Values("qwen2_moe", "gpt_oss", "deepseek_v3"),
                                            ::testing::Values("cpu", "cuda")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// A mask without padding (all ones, or none at all) is the unpadded path exactly.
TEST(LeftPaddingMask, AllOnesEqualsNoMask) {
  auto lm = load("qwen2_moe", "checkpoint_fp32");
  const Tensor ids = Tensor::from_ints({5, 6, 7, 8, 9, 10}, {2, 3});
  const Tensor ones = Tensor::from_ints({1, 1, 1, 1, 1, 1}, {2, 3}, DType::kI32);
  EXPECT_EQ(lm->logits(ids, ones).to_float_vector(), lm->logits(ids).to_float_vector());
  EXPECT_EQ(lm->generate(ids, greedy(4), ones).to_int_vector(), lm->generate(ids, greedy(4)).to_int_vector());
}

// The mask may come as int64, int32 or bool (what torch users hold); all mean the same.
TEST(LeftPaddingMask, IntegerAndBoolMasksAgree) {
  auto lm = load("mixtral", "checkpoint_fp32");
  const Tensor ids = Tensor::from_ints({0, 0, 7, 8, 3, 4, 5, 6}, {2, 4});
  const std::vector<int64_t> m = {0, 0, 1, 1, 1, 1, 1, 1};
  const auto want = lm->logits(ids, Tensor::from_ints(m, {2, 4})).to_float_vector();
  EXPECT_EQ(lm->logits(ids, Tensor::from_ints(m, {2, 4}, DType::kI32)).to_float_vector(), want);
  Tensor as_bool = Tensor::empty({2, 4}, DType::kBool);
  for (size_t i = 0; i < m.size(); ++i) as_bool.data<uint8_t>()[i] = uint8_t(m[i]);
  EXPECT_EQ(lm->logits(ids, as_bool).to_float_vector(), want);
}

// Each bad mask is an InvalidInput whose message names the problem (and the row at fault).
TEST(LeftPaddingMask, BadMasksNameTheProblem) {
  auto lm = load("qwen2_moe", "checkpoint_fp32");
  const Tensor ids = Tensor::from_ints({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  auto expect_invalid = [&](const Tensor& mask, const std::string& needle, const std::string& what) {
    for (int call = 0; call < 2; ++call) {
      try {
        if (call == 0) lm->logits(ids, mask);
        else lm->generate(ids, greedy(2), mask);
        ADD_FAILURE() << what << ": no InvalidInput";
      } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << what << ": expected '" << needle << "' in: " << e.what();
      }
    }
  };
  expect_invalid(Tensor::from_ints({1, 1, 1, 1, 1, 0, 1, 1, 1}, {3, 3}), "row 1 is not left padding",
                 "right padding");
  expect_invalid(Tensor::from_ints({1, 1, 1, 0, 1, 0, 1, 1, 1}, {3, 3}), "row 1 is not left padding",
                 "a hole");
  expect_invalid(Tensor::from_ints({1, 1, 1, 1, 1, 1, 0, 0, 0}, {3, 3}), "row 2 has no token", "all-zero row");
  expect_invalid(Tensor::from_ints({1, 1, 1, 1, 1, 1}, {2, 3}), "shape of input_ids", "too few rows");
  expect_invalid(Tensor::from_ints({1, 1, 1, 1, 1, 1, 1, 1, 1}, {9}), "shape of input_ids", "1-D");
  expect_invalid(Tensor::from_ints({1, 1, 1, 1, 2, 1, 1, 1, 1}, {3, 3}), "row 1 holds 2", "a 2");
  expect_invalid(Tensor::from_ints({1, 1, 1, 1, 1, 1, -1, 1, 1}, {3, 3}), "row 2 holds -1", "a -1");
  expect_invalid(Tensor::from_floats({1, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 3}), "integer or bool", "float mask");
}

// Padding ids are still validated as ids.
TEST(LeftPaddingMask, PaddingIdsMustBeInTheVocabulary) {
  auto lm = load("qwen2_moe", "checkpoint_fp32");
  const Tensor ids = Tensor::from_ints({256, 2, 3, 4}, {2, 2});
  const Tensor mask = Tensor::from_ints({0, 1, 1, 1}, {2, 2});
  EXPECT_THROW(lm->logits(ids, mask), InvalidInput);
  EXPECT_THROW(lm->generate(ids, greedy(1), mask), InvalidInput);
}

}  // namespace
}  // namespace moex
