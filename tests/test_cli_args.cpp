// The CLI's surface, run as a user would (MOEX_CLI_PATH): --help and -h on every command and
// subcommand (exit 0, usage and every flag on stdout), --version, and the parser's strictness:
// unknown positional words, repeated flags, empty values, a flag where a value belongs, and an
// experts SPEC with a key given twice, each one error line and exit 2.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/model.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

using Result = test::CliResult;

class CliArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_cli_args_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }
  Result run(const std::string& args) { return test::run_cli(args, tmp_); }
  void expect_clean_error(const std::string& args, const std::string& needle) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  }
  static std::string qwen2() { return test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"); }

  std::string tmp_;
};

// Every command with the flags its help must list (a sample: the table is the single source).
struct HelpCase {
  std::string command;
  std::vector<std::string> flags;
};
const std::vector<HelpCase> kHelpCases = {
    {"generate", {"--model DIR", "--prompt TEXT", "--prompt-file PATH", "--prompt-ids IDS", "--max-new-tokens N",
                  "--greedy", "--temperature", "--top-k", "--top-p", "--seed", "--json", "--out",
                  "--dtype", "--device", "--experts-implementation", "--decode-switch", "--graph"}},
    {"tokenize", {"--model DIR", "--text", "--decode", "--no-special-tokens", "--skip-special-tokens"}},
    {"info", {"--model DIR", "--dtype", "--device", "--experts-implementation"}},
    {"logits", {"--model DIR", "--inputs", "--out", "--dtype"}},
    {"backends", {"--json"}},
    {"bench generate", {"--model DIR", "--batch", "--prompt-tokens", "--cases", "--new-tokens", "--repeats",
                        "--bandwidth-gbs", "--peak-tflops", "--json", "--graph", "--decode-switch"}},
    {"bench experts", {"--device", "--shape", "--experts", "--top-k", "--hidden", "--intermediate", "--tokens",
                       "--backends", "--graph", "--no-check", "--cpu-kernel", "--json"}},
    {"version", {}},
};

TEST_F(CliArgs, HelpOnEveryCommand) {
  for (const auto& c : kHelpCases) {
    for (const char* h : {"--help", "-h"}) {
      Result r = run(c.command + " " + h);
      EXPECT_EQ(r.exit_code, 0) << c.command << " " << h << "\n" << r.err;
      EXPECT_TRUE(r.err.empty()) << r.err;
      EXPECT_EQ(r.out.rfind("usage: moex " + c.command, 0), 0u) << r.out;
      EXPECT_NE(r.out.find("--help"), std::string::npos) << r.out;
      for (const auto& f : c.flags) EXPECT_NE(r.out.find(f), std::string::npos) << c.command << ": " << f;
      // One line per flag: the flag, then its meaning on the same line.
      for (const auto& f : c.flags) {
        const size_t at = r.out.find("  " + f);
        if (at == std::string::npos) continue;
        const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
        EXPECT_GT(line.size(), f.size() + 10) << "no meaning on the line of " << f << ": " << line;
      }
    }
  }
  // Help wins over the other flags, even invalid ones, and after them.
  Result r = run("generate --model " + qwen2() + " --bogus --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("usage: moex generate", 0), 0u);
  // A flag where a value belongs is no value: help again.
  r = run("generate --prompt --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("usage: moex generate", 0), 0u);
  // A value that reads "-h" is a value, not a help request.
  r = run("tokenize --model " + test::data_path("tokenizers/qwen2_bytelevel") + " --text -h");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"ids\""), std::string::npos) << r.out;
}

TEST_F(CliArgs, TopLevelHelpAndBench) {
  for (const char* h : {"--help", "-h"}) {
    Result r = run(h);
    EXPECT_EQ(r.exit_code, 0);
    for (const char* cmd : {"generate", "tokenize", "info", "logits", "backends", "bench", "version"})
      EXPECT_NE(r.out.find(std::string("  ") + cmd + " "), std::string::npos) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("--plugin"), std::string::npos);
    r = run(std::string("bench ") + h);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("bench generate"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("bench experts"), std::string::npos) << r.out;
  }
  // No command: the usage, as an error.
  Result r = run("");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("usage: moex"), std::string::npos);
  expect_clean_error("frobnicate", "unknown command 'frobnicate'");
  expect_clean_error("--frobnicate", "unknown option '--frobnicate'");
  expect_clean_error("bench", "missing subcommand");
  expect_clean_error("bench run", "unknown subcommand 'run'");
}

TEST_F(CliArgs, Version) {
  for (const char* v : {"--version", "version"}) {
    Result r = run(v);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("moex ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find_first_of("0123456789"), std::string::npos) << r.out;
  }
  expect_clean_error("version extra", "unexpected argument 'extra'");
}

TEST_F(CliArgs, StrictParsing) {
  const std::string m = " --model " + qwen2();
  // Unknown positional words (a forgotten flag name, a stray value).
  expect_clean_error("generate" + m + " --prompt-ids 1 hello", "unexpected argument 'hello'");
  expect_clean_error("info" + m + " extra", "unexpected argument 'extra'");
  expect_clean_error("tokenize stray --model " + qwen2() + " --text a", "unexpected argument 'stray'");
  expect_clean_error("backends list", "unexpected argument 'list'");
  // Repeated flags: valued, switches, and the "=" form.
  expect_clean_error("generate" + m + m + " --prompt-ids 1", "--model given twice");
  expect_clean_error("generate" + m + " --prompt-ids 1 --greedy --greedy", "--greedy given twice");
  expect_clean_error("generate" + m + " --prompt-ids 1 --max-new-tokens=2 --max-new-tokens 3",
                     "--max-new-tokens given twice");
  expect_clean_error("bench experts --tokens 1 --tokens 2", "--tokens given twice");
  // Empty values.
  for (const char* flag : {"dtype", "device", "experts-implementation", "max-new-tokens", "out"}) {
    expect_clean_error("generate" + m + " --prompt-ids 1 --" + flag + " ''", std::string("empty value for --") + flag);
    expect_clean_error("generate" + m + " --prompt-ids 1 --" + flag + "=", std::string("empty value for --") + flag);
  }
  expect_clean_error("generate --model '' --prompt-ids 1", "empty value for --model");
  expect_clean_error("info" + m + " --device ''", "empty value for --device");
  expect_clean_error("bench generate" + m + " --dtype ''", "empty value for --dtype");
  expect_clean_error("bench experts --device ''", "empty value for --device");
  // A flag where a value belongs; the "=" form is the way to give a value that starts with --.
  expect_clean_error("generate --model --prompt-ids 1", "missing value for --model");
  expect_clean_error("generate" + m + " --prompt-ids", "missing value for --prompt-ids");
  // Unknown flags list the known ones; switches take no value.
  expect_clean_error("generate" + m + " --prompt-ids 1 --max-tokens 3", "unknown flag --max-tokens; known:");
  expect_clean_error("generate" + m + " --prompt-ids 1 --greedy=yes", "--greedy takes no value");
  // Text prompts are exclusive with each other and with ids.
  expect_clean_error("generate" + m + " --prompt a --prompt-ids 1", "exactly one of --prompt");
  expect_clean_error("generate" + m + " --prompt a --prompt-file f", "exactly one of --prompt");
  expect_clean_error("generate" + m, "exactly one of --prompt");
}

TEST_F(CliArgs, ExpertsSpecWithARepeatedKeyIsAnError) {
  const std::string m = " --model " + test::data_path("hf-tiny/qwen3_vl_moe/checkpoint_fp32");
  expect_clean_error("info" + m + R"( --experts-implementation '{"text_config":"eager","text_config":"grouped_mm"}')",
                     "duplicate key 'text_config'");
  expect_clean_error("info" + m + R"( --experts-implementation '{"":"eager","":"eager"}')", "duplicate key ''");
  expect_clean_error("info" + m + R"( --experts-implementation '{"text_config":"eager"')", "invalid JSON");
  // The same spec without the repeat loads.
  Result r = run("info" + m + R"( --experts-implementation '{"text_config":"eager","":"grouped_mm"}')");
  EXPECT_EQ(r.exit_code, 0) << r.err;

  EXPECT_THROW(parse_experts_implementation(R"({"a":"eager","b":"x","a":"y"})"), InvalidInput);
  EXPECT_THROW(parse_experts_implementation(R"({"a":{"b":"x","b":"y"}})"), InvalidInput);
  EXPECT_THROW(parse_experts_implementation(""), InvalidInput);
  EXPECT_THROW(parse_experts_implementation("  "), InvalidInput);
  EXPECT_EQ(parse_experts_implementation(R"( {"text_config": "eager", "": "batched_mm"} )"),
            (ExpertsImplementation{{"", "batched_mm"}, {"text_config", "eager"}}));
  EXPECT_EQ(parse_experts_implementation("eager"), (ExpertsImplementation{{"", "eager"}}));
}

}  // namespace
}  // namespace moex
