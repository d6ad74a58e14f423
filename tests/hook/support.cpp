#include "support.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>

#include "process.hpp"

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
  vlake::testsupport::Env vars = vlake::testsupport::Env::inherited();
  vars.set("LD_PRELOAD", setting("VLAKE_HOOK_TEST_LIB", VLAKE_HOOK_LIB));
  if (std::getenv("VLAKE_HOOK_TEST_DRIVER") == nullptr) {
    vars.set("LD_LIBRARY_PATH", vlake::testsupport::dir_of(VLAKE_SIM_LIB));
  }
  vars.set("VLAKE_LOG", "warn");
  // The daemon-path tests see every alloc/free at the daemon; reserve tests set their own.
  vars.set("VLAKE_RESERVE", "0");
#ifdef VLAKE_HOOK_SANITIZED
  // The preloaded hook comes before the sanitizer runtime in the load order (the caller's
  // options are kept: a second ASAN_OPTIONS would be ignored).
  vars.append("ASAN_OPTIONS", "verify_asan_link_order=0", ":");
#endif
  vars.apply(env);
  vlake::testsupport::Spawn spec;
  spec.argv = {setting("VLAKE_HOOK_TEST_TENANT", VLAKE_TENANT)};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = vars.strings();
  const vlake::testsupport::Result r = vlake::testsupport::run(spec, 50000);
  return RunResult{r.code(), r.out, r.err};
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
  if (!daemon) throw std::logic_error("Fixture::run: no fake daemon");  // (and GCC sees it is not null)
  env.insert(env.begin(), {"VLAKE_SOCKET", daemon->socket_path()});
  RunResult r = run_tenant(args, env);
  // The tenant has exited: let the daemon see its connections close before counters are read.
  if (!daemon->wait_disconnected(std::chrono::seconds(5))) {
    throw std::runtime_error("the fake daemon still has connections after the tenant exited");
  }
  return r;
}

}  // namespace hooktest
