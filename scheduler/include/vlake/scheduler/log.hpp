// vlake::scheduler::Log — one line per message on stderr:
// "vlake-device-plugin[<pid>]: <level>: <message>". Thread-safe (one write(2) per line).
#pragma once

#include <string>

#include "vlake/scheduler/options.hpp"

namespace vlake::scheduler {

class Log {
 public:
  explicit Log(LogLevel level = LogLevel::info) noexcept : level_(level) {}
  void debug(const std::string& m) const noexcept { write(LogLevel::debug, m); }
  void info(const std::string& m) const noexcept { write(LogLevel::info, m); }
  void warn(const std::string& m) const noexcept { write(LogLevel::warn, m); }
  void error(const std::string& m) const noexcept { write(LogLevel::error, m); }

 private:
  void write(LogLevel l, const std::string& m) const noexcept;
  LogLevel level_;
};

}  // namespace vlake::scheduler
