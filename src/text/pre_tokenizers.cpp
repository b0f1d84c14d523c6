// tokenizer.json pre-tokenizers: Split (regex or literal, every delimiter behavior, invert),
// ByteLevel (optional GPT-2 regex, optional prefix space, then the byte -> character map) and
// Sequence. Each stage runs on every piece the previous one produced, never across pieces.
#include "moex/error.hpp"
#include "text/components.hpp"
#include "text/regex.hpp"

namespace moex::text {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t b, e;
  bool match;
};

// The spans of `s` that `behavior` keeps, from the matches (which cover part of `s`).
std::vector<Span> apply_behavior(std::vector<Span> spans, Behavior behavior) {
  std::vector<Span> out;
  bool prev_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      return spans;
    case Behavior::kRemoved:
      for (const Span& sp : spans)
        if (!sp.match) out.push_back(sp);
      return out;
    case Behavior::kMergedWithPrevious:
      for (const Span& sp : spans) {
        if (sp.match && !prev_match && !out.empty()) out.back().e = sp.e;
        else out.push_back(sp);
        prev_match = sp.match;
      }
      return out;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !out.empty()) out.back().b = it->b;
        else out.push_back(*it);
        prev_match = it->match;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::kContiguous:
      for (const Span& sp : spans) {
        if (sp.match == prev_match && !out.empty()) out.back().e = sp.e;
        else out.push_back(sp);
        prev_match = sp.match;
      }
      return out;
  }
  return out;
}

class Split : public PreTokenizer {
 public:
  Split(const json& j, const Where& w) {
    const json& pat = object_at(field(j, "pattern", w), w.at("pattern"));
    if (pat.contains("Regex")) {
      regex_ = std::make_unique<Regex>(string_field(pat, "Regex", w.at("pattern")), w.at("pattern").str());
    } else if (pat.contains("String")) {
      literal_ = string_field(pat, "String", w.at("pattern"));
    } else {
      throw InvalidInput(w.at("pattern").str() + ": expected \"String\" or \"Regex\"");
    }
    const std::string b = string_field(j, "behavior", w);
    if (b == "Removed") behavior_ = Behavior::kRemoved;
    else if (b == "Isolated") behavior_ = Behavior::kIsolated;
    else if (b == "MergedWithPrevious") behavior_ = Behavior::kMergedWithPrevious;
    else if (b == "MergedWithNext") behavior_ = Behavior::kMergedWithNext;
    else if (b == "Contiguous") behavior_ = Behavior::kContiguous;
    else unsupported(w.at("behavior"), "Split behavior '" + b + "'");
    invert_ = bool_field(j, "invert", w, false);
  }

  void split(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    for (const std::string& p : pieces) {
      std::vector<std::pair<size_t, size_t>> m;
      if (regex_) {
        m = regex_->find_all(p);
      } else if (!literal_.empty()) {
        for (size_t q = p.find(literal_); q != std::string::npos; q = p.find(literal_, q + literal_.size()))
          m.emplace_back(q, q + literal_.size());
      }
      // Matches and the gaps between them, covering the whole piece.
      std::vector<Span> spans;
      size_t last = 0;
      for (auto [b, e] : m) {
        if (b > last) spans.push_back({last, b, invert_});
        spans.push_back({b, e, !invert_});
        last = e;
      }
      if (last < p.size()) spans.push_back({last, p.size(), invert_});
      for (const Span& sp : apply_behavior(std::move(spans), behavior_))
        if (sp.e > sp.b) out.push_back(p.substr(sp.b, sp.e - sp.b));
    }
    pieces = std::move(out);
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string literal_;
  Behavior behavior_ = Behavior::kIsolated;
  bool invert_ = false;
};

// GPT-2's word split, used by ByteLevel when "use_regex" is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(const json& j, const Where& w)
      : add_prefix_space_(bool_field(j, "add_prefix_space", w, true)) {
    if (bool_field(j, "use_regex", w, true)) regex_ = std::make_unique<Regex>(kGpt2Pattern, w.str());
  }
  void split(std::vector<std::string>& pieces) const override {
    std::vector<std::string> words;
    for (std::string p : pieces) {
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      if (!regex_) {
        words.push_back(std::move(p));
        continue;
      }
      size_t last = 0;
      for (auto [b, e] : regex_->find_all(p)) {
        if (b > last) words.push_back(p.substr(last, b - last));
        words.push_back(p.substr(b, e - b));
        last = e;
      }
      if (last < p.size()) words.push_back(p.substr(last));
    }
    pieces.clear();
    for (const std::string& wd : words) {
      std::string mapped;
      for (unsigned char c : wd) mapped += byte_to_char(c);
      if (!mapped.empty()) pieces.push_back(std::move(mapped));
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> v) : v_(std::move(v)) {}
  void split(std::vector<std::string>& pieces) const override {
    for (const auto& p : v_) p->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> v_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const Where& w) {
  const std::string t = type_of(j, w);
  if (t == "Split") return std::make_unique<Split>(j, w);
  if (t == "ByteLevel") return std::make_unique<ByteLevel>(j, w);
  if (t == "Sequence") {
    const json& list = field(j, "pretokenizers", w);
    if (!list.is_array()) throw InvalidInput(w.at("pretokenizers").str() + ": expected an array");
    std::vector<std::unique_ptr<PreTokenizer>> v;
    for (size_t i = 0; i < list.size(); ++i)
      v.push_back(make_pre_tokenizer(list[i], w.at("pretokenizers").at(i)));
    return std::make_unique<SequencePre>(std::move(v));
  }
  unsupported(w, "pre_tokenizer type '" + t + "'");
}

}  // namespace moex::text
