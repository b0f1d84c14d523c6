// A compiled PCRE2 pattern (UTF + UCP, so \p{..}, \s and \w are Unicode-aware as in the Oniguruma
// engine `tokenizers` uses; MULTILINE because Oniguruma's Ruby syntax makes `$` a line anchor).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moex::text {

class Regex {
 public:
  // Throws InvalidInput "<where>: invalid regex ..." when PCRE2 rejects the pattern.
  Regex(const std::string& pattern, const std::string& where);
  // Non-overlapping matches left to right as [begin, end) byte offsets; empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8, freed by its deleter
  std::string where_;
};

}  // namespace moex::text
