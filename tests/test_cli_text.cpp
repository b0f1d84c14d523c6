// Text in, text out: `moex generate --prompt / --prompt-file` on a copy of the tiny qwen2_moe
// checkpoint (vocab 256) given a byte-level tokenizer whose ids fit it (bytes 0x00-0xFD as ids
// 0-253, which is every byte UTF-8 uses, plus the specials <s> = 254, added as BOS by the
// post-processor, and </s> = 255). The streamed text is the tokenizer's decode of the ids that
// --prompt-ids gives for the same prompt; stop tokens end it and are not printed; a checkpoint
// without tokenizer.json, or whose tokenizer yields ids outside the model's vocabulary, is one
// clear error. TextStream (src/cli) is checked directly on the Qwen2 fixture tokenizer: complete
// UTF-8 only, special tokens skipped, the stop token and what follows it dropped.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/text_stream.hpp"
#include "moex/tokenizer.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

using Result = test::CliResult;
using cli::TextStream;

// GPT-2's byte -> printable character map (what ByteLevel pre-tokenizers and decoders use).
std::string byte_level_char(int b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += !printable(c);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) s += char(cp);
  else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

nlohmann::json tiny_byte_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 254; ++b) vocab[byte_level_char(b)] = b;
  auto added = [](int id, const char* content) {
    return nlohmann::json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  const nlohmann::json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  const nlohmann::json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const nlohmann::json b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", {added(254, "<s>"), added(255, "</s>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {bos, a}},
        {"pair", {bos, a, b}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {254}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
  };
}

// Single quotes for the shell, with embedded quotes closed and reopened.
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

class CliText : public ::testing::Test {
 protected:
  static constexpr const char* kText = "Hello, wörld! naïve 日本";

  void SetUp() override {
    char tmpl[] = "/tmp/moex_cli_text_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    model_ = make_checkpoint("model", tiny_byte_tokenizer().dump());
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }

  // A copy of the qwen2_moe fixture (config + weights) with `tokenizer` as tokenizer.json
  // (none when empty) and, when given, a generation_config.json.
  std::string make_checkpoint(const std::string& name, const std::string& tokenizer,
                              const std::string& generation_config = "") {
    const std::string dir = tmp_ + "/" + name;
    const std::string src = test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32");
    std::filesystem::create_directory(dir);
    for (const char* f : {"config.json", "model.safetensors"}) std::filesystem::copy_file(src + "/" + f, dir + "/" + f);
    if (!tokenizer.empty()) std::ofstream(dir + "/tokenizer.json") << tokenizer;
    if (!generation_config.empty()) std::ofstream(dir + "/generation_config.json") << generation_config;
    return dir;
  }
  Result run(const std::string& args) { return test::run_cli(args, tmp_); }
  void expect_clean_error(const std::string& args, const std::string& needle) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  }
  // The JSON of `generate --prompt-ids` for the ids of `text` (encoded with special tokens).
  nlohmann::json generate_ids(const std::string& dir, const std::string& text, const std::string& flags) {
    const auto ids = Tokenizer::from_dir(dir).encode(text, true);
    Result r = run("generate --model " + dir + " --prompt-ids " + join(ids) + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }

  std::string tmp_, model_;
};

TEST_F(CliText, GreedyTextIsTheDecodedGreedyIds) {
  const Tokenizer tok = Tokenizer::from_dir(model_);
  const auto prompt = tok.encode(kText, true);
  ASSERT_EQ(prompt.front(), 254) << "the post-processor's BOS";
  for (int n : {1, 5, 17}) {
    const std::string flags = "--max-new-tokens " + std::to_string(n) + " --greedy";
    const auto seq = generate_ids(model_, kText, flags)["sequences"][0].get<std::vector<int64_t>>();
    ASSERT_EQ(seq.size(), prompt.size() + size_t(n));
    EXPECT_EQ(std::vector<int64_t>(seq.begin(), seq.begin() + int64_t(prompt.size())), prompt);
    const std::vector<int64_t> fresh(seq.begin() + int64_t(prompt.size()), seq.end());
    const std::string want = tok.decode(fresh, /*skip_special_tokens=*/true);

    Result r = run("generate --model " + model_ + " --prompt " + quote(kText) + " " + flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want + "\n") << "n=" << n;
    EXPECT_TRUE(r.err.empty()) << r.err;  // the timing line is for terminals only

    // --json: the summary instead of the stream, with the same text and ids.
    r = run("generate --model " + model_ + " --prompt " + quote(kText) + " " + flags + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["text"], want);
    EXPECT_EQ(j["sequences"][0].get<std::vector<int64_t>>(), seq);
    EXPECT_EQ(j["new_tokens"], n);
  }
}

TEST_F(CliText, PromptFileIsReadVerbatim) {
  const std::string text = std::string(kText) + "\n";  // the trailing newline is part of the prompt
  const std::string file = tmp_ + "/prompt.txt";
  std::ofstream(file, std::ios::binary) << text;
  const std::string flags = " --max-new-tokens 6 --json";
  Result from_file = run("generate --model " + model_ + " --prompt-file " + file + flags);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  Result from_flag = run("generate --model " + model_ + " --prompt " + quote(text) + flags);
  ASSERT_EQ(from_flag.exit_code, 0) << from_flag.err;
  Result from_stdin = run("generate --model " + model_ + " --prompt-file -" + flags + " <" + file);
  ASSERT_EQ(from_stdin.exit_code, 0) << from_stdin.err;
  const auto seq = nlohmann::json::parse(from_file.out)["sequences"];
  EXPECT_EQ(seq, nlohmann::json::parse(from_flag.out)["sequences"]);
  EXPECT_EQ(seq, nlohmann::json::parse(from_stdin.out)["sequences"]);
  EXPECT_EQ(seq[0].size(), Tokenizer::from_dir(model_).encode(text, true).size() + 6);

  expect_clean_error("generate --model " + model_ + " --prompt-file " + tmp_ + "/missing.txt", "missing.txt");
  expect_clean_error("generate --model " + model_ + " --prompt-file " + tmp_, "is a directory");
  // Not UTF-8: the tokenizer refuses it.
  std::ofstream(file, std::ios::binary) << "caf\xE9";
  expect_clean_error("generate --model " + model_ + " --prompt-file " + file, "UTF-8");
}

// The checkpoint's stop token (generation_config.json) ends generation and is not printed.
TEST_F(CliText, StopsAtTheStopTokenAndDoesNotPrintIt) {
  const Tokenizer tok = Tokenizer::from_dir(model_);
  const auto prompt = tok.encode(kText, true);
  const auto seq = generate_ids(model_, kText, "--max-new-tokens 12")["sequences"][0].get<std::vector<int64_t>>();
  const std::vector<int64_t> fresh(seq.begin() + int64_t(prompt.size()), seq.end());
  // The stop token: the first new id after the first that appears neither in the prompt nor before.
  size_t at = 1;
  while (at < fresh.size() && (std::count(prompt.begin(), prompt.end(), fresh[at]) ||
                               std::count(fresh.begin(), fresh.begin() + int64_t(at), fresh[at])))
    ++at;
  ASSERT_LT(at, fresh.size()) << "no usable stop token in " << join(fresh);
  const int64_t stop = fresh[at];
  for (const std::string& eos : {std::to_string(stop), "[9999, " + std::to_string(stop) + "]"}) {
    const std::string dir = make_checkpoint("stop" + std::to_string(eos.size()), tiny_byte_tokenizer().dump(),
                                            "{\"eos_token_id\": " + eos + "}");
    Result r = run("generate --model " + dir + " --prompt " + quote(kText) + " --max-new-tokens 12");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, tok.decode(std::vector<int64_t>(fresh.begin(), fresh.begin() + int64_t(at)), true) + "\n");
    r = run("generate --model " + dir + " --prompt " + quote(kText) + " --max-new-tokens 12 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["new_tokens"], int64_t(at) + 1) << "the stop token is generated, then generation ends";
    EXPECT_EQ(j["sequences"][0].back(), stop);
  }
}

TEST_F(CliText, TokenizerProblemsAreOneClearError) {
  // The fixture checkpoint itself ships no tokenizer.json.
  const std::string bare = test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32");
  expect_clean_error("generate --model " + bare + " --prompt hi", "has no tokenizer.json");
  // A tokenizer from another model: its ids run past this model's 256.
  const std::string other = make_checkpoint(
      "other", test::read_file(test::data_path("tokenizers/qwen2_bytelevel/tokenizer.json")));
  ASSERT_GT(Tokenizer::from_dir(other).encode("Hello world", true).back(), 255);
  expect_clean_error("generate --model " + other + " --prompt 'Hello world'", "outside the model's vocabulary [0, 256)");
  // A tokenizer.json that is not one.
  const std::string broken = make_checkpoint("broken", "{\"model\": 3}");
  expect_clean_error("generate --model " + broken + " --prompt hi", "tokenizer.json");
  // An empty prompt (this tokenizer adds BOS, so it is not empty) runs; without BOS it is empty.
  Result r = run("generate --model " + model_ + " --prompt '' --max-new-tokens 2 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_clean_error("generate --model " + other + " --prompt ''", "empty prompt");
}

// ---- TextStream, on the Qwen2 fixture tokenizer ----

TEST(TextStream, CompleteUtf8OnlyAndTheSameTextAsDecode) {
  const Tokenizer tok = Tokenizer::from_file(test::data_path("tokenizers/qwen2_bytelevel/tokenizer.json"));
  const std::string text = "naïve café 日本語 🙂👍🏽 ok";
  const auto ids = tok.encode(text, false);
  std::vector<std::string> pieces;
  TextStream s(tok, {}, [&](const std::string& p) { pieces.push_back(p); });
  size_t silent_steps = 0;
  for (int64_t id : ids) {
    const size_t before = pieces.size();
    s.step(id);
    silent_steps += pieces.size() == before;
  }
  s.finish();
  std::string joined;
  for (const auto& p : pieces) {
    EXPECT_FALSE(p.empty());
    EXPECT_TRUE(valid_utf8(p)) << "a piece splits a character";
    EXPECT_EQ(p.find("\xEF\xBF\xBD"), std::string::npos) << "U+FFFD in " << p;
    joined += p;
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(s.text(), text);
  EXPECT_GT(silent_steps, 0u) << "expected some characters to span several byte-level tokens";
  EXPECT_GT(pieces.size(), 3u) << "the text came out in one piece, not streamed";
}

TEST(TextStream, SkipsSpecialTokensAndStopsAtAStopToken) {
  const Tokenizer tok = Tokenizer::from_file(test::data_path("tokenizers/qwen2_bytelevel/tokenizer.json"));
  const int64_t im_start = *tok.token_to_id("<|im_start|>"), eot = *tok.token_to_id("<|endoftext|>");
  ASSERT_TRUE(tok.is_special(im_start));
  const auto hello = tok.encode("Hello", false), world = tok.encode(" world", false);
  std::string out;
  TextStream s(tok, {eot}, [&](const std::string& p) { out += p; });
  for (int64_t id : hello) s.step(id);
  s.step(im_start);   // special: not printed
  s.step(999999);     // no token for it: nothing, no error
  for (int64_t id : world) s.step(id);
  s.step(eot);        // the stop token: not printed, and nothing after it is
  for (int64_t id : hello) s.step(id);
  s.finish();
  EXPECT_EQ(out, "Hello world");
  EXPECT_EQ(s.text(), out);
}

}  // namespace
}  // namespace moex
