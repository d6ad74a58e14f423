// Runs the vlakectl executable (VLAKECTL_PATH) from the tests: to completion with its output
// captured, or in the background (top --watch) with its stdout read incrementally.
//
// Contract: children get this process's environment minus VLAKE_STATE, plus `env`; uid/gid
// >= 0 drop to that gid then uid in the child before exec (the tests run as root); stdin is
// /dev/null. Processes are run with process.hpp (its errors throw std::system_error); a run
// past its timeout is killed. Not thread-safe per object.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "process.hpp"

namespace vlake::ctltest {

struct CtlResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string out;
  std::string err;
};

CtlResult run_ctl(const std::vector<std::string>& args, long uid = -1, long gid = -1,
                  const std::vector<std::string>& env = {}, int timeout_ms = 20000);

class CtlBackground {
 public:
  explicit CtlBackground(const std::vector<std::string>& args);
  ~CtlBackground();  // SIGKILLs and reaps a child still running
  CtlBackground(const CtlBackground&) = delete;
  CtlBackground& operator=(const CtlBackground&) = delete;

  // Reads stdout until `count` occurrences of `needle` were seen or `timeout_ms` passed;
  // returns whether they were.
  bool wait_for(const std::string& needle, std::size_t count, int timeout_ms);
  void signal(int sig);
  // Waits for exit (draining stdout); returns the exit code, or -1 (signal or timeout).
  int wait(int timeout_ms = 10000);
  [[nodiscard]] const std::string& out() const noexcept { return proc_->out(); }

 private:
  std::unique_ptr<testsupport::Process> proc_;
};

std::size_t count_of(const std::string& hay, const std::string& needle);

}  // namespace vlake::ctltest
