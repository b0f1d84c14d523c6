#include "cli/load_progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

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

void note_unused_tensors(const ModelInfo& info, std::FILE* f) {
  const auto& u = info.unused_tensors;
  if (u.empty() || !f) return;
  std::string list;
  for (size_t i = 0; i < u.size() && i < 3; ++i) list += (i ? ", " : "") + u[i];
  if (u.size() > 3) list += ", ...";
  std::fprintf(f, "moex: note: %zu tensor%s of the checkpoint %s not used: %s (moex info lists them)\n", u.size(),
               u.size() == 1 ? "" : "s", u.size() == 1 ? "was" : "were", list.c_str());
}

}  // namespace moex::cli
