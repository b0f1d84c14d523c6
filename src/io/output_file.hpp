// Writing a user-named output file (every --out of the CLI goes through save_safetensors, which
// writes with this class), so that an output path behaves the way `>` does in a shell without
// its dangers:
//
//   target                        what happens
//   absent / regular file         bytes go to a temporary file in the same folder, which is
//                                 renamed over the target on commit(): the old file stays intact
//                                 until the new one is complete (the new file keeps the old one's
//                                 permission bits)
//   symbolic link                 followed: the file it finally points to is written as above
//                                 (the link stays a link); a link to a missing file is refused
//   character device, FIFO        written through (open + write, no rename): /dev/null stays a
//                                 device, a FIFO's reader receives the bytes; a FIFO without a
//                                 reader is refused instead of blocking
//   /dev/stdout, /dev/stderr,     the process's own descriptor N is written through, at its
//   /dev/fd/N, /proc/self/fd/N    current offset (a shell's `>>` keeps appending)
//   folder, socket, block device  refused
//
// Every failure is a moex::Error naming the path and the reason; the temporary file is removed on
// every path that does not commit (an exception between open and commit included).
#pragma once

#include <cstddef>
#include <string>

namespace moex::io {

class OutputFile {
 public:
  // Decides how `path` is written (table above) and opens it. Throws InvalidInput for a target
  // that cannot be an output (folder, socket, dangling link, FIFO without a reader) and Error
  // when the temporary file or the device cannot be opened.
  explicit OutputFile(const std::string& path);
  ~OutputFile();  // without commit(): closes and removes the temporary file; never throws
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Appends n bytes. Throws Error naming the path on a failed write (disk full, EFBIG, EPIPE...).
  void write(const void* data, size_t n);
  // Closes and, for a regular target, renames the temporary file into place. Throws Error (and
  // removes the temporary file) when closing or renaming fails.
  void commit();

  // Whether the bytes go to a temporary file that commit() renames (false: written through).
  bool renames() const { return !tmp_.empty(); }

 private:
  std::string path_;    // as given, for messages
  std::string target_;  // the file that is replaced on commit (links resolved)
  std::string tmp_;     // the temporary file; empty when written through
  int fd_ = -1;
  bool done_ = false;
};

}  // namespace moex::io
