// `moex launch --nproc N -- COMMAND ...`: one process per GPU for expert parallelism. Starts N
// copies of this moex (`moex COMMAND ...`) with RANK, LOCAL_RANK, WORLD_SIZE and MOEX_RENDEZVOUS
// (a file in a fresh directory where NCCL's unique id passes from rank 0 to the others) in their
// environment; the commands' --ep-size machinery (run_ep_ranks) turns that into an NCCL rank on
// cuda:LOCAL_RANK. The launcher owns the group's fate: when a rank fails (non-zero exit, a
// signal), the others get --grace seconds to finish or report, then are terminated, so a rank
// that died never leaves its peers waiting in a collective; the launcher exits with the failed
// rank's code (1 after a signal) and names it. The ranks' fatal error lines come to the launcher
// (launch_errors.hpp), which prints each distinct one once after every rank has ended.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "cli/launch_errors.hpp"
#include "moex/error.hpp"

namespace moex::cli {
namespace {

struct Rank {
  pid_t pid = -1;
  bool done = false;
  int status = 0;
};

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}
bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

int run_launch(const std::vector<std::string>& argv_in) {
  static const Usage kUsage = [] {
    Usage u{"launch", "--nproc N [--grace S] -- COMMAND [FLAGS]",
            "Run `moex COMMAND FLAGS` as N processes, rank r on GPU cuda:r, for expert parallelism\n"
            "over NCCL (e.g. moex launch --nproc 2 -- generate --model DIR --device cuda ...). Each\n"
            "process gets RANK, LOCAL_RANK, WORLD_SIZE and MOEX_RENDEZVOUS; rank 0 prints. When a rank\n"
            "fails, the others are stopped after the grace period and the launcher exits with its code.",
            {}};
    u.flags.push_back({"nproc", "N", "number of processes (ranks), one per GPU"});
    u.flags.push_back({"grace", "S", "seconds the other ranks get after one fails (default 5)"});
    return u;
  }();
  // Flags up to "--", the command after it.
  std::vector<std::string> own, command;
  bool split = false;
  for (const auto& s : argv_in) {
    if (!split && s == "--") {
      split = true;
      continue;
    }
    (split ? command : own).push_back(s);
  }
  Args a(own, kUsage);
  const int64_t n = a.get_int("nproc", 0);
  const double grace = a.get_double("grace", 5.0);
  if (n < 1 || n > 1024) throw InvalidInput("--nproc must be between 1 and 1024, got " + std::to_string(n));
  if (!(grace >= 0)) throw InvalidInput("--grace must be >= 0 seconds");
  if (!split || command.empty())
    throw InvalidInput("missing the command to launch: moex launch --nproc N -- COMMAND [FLAGS]");
  if (command[0] == "launch") throw InvalidInput("moex launch cannot launch itself");

  // The program: this moex, or MOEX_LAUNCH_PROGRAM (tests stand other programs in for it).
  std::string program;
  if (const char* p = std::getenv("MOEX_LAUNCH_PROGRAM"); p && *p) program = p;
  else {
    std::error_code ec;
    program = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) throw Unsupported("moex launch: cannot find this executable (/proc/self/exe): " + ec.message());
  }
  char dir_template[] = "/tmp/moex-launch-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (!dir) throw Unsupported(std::string("moex launch: cannot create a rendezvous directory: ") + std::strerror(errno));
  const std::string rendezvous = std::string(dir) + "/nccl_unique_id";

  std::vector<std::string> args;
  args.push_back(program);
  args.insert(args.end(), command.begin(), command.end());
  std::vector<char*> cargs;
  for (auto& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<Rank> ranks(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (auto& q : ranks)
        if (q.pid > 0) kill(q.pid, SIGKILL);
      throw Unsupported(std::string("moex launch: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MOEX_RENDEZVOUS", rendezvous.c_str(), 1);
      execv(program.c_str(), cargs.data());
      std::fprintf(stderr, "moex launch: rank %lld: cannot run %s: %s\n", (long long)r, program.c_str(),
                   std::strerror(errno));
      _exit(127);
    }
    ranks[size_t(r)].pid = pid;
  }

  // Wait for every rank; after the first failure, give the rest the grace period, then stop them.
  int first_failed = -1;
  auto deadline = std::chrono::steady_clock::time_point::max();
  bool termed = false;
  for (int64_t left = n; left > 0;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, first_failed < 0 ? 0 : WNOHANG);
    if (pid > 0) {
      for (size_t r = 0; r < ranks.size(); ++r)
        if (ranks[r].pid == pid && !ranks[r].done) {
          ranks[r].done = true;
          ranks[r].status = status;
          --left;
          if (failed(status) && first_failed < 0) {
            first_failed = int(r);
            deadline = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(int64_t(grace * 1000.0));
            if (left > 0)
              std::fprintf(stderr, "moex launch: rank %zu failed (%s); stopping the other ranks within %.0f s\n", r,
                           describe(status).c_str(), grace);
          }
        }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (first_failed >= 0 && std::chrono::steady_clock::now() > deadline) {
      const int sig = termed ? SIGKILL : SIGTERM;
      for (auto& q : ranks)
        if (!q.done) kill(q.pid, sig);
      termed = true;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const std::string& line : collect_rank_errors(dir, n)) std::fprintf(stderr, "%s\n", line.c_str());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (first_failed < 0) return 0;
  const int status = ranks[size_t(first_failed)].status;
  std::fprintf(stderr, "moex launch: rank %d of %lld failed (%s)\n", first_failed, (long long)n,
               describe(status).c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

const Registration kLaunch({"launch", "run a command as one process per GPU (expert parallelism over NCCL)",
                            run_launch});

}  // namespace
}  // namespace moex::cli
