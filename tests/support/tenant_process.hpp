// A tenant program (tests/hook/tenant.cpp) run under LD_PRELOAD=libvlake-hook.so against a test
// daemon on the simulated driver, optionally as another uid; its stdout/stderr are collected
// so a test can wait for a step's line while it runs, kill it, or let it finish.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "harness.hpp"

namespace vlake::e2e {

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
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] const std::string& out() const noexcept { return out_; }
  [[nodiscard]] const std::string& err() const noexcept { return err_; }
  // key=value pairs of the first stdout line starting with `prefix` (after finish()).
  [[nodiscard]] std::map<std::string, std::string> line(const std::string& prefix) const;

 private:
  void pump(int timeout_ms);
  std::string reserve_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  int status_ = -1;
  std::string out_;
  std::string err_;
};

}  // namespace vlake::e2e
