#include "vlake/pool/log.hpp"

#include <unistd.h>

#include <stdexcept>
#include <string>

namespace vlake::pool {

LogLevel parse_log_level(std::string_view s) {
  if (s == "debug") return LogLevel::debug;
  if (s == "info") return LogLevel::info;
  if (s == "warn") return LogLevel::warn;
  if (s == "error") return LogLevel::error;
  throw std::invalid_argument("unknown log level '" + std::string(s) + "' (debug, info, warn, error)");
}

const char* to_string(LogLevel l) noexcept {
  switch (l) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
  }
  return "?";
}

void Logger::write(LogLevel l, std::string_view msg) const noexcept {
  if (!enabled(l)) return;
  try {
    std::string line = "vlaked[" + std::to_string(::getpid()) + "]: " + to_string(l) + ": ";
    line.append(msg);
    line.push_back('\n');
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n <= 0) return;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  } catch (...) {
  }
}

}  // namespace vlake::pool
