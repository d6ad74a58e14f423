#include "config.hpp"

#include <strings.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "vlake/common/size.hpp"

namespace vlake::hook {

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) {
  double scale = 1000.0;  // seconds by default
  if (text.size() > 2 && text.substr(text.size() - 2) == "ms") {
    scale = 1.0;
    text.remove_suffix(2);
  } else if (text.size() > 1 && text.back() == 's') {
    text.remove_suffix(1);
  }
  if (text.empty() || text.size() > 32) return std::nullopt;
  for (char c : text) {
    if ((c < '0' || c > '9') && c != '.') return std::nullopt;
  }
  const std::string copy(text);
  char* end = nullptr;
  const double v = std::strtod(copy.c_str(), &end);
  if (end == nullptr || *end != '\0' || !std::isfinite(v) || v < 0 || v * scale > 1e9) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(static_cast<long long>(std::llround(v * scale)));
}

namespace {

bool truthy(const char* v) {
  return ::strcasecmp(v, "1") == 0 || ::strcasecmp(v, "true") == 0 || ::strcasecmp(v, "yes") == 0 ||
         ::strcasecmp(v, "on") == 0;
}

bool falsy(const char* v) {
  return ::strcasecmp(v, "0") == 0 || ::strcasecmp(v, "false") == 0 || ::strcasecmp(v, "no") == 0 ||
         ::strcasecmp(v, "off") == 0 || *v == '\0';
}

}  // namespace

Config Config::parse(const Lookup& lookup) {
  Config c;
  auto bad = [&c](const char* name, const char* value, const char* expected) {
    c.problems.push_back(std::string("ignoring ") + name + "=\"" + value + "\" (expected " + expected + ")");
  };
  if (const char* v = lookup("VLAKE_SOCKET"); v != nullptr) {
    if (*v == '\0' || std::string_view(v).size() >= 108) {
      bad("VLAKE_SOCKET", v, "a socket path of 1..107 characters");
    } else {
      c.socket_path = v;
    }
  }
  if (const char* v = lookup("VLAKE_ON_UNREACHABLE"); v != nullptr) {
    if (::strcasecmp(v, "refuse") == 0) {
      c.on_unreachable = OnUnreachable::refuse;
    } else if (::strcasecmp(v, "passthrough") == 0) {
      c.on_unreachable = OnUnreachable::passthrough;
    } else {
      bad("VLAKE_ON_UNREACHABLE", v, "refuse or passthrough");
    }
  }
  if (const char* v = lookup("VLAKE_RECONNECT_TIMEOUT"); v != nullptr) {
    if (auto d = parse_duration(v)) {
      c.reconnect_timeout = *d;
    } else {
      bad("VLAKE_RECONNECT_TIMEOUT", v, "a duration such as 5, 0.5, 500ms");
    }
  }
  if (const char* v = lookup("VLAKE_TIMEOUT"); v != nullptr) {
    auto d = parse_duration(v);
    if (d && d->count() > 0) {
      c.timeout = *d;
    } else {
      bad("VLAKE_TIMEOUT", v, "a positive duration such as 10, 2.5, 500ms");
    }
  }
  if (const char* v = lookup("VLAKE_WAIT"); v != nullptr) {
    auto d = parse_duration(v);
    if (d && *d <= std::chrono::minutes(10)) {
      c.wait = *d;
    } else {
      bad("VLAKE_WAIT", v, "a duration up to 10 minutes such as 30, 2.5, 500ms");
    }
  }
  if (const char* v = lookup("VLAKE_LOG"); v != nullptr) {
    try {
      c.log_level = parse_log_level(v);
    } catch (const std::invalid_argument&) {
      bad("VLAKE_LOG", v, "error, warn, info or debug");
    }
  }
  if (const char* v = lookup("VLAKE_DISABLE"); v != nullptr) {
    if (truthy(v)) {
      c.disabled = true;
    } else if (!falsy(v)) {
      bad("VLAKE_DISABLE", v, "1 or 0");
    }
  }
  if (const char* v = lookup("VLAKE_PROFILE"); v != nullptr) {
    if (truthy(v)) {
      c.profile = true;
    } else if (!falsy(v)) {
      bad("VLAKE_PROFILE", v, "1 or 0");
    }
  }
  if (const char* v = lookup("VLAKE_KEEP_MAPPED"); v != nullptr) {
    if (truthy(v)) {
      c.keep_mapped = true;
    } else if (falsy(v)) {
      c.keep_mapped = false;
    } else {
      bad("VLAKE_KEEP_MAPPED", v, "1 or 0");
    }
  }
  if (const char* v = lookup("VLAKE_RESERVE"); v != nullptr) {
    try {
      c.reserve_bytes = parse_size(v).value();
    } catch (const SizeError& e) {
      c.problems.push_back("ignoring VLAKE_RESERVE=\"" + std::string(v) + "\": " + e.reason());
    }
  }
  if (const char* v = lookup("VLAKE_RESERVE_STATS"); v != nullptr && *v != '\0') c.reserve_stats = v;
  if (const char* v = lookup("VLAKE_PREFETCH"); v != nullptr) {
    char* end = nullptr;
    errno = 0;
    const unsigned long n = std::strtoul(v, &end, 10);
    if (end != v && *end == '\0' && errno == 0 && n <= 64 && *v != '-') {
      c.prefetch = static_cast<std::uint32_t>(n);
    } else {
      bad("VLAKE_PREFETCH", v, "a count from 0 (off) to 64");
    }
  }
  if (const char* v = lookup("VLAKE_RESERVE_AGE"); v != nullptr) {
    auto d = parse_duration(v);
    if (d && d->count() > 0) {
      c.reserve_age = *d;
    } else {
      bad("VLAKE_RESERVE_AGE", v, "a positive duration such as 30, 2.5, 500ms");
    }
  }
  return c;
}

Config Config::from_environment() {
  return parse([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace vlake::hook
