// Output lost on standard output (a full disk, /dev/full, a closed pipe's EPIPE) must not end in
// exit status 0 with nothing said. stdio reports such errors only through ferror()/fflush(), so
// at exit (every path out of main, which returns normally) stdout is flushed and checked; a
// failure becomes one line on stderr and exit status 2, as for any other error of the CLI.
// Registered like the commands, by a static initialiser, so that main() needs no change.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace moex::cli {
namespace {

void check_stdout_at_exit() {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int e = errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return;
  std::fprintf(stderr, "moex: error: writing to standard output failed%s%s\n", e ? ": " : "",
               e ? std::strerror(e) : "");
  // exit() is already running: _Exit ends the process with the new status (exit() may not be
  // called again from an atexit handler).
  std::_Exit(2);
}

const int kRegistered = std::atexit(check_stdout_at_exit);

}  // namespace
}  // namespace moex::cli
