#include "json_parse.hpp"

#include <cstdlib>
#include <stdexcept>

namespace vlake::ctltest {

namespace {

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Json document() {
    ws();
    Json v = value(0);
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("json: " + what + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  void literal(const char* word) {
    for (const char* p = word; *p != '\0'; ++p) expect(*p);
  }

  // The items of an object or array after its opening character: `item()` reads one, then a
  // ',' continues and `close` ends the list.
  template <class F>
  void items(char close, F&& item) {
    ws();
    if (eat(close)) return;
    for (;;) {
      ws();
      item();
      ws();
      if (eat(',')) continue;
      expect(close);
      return;
    }
  }

  Json value(int depth) {
    if (depth > 64) fail("too deep");
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.type = Json::Type::object;
      ++i_;
      items('}', [&] {
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a key");
        std::string k = string();
        if (v.fields.count(k) != 0) fail("duplicate key '" + k + "'");
        ws();
        expect(':');
        ws();
        v.fields.emplace(k, value(depth + 1));
        v.order.push_back(k);
      });
      return v;
    }
    if (c == '[') {
      v.type = Json::Type::array;
      ++i_;
      items(']', [&] { v.items.push_back(value(depth + 1)); });
      return v;
    }
    if (c == '"') {
      v.type = Json::Type::string;
      v.text = string();
      return v;
    }
    if (c == 't') {
      literal("true");
      v.type = Json::Type::boolean;
      v.b = true;
      return v;
    }
    if (c == 'f') {
      literal("false");
      v.type = Json::Type::boolean;
      return v;
    }
    if (c == 'n') {
      literal("null");
      return v;
    }
    v.type = Json::Type::number;
    v.text = number();
    return v;
  }

  std::string number() {
    const std::size_t start = i_;
    eat('-');
    if (eat('0')) {
    } else if (i_ < s_.size() && s_[i_] >= '1' && s_[i_] <= '9') {
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    } else {
      fail("bad number");
    }
    if (eat('.')) {
      const std::size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == d) fail("bad fraction");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (!eat('+')) eat('-');
      const std::size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == d) fail("bad exponent");
    }
    return s_.substr(start, i_ - start);
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad hex digit");
    }
    return v;
  }

  static void utf8(std::string& o, unsigned cp) {
    if (cp < 0x80) {
      o += static_cast<char>(cp);
    } else if (cp < 0x800) {
      o += static_cast<char>(0xC0 | (cp >> 6));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      o += static_cast<char>(0xE0 | (cp >> 12));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (cp >> 18));
      o += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string o;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return o;
      }
      if (c < 0x20) fail("control character in a string");
      if (c == '\\') {
        ++i_;
        if (i_ >= s_.size()) fail("unterminated escape");
        const char e = s_[i_++];
        switch (e) {
          case '"': o += '"'; break;
          case '\\': o += '\\'; break;
          case '/': o += '/'; break;
          case 'b': o += '\b'; break;
          case 'f': o += '\f'; break;
          case 'n': o += '\n'; break;
          case 'r': o += '\r'; break;
          case 't': o += '\t'; break;
          case 'u': {
            unsigned cp = hex4();
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              expect('\\');
              expect('u');
              const unsigned lo = hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) fail("bad surrogate pair");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
              fail("lone low surrogate");
            }
            utf8(o, cp);
            break;
          }
          default: fail("bad escape");
        }
        continue;
      }
      // Raw UTF-8: check the sequence.
      std::size_t n = c < 0x80                   ? 1
                      : (c >= 0xC2 && c <= 0xDF) ? 2
                      : (c >= 0xE0 && c <= 0xEF) ? 3
                      : (c >= 0xF0 && c <= 0xF4) ? 4
                                                 : 0;
      if (n == 0 || i_ + n > s_.size()) fail("invalid UTF-8");
      for (std::size_t k = 1; k < n; ++k) {
        if ((static_cast<unsigned char>(s_[i_ + k]) & 0xC0) != 0x80) fail("invalid UTF-8");
      }
      o.append(s_, i_, n);
      i_ += n;
    }
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

}  // namespace

const Json& Json::at(const std::string& k) const {
  if (type != Type::object) throw std::runtime_error("json: not an object (looking for '" + k + "')");
  const auto it = fields.find(k);
  if (it == fields.end()) throw std::runtime_error("json: no key '" + k + "'");
  return it->second;
}

const Json& Json::at(std::size_t i) const {
  if (type != Type::array) throw std::runtime_error("json: not an array");
  if (i >= items.size()) throw std::runtime_error("json: index " + std::to_string(i) + " out of range");
  return items[i];
}

std::uint64_t Json::u64() const {
  if (type != Type::number || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    throw std::runtime_error("json: not a non-negative integer: '" + text + "'");
  }
  return std::stoull(text);
}

double Json::num() const {
  if (type != Type::number) throw std::runtime_error("json: not a number");
  return std::strtod(text.c_str(), nullptr);
}

const std::string& Json::str() const {
  if (type != Type::string) throw std::runtime_error("json: not a string");
  return text;
}

bool Json::boolean() const {
  if (type != Type::boolean) throw std::runtime_error("json: not a boolean");
  return b;
}

Json parse_json(const std::string& text) { return Parser(text).document(); }

}  // namespace vlake::ctltest
