// Logging of libvlake-hook.so: a thin front over vlake's one logger (vlake/common/log.hpp), one
// line per message on stderr, prefixed "vlake: ".
//
// Contract
// - set_log_level() is called once at initialization, with the level Config read from VLAKE_LOG
//   (the environment is never read here); log() drops messages below that level.
// - log() formats printf-style into a stack buffer and hands the line to the common
//   format_log_line()/write_log_line(): one write(2), no stdio buffering, no allocation, no lock,
//   errno preserved, so concurrent messages never interleave inside a line. It does not use
//   vlake::Logger itself because the line goes into a tenant's stderr: no pid and no level, just
//   "vlake: <message>" (docs/hook.md), and because printf-style formatting needs no allocation.
// - RateLimiter: allow() returns true at most once per interval; the calls it refuses are
//   counted and handed to the next allowed call (`suppressed`). Thread-safe.
// - format_bytes(): "3.5 GiB", "512 MiB", "4 KiB", "100 B" (binary units, at most one decimal).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "config.hpp"

namespace vlake::hook {

void set_log_level(LogLevel level) noexcept;
[[nodiscard]] bool log_enabled(LogLevel level) noexcept;
void log(LogLevel level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

[[nodiscard]] std::string format_bytes(std::uint64_t bytes);

class RateLimiter {
 public:
  explicit RateLimiter(std::chrono::steady_clock::duration interval) : interval_(interval) {}
  // True if a message may be printed now; then `suppressed` is the number of calls refused
  // since the last allowed one.
  bool allow(std::uint64_t& suppressed) noexcept;
  void reset() noexcept;

 private:
  std::mutex mu_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_{};
  bool ever_ = false;
  std::uint64_t suppressed_ = 0;
};

}  // namespace vlake::hook
