// Bad input reaching the CLI (MOEX_CLI_PATH) as a user would give it: each is one error line on
// stderr and a non-zero exit, never a crash, a hang, a lost output or a replaced device file.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

namespace fs = std::filesystem;
using Result = test::CliResult;

class CliInput : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_cli_input_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    inputs_ = tmp_ + "/in.safetensors";
    save_safetensors(inputs_, {{"input_ids", Tensor::from_ints({3, 1, 4, 1, 5}, {1, 5})}});
  }
  void TearDown() override { fs::remove_all(tmp_); }

  Result run(const std::string& args) { return test::run_cli(args, tmp_); }
  // Exit status of `moex ARGS` run through the shell with REDIRECTS of its own; stderr in r.err.
  Result run_redirected(const std::string& args, const std::string& redirects) {
    const std::string err = tmp_ + "/stderr_redirected";
    const int status = std::system((std::string(MOEX_CLI_PATH) + " " + args + " " + redirects + " 2>" + err).c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = test::read_file(err);
    return r;
  }
  static void expect_one_error_line(const Result& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  }
  static std::string model(const std::string& name = "qwen3_moe") {
    return test::data_path("hf-tiny/" + name + "/checkpoint_fp32");
  }
  std::string logits(const std::string& out) {
    return "logits --model " + model() + " --inputs " + inputs_ + " --out '" + out + "'";
  }

  std::string tmp_, inputs_;
};

TEST_F(CliInput, StdoutWriteErrorsAreNotExitZero) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  Result r = run_redirected("--help", ">/dev/full");
  expect_one_error_line(r, "writing to standard output failed");
  r = run_redirected("info --model " + model(), ">/dev/full");
  expect_one_error_line(r, "writing to standard output failed");
  // The same commands succeed when stdout can be written.
  EXPECT_EQ(run_redirected("info --model " + model(), ">/dev/null").exit_code, 0);
}

TEST_F(CliInput, LogitsOutToDevNullKeepsTheDevice) {
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  if (!S_ISCHR(st.st_mode)) GTEST_SKIP() << "/dev/null is not a character device here";
  Result r = run(logits("/dev/null"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null was replaced";
}

TEST_F(CliInput, LogitsOutFolderIsOneError) {
  fs::create_directory(tmp_ + "/dir");
  expect_one_error_line(run(logits(tmp_ + "/dir")), "is a folder");
  EXPECT_TRUE(fs::is_directory(tmp_ + "/dir"));
}

// A file name is bytes; the JSON summary must stay valid UTF-8 (it used to end in exit 2 with a
// raw JSON-library message after the file was written).
TEST_F(CliInput, LogitsOutNonUtf8NameWritesTheFileAndValidJson) {
  const std::string out = tmp_ + "/logits\xff\xfe.safetensors";
  Result r = run(logits(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out));
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["out"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << j["out"];
}

// (R*H + H*I) * bytes used to wrap around int64: the memory check passed and the process was
// killed, hung or crashed. Now: one error at once, with the rule it applies.
TEST_F(CliInput, BenchSizesThatOverflowAreOneError) {
  for (const char* sizes : {"--experts 1000000 --top-k 2 --hidden 1000000000 --intermediate 1000000000",
                            "--experts 4611686018427387904 --top-k 1 --hidden 4611686018427387904 "
                            "--intermediate 4611686018427387904",
                            "--experts 8 --top-k 2 --hidden 64 --intermediate 64 --tokens 4611686018427387904"}) {
    SCOPED_TRACE(sizes);
    const auto t0 = std::chrono::steady_clock::now();
    Result r = run(std::string("bench experts --device cpu --bandwidth-gbs 10 --peak-tflops 1 ") + sizes);
    expect_one_error_line(r, "more than 80 % of the");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  }
}

TEST_F(CliInput, SeedTakesTheWholeUint64RangeAndNothingElse) {
  const std::string base = "generate --model " + model() + " --prompt-ids 1,2,3 --max-new-tokens 2 --seed ";
  EXPECT_EQ(run(base + "18446744073709551615").exit_code, 0);
  EXPECT_EQ(run(base + "0").exit_code, 0);
  for (const char* bad : {"-1", "18446744073709551616", "+3", "1e3", "' 7'"}) {
    SCOPED_TRACE(bad);
    expect_one_error_line(run(base + bad), "--seed must be an integer in [0, 18446744073709551615]");
  }
}

// A NUL in a shard name cut the error line at the NUL (and a name "a\0b" would have opened "a").
TEST_F(CliInput, NulInShardNameIsShownEscaped) {
  const std::string dir = tmp_ + "/ckpt";
  fs::create_directory(dir);
  fs::copy_file(model() + "/config.json", dir + "/config.json");
  fs::create_symlink(model() + "/model.safetensors", dir + "/model-00001.safetensors");
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "model-00001.safetensors\u0000.evil"}})";
  expect_one_error_line(run("info --model " + dir), "model-00001.safetensors\\x00.evil");
}

// pad_token_id must be an id of the vocabulary: a string, a float or an id past the vocabulary
// is one error naming the file and key (it pads the shorter prompts of a batch).
TEST_F(CliInput, PadTokenIdThatIsNotAnIdIsOneError) {
  const nlohmann::json base = nlohmann::json::parse(test::read_file(model() + "/config.json"));
  const int64_t vocab = base.at("vocab_size").get<int64_t>();
  int i = 0;
  for (const nlohmann::json& bad : {nlohmann::json("0"), nlohmann::json(1.5), nlohmann::json(-1),
                                    nlohmann::json(vocab), nlohmann::json::array({"x"})}) {
    const std::string dir = tmp_ + "/pad" + std::to_string(i++);
    fs::create_directory(dir);
    nlohmann::json c = base;
    c["pad_token_id"] = bad;
    std::ofstream(dir + "/config.json") << c.dump();
    fs::create_symlink(model() + "/model.safetensors", dir + "/model.safetensors");
    SCOPED_TRACE(bad.dump());
    expect_one_error_line(run("generate --model " + dir + " --prompt-ids '1,2,3;4,5' --max-new-tokens 2"),
                          "config.json: pad_token_id");
  }
}

}  // namespace
}  // namespace moex
