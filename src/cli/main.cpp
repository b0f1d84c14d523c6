// `moex`: the command-line tool. Subcommands register themselves (command.hpp). Every library
// error becomes one line "moex <cmd>: error: ..." on stderr and exit code 2; usage errors too.
// `moex --help` lists the commands, `moex CMD --help` a command's flags (from its flag table,
// args.hpp), both on stdout with exit 0; `moex --version` prints the CMake project version.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <cstdlib>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "cli/launch_errors.hpp"
#include "moex/env_switches.hpp"
#include "moex/error.hpp"

namespace moex::cli {

static std::vector<Command>& table() {
  static std::vector<Command> t;
  return t;
}
void register_command(Command c) { table().push_back(std::move(c)); }
const std::vector<Command>& commands() { return table(); }

// One error line on stderr, or, in a rank of `moex launch`, handed to the launcher, which prints
// each distinct line once for all its ranks (launch_errors.hpp).
static void report_error(const std::string& line) {
  if (!hand_error_to_launcher(line)) std::fputs(line.c_str(), stderr);
}

static int print_version() {
  std::printf("moex %s\n", MOEX_VERSION);
  return 0;
}

static const Registration kVersion({"version", "print the version (as moex --version)",
                                    [](const std::vector<std::string>& argv) {
                                      const Args no_flags(argv, {"version", "", "print the version", {}});
                                      return print_version();
                                    }});

}  // namespace moex::cli

// Loads a plugin: a shared library whose static initialisers call moex::register_experts_backend
// (see examples/reference_backend_plugin.cpp). It links against libmoex, which this executable
// already holds, so the plugin's backends land in the same registry.
static void load_plugin(const std::string& path) {
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL))
    throw moex::InvalidInput("cannot load plugin '" + path + "': " + dlerror());
}

static void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: moex [--plugin LIB.so]... <command> [flags]\n"
               "       moex <command> --help     the command's flags\n"
               "       moex --version\n\n"
               "  --plugin LIB.so    load a shared library that registers experts backends (repeatable;\n"
               "                     MOEX_PLUGINS=a.so:b.so does the same)\n\n"
               "commands:\n");
  auto cmds = moex::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (auto& c : cmds) std::fprintf(f, "  %-10s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  int first = 1;
  try {
    moex::check_env_switches();
    if (const char* env = std::getenv("MOEX_PLUGINS")) {
      std::string list = env;
      size_t start = 0;
      while (start <= list.size()) {
        size_t c = list.find(':', start);
        std::string item = list.substr(start, c == std::string::npos ? std::string::npos : c - start);
        if (!item.empty()) load_plugin(item);
        if (c == std::string::npos) break;
        start = c + 1;
      }
    }
    while (first < argc && std::string(argv[first]) == "--plugin") {
      if (first + 1 >= argc) throw moex::InvalidInput("missing value for --plugin");
      load_plugin(argv[first + 1]);
      first += 2;
    }
  } catch (const std::exception& e) {
    moex::cli::report_error(std::string("moex: error: ") + e.what() + "\n");
    return 2;
  }
  if (argc <= first || std::string(argv[first]) == "--help" || std::string(argv[first]) == "-h") {
    usage(argc <= first ? stderr : stdout);
    return argc <= first ? 2 : 0;
  }
  std::string name = argv[first];
  if (name == "--version") return moex::cli::print_version();
  std::vector<std::string> args(argv + first + 1, argv + argc);
  for (auto& c : moex::cli::commands()) {
    if (c.name != name) continue;
    try {
      return c.run(args);
    } catch (const moex::cli::HelpRequested& help) {
      std::fputs(help.what(), stdout);
      return 0;
    } catch (const std::bad_alloc&) {
      moex::cli::report_error("moex " + name +
                              ": error: out of host memory (std::bad_alloc): the model, the batch, the "
                              "prompt or --max-new-tokens need more memory than this machine can give\n");
      return 2;
    } catch (const std::exception& e) {
      moex::cli::report_error("moex " + name + ": error: " + e.what() + "\n");
      return 2;
    }
  }
  moex::cli::report_error("moex: error: unknown " + std::string(name.rfind("-", 0) == 0 ? "option" : "command") +
                          " '" + name + "'; see moex --help\n");
  return 2;
}
