// UTF-8 helpers shared by the tokenizer stages. Decoding follows Rust's String::from_utf8_lossy
// (the conversion `tokenizers` uses): each maximal invalid subpart becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moex::text {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
size_t utf8_valid_len(std::string_view s, size_t i);
// Length of the maximal invalid subpart at s[i] (1..3), for a position where utf8_valid_len is 0.
size_t utf8_invalid_len(std::string_view s, size_t i);
// Byte offset of the first invalid sequence, or npos when all of `s` is UTF-8.
size_t utf8_first_invalid(std::string_view s);
std::string utf8_lossy(std::string_view s);
// Code point of the valid sequence at s[i] (callers ensure validity), its length in `len`.
char32_t utf8_decode(std::string_view s, size_t i, size_t* len);
void utf8_append(std::string& out, char32_t cp);

}  // namespace moex::text
