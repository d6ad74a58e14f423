#include "loop_timers.hpp"

#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string>

#include "vlake/pool/daemon.hpp"

namespace vlake::pool {

Now now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return Now{std::chrono::steady_clock::now(),
             static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<std::uint64_t>(ts.tv_nsec)};
}

void arm(int timer_fd, std::chrono::nanoseconds first, std::chrono::nanoseconds interval) {
  itimerspec its{};
  its.it_value.tv_sec = static_cast<time_t>(first.count() / 1'000'000'000);
  its.it_value.tv_nsec = static_cast<long>(first.count() % 1'000'000'000);
  its.it_interval.tv_sec = static_cast<time_t>(interval.count() / 1'000'000'000);
  its.it_interval.tv_nsec = static_cast<long>(interval.count() % 1'000'000'000);
  ::timerfd_settime(timer_fd, 0, &its, nullptr);
}

UniqueFd make_timer() {
  UniqueFd fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!fd) throw StartupError(std::string("timerfd_create: ") + std::strerror(errno));
  return fd;
}

UniqueFd make_counter() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd) throw StartupError(std::string("eventfd: ") + std::strerror(errno));
  return fd;
}

std::function<void()> ring(int counter_fd) {
  return [counter_fd] {
    const std::uint64_t one = 1;
    (void)!::write(counter_fd, &one, sizeof one);
  };
}

void drain(int fd) {
  std::uint64_t expirations = 0;
  (void)!::read(fd, &expirations, sizeof expirations);
}

void DeadlineTimer::set(std::optional<std::chrono::steady_clock::time_point> deadline) {
  if (known && at == deadline) return;
  if (!deadline) {
    arm(fd.get(), std::chrono::nanoseconds(0), std::chrono::nanoseconds(0));
  } else {
    const auto wait =
        std::max<std::chrono::nanoseconds>(std::chrono::milliseconds(1), *deadline - std::chrono::steady_clock::now());
    arm(fd.get(), wait, std::chrono::nanoseconds(0));
  }
  known = true;
  at = deadline;
}

}  // namespace vlake::pool
