// vlaked's clocks and the descriptors that wake its event loop (internal): the loop's time
// (now()), periodic and one-shot timerfds, eventfd counters that worker threads ring.
//
// DeadlineTimer is a one-shot timerfd that re-arms only when the deadline it is asked for
// changes: the loop asks after every message, and a timerfd_settime per message was a quarter
// of the loop's syscalls.
//
// Thread-safety: the loop's descriptors are used by the loop thread only, except that the
// function returned by ring() may be called from any thread (one write(2)). Errors:
// make_timer() and make_counter() throw StartupError; the rest never throw (a failed
// timerfd_settime or read leaves the descriptor as it was).
#pragma once

#include <chrono>
#include <functional>
#include <optional>

#include "vlake/common/unique_fd.hpp"
#include "vlake/pool/node.hpp"

namespace vlake::pool {

// The steady clock for decisions and CLOCK_REALTIME for records operators read, taken together.
Now now();

// A non-blocking CLOCK_MONOTONIC timerfd, disarmed.
UniqueFd make_timer();
// Arms `timer_fd` to fire after `first`, then every `interval` (0: once; `first` 0: disarm).
void arm(int timer_fd, std::chrono::nanoseconds first, std::chrono::nanoseconds interval);

// A non-blocking eventfd counter, and the function that rings it (adds one).
UniqueFd make_counter();
std::function<void()> ring(int counter_fd);

// Reads a timerfd's expirations or an eventfd's count, so that it stops being readable.
void drain(int fd);

struct DeadlineTimer {
  UniqueFd fd;         // make_timer()
  bool known = false;  // whether `at` is what the timerfd is armed with
  std::optional<std::chrono::steady_clock::time_point> at;

  // Arms the timer for `deadline` (at least 1 ms ahead), or disarms it (nullopt); no syscall
  // when that is what it is armed with already.
  void set(std::optional<std::chrono::steady_clock::time_point> deadline);
  // The timer fired: a one-shot timerfd is disarmed once it has.
  void fired() {
    known = true;
    at.reset();
  }
};

}  // namespace vlake::pool
