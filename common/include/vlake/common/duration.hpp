// vlake's one grammar for durations. The hook's environment (VLAKE_TIMEOUT, VLAKE_WAIT,
// VLAKE_RECONNECT_TIMEOUT, VLAKE_RESERVE_AGE), vlaked's flags (--swap-idle, --pool-idle-release),
// vlake-device-plugin's flags (--gc-grace, --health-interval, ...), vlakectl --watch and the quota
// YAML (wait, kill_grace) all read durations with these functions, so "30s" is thirty seconds
// everywhere and a bare "30" is refused everywhere (it used to mean seconds in some places and
// milliseconds in others). Flags whose name carries the unit (vlaked --pressure-wait-ms) take a
// plain number of that unit and do not use this grammar.
//
// Grammar (case-sensitive):
//   duration := number unit | "0"
//   number   := digit+ ["." digit+]          a fraction is allowed when the duration is a whole
//                                            number of milliseconds ("2.5s", "0.5m", "1.5h")
//   unit     := "ms" | "s" | "m" | "h"       milliseconds, seconds, minutes, hours
//   off      := "off"                        only where the caller allows it
//                                            (parse_duration_or_off): the same as 0
// Spaces before and after the number and the unit are ignored ("30 s" = "30s").
// A bare number other than 0 is an error whose reason says what to write:
//   "30": a duration needs a unit; write 30s or 30ms
// So are a fraction of a millisecond ("1.5ms", "0.0001s"), other unit spellings ("30sec", "2min",
// "1d", "30S"), compounds ("1m30s": write 90s), signs and overflow; each message names what to
// write instead.
//
// Errors: DurationError, a std::invalid_argument whose what() is `"<text>": <reason>`; text() and
// reason() give the two parts, so a caller can name where the text came from (environment
// variable, flag, file:line:column) in its own words (as SizeError, vlake/common/size.hpp).
//
// format_duration() is the one exact formatter: the largest unit that divides the value ("2m",
// "30s", "1500ms", "0s"). Its output parses back to the same value.
//
// Thread-safety: pure functions. Dependencies: libstdc++ only, so common/src/duration.cpp is
// compiled into libvlake-hook.so as well as vlake::common.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

#include "vlake/common/grammar.hpp"

namespace vlake {

// text() and reason(): vlake/common/grammar.hpp.
class DurationError : public GrammarError {
 public:
  using GrammarError::GrammarError;
};

// The duration `text` says (grammar above; "off" is an error). Throws DurationError.
[[nodiscard]] std::chrono::milliseconds parse_duration(std::string_view text);

// parse_duration(), then min <= d <= max, else DurationError "must be greater than zero" (min
// 1ms), "must be at least 10ms" / "must be at most 10m" (the bounds formatted by format_duration).
[[nodiscard]] std::chrono::milliseconds parse_duration(std::string_view text, std::chrono::milliseconds min,
                                                       std::chrono::milliseconds max);

// "off" (after trimming) is 0, else parse_duration(text, 0ms, max): for settings where 0 turns
// the feature off. Throws DurationError.
[[nodiscard]] std::chrono::milliseconds parse_duration_or_off(std::string_view text, std::chrono::milliseconds max);

// Exact rendering: "1h", "2m", "90s", "1500ms", "0s". A negative value is rendered with a
// leading '-' (for messages; the grammar has no negative durations).
[[nodiscard]] std::string format_duration(std::chrono::milliseconds d);

}  // namespace vlake
