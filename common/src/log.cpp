#include "vlake/common/log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace vlake {

LogLevel parse_log_level(std::string_view s) {
  std::string l(s);
  for (char& c : l) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  if (l == "debug") return LogLevel::debug;
  if (l == "info") return LogLevel::info;
  if (l == "warn" || l == "warning") return LogLevel::warn;
  if (l == "error") return LogLevel::error;
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

std::size_t format_log_line(char* out, std::size_t cap, std::string_view tag, LogLevel level, bool with_level,
                            std::string_view message) noexcept {
  if (cap < 2) return 0;
  std::size_t n = 0;
  auto put = [&](std::string_view s) {
    const std::size_t k = std::min(s.size(), cap - 1 - n);
    std::memcpy(out + n, s.data(), k);
    n += k;
  };
  put(tag);
  put(": ");
  if (with_level) {
    put(to_string(level));
    put(": ");
  }
  put(message);
  out[n++] = '\n';
  return n;
}

void write_log_line(int fd, std::string_view line) noexcept {
  const int saved_errno = errno;
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  errno = saved_errno;
}

void Logger::write(LogLevel l, std::string_view msg) const noexcept {
  if (!enabled(l)) return;
  char tag_buf[96];
  std::string_view tag = tag_;
  if (tag.empty()) {
    const int t =
        std::snprintf(tag_buf, sizeof tag_buf, "%s[%d]", program_invocation_short_name, static_cast<int>(::getpid()));
    tag = std::string_view(tag_buf, t < 0 ? 0 : std::min(static_cast<std::size_t>(t), sizeof tag_buf - 1));
  }
  // On the journal, "<N>" first: journald takes the line's priority from it and strips it.
  static constexpr const char* kPriority[] = {"<7>", "<6>", "<4>", "<3>"};
  const std::size_t p = journal_ ? 3 : 0;
  const std::size_t need = p + tag.size() + msg.size() + 16;
  char line[4096];
  char* out = line;
  std::string big;
  if (need > sizeof line) {
    try {
      big.assign(need, '\0');
    } catch (...) {
      return;
    }
    out = big.data();
  }
  const std::size_t cap = need > sizeof line ? need : sizeof line;
  if (p != 0) std::memcpy(out, kPriority[static_cast<int>(l)], p);
  const std::size_t n = format_log_line(out + p, cap - p, tag, l, true, msg);
  if (n != 0) write_log_line(fd_, std::string_view(out, n + p));
}

}  // namespace vlake

namespace vlake {

LogLimiter::Bucket& LogLimiter::bucket(std::string_view key, Clock::time_point now) {
  auto it = buckets_.find(std::string(key));
  if (it != buckets_.end()) return it->second;
  if (buckets_.size() >= kMaxKeys) {
    // Forget keys that refilled and hold nothing pending: they would start the same way.
    for (auto k = buckets_.begin(); k != buckets_.end();) {
      const double elapsed = std::chrono::duration<double>(now - k->second.last).count();
      if (k->second.dropped == 0 && k->second.tokens + elapsed * rate_ >= burst_) {
        k = buckets_.erase(k);
      } else {
        ++k;
      }
    }
    if (buckets_.size() >= kMaxKeys) return overflow_;
  }
  Bucket fresh;
  fresh.tokens = burst_;
  fresh.last = now;
  return buckets_.emplace(std::string(key), fresh).first->second;
}

bool LogLimiter::write(LogLevel level, std::string_view key, std::string_view msg, Clock::time_point now) noexcept {
  try {
    Bucket& b = bucket(key, now);
    if (now > b.last) {
      b.tokens = std::min(burst_, b.tokens + std::chrono::duration<double>(now - b.last).count() * rate_);
      b.last = now;
    }
    if (b.tokens < 1.0) {
      ++b.dropped;
      ++suppressed_;
      if (counter_ != nullptr) ++*counter_;
      return false;
    }
    b.tokens -= 1.0;
    if (b.dropped == 0) {
      log_.write(level, msg);
    } else {
      const std::uint64_t n = b.dropped;
      b.dropped = 0;
      log_.write(level,
                 std::string(msg) + " (" + std::to_string(n) + " similar line" + (n == 1 ? "" : "s") + " suppressed)");
    }
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace vlake
