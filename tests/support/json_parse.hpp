// A tiny strict JSON parser for the vlakectl tests (RFC 8259: no trailing commas, no comments,
// no leading zeros, escapes checked, control characters in strings rejected, UTF-8 checked,
// duplicate object keys rejected, nothing after the document but whitespace).
//
// Contract: parse() returns the document or throws std::runtime_error naming the offset.
// Numbers keep their text so 64-bit integers compare exactly (u64()). Not thread-safe per
// object; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace vlake::ctltest {

struct Json {
  enum class Type { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool b = false;
  std::string text;  // number text, or string value
  std::vector<Json> items;
  std::map<std::string, Json> fields;
  std::vector<std::string> order;  // object keys in document order

  [[nodiscard]] bool is_null() const { return type == Type::null; }
  [[nodiscard]] const Json& at(const std::string& k) const;  // throws if absent / not object
  [[nodiscard]] const Json& at(std::size_t i) const;         // throws if out of range / not array
  [[nodiscard]] bool has(const std::string& k) const { return type == Type::object && fields.count(k) != 0; }
  [[nodiscard]] std::uint64_t u64() const;  // a non-negative integer number
  [[nodiscard]] double num() const;
  [[nodiscard]] const std::string& str() const;
  [[nodiscard]] bool boolean() const;
  [[nodiscard]] std::size_t size() const { return type == Type::array ? items.size() : fields.size(); }
};

Json parse_json(const std::string& text);

}  // namespace vlake::ctltest
