// A progress line on stderr while a checkpoint loads ("moex: loading 12.3 / 57.0 GB, 4.1 GB/s"),
// rewritten in place with \r and cleared when the load ends, so that it leaves nothing behind.
// Only when stderr is a terminal: redirected output and tests see no progress at all.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>

#include "moex/model.hpp"

namespace moex::cli {

class LoadProgress {
 public:
  // Sets options.progress when stderr is a terminal; the object must outlive the load.
  explicit LoadProgress(LoadOptions& options);
  ~LoadProgress();  // clears the line if the load ended early (an exception)
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;

 private:
  void update(int64_t done, int64_t total);
  void clear();

  std::chrono::steady_clock::time_point start_, last_;
  bool shown_ = false;
};

// After a load: one line on `f` naming the checkpoint tensors the model did not use (the first
// few and the count; `moex info` lists them all), as transformers warns of unused weights.
// Nothing when every tensor was used.
void note_unused_tensors(const ModelInfo& info, std::FILE* f);

}  // namespace moex::cli
