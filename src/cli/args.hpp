// A small, strict flag parser shared by the subcommands. Each command declares its flags once, in
// a table with a one-line meaning per flag (Usage below); the parser, `--help` and the "unknown
// flag" error all read that table, so no flag list is kept by hand anywhere else.
//
// Accepted: "--name value", "--name=value" and boolean switches. Rejected with moex::InvalidInput
// naming the flag (main() turns it into one error line and exit 2): unknown flags, positional
// words, a flag given twice, a missing value, a value that is another flag ("--model --greedy";
// write "--model=--greedy" for a value that starts with "--"), an empty value (unless the flag
// allows it) and malformed numbers. "-h" or "--help" anywhere a flag may stand throws
// HelpRequested, whose text main() prints on stdout with exit 0.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "moex/model.hpp"

namespace moex::cli {

struct Flag {
  std::string name;   // without the leading "--"
  std::string value;  // placeholder for the value in help ("DIR", "N"); empty = a switch
  std::string help;   // one line
  bool allow_empty = false;  // an empty value is meaningful (an empty prompt the library reports)
};

// What `moex CMD --help` prints: "usage: moex <command> <synopsis>", the about text, the flags.
struct Usage {
  std::string command;   // "generate", "bench generate"
  std::string synopsis;  // "--model DIR (--prompt TEXT | ...) [flags]"
  std::string about;     // a few lines; may be empty
  std::vector<Flag> flags;
};

// Not an error: the user asked for help. main() prints what() on stdout and exits 0.
class HelpRequested : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string help_text(const Usage& usage);
// True when argv asks for help at a flag position (a value of a valued flag is not a flag).
bool wants_help(const std::vector<std::string>& argv, const std::vector<Flag>& flags);

class Args {
 public:
  // Throws HelpRequested for -h / --help, InvalidInput for the errors above.
  Args(const std::vector<std::string>& argv, const Usage& usage);

  bool has(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& dflt) const;
  std::string require(const std::string& name) const;  // throws "missing required flag --name"
  int64_t get_int(const std::string& name, int64_t dflt) const;
  double get_double(const std::string& name, double dflt) const;
  // The same, refusing a given value <= 0 (ceilings, time budgets).
  double get_positive_double(const std::string& name, double dflt) const;
  // Comma-separated integers ("1,4,16"); throws on a malformed entry.
  std::vector<int64_t> get_int_list(const std::string& name, std::vector<int64_t> dflt) const;
  std::vector<std::string> get_list(const std::string& name, std::vector<std::string> dflt) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
};

// The flags every model-loading command shares, and the decode flags of generate / bench generate.
std::vector<Flag> load_flags();
// The LoadOptions those flags give (make_load_options + --dequantize).
LoadOptions load_options(const Args& a);
std::vector<Flag> decode_flags();
// --ep-size N and --ep-mode (moex generate, moex logits, moex bench generate): expert parallelism
// over N ranks, each model holding 1 / N of every MoE layer's routed experts
// (LoadOptions::ep_comm; docs/expert_parallel.md), and --tp-size N (LoadOptions::tp_comm: the
// attention and dense layers split over the same N ranks).
std::vector<Flag> ep_flags();
// Runs body(options, lead) on the ranks, each with its communicator (and device) in options, rank
// 0 as the lead (the one that prints):
// - launched (WORLD_SIZE > 1 in the environment, as moex launch sets it with RANK, LOCAL_RANK and
//   MOEX_RENDEZVOUS): this process is one rank, an NCCL rank on cuda:LOCAL_RANK; --ep-size, when
//   given, must equal WORLD_SIZE; GPUs only. A failure aborts the rank's communicator and is
//   rethrown (the launcher stops the other processes).
// - else --ep-size N > 1: N threads here, a thread group on the CPU or an NCCL group with rank r on
//   cuda:r (--device cuda); joined; a rank's failure aborts the others and is rethrown (the first
//   rank's own error, not a peer's abort).
// - else body(options, true) here.
void run_ep_ranks(const Args& a, const LoadOptions& options,
                  const std::function<void(LoadOptions&, bool lead)>& body);
// --graph on|off and --decode-switch auto|on|off (moex generate, moex bench generate) into g.
void apply_decode_flags(const Args& a, moex::GenerationOptions& g);

int64_t parse_int(const std::string& s, const std::string& what);
double parse_double(const std::string& s, const std::string& what);

}  // namespace moex::cli
