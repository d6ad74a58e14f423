// A tenant program (tests/hook/tenant.cpp) run under LD_PRELOAD=libvlake-hook.so against a test
// daemon on the simulated driver, optionally as another uid; its stdout/stderr are collected
// so a test can wait for a step's line while it runs, kill it, or let it finish.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "process.hpp"
#include "units.hpp"

namespace vlake::e2e {

using namespace vlake::testunits;            // kMiB, kGiB, MiB (units.hpp)
inline constexpr int kOutOfMemory = 2;       // CUDA_ERROR_OUT_OF_MEMORY
inline constexpr int kIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS

// Whether a wait status (finish()) is a normal exit with code 0.
bool exited_ok(int status);
// The daemon's state segment, read now.
std::unique_ptr<state::State> snapshot(const pooltest::DaemonProcess& d);
// The bytes the tenant named `name` is granted on GPU 0 now (0 if it is not in the state).
std::uint64_t granted(const pooltest::DaemonProcess& d, const std::string& name);
// Polls the daemon's state until `done` holds (up to 5 s); the last snapshot.
std::unique_ptr<state::State> wait_state(const pooltest::DaemonProcess& d,
                                         const std::function<bool(const state::State&)>& done);

class TenantProcess {
 public:
  // uid < 0: stay root. Steps are tenant.cpp's command-line steps. `reserve` is the tenant's
  // VLAKE_RESERVE ("0": no local reserve, every alloc/free reaches the daemon). `extra_env`:
  // more "KEY=value" entries (e.g. VLAKE_DISABLE=1).
  TenantProcess(const pooltest::DaemonProcess& daemon, const std::vector<std::string>& steps, long uid = -1,
                std::string reserve = "0", const std::vector<std::string>& extra_env = {});
  ~TenantProcess();  // SIGKILLs and reaps a tenant still running
  TenantProcess(const TenantProcess&) = delete;
  TenantProcess& operator=(const TenantProcess&) = delete;

  // Waits (up to timeout_ms) for a stdout line starting with `prefix`; returns its key=value
  // pairs (empty map on timeout or exit).
  std::map<std::string, std::string> wait_line(const std::string& prefix, int timeout_ms = 20000);
  // Waits for the exit; returns the wait status (-1 on timeout).
  int finish(int timeout_ms = 60000);
  void kill9();
  [[nodiscard]] pid_t pid() const noexcept { return proc_->pid(); }
  [[nodiscard]] const std::string& out() const noexcept { return proc_->out(); }
  [[nodiscard]] const std::string& err() const noexcept { return proc_->err(); }
  // key=value pairs of the first stdout line starting with `prefix` (after finish()).
  [[nodiscard]] std::map<std::string, std::string> line(const std::string& prefix) const;

 private:
  std::unique_ptr<testsupport::Process> proc_;
};

}  // namespace vlake::e2e
