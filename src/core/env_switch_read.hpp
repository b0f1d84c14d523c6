// Readers of the MOEX_* environment switches for the library's tiers. Each name must be in the
// table of src/core/env_switches.cpp (a name missing there is a library bug and throws). Callers
// read once and keep the value (a static), as the switches are set before the process starts.
#pragma once

#include <optional>
#include <string>

namespace moex {

// The switch's value as an integer (a flag: 0 / 1; MOEX_BENCH_L2_FLUSH: read 0, write 1), or
// `fallback` when it is unset or empty. A value the table does not accept throws InvalidInput
// naming the variable and what it takes.
long env_switch_int(const char* name, long fallback);

// A place's value (a path), nullopt when unset or empty.
std::optional<std::string> env_switch_text(const char* name);

}  // namespace moex
