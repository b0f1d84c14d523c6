// A small, strict flag parser shared by the subcommands: "--name value" or "--name=value", and
// boolean flags. Unknown flags, missing values and malformed numbers throw moex::InvalidInput
// naming the flag, so every command rejects typos the same way.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "moex/model.hpp"

namespace moex::cli {

class Args {
 public:
  // `valued`: flags that take a value; `switches`: boolean flags. Names without the leading "--".
  Args(const std::vector<std::string>& argv, std::set<std::string> valued,
       std::set<std::string> switches);

  bool has(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& dflt) const;
  std::string require(const std::string& name) const;  // throws "missing --name"
  int64_t get_int(const std::string& name, int64_t dflt) const;
  double get_double(const std::string& name, double dflt) const;
  // Comma-separated integers ("1,4,16"); throws on a malformed entry.
  std::vector<int64_t> get_int_list(const std::string& name, std::vector<int64_t> dflt) const;
  std::vector<std::string> get_list(const std::string& name, std::vector<std::string> dflt) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

// --graph on|off and --decode-switch auto|on|off (moex generate, moex bench generate) into g.
void apply_decode_flags(const Args& a, moex::GenerationOptions& g);

int64_t parse_int(const std::string& s, const std::string& what);
double parse_double(const std::string& s, const std::string& what);

}  // namespace moex::cli
