// Checking what vlake's grammars (size.hpp, duration.hpp) refuse: the whole message, and that
// text() and reason() are its two parts.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "vlake/common/grammar.hpp"

namespace vlake::test {

// what() of the GrammarError `parse(text)` raises, or "accepted".
template <class Parse>
std::string error_of(Parse parse, const std::string& text) {
  try {
    (void)parse(text);
  } catch (const GrammarError& e) {
    CHECK(e.text() == text);
    CHECK(std::string(e.what()) == "\"" + text + "\": " + e.reason());
    return e.what();
  }
  return "accepted";
}

// A text and the reason it is refused with.
struct Refusal {
  const char* text;
  std::string what;
};

template <class Parse>
void check_refusals(Parse parse, const std::vector<Refusal>& cases) {
  for (const Refusal& r : cases) {
    INFO(r.text);
    CHECK(error_of(parse, r.text) == "\"" + std::string(r.text) + "\": " + r.what);
  }
}

}  // namespace vlake::test
