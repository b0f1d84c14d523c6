// The table of MOEX_* environment variables (include/moex/env_switches.hpp) and the readers the
// library's tiers call (core/env_switch_read.hpp). The measurements behind the measuring
// switches' defaults are in docs/gpu_model.md, docs/cuda.md and docs/cpu.md.
#include <cstdlib>
#include <string>
#include <vector>

#include "core/env_switch_read.hpp"
#include "moex/env_switches.hpp"
#include "moex/error.hpp"

namespace moex {
namespace {

enum class Accepts : unsigned char { kFlag, kNonNegative, kFlush, kText };

struct Entry {
  const char* name;
  Accepts accepts;
  const char* unset;
  const char* meaning;
  bool measuring;
};

// Measuring switches first (in the order of the tiers that read them), then places.
constexpr Entry kTable[] = {
    {"MOEX_PDL", Accepts::kFlag, "1 on Hopper and later",
     "programmatic dependent launch between dependent CUDA kernels (docs/gpu_model.md); 0 launches "
     "each after the last finished",
     true},
    {"MOEX_STREAM_PRIORITIES", Accepts::kFlag, "1",
     "the current stream at the device's greatest priority and the side stream at its least, so "
     "the side's work gives way (docs/gpu_model.md); 0: both at the default",
     true},
    {"MOEX_SIDE_BLOCKS_PER_SM", Accepts::kNonNegative, "2",
     "blocks per SM a persistent GEMV grid takes on the side stream (the shared expert beside the "
     "routed ones); 0: no cap",
     true},
    {"MOEX_GEMV_BLOCKS_PER_SM", Accepts::kNonNegative, "the measured policy (4 asked at one row, a block per "
     "column group above)",
     "blocks per SM of the GEMV at every row count; 0: one block per column group", true},
    {"MOEX_NORM_GEMV", Accepts::kFlag, "1",
     "decode forms the RMS norm inside the next GEMV; 0: a norm kernel, then the GEMV", true},
    {"MOEX_ROPE_SPREAD", Accepts::kFlag, "1",
     "decode rows spread a row's heads over blocks in the rope kernel; 0: one block per row and tensor", true},
    {"MOEX_GROUPED_GEMV_EARLY", Accepts::kFlag, "1",
     "the experts' down GEMV loads its first weights before waiting for gate_up; 0: waits first", true},
    {"MOEX_WGMMA_SMALL_A", Accepts::kFlag, "1",
     "wgmma tiles of few rows load only their rows' A box; 0: every tile loads the whole stage", true},
    {"MOEX_FP8_Y_FP32", Accepts::kFlag, "0",
     "1: the FP8 experts' down projection writes y in fp32 instead of the element type", true},
    {"MOEX_CUDNN", Accepts::kFlag, "1 (cuDNN's attention for prompts when it loads)",
     "0: prompts' attention runs the project's flash kernel (bit-reproducible first prompts; "
     "docs/gpu_model.md)",
     true},
    {"MOEX_CPU_PROFILE", Accepts::kFlag, "0",
     "1: the CPU grouped experts engine prints the time of each phase to stderr", true},
    {"MOEX_BENCH_L2_FLUSH", Accepts::kFlush, "read",
     "how `bench` empties the GPU's L2 before each timed run: a read of a buffer, or write (zeroes "
     "it, as triton's do_bench does; docs/cuda.md)",
     true},
    {"MOEX_CUDNN_LIBRARY", Accepts::kText, "libcudnn.so.9 from the loader's path",
     "the cuDNN library to load for prompts' attention", false},
    {"MOEX_NCCL_LIBRARY", Accepts::kText, "libnccl.so.2 from the loader's path",
     "the NCCL library to load for expert and tensor parallelism across GPUs", false},
    {"MOEX_CACHE_DIR", Accepts::kText, "$XDG_CACHE_HOME/moex, else ~/.cache/moex",
     "where experts_implementation \"auto\" keeps its measured tables (experts_auto.json)", false},
    {"MOEX_PLUGINS", Accepts::kText, "none",
     "the CLI: shared libraries to load before the command, separated by ':' (as --plugin)", false},
    {"MOEX_RENDEZVOUS", Accepts::kText, "not a launched rank",
     "the CLI: the file where `moex launch`'s ranks meet (set by `moex launch`)", false},
    {"MOEX_LAUNCH_PROGRAM", Accepts::kText, "this moex",
     "the CLI: the program `moex launch` starts per rank (tests stand others in for it)", false},
};

const Entry* find(const char* name) {
  for (const Entry& e : kTable)
    if (std::string(e.name) == name) return &e;
  return nullptr;
}

const char* accepts_text(Accepts a) {
  switch (a) {
    case Accepts::kFlag: return "0 or 1";
    case Accepts::kNonNegative: return "an integer >= 0";
    case Accepts::kFlush: return "read or write";
    case Accepts::kText: return "a path or list of paths";
  }
  return "";
}

std::optional<std::string> value_of(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

// The value's integer, or nullopt when the entry does not accept it.
std::optional<long> parse(const Entry& e, const std::string& v) {
  switch (e.accepts) {
    case Accepts::kFlag:
      if (v == "0" || v == "1") return v == "1" ? 1 : 0;
      return std::nullopt;
    case Accepts::kNonNegative: {
      if (v.find_first_not_of("0123456789") != std::string::npos || v.size() > 9) return std::nullopt;
      return std::strtol(v.c_str(), nullptr, 10);
    }
    case Accepts::kFlush:
      if (v == "read" || v == "write") return v == "write" ? 1 : 0;
      return std::nullopt;
    case Accepts::kText: return 0;
  }
  return std::nullopt;
}

[[noreturn]] void refuse(const Entry& e, const std::string& v) {
  throw InvalidInput("environment variable " + std::string(e.name) + "=\"" + v + "\" is not accepted: it takes " +
                     accepts_text(e.accepts) + " (" + e.meaning + "); unset it for the default (" + e.unset + ")");
}

const Entry& entry(const char* name) {
  const Entry* e = find(name);
  // A reader naming a switch the table lacks is a bug in the library, not bad input.
  if (!e) throw Error(std::string("internal: environment switch ") + name + " is not in the table");
  return *e;
}

}  // namespace

std::vector<EnvSwitch> env_switches() {
  std::vector<EnvSwitch> v;
  for (const Entry& e : kTable)
    v.push_back({e.name, accepts_text(e.accepts), e.unset, e.meaning, e.measuring, value_of(e.name)});
  return v;
}

void check_env_switches() {
  for (const Entry& e : kTable)
    if (auto v = value_of(e.name); v && !parse(e, *v)) refuse(e, *v);
}

std::string measuring_switches_set() {
  std::string s;
  for (const Entry& e : kTable) {
    if (!e.measuring) continue;
    if (auto v = value_of(e.name)) s += (s.empty() ? "" : " ") + std::string(e.name) + "=" + *v;
  }
  return s;
}

long env_switch_int(const char* name, long fallback) {
  const Entry& e = entry(name);
  auto v = value_of(name);
  if (!v) return fallback;
  auto n = parse(e, *v);
  if (!n) refuse(e, *v);
  return *n;
}

std::optional<std::string> env_switch_text(const char* name) {
  entry(name);
  return value_of(name);
}

}  // namespace moex
