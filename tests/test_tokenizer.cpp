// Tokenizers against Hugging Face `tokenizers` 0.23.2 (tests/data/tokenizers/*/reference.json):
// encode with and without special tokens, tokens, decode with and without skipping special
// tokens, the streaming decoder, and the typed errors for malformed or unsupported files.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moex/error.hpp"
#include "moex/tokenizer.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {


std::string dir_of(const std::string& name) { return test::data_path("tokenizers/" + name); }

nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, EncodeAndDecodeMatchTokenizers) {
  const Tokenizer tok = Tokenizer::from_dir(dir_of(GetParam()));
  const auto ref = load_json(dir_of(GetParam()) + "/reference.json");
  const auto& cases = ref.at("cases");
  ASSERT_GE(cases.size(), 86u);
  int enc = 0, enc_ns = 0, toks = 0, dec = 0, dec_skip = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const auto ids = c.at("ids").get<std::vector<int64_t>>();
    const auto ids_ns = c.at("ids_no_special").get<std::vector<int64_t>>();
    const auto got = tok.encode(text);
    const auto got_ns = tok.encode(text, false);
    enc += got == ids;
    enc_ns += got_ns == ids_ns;
    EXPECT_EQ(got, ids) << "text: " << text;
    EXPECT_EQ(got_ns, ids_ns) << "text: " << text;
    const auto t = tok.tokens(ids_ns);  // the reference lists the tokens without specials
    toks += t == c.at("tokens").get<std::vector<std::string>>();
    EXPECT_EQ(t, c.at("tokens").get<std::vector<std::string>>()) << "text: " << text;
    const std::string d = tok.decode(ids_ns), ds = tok.decode(ids, true);
    dec += d == c.at("decoded").get<std::string>();
    dec_skip += ds == c.at("decoded_skip_special").get<std::string>();
    EXPECT_EQ(d, c.at("decoded").get<std::string>()) << "text: " << text;
    EXPECT_EQ(ds, c.at("decoded_skip_special").get<std::string>()) << "text: " << text;
  }
  std::printf("%s: exact of %zu: encode %d, encode(no special) %d, tokens %d, decode %d, "
              "decode(skip special) %d\n", GetParam().c_str(), cases.size(), enc, enc_ns, toks, dec, dec_skip);
}

TEST_P(Reference, StreamingDecoderEmitsCompleteUtf8) {
  const Tokenizer tok = Tokenizer::from_dir(dir_of(GetParam()));
  const auto ref = load_json(dir_of(GetParam()) + "/reference.json");
  for (const auto& c : ref.at("cases")) {
    for (bool skip : {false, true}) {
      const auto ids = c.at(skip ? "ids" : "ids_no_special").get<std::vector<int64_t>>();
      Tokenizer::Decoder d(tok, skip);
      std::string all;
      for (int64_t id : ids) {
        const std::string piece = d.step(id);
        EXPECT_TRUE(valid_utf8(piece)) << "text: " << c.at("text").get<std::string>();
        all += piece;
      }
      const std::string rest = d.finish();
      EXPECT_TRUE(valid_utf8(rest));
      all += rest;
      EXPECT_EQ(all, tok.decode(ids, skip)) << "text: " << c.at("text").get<std::string>();
    }
  }
}

// Random strings and random id lists (random/make_random.py): encode, decode and the stream.
class RandomReference : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomReference, StringsAndIds) {
  const std::string name = GetParam();
  const Tokenizer tok = Tokenizer::from_dir(dir_of(name));
  const auto ref = load_json(dir_of("random/" + name + ".json"));
  ASSERT_EQ(ref.at("cases").size(), 200u);
  for (const auto& c : ref.at("cases")) {
    const std::string text = c.at("text");
    const auto ids = c.at("ids").get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text), ids) << nlohmann::json(text).dump();
    EXPECT_EQ(tok.encode(text, false), c.at("ids_no_special").get<std::vector<int64_t>>()) << nlohmann::json(text).dump();
    EXPECT_EQ(tok.decode(c.at("ids_no_special").get<std::vector<int64_t>>()), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
    const auto rnd = c.at("random_ids").get<std::vector<int64_t>>();
    EXPECT_EQ(tok.decode(rnd), c.at("random_ids_decoded").get<std::string>());
    Tokenizer::Decoder d(tok);
    std::string all;
    for (int64_t id : rnd) all += d.step(id);
    EXPECT_EQ(all + d.finish(), c.at("random_ids_decoded").get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Reference, ::testing::Values("qwen2_bytelevel", "o200k_bytelevel",
                                                         "deepseek_v3_bytelevel", "llama_sentencepiece_bpe"));
INSTANTIATE_TEST_SUITE_P(Fixtures, RandomReference,
                         ::testing::Values("qwen2_bytelevel", "o200k_bytelevel", "deepseek_v3_bytelevel",
                                           "llama_sentencepiece_bpe"));
// Options the four fixtures do not use (variants/make_variants.py: GPT-2 regex in ByteLevel with a
// prefix space, NFKC, a TemplateProcessing with two specials, lstrip / rstrip / single_word /
// normalized added tokens, every Split behavior, unk with and without fuse_unk, ignore_merges).
INSTANTIATE_TEST_SUITE_P(Variants, Reference,
                         ::testing::Values("variants/gpt2_regex_nfkc_flags", "variants/split_removed",
                                           "variants/split_mergedwithprevious",
                                           "variants/split_mergedwithnext",
                                           "variants/split_contiguous_invert",
                                           "variants/llama_unk_fused",
                                           "variants/llama_unk_ignore_merges"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n.substr(n.find('/') + 1);
                         });

// A character split over byte tokens is held back until it is complete (byte-level) or until the
// run of <0xNN> tokens ends (ByteFallback, where one bad byte would turn the run into U+FFFDs).
TEST(TokenizerStream, HoldsPartialCharacters) {
  const Tokenizer llama = Tokenizer::from_dir(dir_of("llama_sentencepiece_bpe"));
  const auto ids = llama.encode("한a", false);  // ▁ <0xED> <0x95> <0x9C> a
  ASSERT_EQ(ids.size(), 5u);
  Tokenizer::Decoder d(llama);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(d.step(ids[i]), "") << i;
  EXPECT_EQ(d.step(ids[4]), "한a");
  EXPECT_EQ(d.finish(), "");
  // Valid bytes followed by a byte that never completes: the stream agrees with decode().
  const std::vector<int64_t> bad = {*llama.token_to_id("<0x41>"), *llama.token_to_id("<0xAA>")};
  Tokenizer::Decoder d2(llama);
  std::string out = d2.step(bad[0]) + d2.step(bad[1]);
  EXPECT_EQ(out + d2.finish(), llama.decode(bad));

  const Tokenizer qwen = Tokenizer::from_dir(dir_of("qwen2_bytelevel"));
  const auto q = qwen.encode("한", false);
  ASSERT_GE(q.size(), 2u);
  Tokenizer::Decoder d3(qwen);
  std::string got;
  for (size_t i = 0; i + 1 < q.size(); ++i) got += d3.step(q[i]);
  EXPECT_EQ(got, "");
  EXPECT_EQ(d3.step(q.back()), "한");
}

TEST(TokenizerApi, SpecialTokensAndVocab) {
  const Tokenizer tok = Tokenizer::from_dir(dir_of("qwen2_bytelevel"));
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), std::optional<int64_t>(1));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_EQ(tok.special_token_ids(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_GT(tok.vocab_size(), 1000);
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
  EXPECT_THROW(tok.decode({tok.vocab_size() + 5}), InvalidInput);
  EXPECT_THROW(tok.encode(std::string("\xff\xfe", 2)), InvalidInput);
  EXPECT_TRUE(tok.encode("", false).empty());
}

class BadFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_tok_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    base_ = load_json(dir_of("llama_sentencepiece_bpe") + "/tokenizer.json");
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }
  std::string write(const std::string& text) {
    const std::string p = tmp_ + "/tokenizer.json";
    std::ofstream(p) << text;
    return p;
  }
  // Expects `E` from loading `j`, with a message containing every needle.
  template <class E>
  void expect_error(const nlohmann::json& j, std::vector<std::string> needles) {
    const std::string p = write(j.dump());
    try {
      Tokenizer::from_file(p);
      ADD_FAILURE() << "no error for " << needles[0];
    } catch (const E& e) {
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }
  std::string tmp_;
  nlohmann::json base_;
};

TEST_F(BadFiles, TruncatedAndMalformed) {
  const std::string full = base_.dump();
  try {
    Tokenizer::from_file(write(full.substr(0, full.size() / 2)));
    ADD_FAILURE() << "truncated file accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_file(tmp_ + "/missing.json"), InvalidInput);
  auto j = base_;
  j.erase("model");
  expect_error<InvalidInput>(j, {"tokenizer.json", "model"});
  j = base_;
  j["model"]["merges"][3] = 42;
  expect_error<InvalidInput>(j, {"tokenizer.json", "model.merges[3]"});
  j = base_;
  j["model"]["merges"][5] = {"no-such-token", "x"};
  expect_error<InvalidInput>(j, {"model.merges[5]", "no-such-token"});
  j = base_;
  j["added_tokens"][0]["id"] = "one";
  expect_error<InvalidInput>(j, {"added_tokens[0].id"});
  j = base_;
  j["normalizer"]["normalizers"][1].erase("content");
  expect_error<InvalidInput>(j, {"normalizer.normalizers[1].content"});
}

TEST_F(BadFiles, UnknownComponentTypes) {
  auto j = base_;
  j["normalizer"]["normalizers"][0] = {{"type", "Lowercase"}};
  expect_error<Unsupported>(j, {"normalizer", "Lowercase"});
  j = base_;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "x"}};
  expect_error<Unsupported>(j, {"pre_tokenizer", "Metaspace"});
  j = base_;
  j["model"]["type"] = "Unigram";
  expect_error<Unsupported>(j, {"model", "Unigram"});
  j = base_;
  j["decoder"]["decoders"][2] = {{"type", "CTC"}};
  expect_error<Unsupported>(j, {"decoder.decoders[2]", "CTC"});
  j = base_;
  j["post_processor"] = {{"type", "Mystery"}};
  expect_error<Unsupported>(j, {"post_processor", "Mystery"});
  j = base_;
  j["model"]["dropout"] = 0.1;
  expect_error<Unsupported>(j, {"dropout"});
}

// Added-token options on a copy of the qwen2 fixture with one extra token: lstrip takes the
// whitespace on its left into the token, rstrip the whitespace on its right, single_word only
// matches between non-word characters, and normalized=false tokens are matched in the raw text
// (id 1500: the next id after the vocab, as `tokenizers` numbers a new token).
class AddedTokenFlags : public BadFiles {
 protected:
  Tokenizer with_token(const nlohmann::json& flags) {
    auto j = load_json(dir_of("qwen2_bytelevel") + "/tokenizer.json");
    nlohmann::json t = {{"id", 1500}, {"content", "<mask>"}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false}, {"normalized", false}, {"special", true}};
    if (flags.is_object()) t.update(flags);
    j["added_tokens"].push_back(t);
    return Tokenizer::from_file(write(j.dump()));
  }
};

TEST_F(AddedTokenFlags, StripAndSingleWord) {
  const Tokenizer plain = with_token({});
  const Tokenizer base = Tokenizer::from_dir(dir_of("qwen2_bytelevel"));
  auto concat = [](std::vector<int64_t> a, const std::vector<int64_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  EXPECT_EQ(plain.encode("a <mask> b"), concat(concat(base.encode("a "), {1500}), base.encode(" b")));
  EXPECT_EQ(with_token({{"lstrip", true}}).encode("a  <mask> b"),
            concat(concat(base.encode("a"), {1500}), base.encode(" b")));
  EXPECT_EQ(with_token({{"rstrip", true}}).encode("a <mask>  b"),
            concat(concat(base.encode("a "), {1500}), base.encode("b")));
  const Tokenizer word = with_token({{"single_word", true}});
  EXPECT_EQ(word.encode("x<mask>y"), base.encode("x<mask>y"));
  EXPECT_EQ(word.encode("x <mask> y"), concat(concat(base.encode("x "), {1500}), base.encode(" y")));
  EXPECT_EQ(plain.decode({1500}), "<mask>");
  EXPECT_EQ(plain.decode({1500}, true), "");
  EXPECT_TRUE(plain.is_special(1500));
}

TEST_F(BadFiles, TokenizerConfigNamesSpecialTokens) {
  std::filesystem::copy_file(dir_of("llama_sentencepiece_bpe") + "/tokenizer.json", tmp_ + "/tokenizer.json");
  std::ofstream(tmp_ + "/tokenizer_config.json")
      << R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}, "unk_token": "<unk>"})";
  const Tokenizer tok = Tokenizer::from_dir(tmp_);
  EXPECT_EQ(tok.bos_token_id(), std::optional<int64_t>(1));
  EXPECT_EQ(tok.eos_token_id(), std::optional<int64_t>(2));
  EXPECT_EQ(tok.unk_token_id(), std::optional<int64_t>(0));
  EXPECT_FALSE(tok.pad_token_id().has_value());
  std::ofstream(tmp_ + "/tokenizer_config.json") << "{\"bos_token\": ";
  EXPECT_THROW(Tokenizer::from_dir(tmp_), InvalidInput);
}

}  // namespace
}  // namespace moex
