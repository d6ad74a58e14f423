// vlake::ctl::App — vlakectl's commands wired together: options → state → view → output.
//
// Contract: run() executes one parsed command, writing the result to `out` and diagnostics
// ("vlakectl: ...", one line) to `err`, and returns the exit code: 0 ok, 1 quota file invalid,
// 2 usage error / state not readable. It never throws (internal errors are reported and give 2).
// `top --watch` loops until SIGINT or SIGTERM (returns 0): it blocks both signals in the calling
// thread and waits for them with sigtimedwait, so call it from the main thread of a process
// (as vlakectl does). When `out_is_tty`, each frame starts with the ANSI "home + clear screen"
// sequence; otherwise frames are separated by a blank line.
// main_entry() is the whole of main(): parses argv (and $VLAKE_STATE), prints usage for --help
// (exit 0) or a usage error (exit 2), then run().
#pragma once

#include <iostream>

#include "vlake/ctl/options.hpp"

namespace vlake::ctl {

class App {
 public:
  // `in`: what `quota check -` reads (standard input).
  App(std::ostream& out, std::ostream& err, bool out_is_tty, std::istream& in = std::cin)
      : out_(out), err_(err), tty_(out_is_tty), in_(in) {}
  int run(const CtlOptions& o);

 private:
  int run_state_command(const CtlOptions& o);
  int watch(const CtlOptions& o);
  int quota_check(const CtlOptions& o);

  std::ostream& out_;
  std::ostream& err_;
  bool tty_;
  std::istream& in_;
};

int main_entry(int argc, const char* const* argv);

}  // namespace vlake::ctl
