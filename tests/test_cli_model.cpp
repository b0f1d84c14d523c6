// The model commands of the CLI, run as a user would (MOEX_CLI_PATH): generate, logits and info
// against the transformers fixtures, and bad input answered by one clear error line and exit 2.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

struct Result {
  int exit_code = -1;  // -1: killed by a signal
  std::string out, err;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_cli_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }

  // Runs `moex ARGS` (ARGS already shell-quoted) and captures stdout and stderr separately.
  Result run(const std::string& args) {
    const std::string out = tmp_ + "/stdout", err = tmp_ + "/stderr";
    const std::string cmd = std::string(MOEX_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
    const int status = std::system(cmd.c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
  }
  // A bad-input run: non-zero exit (not a crash), nothing on stdout, exactly one stderr line that
  // says "error" and contains `needle`.
  void expect_clean_error(const std::string& args, const std::string& needle) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    ASSERT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  }

  static std::string model(const std::string& name, const std::string& ckpt = "checkpoint_fp32") {
    return test::data_path("hf-tiny/" + name + "/" + ckpt);
  }
  static std::shared_ptr<SafetensorsFile> reference(const std::string& name) {
    return SafetensorsFile::open(test::data_path("hf-tiny/" + name + "/reference.safetensors"));
  }

  std::string tmp_;
};

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

TEST_F(Cli, GenerateGreedyMatchesTransformersWithEveryBackend) {
  auto ref = reference("qwen2_moe");
  const auto greedy = ref->get("greedy_fp32").to_int_vector();
  const auto prompt = std::vector<int64_t>(greedy.begin(), greedy.begin() + 11);
  for (const char* backend : {"eager", "batched_mm", "grouped_mm"}) {
    const std::string out = tmp_ + "/seq.safetensors";
    Result r = run("generate --model " + model("qwen2_moe") + " --prompt-ids " + join(prompt) +
                   " --max-new-tokens 12 --greedy --experts-implementation " + backend + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["sequences"][0].get<std::vector<int64_t>>(), greedy) << backend;
    EXPECT_EQ(j["experts_implementation"][""], backend);
    EXPECT_EQ(j["new_tokens"], 12);
    Tensor seq = SafetensorsFile::open(out)->get("sequences");
    EXPECT_EQ(seq.dtype(), DType::kI64);
    EXPECT_EQ(seq.shape(), (Shape{1, 23}));
    EXPECT_EQ(seq.to_int_vector(), greedy);
  }
}

TEST_F(Cli, GenerateSamplingIsSeeded) {
  const std::string args = "generate --model " + model("mixtral") +
                           " --prompt-ids 5,6,7 --max-new-tokens 6 --temperature 0.9 --top-k 50 --top-p 0.95 --seed 11";
  Result a = run(args), b = run(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["sequences"], nlohmann::json::parse(b.out)["sequences"]);
}

TEST_F(Cli, GenerateBf16) {
  Result r = run("generate --model " + model("olmoe", "checkpoint_bf16") + " --prompt-ids 1,2,3 --max-new-tokens 4 --dtype bfloat16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(j["sequences"][0].size(), 7u);
}

TEST_F(Cli, LogitsMatchTransformers) {
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    auto ref = reference(name);
    const std::string in = tmp_ + "/in.safetensors", out = tmp_ + "/out.safetensors";
    save_safetensors(in, {{"input_ids", ref->get("input_ids")}});
    Result r = run("logits --model " + model(name) + " --inputs " + in + " --out " + out +
                   " --experts-implementation batched_mm");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Tensor logits = SafetensorsFile::open(out)->get("logits");
    EXPECT_EQ(logits.dtype(), DType::kF32);
    EXPECT_LE(test::rel_l2_error(logits, ref->get("logits_fp32_batched_mm")), 1e-4) << name;
  }
}

TEST_F(Cli, InfoReportsTheModelAndTheExpertsMap) {
  Result r = run("info --model " + model("qwen3_vl_moe") + " --experts-implementation '{\"\": \"batched_mm\"}'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "qwen3_vl_moe");
  EXPECT_EQ(j["architecture"], "Qwen3VLMoeForConditionalGeneration");
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_GT(j["parameter_count"].get<int64_t>(), 0);
  EXPECT_EQ(j["moe_layers"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(j["experts_implementation"],
            nlohmann::json({{"", "batched_mm"}, {"text_config", "batched_mm"}, {"vision_config", "batched_mm"}}));

  r = run("info --model " + model("qwen2_moe", "checkpoint_bf16"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(j["experts_implementation"], nlohmann::json({{"", "grouped_mm"}}));
}

TEST_F(Cli, BadInputGivesOneClearError) {
  const std::string q2 = " --model " + model("qwen2_moe");
  expect_clean_error("generate" + q2 + " --prompt-ids 1,2,256", "256");
  expect_clean_error("generate" + q2 + " --prompt-ids ''", "empty prompt");
  expect_clean_error("generate" + q2 + " --prompt-ids 1 --experts-implementation fastest", "fastest");
  expect_clean_error("generate --model " + model("qwen3_vl_moe") +
                         " --prompt-ids 1 --experts-implementation '{\"audio_config\": \"eager\"}'",
                     "audio_config");
  expect_clean_error("info" + q2 + " --experts-implementation '{\"text_config\": \"eager\"}'", "text_config");
  expect_clean_error("generate" + q2 + " --prompt-ids 1 --device cuda:99", "cuda:99");
  expect_clean_error("generate" + q2 + " --prompt-ids 1 --greedy --seed 3", "--greedy");
  expect_clean_error("generate" + q2 + " --prompt-ids 1,x", "x");

  // Unknown model_type: a folder whose config names an architecture moex does not have.
  const std::string dir = tmp_ + "/unknown";
  std::filesystem::create_directory(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama4_moe"})";
  std::filesystem::copy_file(model("qwen2_moe") + "/model.safetensors", dir + "/model.safetensors");
  expect_clean_error("info --model " + dir, "llama4_moe");

  // logits: token ids out of range, and an inputs file without input_ids.
  const std::string in = tmp_ + "/bad.safetensors";
  save_safetensors(in, {{"input_ids", Tensor::from_ints({1, 2, 999}, {1, 3})}});
  expect_clean_error("logits" + q2 + " --inputs " + in + " --out " + tmp_ + "/o.safetensors", "999");
  save_safetensors(in, {{"tokens", Tensor::from_ints({1, 2}, {1, 2})}});
  expect_clean_error("logits" + q2 + " --inputs " + in + " --out " + tmp_ + "/o.safetensors", "input_ids");
}

}  // namespace
}  // namespace moex
