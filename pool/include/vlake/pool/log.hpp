// vlake::pool::Logger — leveled log lines on stderr: "vlaked[<pid>]: <level>: <message>".
//
// Contract: messages below the configured level are dropped; each line is written with one
// write(2) so lines from several threads never interleave. Thread-safe. Never throws from
// write() (a failing stderr is ignored).
#pragma once

#include <string>
#include <string_view>

namespace vlake::pool {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

// "debug"/"info"/"warn"/"error" → level; throws std::invalid_argument otherwise.
LogLevel parse_log_level(std::string_view s);
const char* to_string(LogLevel l) noexcept;

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::info, int fd = 2) noexcept : level_(level), fd_(fd) {}
  void set_level(LogLevel l) noexcept { level_ = l; }
  [[nodiscard]] LogLevel level() const noexcept { return level_; }
  [[nodiscard]] bool enabled(LogLevel l) const noexcept { return l >= level_; }

  void write(LogLevel l, std::string_view msg) const noexcept;
  void debug(std::string_view m) const noexcept { write(LogLevel::debug, m); }
  void info(std::string_view m) const noexcept { write(LogLevel::info, m); }
  void warn(std::string_view m) const noexcept { write(LogLevel::warn, m); }
  void error(std::string_view m) const noexcept { write(LogLevel::error, m); }

 private:
  LogLevel level_;
  int fd_;
};

}  // namespace vlake::pool
