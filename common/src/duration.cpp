#include "vlake/common/duration.hpp"

#include <cstdint>
#include <limits>
#include <optional>

namespace vlake {

namespace {

using std::chrono::milliseconds;

constexpr std::int64_t kMaxMs = std::numeric_limits<std::int64_t>::max();
constexpr const char* kUse = "use ms, s, m or h";

struct Unit {
  const char* name;
  std::int64_t ms;
};
constexpr Unit kUnits[] = {{"h", 3'600'000}, {"m", 60'000}, {"s", 1000}, {"ms", 1}};

using grammar::Number;
using grammar::read_number;
using grammar::trim;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::optional<std::int64_t> unit_ms(std::string_view unit) {
  for (const Unit& u : kUnits) {
    if (unit == u.name) return u.ms;
  }
  return std::nullopt;
}

// Why a number times `ms` is not a whole number of milliseconds in range, or the milliseconds.
struct Value {
  std::int64_t ms = 0;
  std::string why;  // empty: ok
};

Value value_of(const Number& n, std::int64_t ms) {
  Value v;
  std::int64_t w = 0;
  for (char c : n.whole) {
    if (w > (kMaxMs - (c - '0')) / 10) return Value{0, "too large"};
    w = w * 10 + (c - '0');
  }
  if (w > kMaxMs / ms) return Value{0, "too large"};
  v.ms = w * ms;
  if (n.frac.empty()) return v;
  if (n.frac.size() > 9) return Value{0, "at most 9 decimals"};
  std::int64_t f = 0;
  std::int64_t scale = 1;
  for (char c : n.frac) {
    f = f * 10 + (c - '0');
    scale *= 10;
  }
  const std::int64_t part = f * ms;  // < 1e9 * 3.6e6: no overflow
  if (v.ms > kMaxMs - part / scale - 1) return Value{0, "too large"};
  v.ms += part / scale;
  if (part % scale != 0) {
    v.why = "finer than a millisecond, the smallest step; write " + std::to_string(v.ms) + "ms or " +
            std::to_string(v.ms + 1) + "ms";
  }
  return v;
}

// "1m30s", "1h 30m": every part a number and a unit; nullopt when `s` is not such a compound.
std::optional<std::int64_t> compound(std::string_view s) {
  std::int64_t total = 0;
  int parts = 0;
  while (!s.empty()) {
    const Number n = read_number(s);
    if (n.whole.empty() || (n.dot && n.frac.empty())) return std::nullopt;
    s = trim(s.substr(n.end));
    std::size_t u = 0;
    while (u < s.size() && s[u] >= 'a' && s[u] <= 'z') ++u;
    const std::optional<std::int64_t> ms = unit_ms(s.substr(0, u));
    if (!ms) return std::nullopt;
    const Value v = value_of(n, *ms);
    if (!v.why.empty() || v.ms > kMaxMs - total) return std::nullopt;
    total += v.ms;
    ++parts;
    s = trim(s.substr(u));
  }
  if (parts < 2) return std::nullopt;
  return total;
}

// The reason an unknown unit is refused: what to write instead.
std::string unknown_unit(std::string_view s, const Number& n, std::string_view unit) {
  const std::string num(n.text(s));
  const std::string low = lower(unit);
  for (const Unit& u : kUnits) {
    if (low == u.name) {
      return "unknown unit \"" + std::string(unit) + "\" (units are case-sensitive: write " + num + u.name + ")";
    }
  }
  static constexpr struct {
    const char* spelling;
    const char* unit;
  } kSpellings[] = {{"msec", "ms"}, {"msecs", "ms"}, {"millisecond", "ms"}, {"milliseconds", "ms"},
                    {"sec", "s"},   {"secs", "s"},   {"second", "s"},       {"seconds", "s"},
                    {"min", "m"},   {"mins", "m"},   {"minute", "m"},       {"minutes", "m"},
                    {"hr", "h"},    {"hrs", "h"},    {"hour", "h"},         {"hours", "h"}};
  for (const auto& sp : kSpellings) {
    if (low == sp.spelling) return "unknown unit \"" + std::string(unit) + "\"; write " + num + sp.unit;
  }
  if (low == "d" || low == "day" || low == "days") {
    const Value v = value_of(n, 24);
    if (v.why.empty()) return "unknown unit \"" + std::string(unit) + "\"; write " + std::to_string(v.ms) + "h";
  }
  if (low == "us" || low == "ns" || unit == "\xC2\xB5s") {
    return "unit \"" + std::string(unit) + "\" is finer than a millisecond, the smallest step; " + kUse;
  }
  if (const std::optional<std::int64_t> total = compound(s)) {
    return "one number and one unit; write " + format_duration(milliseconds(*total));
  }
  bool word = true;
  for (char c : unit) word = word && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'));
  if (word) return "unknown unit \"" + std::string(unit) + "\"; " + kUse;
  return "unexpected \"" + std::string(unit) + "\" after the number; " + kUse;
}

}  // namespace

milliseconds parse_duration(std::string_view text) {
  const std::string_view s = trim(text);
  auto fail = [&](const std::string& why) -> milliseconds { throw DurationError(text, why); };
  if (s.empty()) return fail("empty; write a duration such as 500ms, 30s or 2m");
  if (s[0] == '-') return fail("a duration cannot be negative");
  if (lower(s) == "off") return fail("'off' is not allowed here; write a duration such as 30s");
  const Number n = read_number(s);
  if (n.whole.empty()) return fail("expected a number, such as 500ms, 30s or 2m");
  if (n.dot && n.frac.empty()) return fail("expected digits after '.'");
  const std::string_view unit = trim(s.substr(n.end));
  if (unit.empty()) {
    if (n.zero()) return milliseconds(0);
    const std::string num(n.text(s));
    if (n.dot) return fail("a duration needs a unit; write " + num + "s");
    return fail("a duration needs a unit; write " + num + "s or " + num + "ms");
  }
  const std::optional<std::int64_t> ms = unit_ms(unit);
  if (!ms) return fail(unknown_unit(s, n, unit));
  const Value v = value_of(n, *ms);
  if (!v.why.empty()) return fail(v.why);
  return milliseconds(v.ms);
}

milliseconds parse_duration(std::string_view text, milliseconds min, milliseconds max) {
  const milliseconds d = parse_duration(text);
  if (d < min) {
    throw DurationError(text, min == milliseconds(1) ? std::string("must be greater than zero")
                                                     : "must be at least " + format_duration(min));
  }
  if (d > max) throw DurationError(text, "must be at most " + format_duration(max));
  return d;
}

milliseconds parse_duration_or_off(std::string_view text, milliseconds max) {
  if (trim(text) == "off") return milliseconds(0);
  return parse_duration(text, milliseconds(0), max);
}

std::string format_duration(milliseconds d) {
  if (d.count() < 0) return "-" + format_duration(-d);
  if (d.count() == 0) return "0s";
  for (const Unit& u : kUnits) {
    if (d.count() % u.ms == 0) return std::to_string(d.count() / u.ms) + u.name;
  }
  return std::to_string(d.count()) + "ms";
}

}  // namespace vlake
