// Test harness for daemon process tests: a vlaked started with the simulator on its own
// simulated node, temp socket and state segment; tenant helper processes
// (vlake_pool_test_client) driven over pipes; state segment snapshots. Processes are run with
// process.hpp; every object removes what it created (processes, directory, segment, node).
//
// Paths come from compile definitions: VLAKED_PATH, VLAKE_POOL_CLIENT_PATH, VLAKE_SIM_LIB,
// VLAKE_HOOK_LIB (vlake::test_support's).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "process.hpp"
#include "vlake/contracts/state.hpp"

namespace vlake::pooltest {

// A name no other test (or test process) uses: "pt<pid>-<n>-<tag>".
std::string unique_name(const std::string& tag);

// A quota config giving every tenant the whole GPU.
inline constexpr const char* kWholeGpuConfig = "version: 1\ndefault:\n  limit: 100%\n";
// `n` MiB as the decimal byte count the helper's commands take.
std::string mib(std::uint64_t n);

// Environment of the daemon and its helpers: this process's plus the simulated node (with
// `devices` GPUs).
std::vector<std::string> child_env(const std::string& node, int devices = 1);

class DaemonProcess;
// Environment of a tenant program run under LD_PRELOAD=libvlake-hook.so against `daemon`: this
// process's without LD_PRELOAD, LD_LIBRARY_PATH and VLAKE_*, plus the daemon's simulated node,
// the hook, the simulator's directory on LD_LIBRARY_PATH, VLAKE_SOCKET, and (sanitizer builds:
// the preloaded hook comes before the sanitizer runtime) verify_asan_link_order=0 appended to
// the caller's ASAN_OPTIONS.
testsupport::Env hooked_env(const DaemonProcess& daemon);

class DaemonProcess {
 public:
  // Creates a temp directory (mode 0755) holding the config (if `config_yaml` is not empty).
  explicit DaemonProcess(const std::string& tag, const std::string& config_yaml = "");
  ~DaemonProcess();  // SIGKILLs a running daemon, removes the directory, segment and sim node
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Spawns vlaked (log to log_path, appended) and waits until the socket accepts connections.
  // Returns false if it exited or did not come up within 10 s.
  bool start(const std::vector<std::string>& extra = {});
  // Spawns another vlaked with the same arguments; returns its exit status (waits up to 10 s).
  int run_second();
  void signal(int sig);
  // Waits for the daemon to exit; returns its wait status, or -1 after `timeout_ms`.
  int wait_exit(int timeout_ms = 10000);
  [[nodiscard]] std::string log() const;
  // The running daemon's pid; -1 before start() and once it exited.
  [[nodiscard]] pid_t pid() const noexcept { return proc_ ? proc_->pid() : -1; }

  std::string dir;
  std::string socket;
  std::string state;
  std::string node;
  std::string config;
  std::string log_path;
  int devices = 1;  // GPUs of the simulated node (set before start())
  // Memory of each simulated GPU as the daemon sees it (set before start(); helpers that map
  // memory use 1GiB, so only tests whose helpers do not touch the simulated GPU change it).
  std::string device_memory = "1GiB";
  // More "KEY=value" for vlaked alone, after the simulator's (e.g. VLAKE_SIM_CONTEXT_MEMORY=8MiB:
  // its own context's size); set before start().
  std::vector<std::string> env;

 private:
  [[nodiscard]] testsupport::Spawn spawn_spec(const std::vector<std::string>& extra) const;
  std::unique_ptr<testsupport::Process> proc_;
  std::vector<std::string> last_extra_;
};

// The key=value pairs of a helper's reply line ("ok k=v ..."). No assertion: any thread.
std::map<std::string, std::string> reply_fields(const std::string& reply);

// A tenant helper process.
class Helper {
 public:
  // uid/gid < 0: stay root.
  Helper(const std::string& node, long uid = -1, long gid = -1);
  ~Helper();  // closes stdin (the helper exits) and reaps it; SIGKILL if it lingers
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;

  // Sends one command, returns the reply line (throws on EOF or when no line arrives within
  // `timeout`; long storms under a sanitizer on 2 cores pass a longer one).
  std::string cmd(const std::string& line, std::chrono::seconds timeout = std::chrono::seconds(30));
  // cmd() that must answer "ok ..."; returns its key=value pairs (REQUIREs inside: call it on
  // the test's own thread only, Catch2's assertions are not thread-safe; other threads use cmd()
  // and reply_fields()).
  std::map<std::string, std::string> ok(const std::string& line,
                                        std::chrono::seconds timeout = std::chrono::seconds(30));
  void kill9();
  [[nodiscard]] pid_t pid() const noexcept { return proc_->status() ? -1 : proc_->pid(); }

 private:
  std::unique_ptr<testsupport::Process> proc_;
};

// Two tenants, helpers as uids 4242 and 4243 (gid 0) connected to the daemon, and a root helper
// not connected (it takes the simulated GPU's memory from outside vlake).
struct TwoTenants {
  explicit TwoTenants(const DaemonProcess& d);
  Helper a;
  Helper b;
  Helper filler;
};

std::uint64_t num(const std::map<std::string, std::string>& kv, const std::string& key);

// A session record of layout 8's fields (gid = uid), the rest zero: for synthetic states.
state::SessionRecord session_record(std::uint64_t id, std::uint64_t start, std::uint32_t pid, std::uint32_t uid,
                                    std::uint32_t tenant, std::uint32_t state, std::uint32_t grants);

// Snapshot helpers.
std::unique_ptr<state::State> snapshot(const std::string& state_name);
// The tenant record with this name, or nullptr.
const state::TenantRecord* tenant(const state::State& s, const std::string& name);
std::string tenant_name(const state::State& s, std::uint32_t id);
std::size_t live_sessions(const state::State& s);
std::size_t live_grants(const state::State& s);

// Physical bytes used on device 0 of `node`, as a separate simulator process sees it.
std::uint64_t sim_used(const std::string& node);

// Polls `pred` every 10 ms until it is true or `timeout_ms` passed; returns the last result.
template <class F>
bool eventually(F&& pred, int timeout_ms = 2000);

}  // namespace vlake::pooltest

#include <chrono>
#include <thread>

template <class F>
bool vlake::pooltest::eventually(F&& pred, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
