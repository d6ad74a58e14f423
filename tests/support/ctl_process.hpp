// Runs the vlakectl executable (VLAKECTL_PATH) from the tests: to completion with its output
// captured, or in the background (top --watch) with its stdout read incrementally.
//
// Contract: children get this process's environment minus VLAKE_STATE, plus `env`; uid/gid
// >= 0 drop to that gid then uid in the child before exec (the tests run as root). Errors
// (fork/pipe failures, timeouts) throw std::runtime_error. Not thread-safe per object.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

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
  [[nodiscard]] const std::string& out() const noexcept { return out_; }

 private:
  bool pump(int timeout_ms);  // reads once; false at EOF
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string out_;
};

std::size_t count_of(const std::string& hay, const std::string& needle);

}  // namespace vlake::ctltest
