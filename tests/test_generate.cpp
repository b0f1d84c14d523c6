// generate(): stop tokens (from options and from generation_config.json), max_new_tokens,
// batches, sampling (seeded, temperature / top-k / top-p limits) and invalid input.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

std::unique_ptr<CausalLM> load(const std::string& model = "qwen2_moe") {
  LoadOptions o;
  o.experts_implementation = {{"", "grouped_mm"}};
  return from_pretrained(test::data_path("hf-tiny/" + model + "/checkpoint_fp32"), o);
}

Tensor reference_ids(const std::string& model = "qwen2_moe") {
  return SafetensorsFile::open(test::data_path("hf-tiny/" + model + "/reference.safetensors"))
      ->get("input_ids");
}

GenerationOptions greedy(int64_t n) {
  GenerationOptions g;
  g.max_new_tokens = n;
  g.eos_token_ids = std::vector<int64_t>{};
  return g;
}

TEST(Generate, StopsAtAStopToken) {
  auto lm = load();
  Tensor prompt = reference_ids().slice(0, 0, 1).contiguous();
  const auto full = lm->generate(prompt, greedy(12)).to_int_vector();
  const int64_t T = prompt.size(1);
  // Pick the 4th generated token as the stop token: generation ends right after its first use.
  const int64_t stop = full[size_t(T + 3)];
  size_t first = size_t(T);
  while (full[first] != stop) ++first;
  GenerationOptions g = greedy(12);
  g.eos_token_ids = std::vector<int64_t>{999999, stop};
  const auto cut = lm->generate(prompt, g).to_int_vector();
  EXPECT_EQ(cut, std::vector<int64_t>(full.begin(), full.begin() + int64_t(first) + 1));
  EXPECT_EQ(lm->last_generation_stats().new_tokens, int64_t(first) + 1 - T);
}

TEST(Generate, DefaultStopTokensComeFromGenerationConfig) {
  EXPECT_EQ(load("mixtral")->default_eos_token_ids(), std::vector<int64_t>{2});
  EXPECT_EQ(load("olmoe")->default_eos_token_ids(), std::vector<int64_t>{50279});
  EXPECT_TRUE(load("qwen2_moe")->default_eos_token_ids().empty());
}

TEST(Generate, ZeroNewTokensReturnsThePrompt) {
  auto lm = load();
  Tensor prompt = Tensor::from_ints({3, 4, 5}, {1, 3});
  EXPECT_EQ(lm->generate(prompt, greedy(0)).to_int_vector(), (std::vector<int64_t>{3, 4, 5}));
}

TEST(Generate, BatchRowsEqualSingleRuns) {
  auto lm = load();
  Tensor ids = reference_ids();  // [2, 11]
  const auto both = lm->generate(ids, greedy(5)).to_int_vector();
  const size_t L = both.size() / 2;
  for (int64_t b = 0; b < 2; ++b) {
    const auto one = lm->generate(ids.slice(0, b, b + 1).contiguous(), greedy(5)).to_int_vector();
    EXPECT_EQ(one, std::vector<int64_t>(both.begin() + int64_t(b * L), both.begin() + int64_t((b + 1) * L)))
        << "row " << b;
  }
}

TEST(Generate, FinishedSequencesArePaddedWithTheirStopToken) {
  auto lm = load();
  Tensor ids = reference_ids();  // [2, 11]
  const size_t T = 11, n = 6;
  const auto free_run = lm->generate(ids, greedy(int64_t(n))).to_int_vector();
  ASSERT_EQ(free_run.size(), 2 * (T + n));
  const std::vector<int64_t> row0(free_run.begin(), free_run.begin() + int64_t(T + n));
  const std::vector<int64_t> row1(free_run.begin() + int64_t(T + n), free_run.end());
  // Stop on row 0's first generated token; row 1 keeps going until it emits that token too.
  const int64_t stop = row0[T];
  size_t row1_stop = T;
  while (row1_stop < T + n && row1[row1_stop] != stop) ++row1_stop;
  // The fixture must leave row 1 running after row 0 stopped, or there is nothing to pad.
  ASSERT_GT(row1_stop, T) << "row 1 stops at once too; pick another stop token";
  const size_t len = row1_stop < T + n ? row1_stop + 1 : T + n;  // ends when every row is done

  GenerationOptions g = greedy(int64_t(n));
  g.eos_token_ids = std::vector<int64_t>{stop};
  const auto out = lm->generate(ids, g).to_int_vector();
  ASSERT_EQ(out.size(), 2 * len) << "generation must run until the last row stops";
  // Row 0: its prompt, the stop token, then the stop token as padding to the common length.
  std::vector<int64_t> want0(row0.begin(), row0.begin() + int64_t(T));
  want0.resize(len, stop);
  // Row 1: exactly its free run (padding row 0 must not change row 1).
  const std::vector<int64_t> want1(row1.begin(), row1.begin() + int64_t(len));
  EXPECT_EQ(std::vector<int64_t>(out.begin(), out.begin() + int64_t(len)), want0);
  EXPECT_EQ(std::vector<int64_t>(out.begin() + int64_t(len), out.end()), want1);
}

TEST(Sampling, SameSeedSameTokensAndTopK1IsGreedy) {
  auto lm = load();
  Tensor prompt = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
  GenerationOptions s = greedy(10);
  s.do_sample = true;
  s.temperature = 1.5f;
  s.seed = 7;
  const auto a = lm->generate(prompt, s).to_int_vector();
  EXPECT_EQ(lm->generate(prompt, s).to_int_vector(), a);
  std::set<std::vector<int64_t>> distinct;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    s.seed = seed;
    distinct.insert(lm->generate(prompt, s).to_int_vector());
  }
  EXPECT_GT(distinct.size(), 1u) << "different seeds never changed a 10-token sample";
  // top_k = 1 and a tiny top_p both leave only the most likely token: greedy.
  const auto g = lm->generate(prompt, greedy(10)).to_int_vector();
  s.top_k = 1;
  EXPECT_EQ(lm->generate(prompt, s).to_int_vector(), g);
  s.top_k = 0;
  s.top_p = 1e-6f;
  EXPECT_EQ(lm->generate(prompt, s).to_int_vector(), g);
}

TEST(Sampling, TopKLimitsTheChoices) {
  // With top_k = 3 every sampled token is among the 3 most likely at its step.
  auto lm = load();
  Tensor prompt = Tensor::from_ints({9, 8, 7}, {1, 3});
  GenerationOptions s = greedy(8);
  s.do_sample = true;
  s.top_k = 3;
  s.temperature = 5.0f;  // flatten, so that rank 2 and 3 are drawn often
  for (uint64_t seed = 0; seed < 4; ++seed) {
    s.seed = seed;
    const auto seq = lm->generate(prompt, s).to_int_vector();
    for (size_t n = 3; n < seq.size(); ++n) {
      Tensor logits = lm->logits(Tensor::from_ints(std::vector<int64_t>(seq.begin(), seq.begin() + int64_t(n)),
                                                   {1, int64_t(n)}));
      const auto f = logits.to_float_vector();
      const int64_t V = logits.size(2);
      const float* row = f.data() + (int64_t(n) - 1) * V;
      int64_t better = 0;
      for (int64_t v = 0; v < V; ++v) better += row[v] > row[seq[n]];
      EXPECT_LT(better, 3) << "seed " << seed << " step " << n;
    }
  }
}

TEST(GenerateErrors, InvalidInputsThrow) {
  auto lm = load();
  Tensor ok = Tensor::from_ints({1, 2}, {1, 2});
  EXPECT_THROW(lm->generate(Tensor::from_ints({}, {1, 0}), greedy(3)), InvalidInput);
  EXPECT_THROW(lm->generate(Tensor::from_ints({1, 256}, {1, 2}), greedy(3)), InvalidInput);
  EXPECT_THROW(lm->generate(Tensor::from_ints({-1}, {1, 1}), greedy(3)), InvalidInput);
  EXPECT_THROW(lm->logits(Tensor::from_floats({1, 2}, {1, 2})), InvalidInput);
  EXPECT_THROW(lm->logits(Tensor::from_ints({1, 2}, {2})), InvalidInput);
  GenerationOptions g = greedy(3);
  g.max_new_tokens = -1;
  EXPECT_THROW(lm->generate(ok, g), InvalidInput);
  g = greedy(3);
  g.do_sample = true;
  g.temperature = 0;
  EXPECT_THROW(lm->generate(ok, g), InvalidInput);
  g.temperature = 1;
  g.top_p = 0;
  EXPECT_THROW(lm->generate(ok, g), InvalidInput);
  g.top_p = 1;
  g.top_k = -2;
  EXPECT_THROW(lm->generate(ok, g), InvalidInput);
}

TEST(LoadErrors, UnknownModelTypeAndUnsupportedTargets) {
  EXPECT_THROW(from_pretrained(test::data_path("hf-tiny/does_not_exist")), Error);
  LoadOptions o;
  o.device = Device::cuda(99);  // no such device, with or without CUDA
  EXPECT_THROW(from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), o), Unsupported);
  o = LoadOptions{};
  o.dtype = DType::kF16;
  EXPECT_THROW(from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), o), Unsupported);
}

TEST(LoadErrors, UnknownModelTypeListsSupportedOnes) {
  char tmpl[] = "/tmp/moex_model_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    std::ofstream(dir + "/config.json") << R"({"model_type": "llama4_moe", "vocab_size": 8})";
  }
  std::filesystem::copy_file(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32/model.safetensors"),
                             dir + "/model.safetensors");
  try {
    from_pretrained(dir);
    FAIL() << "expected UnknownName";
  } catch (const UnknownName& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("llama4_moe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("qwen2_moe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mixtral"), std::string::npos) << msg;
  }
  std::filesystem::remove_all(dir);
}

TEST(LoadDefaults, DtypeComesFromTheCheckpoint) {
  auto lm = from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_bf16"));
  EXPECT_EQ(lm->info().dtype, DType::kBF16);
  EXPECT_EQ(lm->get_experts_implementation(), (ExpertsImplementation{{"", "grouped_mm"}}));
}

}  // namespace
}  // namespace moex
