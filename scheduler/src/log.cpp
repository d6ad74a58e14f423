#include "vlake/scheduler/log.hpp"

#include <unistd.h>

namespace vlake::scheduler {

void Log::write(LogLevel l, const std::string& m) const noexcept {
  if (static_cast<int>(l) < static_cast<int>(level_)) return;
  static const char* const kNames[] = {"debug", "info", "warn", "error"};
  try {
    const std::string line = "vlake-device-plugin[" + std::to_string(::getpid()) + "]: " +
                             kNames[static_cast<int>(l)] + ": " + m + "\n";
    (void)!::write(2, line.data(), line.size());
  } catch (...) {
  }
}

}  // namespace vlake::scheduler
