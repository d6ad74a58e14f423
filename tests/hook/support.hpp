// Helpers of the hook tests: the test process's simulated node, running vlake_hook_tenant under
// LD_PRELOAD=libvlake-hook.so (with vlake::test_support's process.hpp), and reading its
// "<step> rc=... key=value" lines.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fake_daemon.hpp"
#include "vlake/common/driver.hpp"

namespace hooktest {

using Env = std::vector<std::pair<std::string, std::string>>;  // overrides; "\x01" unsets

struct RunResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
};

// Runs vlake_hook_tenant with `args`; environment: this process's, plus LD_PRELOAD (the hook),
// LD_LIBRARY_PATH (the simulator's libcuda.so.1 and libnvidia-ml.so.1), then `env`.
RunResult run_tenant(const std::vector<std::string>& args, const Env& env = {});

// The key=value pairs of the first output line for `step` (the line starts with "<step> "),
// including "rc". Empty when there is no such line.
std::map<std::string, std::string> line_of(const std::string& out, const std::string& step);
// Number of lines of `text` containing `needle`.
int count_lines(const std::string& text, const std::string& needle);

// A unique socket path for this test process.
std::string fresh_socket_path();

// The simulator driver and a fake daemon on a fresh socket.
struct Fixture {
  explicit Fixture(FakeDaemonOptions options = {});
  // run_tenant() with VLAKE_SOCKET set to the daemon's; returns once the daemon has handled the
  // tenant's disconnection (so its counters are final).
  RunResult run(const std::vector<std::string>& args, Env env = {}) const;

  std::unique_ptr<vlake::Driver> driver;
  std::unique_ptr<FakeDaemon> daemon;
};

}  // namespace hooktest
