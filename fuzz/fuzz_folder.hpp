// A scratch checkpoint folder for the checkpoint fuzz targets: Checkpoint::open reads files, so
// each input is written into one folder per process (made once, removed at exit) before opening.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace moex::fuzz {

inline const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes the folder runs after static destructors
  // could have freed a plain static string.
  static const std::string& dir = *[] {
    char tmpl[] = "/tmp/moex_fuzz_XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    return new std::string(tmpl);
  }();
  static const bool cleanup_registered = [] {
    return std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    }) == 0;
  }();
  (void)cleanup_registered;
  return dir;
}

inline void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), std::streamsize(size));
  if (!out.good()) std::abort();
}
inline void write_file(const std::string& path, const std::string& text) {
  write_file(path, text.data(), text.size());
}

}  // namespace moex::fuzz
