// tokenizer.json normalizers: the Unicode forms (through utf8proc), Prepend, Replace and Sequence.
// Each runs on one segment of text between added tokens, as `tokenizers` normalizes segments
// independently (so Prepend applies after every special token too).
#include <cstdlib>

#include <utf8proc.h>

#include "moex/error.hpp"
#include "text/components.hpp"

namespace moex::text {
namespace {

class UnicodeForm : public Normalizer {
 public:
  UnicodeForm(int options, std::string name) : options_(options), name_(std::move(name)) {}
  std::string normalize(std::string s) const override {
    if (s.empty()) return s;
    utf8proc_uint8_t* out = nullptr;
    // An explicit length (not NULLTERM) so that embedded NUL characters are kept.
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out,
                                            static_cast<utf8proc_option_t>(options_));
    if (n < 0) throw InvalidInput(name_ + " normalization failed: " + utf8proc_errmsg(n));
    std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  }

 private:
  int options_;
  std::string name_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  // `tokenizers` leaves an empty segment empty.
  std::string normalize(std::string s) const override { return s.empty() ? s : p_ + s; }

 private:
  std::string p_;
};

class Replace : public Normalizer {
 public:
  Replace(const json& j, const Where& w) : r_(j, w) {}
  std::string normalize(std::string s) const override { return r_.apply(s); }

 private:
  Replacer r_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> v) : v_(std::move(v)) {}
  std::string normalize(std::string s) const override {
    for (const auto& n : v_) s = n->normalize(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> v_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const Where& w) {
  const std::string t = type_of(j, w);
  if (t == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE, t);
  if (t == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, t);
  if (t == "NFKC")
    return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, t);
  if (t == "NFKD")
    return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, t);
  if (t == "Prepend") return std::make_unique<Prepend>(string_field(j, "prepend", w));
  if (t == "Replace") return std::make_unique<Replace>(j, w);
  if (t == "Sequence") {
    const json& list = field(j, "normalizers", w);
    if (!list.is_array()) throw InvalidInput(w.at("normalizers").str() + ": expected an array");
    std::vector<std::unique_ptr<Normalizer>> v;
    for (size_t i = 0; i < list.size(); ++i) v.push_back(make_normalizer(list[i], w.at("normalizers").at(i)));
    return std::make_unique<SequenceNormalizer>(std::move(v));
  }
  unsupported(w, "normalizer type '" + t + "'");
}

}  // namespace moex::text
