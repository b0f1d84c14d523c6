#include "text/utf8.hpp"

namespace moex::text {
namespace {

bool cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Bounds of the second byte for a lead byte (Unicode Table 3-7); the rest are 80..BF.
bool second_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return cont(b);
}

size_t seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Number of leading bytes at s[i] that form a valid prefix of a sequence (at most its length).
size_t valid_prefix(std::string_view s, size_t i, size_t* need) {
  const auto lead = static_cast<unsigned char>(s[i]);
  *need = seq_len(lead);
  if (*need <= 1) return *need;
  size_t k = 1;
  if (i + k < s.size() && second_ok(lead, static_cast<unsigned char>(s[i + k]))) {
    ++k;
    while (k < *need && i + k < s.size() && cont(static_cast<unsigned char>(s[i + k]))) ++k;
  }
  return k;
}

}  // namespace

size_t utf8_valid_len(std::string_view s, size_t i) {
  size_t need = 0;
  const size_t k = valid_prefix(s, i, &need);
  return (need != 0 && k == need) ? need : 0;
}

size_t utf8_invalid_len(std::string_view s, size_t i) {
  size_t need = 0;
  const size_t k = valid_prefix(s, i, &need);
  return k == 0 ? 1 : k;
}

size_t utf8_first_invalid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacementChar);
      i += utf8_invalid_len(s, i);
    }
  }
  return out;
}

char32_t utf8_decode(std::string_view s, size_t i, size_t* len) {
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  const char32_t c = b(0);
  if (c < 0x80) { *len = 1; return c; }
  if (c < 0xE0) { *len = 2; return ((c & 0x1F) << 6) | (b(1) & 0x3F); }
  if (c < 0xF0) { *len = 3; return ((c & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F); }
  *len = 4;
  return ((c & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace moex::text
