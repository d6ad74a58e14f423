// vlaked's handles on processes (pool/src/io/process_control.hpp) against real children: a
// pidfd tells when its process exited; a kill hits only the process with the given start time;
// a uid's groups include its primary group, and a uid without passwd entry has just that one.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "process_control.hpp"
#include "vlake/common/proc.hpp"
#include "vlake/common/unique_fd.hpp"

using namespace vlake::pool;

namespace {

// A child that sleeps until killed; reaped by the destructor.
struct Sleeper {
  pid_t pid = ::fork();
  Sleeper() {
    if (pid == 0) {
      for (;;) ::pause();
    }
    REQUIRE(pid > 0);
  }
  ~Sleeper() {
    if (pid <= 0) return;  // never kill(-1, ...)
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  [[nodiscard]] std::uint32_t upid() const { return static_cast<std::uint32_t>(pid); }
  // Whether it died of SIGKILL (reaps it; false while it runs).
  bool killed(int timeout_ms = 2000) {
    for (int i = 0; i < timeout_ms; ++i) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;  // nothing to kill nor reap any more
        return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
};

}  // namespace

TEST_CASE("process control: a pidfd reports its process's exit", "[process_control]") {
  Sleeper child;
  vlake::UniqueFd fd(pidfd_open(child.upid()));
  REQUIRE(fd);
  CHECK_FALSE(pidfd_exited(fd.get()));
  ::kill(child.pid, SIGKILL);
  bool exited = false;
  for (int i = 0; i < 2000 && !exited; ++i) {
    exited = pidfd_exited(fd.get());
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(exited);
}

TEST_CASE("process control: a kill with another start time spares the process", "[process_control]") {
  Sleeper child;
  const std::uint64_t start = vlake::process_start_time(child.upid());
  REQUIRE(start != 0);
  CHECK_FALSE(kill_process(child.upid(), start + 1));
  CHECK_FALSE(child.killed(50));
  CHECK(kill_process(child.upid(), start));
  CHECK(child.killed());
}

TEST_CASE("process control: a process that is gone cannot be killed", "[process_control]") {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  REQUIRE(::waitpid(pid, nullptr, 0) == pid);
  CHECK_FALSE(kill_process(static_cast<std::uint32_t>(pid), 1));
}

TEST_CASE("process control: a uid's groups include its primary group", "[process_control]") {
  const std::vector<gid_t> mine = supplementary_groups(::getuid(), ::getgid());
  CHECK(std::find(mine.begin(), mine.end(), ::getgid()) != mine.end());
  // No passwd entry for this uid: its primary group alone.
  CHECK(supplementary_groups(3'999'999'999U, 4242) == std::vector<gid_t>{4242});
}
