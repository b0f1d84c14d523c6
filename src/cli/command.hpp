// CLI subcommands register themselves here (one static Registration per command file), so that
// adding a command is adding a file. main() turns any moex::Error into one line on stderr + exit 2.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace moex::cli {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Command {
  std::string name;     // "bench", "generate", ...
  std::string summary;  // one line for `moex --help`
  CommandFn run;
};

void register_command(Command c);

// `moex bench generate` (cmd_bench_generate.cpp), reached through `moex bench`.
int run_bench_generate(const std::vector<std::string>& argv);
// `moex bench comm` (cmd_bench_comm.cpp).
int run_bench_comm(const std::vector<std::string>& argv);
const std::vector<Command>& commands();

struct Registration {
  explicit Registration(Command c) { register_command(std::move(c)); }
};

}  // namespace moex::cli
