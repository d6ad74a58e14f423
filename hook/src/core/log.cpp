#include "log.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <new>

namespace vlake::hook {

namespace {
std::atomic<LogLevel> g_level{LogLevel::warn};
}

void set_log_level(LogLevel level) noexcept { g_level.store(level); }

bool log_enabled(LogLevel level) noexcept { return level >= g_level.load(std::memory_order_relaxed); }

void log(LogLevel level, const char* fmt, ...) noexcept {
  if (!log_enabled(level)) return;
  const int saved_errno = errno;
  char message[1024];
  va_list ap;
  va_start(ap, fmt);
  const int m = std::vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  const std::size_t len = m < 0 ? 0 : std::min(static_cast<std::size_t>(m), sizeof message - 1);
  char line[1040];
  const std::size_t n = format_log_line(line, sizeof line, "vlake", level, false, std::string_view(message, len));
  write_log_line(STDERR_FILENO, std::string_view(line, n));
  errno = saved_errno;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  std::uint64_t scale = 1;
  while (unit < 6 && bytes >= scale * 1024) {
    scale *= 1024;
    ++unit;
  }
  char buf[48];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    return buf;
  }
  // Tenths of a unit, rounded down so a limit is never overstated.
  const std::uint64_t whole = bytes / scale;
  const std::uint64_t tenths = (bytes % scale) * 10 / scale;
  if (tenths == 0) {
    std::snprintf(buf, sizeof buf, "%llu %s", static_cast<unsigned long long>(whole), kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%llu.%llu %s", static_cast<unsigned long long>(whole),
                  static_cast<unsigned long long>(tenths), kUnits[unit]);
  }
  return buf;
}

bool RateLimiter::allow(std::uint64_t& suppressed) noexcept {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (ever_ && now - last_ < interval_) {
    ++suppressed_;
    return false;
  }
  ever_ = true;
  last_ = now;
  suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

void RateLimiter::reset() noexcept {
  // Used in a fork()ed child only (single-threaded): the mutex may have been copied locked.
  new (&mu_) std::mutex();
  ever_ = false;
  suppressed_ = 0;
}

}  // namespace vlake::hook
