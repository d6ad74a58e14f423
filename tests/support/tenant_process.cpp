#include "tenant_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace vlake::e2e {

namespace {
std::map<std::string, std::string> parse_pairs(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream in(line);
  std::string word;
  in >> word;
  kv["step"] = word;
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq != std::string::npos) kv[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return kv;
}

std::string find_line(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) {
    if (l.rfind(prefix, 0) == 0) return l;
  }
  return {};
}

std::string sim_dir() {
  std::string p = VLAKE_SIM_LIB;
  return p.substr(0, p.rfind('/'));
}
}  // namespace

TenantProcess::TenantProcess(const pooltest::DaemonProcess& daemon, const std::vector<std::string>& steps, long uid,
                             std::string reserve, const std::vector<std::string>& extra_env)
    : reserve_(std::move(reserve)) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe2 failed");
  }
  std::vector<std::string> env;
  std::string asan_options;  // the caller's, kept: the link-order option is appended below
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("ASAN_OPTIONS=", 0) == 0) {
      asan_options = kv.substr(13) + ":";
      continue;
    }
    if (kv.rfind("LD_PRELOAD=", 0) == 0 || kv.rfind("LD_LIBRARY_PATH=", 0) == 0 || kv.rfind("VLAKE_", 0) == 0) {
      continue;
    }
    env.push_back(kv);
  }
  for (const auto& kv : pooltest::child_env(daemon.node, daemon.devices)) {
    if (kv.rfind("VLAKE_SIM_", 0) == 0) env.push_back(kv);
  }
  env.push_back(std::string("LD_PRELOAD=") + VLAKE_HOOK_LIB);
  env.push_back("LD_LIBRARY_PATH=" + sim_dir());
  env.push_back("VLAKE_SOCKET=" + daemon.socket);
  env.push_back("VLAKE_RECONNECT_TIMEOUT=10");
  // These tests follow every alloc/free at the daemon; the reserve is tested on its own.
  env.push_back("VLAKE_RESERVE=" + reserve_);
  for (const std::string& kv : extra_env) env.push_back(kv);
  // Sanitizer builds: the preloaded hook comes before the sanitizer runtime in the tenant.
  env.push_back("ASAN_OPTIONS=" + asan_options + "verify_asan_link_order=0");
  std::vector<std::string> args{VLAKE_TENANT_PATH};
  args.insert(args.end(), steps.begin(), steps.end());

  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    if (uid >= 0 && (::setgid(0) != 0 || ::setuid(static_cast<uid_t>(uid)) != 0)) ::_exit(126);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  out_fd_ = out_pipe[0];
  err_fd_ = err_pipe[0];
}

TenantProcess::~TenantProcess() {
  if (pid_ > 0 && status_ < 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

void TenantProcess::pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (::poll(fds, 2, timeout_ms) <= 0) return;
  char buf[4096];
  for (int i = 0; i < 2; ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
    const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
    if (n > 0) (i == 0 ? out_ : err_).append(buf, static_cast<std::size_t>(n));
  }
}

std::map<std::string, std::string> TenantProcess::wait_line(const std::string& prefix, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string l = find_line(out_, prefix);
    if (!l.empty() && out_.find(l + "\n") != std::string::npos) return parse_pairs(l);
    if (status_ >= 0) break;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = st;
      pump(0);
      pump(0);
      continue;
    }
    pump(20);
  }
  return {};
}

int TenantProcess::finish(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (status_ < 0 && std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = st;
      break;
    }
    pump(20);
  }
  for (int i = 0; i < 50; ++i) pump(0);  // drain what is left in the pipes
  return status_;
}

void TenantProcess::kill9() {
  if (status_ >= 0) return;
  ::kill(pid_, SIGKILL);
  int st = 0;
  ::waitpid(pid_, &st, 0);
  status_ = st;
}

std::map<std::string, std::string> TenantProcess::line(const std::string& prefix) const {
  const std::string l = find_line(out_, prefix);
  return l.empty() ? std::map<std::string, std::string>{} : parse_pairs(l);
}

}  // namespace vlake::e2e
