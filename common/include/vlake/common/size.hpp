// vlake's one grammar for sizes. Environment variables (the hook's VLAKE_RESERVE, the
// simulator's VLAKE_SIM_DEVICE_MEMORY), command-line flags (vlaked --bulk-size/--warm-reserve,
// vlake-device-plugin --unit, vlakectl --gpu-memory, the benchmarks) and the quota YAML all read
// sizes with these functions, so the same words mean the same bytes everywhere.
//
// Grammar (case-sensitive):
//   size     := number unit | "0"            a unit is required: "8" is an error, not 8 bytes
//   number   := digit+                       a whole number (no sign, no fraction)
//   unit     := "B" | "KiB" | "MiB" | "GiB" | "TiB"      binary: KiB = 1024 bytes
//             | "Ki" | "Mi" | "Gi" | "Ti"               Kubernetes spellings of the same
//   percent  := digit+ ["." digit{1,4}] "%"   0..100; only where the caller allows it
//                                            (parse_size_or_percent: quota limits)
// Spaces before and after the number and the unit are ignored ("8 GiB" = "8GiB").
// A bare number other than 0 is an error whose reason says what to write:
//   "8": a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB
// (it used to be a byte count, so `limit: 8` meant 8 bytes; it is refused, never reinterpreted).
// Decimal or single-letter units (K, KB, kB, M, MB, G, GB, T, TB, in any case) are errors: they
// meant 10^n bytes in some vlake programs and 2^n in others. A fraction ("1.5GiB") is an error
// too; the message says what to write instead ("1536MiB").
//
// Errors: SizeError, a std::invalid_argument whose what() is `"<text>": <reason>`, where the
// reason says what to write, e.g.
//   "1GB": decimal units are ambiguous; write 1GiB (1073741824 bytes)
// text() and reason() give the two parts, so a caller can name where the text came from
// (environment variable, flag, file:line:column) in its own words.
//
// format_size() is the one exact formatter: the largest binary unit that divides the value
// ("1GiB", "512MiB", "3KiB"), else the byte count with "B" ("1536B", "0B"). Its output parses back
// to the same value.
//
// Machine-written byte counts (the allocation files of contracts/allocation.hpp, the socket
// protocol, the state segment) are contracts, not human input: they keep their plain-digit
// format and their own parsers, and never go through this grammar.
//
// Thread-safety: pure functions. Dependencies: libstdc++ only, so common/src/size.cpp is compiled
// into libvlake-hook.so and the simulator as well as vlake::common.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "vlake/common/grammar.hpp"
#include "vlake/common/strong_types.hpp"

namespace vlake {

// text() and reason(): vlake/common/grammar.hpp.
class SizeError : public GrammarError {
 public:
  using GrammarError::GrammarError;
};

// The bytes `text` says (grammar above; no percentage). Throws SizeError.
[[nodiscard]] Bytes parse_size(std::string_view text);

// parse_size(), then min <= bytes <= max, else SizeError "must be at least 2MiB" / "must be at
// most 1TiB" (the bounds formatted by format_size).
[[nodiscard]] Bytes parse_size(std::string_view text, Bytes min, Bytes max);

// A size, or a percentage of something the caller knows (a GPU's memory).
struct SizeOrPercent {
  bool percent = false;
  Bytes bytes{0};         // when !percent
  std::uint32_t ppm = 0;  // when percent: parts per million, 0..1'000'000 (100%)
};

// parse_size(), or a percentage (0..100, at most 4 decimals). Throws SizeError.
[[nodiscard]] SizeOrPercent parse_size_or_percent(std::string_view text);

// Exact rendering: "1GiB", "512MiB", "3KiB", "1536B", "0B".
[[nodiscard]] std::string format_size(Bytes b);

}  // namespace vlake
