// Helpers of the limits tests (test_limits.cpp) and soaks (test_limits_soak.cpp): forked
// tenants of their own uid, a Hello that reports the daemon's Error, small state readers.
#pragma once

#include <catch2/catch.hpp>

#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "pool_client.hpp"
#include "units.hpp"
#include "vlake/contracts/protocol.hpp"

namespace vlake::pooltest::limits {

namespace st = vlake::state;
using proto::Status;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)
inline const char* const kConfig = "version: 1\ndefault:\n  limit: 100%\n";

struct HelloResult {
  bool ok = false;
  Status status = Status::internal;
  std::string text;
  proto::HelloAck ack{};
};

// Hello on `c`: the ack, or the Error's status and text (closed: internal, "closed").
inline HelloResult try_hello(PoolClient& c) {
  auto m = proto::make<proto::Hello>(c.next_request_id());
  m.pid = static_cast<std::uint32_t>(::getpid());
  c.send(m);
  HelloResult r;
  const auto got = c.recv(10000);
  if (!got || got->closed) {
    r.text = "closed";
    return r;
  }
  if (got->type() == proto::MsgType::error) {
    const auto e = got->as<proto::Error>();
    r.status = e.status;
    r.text.assign(e.message, strnlen(e.message, sizeof e.message));
    return r;
  }
  r.ack = got->as<proto::HelloAck>();
  r.ok = true;
  r.status = r.ack.status;
  return r;
}

// Child exit codes.
inline constexpr int kServed = 0;
inline constexpr int kLimitReached = 10;
inline constexpr int kOtherError = 11;

[[noreturn]] inline void child_exit(int code) { ::_exit(code); }

// A forked tenant of its own uid (gid = uid): connects, says Hello, then exits with kServed /
// kLimitReached / kOtherError — at once, or (`hold`) when the parent closes its pipe.
struct Tenant {
  pid_t pid = -1;
  int hold_fd = -1;  // parent's end: closing it lets the child exit

  static Tenant fork_one(const std::string& socket, std::uint32_t uid, bool hold) {
    int p[2] = {-1, -1};
    if (hold) REQUIRE(::pipe(p) == 0);
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Keep only what this child needs (3: ready, 4: hold): the other children's hold pipes
      // must not stay open here.
      ::dup2(ready[1], 3);
      if (hold) ::dup2(p[0], 4);
      ::syscall(SYS_close_range, hold ? 5U : 4U, ~0U, 0U);
      ready[1] = 3;
      p[0] = 4;
      int code = kOtherError;
      if (::setgroups(0, nullptr) == 0 && ::setgid(uid) == 0 && ::setuid(uid) == 0) {
        try {
          PoolClient c(socket);
          const HelloResult r = try_hello(c);
          code = r.ok ? kServed : r.status == Status::limit_reached ? kLimitReached : kOtherError;
          char b = static_cast<char>(code);
          (void)!::write(ready[1], &b, 1);
          if (hold) {
            char x;
            while (::read(p[0], &x, 1) > 0) {
            }
          }
        } catch (...) {
          code = kOtherError;
        }
      }
      child_exit(code);
    }
    ::close(ready[1]);
    char b = 0;
    (void)!::read(ready[0], &b, 1);  // served or refused by now (or the child failed)
    ::close(ready[0]);
    if (hold) ::close(p[0]);
    return Tenant{pid, hold ? p[1] : -1};
  }
  // Lets a held child go and returns its exit code (-1: killed / not exited).
  int finish() {
    if (hold_fd >= 0) ::close(hold_fd);
    hold_fd = -1;
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

inline std::size_t file_size(const std::string& path) {
  struct stat sb {};
  return ::stat(path.c_str(), &sb) == 0 ? static_cast<std::size_t>(sb.st_size) : 0;
}

inline std::size_t tenant_records(const st::State& s) {
  std::size_t n = 0;
  for (const st::TenantRecord& r : s.tenants) n += r.in_use != 0 ? 1 : 0;
  return n;
}

// Raises this process's descriptor limit (root may raise the hard limit too).
inline void raise_nofile(rlim_t want) {
  rlimit rl{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
  if (rl.rlim_cur >= want) return;
  rl.rlim_cur = want;
  if (rl.rlim_max < want) rl.rlim_max = want;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &rl) == 0);
}

}  // namespace vlake::pooltest::limits
