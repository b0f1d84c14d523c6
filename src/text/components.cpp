// JSON field access with file + key in every error, and the GPT-2 byte-level character map.
#include "text/components.hpp"

#include <array>
#include <unordered_map>

#include "io/strict_json.hpp"
#include "moex/error.hpp"
#include "text/regex.hpp"
#include "text/utf8.hpp"

namespace moex::text {

const json& field(const json& obj, const std::string& k, const Where& w) {
  if (!obj.is_object()) throw InvalidInput(w.str() + ": expected an object, got " + io::json_type_name(obj));
  auto it = obj.find(k);
  if (it == obj.end()) throw InvalidInput(w.at(k).str() + ": missing");
  return *it;
}

std::string string_field(const json& obj, const std::string& k, const Where& w) {
  const json& v = field(obj, k, w);
  if (!v.is_string())
    throw InvalidInput(w.at(k).str() + ": expected a string, got " + io::json_type_name(v));
  return v.get<std::string>();
}

bool bool_field(const json& obj, const std::string& k, const Where& w, bool dflt) {
  if (!obj.is_object()) throw InvalidInput(w.str() + ": expected an object, got " + io::json_type_name(obj));
  auto it = obj.find(k);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean())
    throw InvalidInput(w.at(k).str() + ": expected a boolean, got " + io::json_type_name(*it));
  return it->get<bool>();
}

const json& object_at(const json& j, const Where& w) {
  if (!j.is_object()) throw InvalidInput(w.str() + ": expected an object, got " + io::json_type_name(j));
  return j;
}

std::string type_of(const json& obj, const Where& w) {
  object_at(obj, w);
  return string_field(obj, "type", w);
}

void unsupported(const Where& w, const std::string& what) {
  throw Unsupported(w.str() + ": " + what + " is not supported");
}

Replacer::Replacer(const json& j, const Where& w) {
  const json& pat = object_at(field(j, "pattern", w), w.at("pattern"));
  content_ = string_field(j, "content", w);
  if (pat.contains("String")) {
    literal_ = string_field(pat, "String", w.at("pattern"));
    if (literal_.empty()) throw InvalidInput(w.at("pattern.String").str() + ": empty pattern");
  } else if (pat.contains("Regex")) {
    regex_ = std::make_shared<Regex>(string_field(pat, "Regex", w.at("pattern")), w.at("pattern").str());
  } else {
    throw InvalidInput(w.at("pattern").str() + ": expected \"String\" or \"Regex\"");
  }
}

std::string Replacer::apply(const std::string& s) const {
  std::string out;
  size_t last = 0;
  if (regex_) {
    for (auto [b, e] : regex_->find_all(s)) {
      out.append(s, last, b - last);
      out += content_;
      last = e;
    }
  } else {
    for (size_t p = s.find(literal_); p != std::string::npos; p = s.find(literal_, last)) {
      out.append(s, last, p - last);
      out += content_;
      last = p + literal_.size();
    }
  }
  out.append(s, last);
  return out;
}

namespace {

// Bytes that are printable in Latin-1 stand for themselves; the others are shifted to 256+n in
// byte order, so every byte has a visible, non-space character.
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<char32_t, int> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = keep ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8_append(to_char[b], cp);
      to_byte[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

const std::string& byte_to_char(unsigned char b) { return byte_map().to_char[b]; }

int char_to_byte(char32_t c) {
  const auto& m = byte_map().to_byte;
  auto it = m.find(c);
  return it == m.end() ? -1 : it->second;
}

}  // namespace moex::text
