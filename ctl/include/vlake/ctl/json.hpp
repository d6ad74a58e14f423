// vlake::ctl::JsonWriter — a small streaming JSON writer (no dependency).
//
// Contract: build one document with begin_object/end_object, begin_array/end_array, key() and
// the value functions; str() returns it (pretty-printed with 2-space indentation, or compact).
// Strings are escaped per RFC 8259: '"', '\\' and control characters are escaped (\n, \t, ...,
// \u00XX); bytes that are not valid UTF-8 are replaced by U+FFFD, so the output is always
// valid UTF-8 JSON. Doubles that are not finite are written as null.
//
// Errors: misuse (a value where a key is needed, unbalanced end_*, str() on an unfinished
// document, two top-level values) throws std::logic_error. Not thread-safe (one writer per
// thread); no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vlake::ctl {

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

class JsonWriter {
 public:
  explicit JsonWriter(bool pretty = true) : pretty_(pretty) {}

  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view k);

  JsonWriter& string(std::string_view v);
  JsonWriter& uint(std::uint64_t v);
  JsonWriter& sint(std::int64_t v);
  JsonWriter& number(double v, int decimals = 2);
  JsonWriter& boolean(bool v);
  JsonWriter& null();

  // key(k) followed by a value.
  JsonWriter& field(std::string_view k, std::string_view v) { return key(k).string(v); }
  JsonWriter& field(std::string_view k, const char* v) { return key(k).string(v); }
  JsonWriter& field_uint(std::string_view k, std::uint64_t v) { return key(k).uint(v); }
  JsonWriter& field_bool(std::string_view k, bool v) { return key(k).boolean(v); }

  // The finished document (with a trailing newline when pretty).
  [[nodiscard]] std::string str() const;

 private:
  enum class Ctx : std::uint8_t { object, array };
  struct Frame {
    Ctx ctx;
    bool empty = true;
    bool have_key = false;
  };
  void before_value();
  void newline_indent();
  void close(Ctx c);

  bool pretty_;
  bool done_ = false;
  std::string out_;
  std::vector<Frame> stack_;
};

}  // namespace vlake::ctl
