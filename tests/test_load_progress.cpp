// LoadOptions::progress: called as the weights are read, with bytes that only grow, a total equal
// to the checkpoint's tensor bytes, and a last call with done == total.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "moex/checkpoint.hpp"
#include "moex/model.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

TEST(LoadProgress, GrowsToTheCheckpointsBytes) {
  for (const char* name : {"qwen2_moe", "gpt_oss", "deepseek_v3"}) {
    const std::string dir = test::data_path(std::string("hf-tiny/") + name + "/checkpoint_fp32");
    auto ckpt = Checkpoint::open(dir);
    int64_t bytes = 0;
    for (const auto& n : ckpt->names()) bytes += int64_t(ckpt->get(n).nbytes());
    std::vector<std::pair<int64_t, int64_t>> calls;
    LoadOptions o;
    o.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
    auto lm = from_pretrained(dir, o);
    ASSERT_GT(calls.size(), 2u) << name;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].second, bytes) << name;
      EXPECT_LE(calls[i].first, calls[i].second) << name;
      if (i) EXPECT_GE(calls[i].first, calls[i - 1].first) << name;
    }
    EXPECT_EQ(calls.back().first, bytes) << name;
    // Most of the bytes are counted as they are read, not only by the final call.
    EXPECT_GT(calls[calls.size() - 2].first, bytes / 2) << name;
  }
}

}  // namespace
}  // namespace moex
