#include "cli/load_progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace moex::cli {

LoadProgress::LoadProgress(LoadOptions& options) {
  if (!isatty(fileno(stderr))) return;
  start_ = last_ = std::chrono::steady_clock::now();
  options.progress = [this](int64_t done, int64_t total) { update(done, total); };
}

LoadProgress::~LoadProgress() { clear(); }

void LoadProgress::update(int64_t done, int64_t total) {
  const auto now = std::chrono::steady_clock::now();
  if (done >= total) return clear();
  // Nothing for a load that ends at once; then a few redraws a second, enough to read and
  // nothing against the load.
  if (now - start_ < std::chrono::milliseconds(300)) return;
  if (shown_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double s = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\rmoex: loading %.1f / %.1f GB, %.2f GB/s\033[K", double(done) / 1e9, double(total) / 1e9,
               s > 0 ? double(done) / s / 1e9 : 0.0);
  std::fflush(stderr);
  shown_ = true;
}

void LoadProgress::clear() {
  if (!shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace moex::cli
