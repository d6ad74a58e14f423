#include "config.hpp"

#include <strings.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "vlake/common/duration.hpp"
#include "vlake/common/size.hpp"

namespace vlake::hook {

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
  using ms = std::chrono::milliseconds;
  constexpr ms kLongest{1'000'000'000};  // what the socket's timeouts can take (about 11.6 days)
  // `name`, if set, into `out` when it is a duration in [min, max] (vlake/common/duration.hpp);
  // else a problem naming the variable and what to write. True when `out` was set.
  auto duration = [&](const char* name, ms min, ms max, ms& out) {
    const char* v = lookup(name);
    if (v == nullptr) return false;
    try {
      out = parse_duration(v, min, max);
      return true;
    } catch (const DurationError& e) {
      c.problems.push_back(std::string("ignoring ") + name + "=\"" + v + "\": " + e.reason());
      return false;
    }
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
  duration("VLAKE_RECONNECT_TIMEOUT", ms(0), kLongest, c.reconnect_timeout);
  duration("VLAKE_TIMEOUT", ms(1), kLongest, c.timeout);
  if (std::chrono::milliseconds w{0}; duration("VLAKE_WAIT", ms(0), std::chrono::minutes(10), w)) c.wait = w;
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
  duration("VLAKE_RESERVE_AGE", ms(1), kLongest, c.reserve_age);
  return c;
}

Config Config::from_environment() {
  return parse([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace vlake::hook
