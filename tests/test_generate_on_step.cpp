// GenerationOptions::on_step, what streaming is built on: one call per generated position, in
// order, each with the ids that end up in that column of the result; a finished row repeats its
// stop token; an exception thrown by the callback leaves generate() and the model usable.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

std::unique_ptr<CausalLM> load() {
  return from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"));
}

Tensor prompts(int64_t rows) {
  return SafetensorsFile::open(test::data_path("hf-tiny/qwen2_moe/reference.safetensors"))
      ->get("input_ids")
      .slice(0, 0, rows)
      .contiguous();
}

// Column `c` of a [B, L] int64 result.
std::vector<int64_t> column(const Tensor& seq, int64_t c) {
  const auto flat = seq.to_int_vector();
  std::vector<int64_t> out;
  for (int64_t b = 0; b < seq.size(0); ++b) out.push_back(flat[size_t(b * seq.size(1) + c)]);
  return out;
}

TEST(GenerateOnStep, OneCallPerNewTokenWithThatColumn) {
  auto lm = load();
  for (int64_t n : {0, 1, 2, 9}) {
    for (int64_t B : {1, 2}) {
      const Tensor p = prompts(B);
      std::vector<std::vector<int64_t>> calls;
      GenerationOptions g;
      g.max_new_tokens = n;
      g.on_step = [&](std::span<const int64_t> ids) { calls.emplace_back(ids.begin(), ids.end()); };
      const Tensor seq = lm->generate(p, g);
      const int64_t T = p.size(1);
      // qwen2_moe's fixture has no stop token: every asked token is generated.
      ASSERT_EQ(seq.size(1), T + n) << "n=" << n << " B=" << B;
      ASSERT_EQ(int64_t(calls.size()), n) << "n=" << n << " B=" << B;
      ASSERT_EQ(int64_t(calls.size()), lm->last_generation_stats().new_tokens);
      for (size_t i = 0; i < calls.size(); ++i)
        EXPECT_EQ(calls[i], column(seq, T + int64_t(i))) << "step " << i << " n=" << n << " B=" << B;
    }
  }
}

// Row 0 stops at its 3rd new token; the callback keeps coming for row 1, with row 0 repeating
// its stop token, and stops with generate().
TEST(GenerateOnStep, FinishedRowsRepeatTheirStopToken) {
  auto lm = load();
  const Tensor p = prompts(2);
  const int64_t T = p.size(1);
  GenerationOptions g;
  g.max_new_tokens = 8;
  g.eos_token_ids = std::vector<int64_t>{};
  const Tensor free_run = lm->generate(p, g);
  const int64_t stop = column(free_run, T + 2)[0];
  g.eos_token_ids = std::vector<int64_t>{stop};
  std::vector<std::vector<int64_t>> calls;
  g.on_step = [&](std::span<const int64_t> ids) { calls.emplace_back(ids.begin(), ids.end()); };
  const Tensor seq = lm->generate(p, g);
  ASSERT_EQ(int64_t(calls.size()), seq.size(1) - T);
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i], column(seq, T + int64_t(i)));
  bool stopped = false;
  for (const auto& c : calls) {
    if (stopped) EXPECT_EQ(c[0], stop);
    stopped = stopped || c[0] == stop;
  }
  EXPECT_TRUE(stopped);
}

TEST(GenerateOnStep, AnExceptionFromTheCallbackEndsGenerate) {
  auto lm = load();
  const Tensor p = prompts(1);
  GenerationOptions g;
  g.max_new_tokens = 6;
  int calls = 0;
  g.on_step = [&](std::span<const int64_t>) {
    if (++calls == 3) throw std::runtime_error("enough");
  };
  EXPECT_THROW(lm->generate(p, g), std::runtime_error);
  EXPECT_EQ(calls, 3);
  // The model is intact: the same request without the callback runs to the end.
  g.on_step = nullptr;
  EXPECT_EQ(lm->generate(p, g).size(1), p.size(1) + 6);
}

}  // namespace
}  // namespace moex
