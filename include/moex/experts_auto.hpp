// The "auto" experts backend: each call runs grouped_mm or batched_mm, chosen by the call's token
// count from a table measured on the device.
//
// Why. transformers' decode-stage switch (grouped_mm -> batched_mm while generating on a GPU) is a
// fixed rule; which backend is faster depends on the experts' shape, the dtype, the GPU and the
// number of tokens in the call (a decode step of batch 64 is a 64-token call, a prompt of 8 x 128
// a 1024-token one). "auto" measures both backends once per experts shape at bucket sizes of 1 to
// 8192 tokens, on random routing, with the L2 flushed before each timed run (weights from HBM, as
// in a model), and then picks per call the faster one of the smallest bucket holding the call's
// tokens. A call's token count is a host value, so the choice adds no synchronisation and a
// captured decode graph records the backend its step size chose.
//
// Where the table comes from (ExpertsAutoTable::source):
// - "measured": at the first prepare of that shape in this process (14 buckets, one warm-up and
//   five timed calls each; batched_mm stops being timed once it has lost by 2x at two buckets in
//   a row, its per-pair products only grow slower with more tokens), then written to the cache
//   file;
// - "cache FILE": a table measured earlier on a device of the same name, read from the cache
//   file (experts_auto_cache_file());
// - "rule": on the CPU, grouped_mm at every size, without measuring (measured there at every T,
//   docs/cpu.md: batched_mm's per-pair products never win on a CPU, and transformers never
//   switches on the CPU either).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moex {

struct ExpertsAutoRow {
  int64_t tokens = 0;        // calls of up to this many tokens (and more than the row before)
  double grouped_mm_ms = 0;  // median ms of one call; 0 = not measured
  double batched_mm_ms = 0;
  std::string choice;        // "grouped_mm" or "batched_mm"
};

struct ExpertsAutoTable {
  std::string key;     // "DEVICE | SPEC | DTYPE": what the timings depend on
  std::string source;  // "measured", "cache FILE" or "rule"
  std::vector<ExpertsAutoRow> rows;  // increasing tokens; the last row also serves larger calls
  // The backend for a call of `tokens` tokens.
  const std::string& choose(int64_t tokens) const;
};

// The tables the auto backend has used in this process, one per key, in the order first used.
std::vector<ExpertsAutoTable> experts_auto_tables();

// The file measured tables are kept in: $MOEX_CACHE_DIR/experts_auto.json, else
// $XDG_CACHE_HOME/moex/experts_auto.json, else $HOME/.cache/moex/experts_auto.json; "" when none
// of the variables is set (tables are then measured once per process and not written).
std::string experts_auto_cache_file();

}  // namespace moex
