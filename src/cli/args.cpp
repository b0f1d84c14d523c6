#include "cli/args.hpp"

#include <cerrno>
#include <cstdlib>

#include "moex/error.hpp"

namespace moex::cli {

int64_t parse_int(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    throw InvalidInput("invalid integer '" + s + "' for " + what);
  return v;
}

double parse_double(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    throw InvalidInput("invalid number '" + s + "' for " + what);
  return v;
}

Args::Args(const std::vector<std::string>& argv, std::set<std::string> valued,
           std::set<std::string> switches) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (switches.count(name)) {
      if (inline_value) throw InvalidInput("flag --" + name + " takes no value");
      flags_.insert(name);
    } else if (valued.count(name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) throw InvalidInput("missing value for --" + name);
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      std::string known;
      for (const auto& v : valued) known += " --" + v;
      for (const auto& v : switches) known += " --" + v;
      throw InvalidInput("unknown flag --" + name + "; known:" + known);
    }
  }
}

bool Args::has(const std::string& name) const {
  return flags_.count(name) || values_.count(name);
}
std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}
std::string Args::get_or(const std::string& name, const std::string& dflt) const {
  auto v = get(name);
  return v ? *v : dflt;
}
std::string Args::require(const std::string& name) const {
  auto v = get(name);
  if (!v) throw InvalidInput("missing required flag --" + name);
  return *v;
}
int64_t Args::get_int(const std::string& name, int64_t dflt) const {
  auto v = get(name);
  return v ? parse_int(*v, "--" + name) : dflt;
}
double Args::get_double(const std::string& name, double dflt) const {
  auto v = get(name);
  return v ? parse_double(*v, "--" + name) : dflt;
}
std::vector<std::string> Args::get_list(const std::string& name,
                                        std::vector<std::string> dflt) const {
  auto v = get(name);
  if (!v) return dflt;
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t c = v->find(',', start);
    std::string item = v->substr(start, c == std::string::npos ? std::string::npos : c - start);
    if (item.empty()) throw InvalidInput("empty entry in --" + name + " '" + *v + "'");
    out.push_back(item);
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}
std::vector<int64_t> Args::get_int_list(const std::string& name,
                                        std::vector<int64_t> dflt) const {
  if (!get(name)) return dflt;
  std::vector<int64_t> out;
  for (const auto& s : get_list(name, {})) out.push_back(parse_int(s, "--" + name));
  return out;
}

void apply_decode_flags(const Args& a, moex::GenerationOptions& g) {
  const std::string graph = a.get_or("graph", "on");
  if (graph != "on" && graph != "off") throw InvalidInput("--graph must be on or off, got '" + graph + "'");
  g.cuda_graph = graph == "on";
  // The decode-stage switch (grouped_mm -> batched_mm for the decode steps): auto = on GPUs only.
  const std::string sw = a.get_or("decode-switch", "auto");
  if (sw == "auto") g.decode_switch = DecodeSwitch::kAuto;
  else if (sw == "on") g.decode_switch = DecodeSwitch::kOn;
  else if (sw == "off") g.decode_switch = DecodeSwitch::kOff;
  else throw InvalidInput("--decode-switch must be auto, on or off, got '" + sw + "'");
}

}  // namespace moex::cli
