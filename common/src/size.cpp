#include "vlake/common/size.hpp"

#include <limits>
#include <optional>

namespace vlake {

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
constexpr const char* kUnitNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
constexpr const char* kUse = "use B, KiB, MiB, GiB or TiB (or Ki, Mi, Gi, Ti)";

using grammar::trim;
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string lowered(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

// Power of 1024 (0..4) of a unit of the grammar; nullopt when `unit` is not one.
std::optional<int> binary_unit(std::string_view unit) {
  if (unit == "B") return 0;
  if (unit == "KiB" || unit == "Ki") return 1;
  if (unit == "MiB" || unit == "Mi") return 2;
  if (unit == "GiB" || unit == "Gi") return 3;
  if (unit == "TiB" || unit == "Ti") return 4;
  return std::nullopt;
}

// The binary power a decimal or single-letter unit (k, kb, M, MB, g, Gb, T, TB …) stands for.
std::optional<int> ambiguous_unit(std::string_view unit) {
  const std::string u = lowered(unit);
  if (u.empty() || u.size() > 2 || (u.size() == 2 && u[1] != 'b')) return std::nullopt;
  switch (u[0]) {
    case 'k': return 1;
    case 'm': return 2;
    case 'g': return 3;
    case 't': return 4;
    default: return std::nullopt;
  }
}

// Digits -> value; nullopt on overflow.
std::optional<std::uint64_t> to_u64(std::string_view digits) {
  if (digits.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : digits) {
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (kMax - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

struct Exact {
  std::string text;  // "1536MiB"
  std::uint64_t bytes;
};

// `whole`.`frac` units of 1024^power written exactly in the grammar (a fraction in the next
// smaller unit); nullopt when that is not a whole number of bytes or too large.
std::optional<Exact> exact_form(std::string_view whole, std::string_view frac, int power) {
  const std::optional<std::uint64_t> w = to_u64(whole);
  if (!w) return std::nullopt;
  std::uint64_t value = *w;
  bool all_zero = true;
  for (char c : frac) all_zero = all_zero && c == '0';
  if (!all_zero) {
    if (power == 0 || frac.size() > 9) return std::nullopt;
    std::uint64_t scale = 1;
    for (std::size_t i = 0; i < frac.size(); ++i) scale *= 10;
    const std::uint64_t f = *to_u64(frac) * 1024;
    if (f % scale != 0 || value > (kMax - 1024) / 1024) return std::nullopt;
    value = value * 1024 + f / scale;
    --power;
  }
  const unsigned shift = static_cast<unsigned>(power) * 10;
  if (value > (kMax >> shift)) return std::nullopt;
  return Exact{std::to_string(value) + kUnitNames[power], value << shift};
}

struct Parsed : grammar::Number {
  std::string_view unit;  // trimmed
};

// The shared front of both parsers: number, optional fraction, unit. Throws SizeError for what
// no caller accepts.
Parsed split(std::string_view text) {
  const std::string_view s = trim(text);
  auto fail = [&](const std::string& why) -> Parsed { throw SizeError(text, why); };
  if (s.empty()) return fail("empty; write a size such as 512MiB or 2GiB");
  if (s[0] == '-') return fail("a size cannot be negative");
  Parsed p;
  static_cast<grammar::Number&>(p) = grammar::read_number(s);
  if (p.whole.empty()) return fail("expected a number, such as 512MiB or 2GiB");
  if (p.dot && p.frac.empty()) return fail("expected digits after '.'");
  p.unit = trim(s.substr(p.end));
  return p;
}

[[noreturn]] void too_large(std::string_view text) {
  throw SizeError(text, "too large (at most " + std::to_string(kMax) + " bytes)");
}

Bytes parse_bytes(std::string_view text, const Parsed& p) {
  auto fail = [&](const std::string& why) -> Bytes { throw SizeError(text, why); };
  if (p.unit.empty()) {
    if (p.zero()) return Bytes{0};
    const std::string n(p.whole);
    if (p.dot) return fail("a size needs a unit; write a whole number of B, KiB, MiB or GiB");
    return fail("a size needs a unit; write " + n + "B, " + n + "KiB, " + n + "MiB or " + n + "GiB");
  }
  if (const std::optional<int> power = ambiguous_unit(p.unit)) {
    const std::optional<Exact> e = exact_form(p.whole, p.frac, *power);
    const std::string what = p.unit.size() == 1 ? "single-letter units are ambiguous" : "decimal units are ambiguous";
    if (!e) return fail(what + "; write a whole number of B, KiB, MiB, GiB or TiB");
    return fail(what + "; write " + e->text + " (" + std::to_string(e->bytes) + " bytes)");
  }
  const std::optional<int> power = binary_unit(p.unit);
  if (!power) {
    const std::string u(p.unit);
    const std::string low = lowered(p.unit);
    for (const char* name : {"B", "KiB", "MiB", "GiB", "TiB", "Ki", "Mi", "Gi", "Ti"}) {
      if (low == lowered(name)) {
        return fail("unknown unit \"" + u + "\" (units are case-sensitive: write " + name + ")");
      }
    }
    bool word = true;
    for (char c : p.unit) word = word && is_letter(c);
    if (word) return fail("unknown unit \"" + u + "\"; " + kUse);
    return fail("unexpected \"" + u + "\" after the number; " + kUse);
  }
  if (p.dot) {
    const std::optional<Exact> e = exact_form(p.whole, p.frac, *power);
    if (*power == 0) return fail("a byte count is a whole number");
    if (e) return fail("a size is a whole number; write " + e->text);
    return fail("a size is a whole number; use a smaller unit");
  }
  const std::optional<std::uint64_t> w = to_u64(p.whole);
  const unsigned shift = static_cast<unsigned>(*power) * 10;
  if (!w || *w > (kMax >> shift)) too_large(text);
  return Bytes{*w << shift};
}

}  // namespace

Bytes parse_size(std::string_view text) {
  const Parsed p = split(text);
  if (p.unit == "%") throw SizeError(text, "a percentage is not allowed here; write a size such as 8GiB");
  return parse_bytes(text, p);
}

Bytes parse_size(std::string_view text, Bytes min, Bytes max) {
  const Bytes b = parse_size(text);
  if (b < min) {
    throw SizeError(
        text, min == Bytes{1} ? std::string("must be greater than zero") : "must be at least " + format_size(min));
  }
  if (b > max) throw SizeError(text, "must be at most " + format_size(max));
  return b;
}

SizeOrPercent parse_size_or_percent(std::string_view text) {
  const Parsed p = split(text);
  SizeOrPercent out;
  if (p.unit != "%") {
    out.bytes = parse_bytes(text, p);
    return out;
  }
  if (p.frac.size() > 4) throw SizeError(text, "at most 4 decimals in a percentage");
  const std::optional<std::uint64_t> w = to_u64(p.whole);
  if (!w || *w > 100) throw SizeError(text, "percentage over 100");
  std::uint64_t ppm = *w * 10'000;
  std::uint64_t scale = 1'000;
  for (char c : p.frac) {
    ppm += static_cast<std::uint64_t>(c - '0') * scale;
    scale /= 10;
  }
  if (ppm > 1'000'000) throw SizeError(text, "percentage over 100");
  out.percent = true;
  out.ppm = static_cast<std::uint32_t>(ppm);
  return out;
}

std::string format_size(Bytes b) {
  std::uint64_t v = b.value();
  int u = 0;
  while (u < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + kUnitNames[u];
}

}  // namespace vlake
