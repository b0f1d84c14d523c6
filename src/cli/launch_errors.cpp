// The file hand-over between a launched rank and `moex launch` (launch_errors.hpp): rank r writes
// "<directory of MOEX_RENDEZVOUS>/error.<r>" before it exits; the launcher reads them after every
// rank has ended and removes the directory.
#include "cli/launch_errors.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

namespace moex::cli {
namespace {

std::string error_file(const std::string& dir, int64_t rank) {
  return dir + "/error." + std::to_string(rank);
}

// "0-3", "0, 2-3": the ranks, consecutive runs joined.
std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

bool hand_error_to_launcher(const std::string& line) {
  const char* rendezvous = std::getenv("MOEX_RENDEZVOUS");
  const char* rank = std::getenv("RANK");
  if (!rendezvous || !*rendezvous || !rank || !*rank) return false;
  const std::string r = rendezvous;
  const size_t slash = r.rfind('/');
  if (slash == std::string::npos) return false;
  char* end = nullptr;
  const long long k = std::strtoll(rank, &end, 10);
  if (*end != '\0' || k < 0) return false;
  std::ofstream f(error_file(r.substr(0, slash), k), std::ios::trunc);
  f << line;
  if (line.empty() || line.back() != '\n') f << '\n';
  f.flush();
  return bool(f);
}

std::vector<std::string> collect_rank_errors(const std::string& dir, int64_t nranks) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> groups;
  for (int64_t r = 0; r < nranks; ++r) {
    std::ifstream f(error_file(dir, r));
    if (!f) continue;
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (text.empty()) continue;
    bool found = false;
    for (auto& g : groups)
      if (g.first == text) g.second.push_back(r), found = true;
    if (!found) groups.push_back({text, {r}});
  }
  std::vector<std::string> lines;
  for (const auto& [text, ranks] : groups)
    lines.push_back((ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks) + ": " + text);
  return lines;
}

}  // namespace moex::cli
