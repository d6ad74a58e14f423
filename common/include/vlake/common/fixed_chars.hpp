// vlake::copy_chars — writes a string into a fixed char array of a record or message (state
// segment, protocol): truncated to N - 1 bytes, always NUL-terminated, the rest zeroed (no
// stale bytes travel). Header-only; thread-safe; never throws.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string_view>

namespace vlake {

template <std::size_t N>
void copy_chars(char (&dst)[N], std::string_view src) noexcept {
  static_assert(N > 0);
  std::memset(dst, 0, N);
  std::memcpy(dst, src.data(), std::min(src.size(), N - 1));
}

}  // namespace vlake
