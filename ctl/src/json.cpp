#include "vlake/ctl/json.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace vlake::ctl {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid.
std::size_t utf8_len(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const auto cont = [&](std::size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(i + 1) || !cont(i + 2)) return 0;
    const unsigned char c1 = b(i + 1);
    if (c == 0xE0 && c1 < 0xA0) return 0;  // overlong
    if (c == 0xED && c1 > 0x9F) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    const unsigned char c1 = b(i + 1);
    if (c == 0xF0 && c1 < 0x90) return 0;  // overlong
    if (c == 0xF4 && c1 > 0x8F) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;
}

}  // namespace

std::string json_quote(std::string_view s) {
  std::string o;
  o.reserve(s.size() + 2);
  o += '"';
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        o += "\\\"";
        ++i;
        continue;
      case '\\':
        o += "\\\\";
        ++i;
        continue;
      case '\b':
        o += "\\b";
        ++i;
        continue;
      case '\f':
        o += "\\f";
        ++i;
        continue;
      case '\n':
        o += "\\n";
        ++i;
        continue;
      case '\r':
        o += "\\r";
        ++i;
        continue;
      case '\t':
        o += "\\t";
        ++i;
        continue;
      default: break;
    }
    if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
      ++i;
      continue;
    }
    const std::size_t n = utf8_len(s, i);
    if (n == 0) {
      o += "\\ufffd";
      ++i;
    } else {
      o.append(s.substr(i, n));
      i += n;
    }
  }
  o += '"';
  return o;
}

void JsonWriter::newline_indent() {
  if (!pretty_) return;
  out_ += '\n';
  out_.append(stack_.size() * 2, ' ');
}

void JsonWriter::before_value() {
  if (done_) throw std::logic_error("json: a second top-level value");
  if (stack_.empty()) return;
  Frame& f = stack_.back();
  if (f.ctx == Ctx::object) {
    if (!f.have_key) throw std::logic_error("json: a value in an object needs a key first");
    f.have_key = false;
    return;
  }
  if (!f.empty) out_ += ',';
  f.empty = false;
  newline_indent();
}

JsonWriter& JsonWriter::key(std::string_view k) {
  if (stack_.empty() || stack_.back().ctx != Ctx::object) throw std::logic_error("json: key outside an object");
  Frame& f = stack_.back();
  if (f.have_key) throw std::logic_error("json: two keys in a row");
  if (!f.empty) out_ += ',';
  f.empty = false;
  f.have_key = true;
  newline_indent();
  out_ += json_quote(k);
  out_ += pretty_ ? ": " : ":";
  return *this;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  stack_.push_back({Ctx::object});
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  stack_.push_back({Ctx::array});
  return *this;
}

void JsonWriter::close(Ctx c) {
  if (stack_.empty() || stack_.back().ctx != c) throw std::logic_error("json: unbalanced end");
  if (stack_.back().have_key) throw std::logic_error("json: a key without a value");
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (!empty) newline_indent();
  out_ += c == Ctx::object ? '}' : ']';
  if (stack_.empty()) done_ = true;
}

JsonWriter& JsonWriter::end_object() {
  close(Ctx::object);
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  close(Ctx::array);
  return *this;
}

JsonWriter& JsonWriter::string(std::string_view v) {
  before_value();
  out_ += json_quote(v);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::uint(std::uint64_t v) {
  before_value();
  out_ += std::to_string(v);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::sint(std::int64_t v) {
  before_value();
  out_ += std::to_string(v);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::number(double v, int decimals) {
  if (!std::isfinite(v)) return null();
  before_value();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals < 0 ? 0 : (decimals > 17 ? 17 : decimals), v);
  out_ += buf;
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::boolean(bool v) {
  before_value();
  out_ += v ? "true" : "false";
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ += "null";
  if (stack_.empty()) done_ = true;
  return *this;
}

std::string JsonWriter::str() const {
  if (!done_) throw std::logic_error("json: document not finished");
  return pretty_ ? out_ + "\n" : out_;
}

}  // namespace vlake::ctl
