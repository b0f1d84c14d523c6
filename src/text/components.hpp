// The stages of a tokenizer.json pipeline as small interfaces, each built from its JSON object by
// one factory that throws Unsupported naming the stage and its "type" for a kind not implemented.
// `Where` carries the file and key path so that every error names both.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moex::text {

using nlohmann::json;
class Regex;

// "<file>: <key path>", extended per nested key as the loader descends.
struct Where {
  std::string file, key;
  Where at(const std::string& k) const { return {file, key.empty() ? k : key + "." + k}; }
  Where at(size_t i) const { return {file, key + "[" + std::to_string(i) + "]"}; }
  std::string str() const { return file + ": " + key; }
};

// Typed field access: throws InvalidInput naming the file and key when missing or mistyped.
const json& field(const json& obj, const std::string& k, const Where& w);
std::string string_field(const json& obj, const std::string& k, const Where& w);
bool bool_field(const json& obj, const std::string& k, const Where& w, bool dflt);
const json& object_at(const json& j, const Where& w);
std::string type_of(const json& obj, const Where& w);  // the "type" string of a component
[[noreturn]] void unsupported(const Where& w, const std::string& what);

// The "Replace" normalizer and decoder: {"pattern": {"String": s} | {"Regex": r}, "content": c}
// replaces every occurrence (or non-overlapping match) with c.
class Replacer {
 public:
  Replacer(const json& j, const Where& w);
  std::string apply(const std::string& s) const;

 private:
  std::string literal_, content_;
  std::shared_ptr<const Regex> regex_;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string s) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const json& j, const Where& w);

// Refines a list of pieces; pieces never become empty strings.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(std::vector<std::string>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const Where& w);

// One step of a decoder chain (tokenizers' decode_chain): tokens in, tokens out.
class DecodeStep {
 public:
  virtual ~DecodeStep() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};
std::unique_ptr<DecodeStep> make_decoder(const json& j, const Where& w);

// The byte of a ByteFallback token "<0xNN>", or -1 for any other token.
int byte_token_value(const std::string& token);

// GPT-2's reversible byte <-> printable character map used by ByteLevel.
const std::string& byte_to_char(unsigned char b);
// The byte a byte-level character stands for, or -1.
int char_to_byte(char32_t c);

}  // namespace moex::text
