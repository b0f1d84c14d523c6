// Output paths (every --out of the CLI is written by save_safetensors through io::OutputFile):
// devices and FIFOs are written through and stay what they are, regular files are replaced only
// by a complete new file, links are followed, folders and dangling links are refused, and no
// temporary file survives a failure.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "io/output_file.hpp"
#include "moex/error.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

namespace fs = std::filesystem;

class OutputPath : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_output_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(tmp_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(tmp_, ec);
  }
  // 19 x 111 float32 values: bigger than one write of the header, small enough for a pipe buffer.
  static std::map<std::string, Tensor> tensors() {
    std::vector<float> v(19 * 111);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f - 3.f;
    return {{"logits", Tensor::from_floats(v, {19, 111})}};
  }
  // The bytes save_safetensors writes for tensors() (to a fresh regular file).
  std::string expected_bytes() {
    const std::string p = tmp_ + "/expected.safetensors";
    save_safetensors(p, tensors());
    std::string s = test::read_file(p);
    fs::remove(p);
    return s;
  }
  std::vector<std::string> listing(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

  std::string tmp_;
};

TEST_F(OutputPath, DevNullStaysACharacterDevice) {
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  if (!S_ISCHR(st.st_mode)) GTEST_SKIP() << "/dev/null is not a character device on this machine";
  save_safetensors("/dev/null", tensors());
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null was replaced (running as uid " << ::geteuid() << ")";
  EXPECT_TRUE(listing(tmp_).empty());
}

TEST_F(OutputPath, DevFullReportsTheWriteError) {
  struct stat st {};
  if (::stat("/dev/full", &st) != 0 || !S_ISCHR(st.st_mode)) GTEST_SKIP() << "no /dev/full";
  try {
    save_safetensors("/dev/full", tensors());
    FAIL() << "expected a write error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: write failed"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST_F(OutputPath, FifoWithAReaderReceivesTheBytes) {
  const std::string fifo = tmp_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string expected = expected_bytes();
  std::string received;
  std::thread reader([&] {
    const int fd = ::open(fifo.c_str(), O_RDONLY);  // blocks until the writer opens
    if (fd < 0) return;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) received.append(buf, size_t(n));
    ::close(fd);
  });
  // The reader may not have reached open() yet: until it has, the FIFO has no reader, which is
  // an error (not a wait).
  bool written = false;
  for (int i = 0; i < 500 && !written; ++i) {
    try {
      save_safetensors(fifo, tensors());
      written = true;
    } catch (const InvalidInput& e) {
      ASSERT_NE(std::string(e.what()).find("no process is reading"), std::string::npos) << e.what();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  reader.join();
  ASSERT_TRUE(written);
  EXPECT_EQ(received, expected);
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(OutputPath, FifoWithoutAReaderIsRefusedAtOnce) {
  const std::string fifo = tmp_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(save_safetensors(fifo, tensors()), InvalidInput);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(OutputPath, OwnDescriptorIsWrittenAtItsOffset) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const std::string expected = expected_bytes();
  ASSERT_LT(expected.size(), 60000u);  // fits the pipe's buffer: no reader thread needed
  save_safetensors("/dev/fd/" + std::to_string(p[1]), tensors());
  ::close(p[1]);
  std::string received;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) received.append(buf, size_t(n));
  ::close(p[0]);
  EXPECT_EQ(received, expected);
}

TEST_F(OutputPath, RegularFileIsReplacedWithItsPermissions) {
  const std::string out = tmp_ + "/out.safetensors";
  write_text(out, "old");
  ASSERT_EQ(::chmod(out.c_str(), 0640), 0);
  save_safetensors(out, tensors());
  EXPECT_EQ(SafetensorsFile::open(out)->get("logits").to_float_vector(),
            tensors().at("logits").to_float_vector());
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(listing(tmp_), std::vector<std::string>{"out.safetensors"});
}

// A link is followed: the file it points to is replaced and the link stays a link.
TEST_F(OutputPath, SymlinkWritesTheFileItPointsTo) {
  fs::create_directory(tmp_ + "/real");
  const std::string target = tmp_ + "/real/out.safetensors", link = tmp_ + "/link.safetensors";
  write_text(target, "old");
  fs::create_symlink(target, link);
  save_safetensors(link, tensors());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(SafetensorsFile::open(target)->get("logits").shape(), (Shape{19, 111}));
  EXPECT_EQ(listing(tmp_ + "/real"), std::vector<std::string>{"out.safetensors"});
  EXPECT_EQ(listing(tmp_), (std::vector<std::string>{"link.safetensors", "real"}));
}

TEST_F(OutputPath, DanglingSymlinkIsRefused) {
  const std::string link = tmp_ + "/link.safetensors";
  fs::create_symlink(tmp_ + "/missing/out.safetensors", link);
  try {
    save_safetensors(link, tensors());
    FAIL() << "expected an error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link to a missing file"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_symlink(link));
}

TEST_F(OutputPath, FolderIsRefused) {
  try {
    save_safetensors(tmp_, tensors());
    FAIL() << "expected an error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("is a folder"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(tmp_));
  EXPECT_TRUE(listing(tmp_).empty());
}

TEST_F(OutputPath, MissingFolderIsAnError) {
  EXPECT_THROW(save_safetensors(tmp_ + "/missing/out.safetensors", tensors()), Error);
  EXPECT_TRUE(listing(tmp_).empty());
}

// Root may write anywhere, so the attempt runs in a child that drops to an unprivileged user.
TEST_F(OutputPath, UnwritableFolderLeavesNoTemporaryFile) {
  const std::string dir = tmp_ + "/ro";
  fs::create_directory(dir);
  write_text(dir + "/out.safetensors", "old");
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(tmp_.c_str(), 0755), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    try {
      save_safetensors(dir + "/out.safetensors", tensors());
    } catch (const Error& e) {
      ::_exit(std::string(e.what()).find("cannot create a temporary file") != std::string::npos ? 0 : 2);
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error, 2: another message, 3: cannot drop root";
  EXPECT_EQ(listing(dir), std::vector<std::string>{"out.safetensors"});
  EXPECT_EQ(test::read_file(dir + "/out.safetensors"), "old");
}

// A write that fails halfway (here: the file size limit) leaves the old file as it was.
TEST_F(OutputPath, FailureMidWriteKeepsTheOldFile) {
  const std::string out = tmp_ + "/out.safetensors";
  write_text(out, "old contents");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG instead of killing the process
    rlimit lim{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(3);
    try {
      save_safetensors(out, tensors());
    } catch (const Error& e) {
      ::_exit(std::string(e.what()).find("write failed") != std::string::npos ? 0 : 2);
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error, 2: another message, 3: setrlimit failed";
  EXPECT_EQ(test::read_file(out), "old contents");
  EXPECT_EQ(listing(tmp_), std::vector<std::string>{"out.safetensors"});
}

// An exception between open and commit (the writer's caller failing) removes the temporary file.
TEST_F(OutputPath, NoCommitRemovesTheTemporaryFile) {
  const std::string out = tmp_ + "/out.bin";
  write_text(out, "old");
  struct CallerFailed {};  // only this test's throw is caught: a failing OutputFile is not swallowed
  bool failed = false;
  try {
    io::OutputFile f(out);
    EXPECT_TRUE(f.renames());
    f.write("new bytes", 9);
    EXPECT_EQ(listing(tmp_).size(), 2u);
    throw CallerFailed{};
  } catch (const CallerFailed&) {
    failed = true;
  }
  EXPECT_TRUE(failed);
  EXPECT_EQ(test::read_file(out), "old");
  EXPECT_EQ(listing(tmp_), std::vector<std::string>{"out.bin"});
}

TEST_F(OutputPath, EmptyPathIsRefused) { EXPECT_THROW(save_safetensors("", tensors()), InvalidInput); }

}  // namespace
}  // namespace moex
