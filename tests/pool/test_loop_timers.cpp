// vlaked's loop clocks and wake-up descriptors (pool/src/io/loop_timers.hpp): a DeadlineTimer
// re-arms only when its deadline changes, never arms in the past, disarms on nullopt; a counter
// rung from another thread wakes the loop until drained.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/timerfd.h>

#include <chrono>
#include <ctime>
#include <thread>

#include "loop_timers.hpp"

using namespace vlake::pool;
using namespace std::chrono_literals;

namespace {

// Time left before `fd` fires (0: disarmed).
std::chrono::nanoseconds left(int fd) {
  itimerspec its{};
  REQUIRE(::timerfd_gettime(fd, &its) == 0);
  return std::chrono::seconds(its.it_value.tv_sec) + std::chrono::nanoseconds(its.it_value.tv_nsec);
}

bool readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) > 0 && (p.revents & POLLIN) != 0;
}

}  // namespace

TEST_CASE("loop timers: a deadline timer arms for its deadline and disarms on nullopt", "[loop_timers]") {
  DeadlineTimer timer;
  timer.fd = make_timer();
  CHECK(left(timer.fd.get()) == 0ns);
  timer.set(std::chrono::steady_clock::now() + 10s);
  CHECK(left(timer.fd.get()) > 9s);
  CHECK(left(timer.fd.get()) <= 10s);
  timer.set(std::nullopt);
  CHECK(left(timer.fd.get()) == 0ns);
  CHECK_FALSE(timer.at.has_value());
}

TEST_CASE("loop timers: the same deadline again does not re-arm the timer", "[loop_timers]") {
  DeadlineTimer timer;
  timer.fd = make_timer();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  timer.set(deadline);
  // Re-arm the timerfd behind its back: a set() with the same deadline must leave it so.
  arm(timer.fd.get(), 30s, 0s);
  timer.set(deadline);
  CHECK(left(timer.fd.get()) > 20s);
  // Another deadline is armed.
  timer.set(deadline + 1s);
  CHECK(left(timer.fd.get()) <= 11s);
}

TEST_CASE("loop timers: a past deadline fires soon, and once fired the same deadline arms it again", "[loop_timers]") {
  DeadlineTimer timer;
  timer.fd = make_timer();
  const auto past = std::chrono::steady_clock::now() - 1s;
  timer.set(past);
  CHECK(left(timer.fd.get()) > 0ns);  // armed, not disarmed by a zero value
  REQUIRE(readable(timer.fd.get(), 1000));
  drain(timer.fd.get());
  CHECK_FALSE(readable(timer.fd.get()));
  timer.fired();
  timer.set(past);  // what it was armed with before it fired: armed again
  CHECK(readable(timer.fd.get(), 1000));
}

TEST_CASE("loop timers: a periodic timer fires every interval", "[loop_timers]") {
  vlake::UniqueFd fd = make_timer();
  arm(fd.get(), 1ms, 1ms);
  REQUIRE(readable(fd.get(), 1000));
  drain(fd.get());
  CHECK(readable(fd.get(), 1000));
  arm(fd.get(), 0ns, 0ns);
  drain(fd.get());
  CHECK(left(fd.get()) == 0ns);
}

TEST_CASE("loop timers: a counter rung from another thread is readable until drained", "[loop_timers]") {
  vlake::UniqueFd fd = make_counter();
  CHECK_FALSE(readable(fd.get()));
  const auto bell = ring(fd.get());
  std::thread t([&] {
    bell();
    bell();
  });
  t.join();
  CHECK(readable(fd.get()));
  drain(fd.get());  // both rings at once
  CHECK_FALSE(readable(fd.get()));
}

TEST_CASE("loop timers: now() pairs the steady clock with the wall clock", "[loop_timers]") {
  const auto before = std::chrono::steady_clock::now();
  const std::uint64_t wall = static_cast<std::uint64_t>(std::time(nullptr)) * 1'000'000'000ULL;
  const Now t = now();
  CHECK(t.steady >= before);
  CHECK(t.unix_ns + 1'000'000'000ULL >= wall);
  CHECK(t.unix_ns <= wall + 2'000'000'000ULL);
}
