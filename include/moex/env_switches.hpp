// The environment variables the library reads (MOEX_*), in one table: what each accepts, what it
// does, and its value in this process.
//
// Two kinds. Measuring switches turn one measured design choice off or change one kernel
// parameter (MOEX_PDL=0, MOEX_GEMV_BLOCKS_PER_SM=3, ...): the defaults are the measured best, and
// a set switch changes which kernels run and so the speed, sometimes the bits. Places tell the
// library where to find a library or a cache (MOEX_CUDNN_LIBRARY, MOEX_CACHE_DIR, ...).
//
// Why one table: a switch read in a scattered static with its own parsing ignored a value it did
// not understand (MOEX_PDL=off left PDL on) or took any value as "on" (MOEX_CPU_PROFILE=0 turned
// profiling on), and a timing made with a switch set did not say so. Now a value the table does
// not accept is an error naming the variable and what it accepts, `moex info` lists every switch,
// and bench rows record the measuring switches that are set.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace moex {

struct EnvSwitch {
  std::string name;                  // MOEX_...
  std::string accepts;               // "0 or 1", "an integer >= 0", "read or write", "a path", ...
  std::string unset;                 // what the library does when it is not set
  std::string meaning;               // what it changes
  bool measuring = false;            // a measuring switch (changes kernels or numbers) or a place
  std::optional<std::string> value;  // its value in this process's environment (an empty value is unset)
};

// Every switch, in the table's order, with its value now.
std::vector<EnvSwitch> env_switches();

// Throws moex::InvalidInput naming the first set switch whose value the table does not accept.
// The library calls it where it starts work (loading a model, building an experts layer); the
// readers check again, so a value changed later is caught where it is read.
void check_env_switches();

// The measuring switches that are set, as "NAME=VALUE" joined by single spaces ("" when none):
// what a timing must carry to be rerun.
std::string measuring_switches_set();

}  // namespace moex
