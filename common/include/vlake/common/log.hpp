// vlake's one logger: leveled lines on stderr, used by vlaked, vlake-device-plugin and (through
// its thin front, hook/src/core/log.hpp) libvlake-hook.so.
//
// Line format: "<tag>: <level>: <message>\n", the tag being "<program>[<pid>]" by default
// ("vlaked[123]: warn: …", "vlake-device-plugin[7]: info: …"); format_log_line() can leave the
// level out (the hook writes "vlake: <message>" into its tenants' stderr).
//
// Contract
// - parse_log_level() takes "debug", "info", "warn" (or "warning"), "error", in any case, and
//   throws std::invalid_argument naming the text and the choices otherwise. to_string() gives
//   the lower-case name back.
// - Logger drops messages below its level (enabled()); set_level() may be called at any time
//   from any thread (the level is atomic). Each line is written with one write(2) loop on the
//   logger's fd, so lines from several threads or processes never interleave; EINTR is retried,
//   any other failure drops the line. Logging never throws and leaves errno unchanged. The
//   logger does not own its fd.
// - journald: when the logger's fd is the stream systemd connected to the journal
//   ($JOURNAL_STREAM names its device and inode, checked once when the Logger is made), each
//   line starts with its syslog priority ("<3>" error, "<4>" warn, "<6>" info, "<7>" debug), so
//   that `journalctl -p err` shows vlaked's errors; elsewhere lines are as above.
// - format_log_line() and write_log_line() are the formatting and writing underneath, for
//   callers that cannot allocate (the hook): no allocation, no locks, async-signal-safe.
// - Dependencies: libc and libstdc++ only (common/src/log.cpp is compiled into the hook too).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace vlake {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

// "debug"/"info"/"warn"/"warning"/"error" (any case) -> level; throws std::invalid_argument.
[[nodiscard]] LogLevel parse_log_level(std::string_view s);
[[nodiscard]] const char* to_string(LogLevel l) noexcept;

// Writes "<tag>: [<level>: ]<message>\n" into out[0..cap) (the level when `with_level`),
// truncating the message so that the newline always fits; returns the line's length (0 when
// cap < 2).
std::size_t format_log_line(char* out, std::size_t cap, std::string_view tag, LogLevel level, bool with_level,
                            std::string_view message) noexcept;

// Writes `line` to `fd` (retrying on EINTR and short writes); errno is preserved.
void write_log_line(int fd, std::string_view line) noexcept;

class Logger {
 public:
  // Tag "<program>[<pid>]" (program: the process's short name, at the time of each line).
  explicit Logger(LogLevel level = LogLevel::info, int fd = 2) noexcept
      : level_(level), fd_(fd), journal_(is_journal_stream(fd)) {}
  // A fixed tag instead.
  Logger(std::string tag, LogLevel level, int fd = 2)
      : level_(level), fd_(fd), journal_(is_journal_stream(fd)), tag_(std::move(tag)) {}
  Logger(const Logger& o) : level_(o.level()), fd_(o.fd_), journal_(o.journal_), tag_(o.tag_) {}
  Logger& operator=(const Logger&) = delete;

  void set_level(LogLevel l) noexcept { level_.store(l, std::memory_order_relaxed); }
  [[nodiscard]] LogLevel level() const noexcept { return level_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool enabled(LogLevel l) const noexcept { return l >= level(); }

  void write(LogLevel l, std::string_view msg) const noexcept;
  void debug(std::string_view m) const noexcept { write(LogLevel::debug, m); }
  void info(std::string_view m) const noexcept { write(LogLevel::info, m); }
  void warn(std::string_view m) const noexcept { write(LogLevel::warn, m); }
  void error(std::string_view m) const noexcept { write(LogLevel::error, m); }
  // Lines carry journald priorities (see above).
  [[nodiscard]] bool journal() const noexcept { return journal_; }
  // Whether `fd` is the stream $JOURNAL_STREAM ("<device>:<inode>") names.
  [[nodiscard]] static bool is_journal_stream(int fd) noexcept;

 private:
  std::atomic<LogLevel> level_;
  int fd_;
  bool journal_ = false;
  std::string tag_;  // "": "<program>[<pid>]"
};

// LogLimiter: rate limits for log lines that someone else (a tenant, a peer) can trigger.
//
// Contract
// - One token bucket per key (a short text naming the site and, where useful, who triggered
//   it: "malformed uid 1000", "guard tenant alice"): `rate` lines per second, at most `burst`
//   in a row. write() logs the line when the key's bucket holds a token; otherwise it drops the
//   line, counts it (per key, in suppressed(), and in *counter when given) and returns false.
//   The first line a key logs after dropping some ends in " (N similar lines suppressed)".
// - Time comes from the caller (`now`); no clock is read. A limiter tracks at most
//   kMaxKeys keys: when full, keys whose bucket refilled (nothing pending) are forgotten, and
//   if none refilled, a new key shares one overflow bucket, so memory stays bounded whatever
//   keys a peer makes up.
// - Not thread-safe (one owner, e.g. the daemon's event loop). Never throws from write().
class LogLimiter {
 public:
  static constexpr std::size_t kMaxKeys = 4096;
  using Clock = std::chrono::steady_clock;

  // `counter` (optional) is incremented once per dropped line; it must outlive the limiter.
  LogLimiter(const Logger& log, double rate_per_s, double burst, std::uint64_t* counter = nullptr) noexcept
      : log_(log), rate_(rate_per_s), burst_(burst), counter_(counter) {}

  bool write(LogLevel level, std::string_view key, std::string_view msg, Clock::time_point now) noexcept;
  bool warn(std::string_view key, std::string_view msg, Clock::time_point now) noexcept {
    return write(LogLevel::warn, key, msg, now);
  }
  bool info(std::string_view key, std::string_view msg, Clock::time_point now) noexcept {
    return write(LogLevel::info, key, msg, now);
  }
  [[nodiscard]] std::uint64_t suppressed() const noexcept { return suppressed_; }

 private:
  struct Bucket {
    double tokens = 0;
    Clock::time_point last{};
    std::uint64_t dropped = 0;  // since the key's last line
  };
  Bucket& bucket(std::string_view key, Clock::time_point now);

  const Logger& log_;
  double rate_;
  double burst_;
  std::uint64_t* counter_;
  std::uint64_t suppressed_ = 0;
  std::unordered_map<std::string, Bucket> buckets_;
  Bucket overflow_;
};

}  // namespace vlake
