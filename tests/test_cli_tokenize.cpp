// `moex tokenize` run as a user would (MOEX_CLI_PATH), on a directory that holds only
// tokenizer.json, against the Hugging Face tokenizers reference; bad input gives one error line.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

namespace moex {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Single quotes for the shell, with embedded quotes closed and reopened.
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class CliTokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_cli_tok_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    model_ = tmp_ + "/model";
    std::filesystem::create_directory(model_);
    std::filesystem::copy_file(test::data_path("tokenizers/llama_sentencepiece_bpe/tokenizer.json"),
                               model_ + "/tokenizer.json");
    ref_ = nlohmann::json::parse(slurp(test::data_path("tokenizers/llama_sentencepiece_bpe/reference.json")));
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }

  int run(const std::string& args, std::string* out, std::string* err) {
    const std::string o = tmp_ + "/stdout", e = tmp_ + "/stderr";
    const int status = std::system((std::string(MOEX_CLI_PATH) + " " + args + " >" + o + " 2>" + e).c_str());
    *out = slurp(o);
    *err = slurp(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string tmp_, model_;
  nlohmann::json ref_;
};

TEST_F(CliTokenize, EncodeAndDecodeMatchReference) {
  int checked = 0;
  for (const auto& c : ref_.at("cases")) {
    const std::string text = c.at("text");
    // Shell arguments cannot carry NUL; keep the command lines short.
    if (text.find('\0') != std::string::npos || text.size() > 200 || text.empty()) continue;
    if (++checked > 12) break;
    std::string out, err;
    ASSERT_EQ(run("tokenize --model " + model_ + " --text " + quote(text), &out, &err), 0) << err;
    auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j.at("ids"), c.at("ids")) << text;
    ASSERT_EQ(run("tokenize --model " + model_ + " --no-special-tokens --text " + quote(text), &out, &err), 0) << err;
    j = nlohmann::json::parse(out);
    EXPECT_EQ(j.at("ids"), c.at("ids_no_special")) << text;
    EXPECT_EQ(j.at("tokens"), c.at("tokens")) << text;

    std::string ids;
    for (const auto& id : c.at("ids")) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
    ASSERT_EQ(run("tokenize --model " + model_ + " --decode " + ids + " --skip-special-tokens", &out, &err), 0) << err;
    EXPECT_EQ(nlohmann::json::parse(out).at("text"), c.at("decoded_skip_special")) << text;
  }
  EXPECT_GT(checked, 10);
}

TEST_F(CliTokenize, BadInputIsOneErrorLine) {
  for (const std::string& args : {"tokenize --model " + model_,
                                  "tokenize --model " + model_ + " --text a --decode 1",
                                  "tokenize --model " + model_ + " --decode 1,x",
                                  "tokenize --model " + model_ + " --decode 999999",
                                  "tokenize --model " + tmp_ + "/nowhere --text a"}) {
    std::string out, err;
    EXPECT_EQ(run(args, &out, &err), 2) << args;
    EXPECT_TRUE(out.empty()) << out;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find("error"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace moex
