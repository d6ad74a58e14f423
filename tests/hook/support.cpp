#include "support.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace hooktest {

namespace {

// Every test process gets its own simulated machine (parallel ctest runs never share capacity).
struct EnvSetup {
  EnvSetup() {
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    const std::string node = "hooktest-" + std::to_string(::getpid()) + "-" + std::to_string(now % 1000000007);
    ::setenv("VLAKE_SIM_NODE", node.c_str(), 1);
    ::setenv("VLAKE_SIM_DEVICE_MEMORY", "1GiB", 1);
    ::setenv("VLAKE_SIM_DEVICE_COUNT", "1", 1);
    // Nothing of the test process's own environment may change the hook's behaviour.
    for (const char* v : {"VLAKE_SOCKET", "VLAKE_ON_UNREACHABLE", "VLAKE_RECONNECT_TIMEOUT", "VLAKE_TIMEOUT",
                          "VLAKE_LOG", "VLAKE_DISABLE", "VLAKE_RESERVE", "VLAKE_RESERVE_AGE", "LD_PRELOAD"}) {
      ::unsetenv(v);
    }
  }
};
EnvSetup g_env;

std::string dir_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

// Overrides for running the suite by hand against a real GPU (e.g. from another checkout):
// VLAKE_HOOK_TEST_DRIVER (the fake daemon's driver; tenants then use the system's libcuda),
// VLAKE_HOOK_TEST_LIB, VLAKE_HOOK_TEST_TENANT. Unset in CI: the simulator and the build tree.
std::string setting(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

}  // namespace

std::string fresh_socket_path() {
  static std::atomic<int> n{0};
  return "/tmp/vlake-hooktest-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".sock";
}

RunResult run_tenant(const std::vector<std::string>& args, const Env& env) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  vars["LD_PRELOAD"] = setting("VLAKE_HOOK_TEST_LIB", VLAKE_HOOK_LIB);
  if (std::getenv("VLAKE_HOOK_TEST_DRIVER") == nullptr) {
    vars["LD_LIBRARY_PATH"] = dir_of(VLAKE_SIM_LIB);
  }
  vars["VLAKE_LOG"] = "warn";
  // The daemon-path tests see every alloc/free at the daemon; reserve tests set their own.
  vars["VLAKE_RESERVE"] = "0";
#ifdef VLAKE_HOOK_SANITIZED
  // The preloaded hook comes before the sanitizer runtime in the load order (the caller's
  // options are kept: a second ASAN_OPTIONS would be ignored).
  std::string& asan_options = vars["ASAN_OPTIONS"];
  asan_options += asan_options.empty() ? "verify_asan_link_order=0" : ":verify_asan_link_order=0";
#endif
  for (const auto& [k, v] : env) {
    if (v == "\x01") {
      vars.erase(k);
    } else {
      vars[k] = v;
    }
  }
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string tenant = setting("VLAKE_HOOK_TEST_TENANT", VLAKE_TENANT);
  std::vector<std::string> argv_strings{tenant};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, tenant.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) throw std::runtime_error("posix_spawn failed");

  RunResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(50);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open = 2;
  while (open > 0 && std::chrono::steady_clock::now() < deadline) {
    if (::poll(fds, 2, 200) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  if (open > 0) ::kill(pid, SIGKILL);
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::map<std::string, std::string> line_of(const std::string& out, const std::string& step) {
  std::map<std::string, std::string> kv;
  std::size_t pos = 0;
  while (pos < out.size()) {
    std::size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind(step + " ", 0) != 0) continue;
    std::size_t p = step.size() + 1;
    while (p < line.size()) {
      std::size_t q = line.find(' ', p);
      if (q == std::string::npos) q = line.size();
      const std::string tok = line.substr(p, q - p);
      const auto eq = tok.find('=');
      if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
      p = q + 1;
    }
    return kv;
  }
  return kv;
}

int count_lines(const std::string& text, const std::string& needle) {
  int n = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    if (text.substr(pos, end - pos).find(needle) != std::string::npos) ++n;
    pos = end + 1;
  }
  return n;
}

Fixture::Fixture(FakeDaemonOptions options)
    : driver(vlake::open_driver(setting("VLAKE_HOOK_TEST_DRIVER", VLAKE_SIM_LIB))) {
  if (options.socket_path.empty()) options.socket_path = fresh_socket_path();
  daemon = std::make_unique<FakeDaemon>(*driver, std::move(options));
}

RunResult Fixture::run(const std::vector<std::string>& args, Env env) const {
  env.insert(env.begin(), {"VLAKE_SOCKET", daemon->socket_path()});
  RunResult r = run_tenant(args, env);
  // The tenant has exited: let the daemon see its connections close before counters are read.
  if (!daemon->wait_disconnected(std::chrono::seconds(5))) {
    throw std::runtime_error("the fake daemon still has connections after the tenant exited");
  }
  return r;
}

}  // namespace hooktest
