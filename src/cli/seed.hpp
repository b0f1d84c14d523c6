// --seed values: the whole uint64 range the generators take ("0" to "18446744073709551615");
// a sign, a negative number or anything that is not plain decimal digits is an InvalidInput, so
// that -1 is never read as 2^64 - 1 by wrap-around. Used by every command that takes --seed.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "moex/error.hpp"

namespace moex::cli {

inline uint64_t parse_seed(const std::optional<std::string>& value, uint64_t dflt) {
  if (!value) return dflt;
  const std::string& s = *value;
  bool digits = !s.empty() && s.size() <= 20;
  for (char c : s) digits = digits && c >= '0' && c <= '9';
  errno = 0;
  const unsigned long long v = digits ? std::strtoull(s.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE)
    throw InvalidInput("--seed must be an integer in [0, 18446744073709551615], got '" + s + "'");
  return uint64_t(v);
}

}  // namespace moex::cli
