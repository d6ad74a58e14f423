#include "ctl_process.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace vlake::ctltest {

namespace {

struct Argv {
  std::vector<std::string> a, e;
  std::vector<char*> argv, envp;
  Argv(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    a.push_back(VLAKECTL_PATH);
    a.insert(a.end(), args.begin(), args.end());
    for (char** p = environ; *p != nullptr; ++p) {
      const std::string kv = *p;
      if (kv.rfind("VLAKE_STATE=", 0) == 0) continue;
      e.push_back(kv);
    }
    e.insert(e.end(), env.begin(), env.end());
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
  }
};

// Forks and execs; the child's stdout/stderr go to the given pipe write ends.
pid_t spawn(Argv& av, int out_w, int err_w, long uid, long gid) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(out_w, 1);
    ::dup2(err_w, 2);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    if (gid >= 0 && (::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(gid)) != 0)) ::_exit(126);
    if (uid >= 0 && ::setuid(static_cast<uid_t>(uid)) != 0) ::_exit(126);
    ::execve(av.argv[0], av.argv.data(), av.envp.data());
    ::_exit(127);
  }
  return pid;
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

int wait_child(pid_t pid, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

CtlResult run_ctl(const std::vector<std::string>& args, long uid, long gid, const std::vector<std::string>& env,
                  int timeout_ms) {
  Argv av(args, env);
  int o[2];
  int e[2];
  if (::pipe2(o, O_CLOEXEC) != 0 || ::pipe2(e, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = spawn(av, o[1], e[1], uid, gid);
  ::close(o[1]);
  ::close(e[1]);
  CtlResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool out_open = true;
  bool err_open = true;
  while (out_open || err_open) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p[2] = {{out_open ? o[0] : -1, POLLIN, 0}, {err_open ? e[0] : -1, POLLIN, 0}};
    if (::poll(p, 2, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    for (int k = 0; k < 2; ++k) {
      if (p[k].revents == 0) continue;
      const ssize_t n = ::read(k == 0 ? o[0] : e[0], buf, sizeof buf);
      if (n <= 0) {
        (k == 0 ? out_open : err_open) = false;
      } else {
        (k == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  ::close(o[0]);
  ::close(e[0]);
  const int status = wait_child(pid, 5000);
  if (status < 0) {
    ::kill(pid, SIGKILL);
    wait_child(pid, 5000);
    return r;
  }
  r.exit_code = exit_code_of(status);
  return r;
}

CtlBackground::CtlBackground(const std::vector<std::string>& args) {
  Argv av(args, {});
  int o[2];
  if (::pipe2(o, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  // stderr to the same pipe: errors show up in out().
  pid_ = spawn(av, o[1], o[1], -1, -1);
  ::close(o[1]);
  out_fd_ = o[0];
}

CtlBackground::~CtlBackground() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    wait_child(pid_, 5000);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

bool CtlBackground::pump(int timeout_ms) {
  pollfd p{out_fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return true;
  char buf[4096];
  const ssize_t n = ::read(out_fd_, buf, sizeof buf);
  if (n <= 0) return false;
  out_.append(buf, static_cast<std::size_t>(n));
  return true;
}

bool CtlBackground::wait_for(const std::string& needle, std::size_t count, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (count_of(out_, needle) < count) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    if (!pump(static_cast<int>(left))) return count_of(out_, needle) >= count;
  }
  return true;
}

void CtlBackground::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int CtlBackground::wait(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (pump(50)) {
    if (std::chrono::steady_clock::now() > deadline) break;
  }
  const int status = wait_child(pid_, 2000);
  if (status < 0) return -1;
  pid_ = -1;
  return exit_code_of(status);
}

}  // namespace vlake::ctltest
