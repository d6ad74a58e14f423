#include "log.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <new>

namespace vlake::hook {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::warn)};
}

void set_log_level(LogLevel level) noexcept {
  g_level.store(static_cast<int>(level));
}

bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void log(LogLevel level, const char* fmt, ...) noexcept {
  if (!log_enabled(level)) return;
  const int saved_errno = errno;
  char line[1024];
  int n = std::snprintf(line, sizeof line, "vlake: ");
  va_list ap;
  va_start(ap, fmt);
  const int m = std::vsnprintf(line + n, sizeof line - static_cast<std::size_t>(n) - 1, fmt, ap);
  va_end(ap);
  if (m > 0) n += m;
  if (n > static_cast<int>(sizeof line) - 2) n = static_cast<int>(sizeof line) - 2;
  line[n++] = '\n';
  ssize_t off = 0;
  while (off < n) {
    const ssize_t w = ::write(STDERR_FILENO, line + off, static_cast<std::size_t>(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += w;
  }
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
