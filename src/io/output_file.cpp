// See output_file.hpp. The kind of target is decided once, when the file is opened: lstat() says
// whether the name itself is a link, stat() what it finally is.
#include "io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "moex/error.hpp"

namespace moex::io {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

// Descriptor N for the names that mean "this process's descriptor N", else -1. Opening them
// anew would start at offset 0 (and truncating would clobber what a shell's `>>` appended to).
int own_descriptor(const std::string& path) {
  if (path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const size_t n = std::strlen(prefix);
    if (path.compare(0, n, prefix) != 0 || path.size() == n || path.size() > n + 9) continue;
    const std::string digits = path.substr(n);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    return std::atoi(digits.c_str());
  }
  return -1;
}

std::string kind_name(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file, character device or FIFO";
}

}  // namespace

OutputFile::OutputFile(const std::string& path) : path_(path) {
  if (path.empty()) throw InvalidInput("output path is empty");
  if (const int own = own_descriptor(path); own >= 0) {
    fd_ = ::fcntl(own, F_DUPFD_CLOEXEC, 3);
    if (fd_ < 0) throw Error(path + ": cannot write to descriptor " + std::to_string(own) + ": " + errno_text(errno));
    return;
  }
  struct stat link_st {}, st {};
  const bool exists = ::lstat(path.c_str(), &link_st) == 0;
  if (!exists && errno != ENOENT) throw Error(path + ": cannot be written: " + errno_text(errno));
  const bool is_link = exists && S_ISLNK(link_st.st_mode);
  if (exists) {
    if (::stat(path.c_str(), &st) != 0) {
      if (is_link && errno == ENOENT)
        throw InvalidInput(path + ": is a symbolic link to a missing file; give the target's path");
      throw Error(path + ": cannot be written: " + errno_text(errno));
    }
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      // Non-blocking open: a FIFO without a reader fails (ENXIO) instead of waiting forever.
      fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | (S_ISFIFO(st.st_mode) ? O_NONBLOCK : 0));
      if (fd_ < 0 && errno == ENXIO)
        throw InvalidInput(path + ": is a FIFO that no process is reading");
      if (fd_ < 0) throw Error(path + ": cannot open for writing: " + errno_text(errno));
      if (S_ISFIFO(st.st_mode)) ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
      return;
    }
    if (!S_ISREG(st.st_mode))
      throw InvalidInput(path + ": is " + kind_name(st.st_mode) + ", not a file an output can be written to");
  }
  target_ = path;
  if (is_link) {
    char* real = ::realpath(path.c_str(), nullptr);
    if (!real) throw Error(path + ": cannot resolve the symbolic link: " + errno_text(errno));
    target_ = real;
    std::free(real);
  }
  // The temporary file lives in the target's folder, so that rename() is atomic (same file system).
  const size_t slash = target_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : target_.substr(0, std::max<size_t>(slash, 1));
  const std::string base = slash == std::string::npos ? target_ : target_.substr(slash + 1);
  static std::atomic<unsigned> counter{0};
  // O_EXCL with mode 0666: the process umask applies as for any new file; an existing target's
  // permission bits are copied below.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    const std::string name = dir + "/." + base.substr(0, 64) + ".tmp" + std::to_string(::getpid()) +
                             "." + std::to_string(counter++);
    fd_ = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) {
      tmp_ = name;
    } else if (errno != EEXIST || attempt > 100) {
      throw Error(path + ": cannot create a temporary file in '" + dir + "': " + errno_text(errno));
    }
  }
  if (exists) (void)::fchmod(fd_, st.st_mode & 07777);
}

OutputFile::~OutputFile() {
  if (done_) return;
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  if (done_ || fd_ < 0) throw Error(path_ + ": write after the file was closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Pieces of at most 1 GiB: write(2) returns short counts for larger requests anyway.
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(path_ + ": write failed: " + errno_text(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

void OutputFile::commit() {
  if (done_) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int e = errno;
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
    done_ = true;
    throw Error(path_ + ": write failed when closing: " + errno_text(e));
  }
  done_ = true;
  if (tmp_.empty()) return;
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    throw Error(path_ + ": cannot move the written file into place: " + errno_text(e));
  }
}

}  // namespace moex::io
