// vlake::excerpt — a bounded rendering of text that came from outside (a file, a flag, a
// message) for error messages and log lines: at most `max` bytes of it, and when it is longer,
// those bytes (cut at a UTF-8 character boundary) followed by "…(N bytes)" with the full size.
// Control characters (newlines included) become '?', so one quoted value is one line.
// Header-only; thread-safe; throws only std::bad_alloc.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vlake {

inline constexpr std::size_t kExcerptBytes = 120;

inline std::string excerpt(std::string_view text, std::size_t max = kExcerptBytes) {
  std::size_t n = text.size() <= max ? text.size() : max;
  // Do not split a UTF-8 sequence: back off over continuation bytes (10xxxxxx).
  if (n < text.size()) {
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  }
  std::string out;
  out.reserve(n + 24);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out.push_back(c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c));
  }
  if (n < text.size()) out += "\xE2\x80\xA6(" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace vlake
