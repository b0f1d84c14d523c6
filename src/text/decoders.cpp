// tokenizer.json decoders, as `tokenizers` chains them: each step maps the list of token strings
// to a new list, and decode() joins the final list. ByteLevel fuses everything into one string
// (invalid UTF-8 -> U+FFFD per maximal subpart); ByteFallback turns runs of <0xNN> tokens into
// their text (or one U+FFFD per byte when the run is not UTF-8).
#include "moex/error.hpp"
#include "text/components.hpp"
#include "text/utf8.hpp"

namespace moex::text {
namespace {

class ByteLevelDecode : public DecodeStep {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      // A token with any character outside the byte map contributes its own UTF-8 bytes.
      std::string mapped;
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        const size_t n = utf8_valid_len(t, i);
        if (n == 0) { ok = false; break; }
        size_t len = 0;
        const int b = char_to_byte(utf8_decode(t, i, &len));
        if (b < 0) ok = false;
        else mapped += static_cast<char>(b);
        i += n;
      }
      bytes += ok ? mapped : t;
    }
    return {utf8_lossy(bytes)};
  }
};

class ReplaceDecode : public DecodeStep {
 public:
  ReplaceDecode(const json& j, const Where& w) : r_(j, w) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& t : tokens) t = r_.apply(t);
    return tokens;
  }

 private:
  Replacer r_;
};

class ByteFallbackDecode : public DecodeStep {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string run;  // bytes of consecutive <0xNN> tokens
    auto flush = [&] {
      if (run.empty()) return;
      if (utf8_first_invalid(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (std::string& t : tokens) {
      const int b = byte_token_value(t);
      if (b >= 0) {
        run += static_cast<char>(b);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }
};

class FuseDecode : public DecodeStep {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    return {all};
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecode : public DecodeStep {
 public:
  StripDecode(const json& j, const Where& w) {
    const std::string c = string_field(j, "content", w);
    if (c.empty() || utf8_valid_len(c, 0) != c.size())
      throw InvalidInput(w.at("content").str() + ": expected one character");
    content_ = c;
    start_ = count(j, "start", w);
    stop_ = count(j, "stop", w);
  }
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> starts;  // byte offset of each character
      for (size_t i = 0; i < t.size(); i += std::max<size_t>(1, utf8_valid_len(t, i))) starts.push_back(i);
      const size_t n = starts.size();
      auto char_at = [&](size_t k) {
        const size_t e = k + 1 < n ? starts[k + 1] : t.size();
        return t.substr(starts[k], e - starts[k]);
      };
      size_t cut_b = 0, cut_e = 0;
      while (cut_b < start_ && cut_b < n && char_at(cut_b) == content_) ++cut_b;
      while (cut_e < stop_ && cut_e < n && char_at(n - 1 - cut_e) == content_) ++cut_e;
      if (cut_b + cut_e >= n) {
        t.clear();
      } else {
        const size_t b = starts[cut_b], e = starts[n - cut_e - 1] + char_at(n - cut_e - 1).size();
        t = t.substr(b, e - b);
      }
    }
    return tokens;
  }

 private:
  static size_t count(const json& j, const std::string& k, const Where& w) {
    const json& v = field(j, k, w);
    if (!v.is_number_unsigned()) throw InvalidInput(w.at(k).str() + ": expected a non-negative integer");
    return v.get<size_t>();
  }
  std::string content_;
  size_t start_ = 0, stop_ = 0;
};

class SequenceDecode : public DecodeStep {
 public:
  explicit SequenceDecode(std::vector<std::unique_ptr<DecodeStep>> v) : v_(std::move(v)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& d : v_) tokens = d->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<DecodeStep>> v_;
};

}  // namespace

int byte_token_value(const std::string& t) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>' || hex(t[3]) < 0 || hex(t[4]) < 0) return -1;
  return hex(t[3]) * 16 + hex(t[4]);
}

std::unique_ptr<DecodeStep> make_decoder(const json& j, const Where& w) {
  const std::string t = type_of(j, w);
  if (t == "ByteLevel") return std::make_unique<ByteLevelDecode>();
  if (t == "Replace") return std::make_unique<ReplaceDecode>(j, w);
  if (t == "ByteFallback") return std::make_unique<ByteFallbackDecode>();
  if (t == "Fuse") return std::make_unique<FuseDecode>();
  if (t == "Strip") return std::make_unique<StripDecode>(j, w);
  if (t == "Sequence") {
    const json& list = field(j, "decoders", w);
    if (!list.is_array()) throw InvalidInput(w.at("decoders").str() + ": expected an array");
    std::vector<std::unique_ptr<DecodeStep>> v;
    for (size_t i = 0; i < list.size(); ++i) v.push_back(make_decoder(list[i], w.at("decoders").at(i)));
    return std::make_unique<SequenceDecode>(std::move(v));
  }
  unsupported(w, "decoder type '" + t + "'");
}

}  // namespace moex::text
