// The common part of vlake's grammars for sizes (size.hpp) and durations (duration.hpp): the
// error they throw and the trimming they share.
//
// GrammarError is a std::invalid_argument whose what() is `"<text>": <reason>` (the text cut by
// vlake::excerpt, so one from a file stays one bounded line); text() gives the text as given and
// reason() what is wrong and what to write instead, so a caller can name where the text came
// from (environment variable, flag, file:line:column) in its own words.
//
// Header-only; libstdc++ only (compiled into libvlake-hook.so with size.cpp and duration.cpp);
// thread-safe as any value.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "vlake/common/excerpt.hpp"

namespace vlake {

class GrammarError : public std::invalid_argument {
 public:
  GrammarError(std::string_view text, std::string reason)
      : std::invalid_argument("\"" + excerpt(text) + "\": " + reason), text_(text), reason_(std::move(reason)) {}
  // The text as given (untrimmed).
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  // What is wrong and what to write instead, without the text.
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

 private:
  std::string text_;
  std::string reason_;
};

namespace grammar {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

// `s` without the spaces, tabs and line ends around it.
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// A number at the front of a text: whole digits, then optionally '.' and digits (possibly none:
// a caller refuses "1." itself).
struct Number {
  std::string_view whole;
  std::string_view frac;  // digits after '.', if any
  bool dot = false;
  std::size_t end = 0;  // where the number ends in the text
  [[nodiscard]] std::string_view text(std::string_view s) const { return s.substr(0, end); }
  [[nodiscard]] bool zero() const {
    for (char c : whole) {
      if (c != '0') return false;
    }
    for (char c : frac) {
      if (c != '0') return false;
    }
    return true;
  }
};

inline Number read_number(std::string_view s) {
  Number n;
  std::size_t i = 0;
  while (i < s.size() && is_digit(s[i])) ++i;
  n.whole = s.substr(0, i);
  if (i < s.size() && s[i] == '.') {
    n.dot = true;
    std::size_t j = i + 1;
    while (j < s.size() && is_digit(s[j])) ++j;
    n.frac = s.substr(i + 1, j - i - 1);
    i = j;
  }
  n.end = i;
  return n;
}

}  // namespace grammar
}  // namespace vlake
