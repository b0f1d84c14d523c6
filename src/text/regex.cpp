#include "text/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "moex/error.hpp"

namespace moex::text {

Regex::Regex(const std::string& pattern, const std::string& where) : where_(where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    throw InvalidInput(where + ": invalid regex at offset " + std::to_string(off) + ": " +
                       reinterpret_cast<const char*>(buf));
  }
  // JIT is only a speed-up; the interpreter gives the same matches when it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  // Match data per call, so that one Regex can serve several threads.
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  std::vector<std::pair<size_t, size_t>> out;
  size_t start = 0;
  // PCRE2 validates the whole subject as UTF-8 on every call; once is enough (and keeps a scan
  // over n matches linear instead of quadratic). Later starts are always character boundaries.
  uint32_t options = 0;
  while (start <= subject.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                               start, options, md.get(), nullptr);
    options = PCRE2_NO_UTF_CHECK;
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      throw InvalidInput(where_ + ": regex match failed: " + reinterpret_cast<const char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Step over one whole character so the next search starts on a character boundary.
      size_t n = 1;
      while (b + n < subject.size() && (static_cast<unsigned char>(subject[b + n]) & 0xC0) == 0x80) ++n;
      start = b + n;
    }
  }
  return out;
}

}  // namespace moex::text
