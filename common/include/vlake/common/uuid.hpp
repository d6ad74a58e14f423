// vlake::Uuid — the 16-byte identity of a GPU (cuDeviceGetUuid, nvmlDeviceGetUUID), defined once.
//
// Contract
// - A value type: trivially copyable, 16 bytes, ordered and comparable, so it can sit in a map,
//   a wire message or a shared-memory record (as its raw 16 bytes: from_bytes()/copy_to()).
// - to_string() gives NVML's form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase.
// - parse() accepts that form with or without the "GPU-" prefix, hex digits of either case, and
//   nothing else (no other separators, no surrounding text, no "MIG-" identities): nullopt on
//   anything else. parse(u.to_string()) == u for every u.
// - Header-only, standard library only, no exceptions (to_string() may throw std::bad_alloc):
//   the hook and the simulator include it. Thread-safe as any plain value.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace vlake {

struct Uuid {
  static constexpr std::size_t kBytes = 16;
  static constexpr std::size_t kStringLength = 40;  // "GPU-" + 8-4-4-4-12 hex digits

  std::array<std::uint8_t, kBytes> bytes{};

  constexpr Uuid() = default;
  constexpr explicit Uuid(const std::array<std::uint8_t, kBytes>& b) noexcept : bytes(b) {}

  // The 16 bytes at `raw` (a wire field, CUuuid::bytes, a state record's uuid).
  [[nodiscard]] static Uuid from_bytes(const void* raw) noexcept {
    Uuid u;
    std::memcpy(u.bytes.data(), raw, kBytes);
    return u;
  }
  // Writes the 16 bytes to `out`.
  void copy_to(void* out) const noexcept { std::memcpy(out, bytes.data(), kBytes); }

  [[nodiscard]] constexpr const std::uint8_t* data() const noexcept { return bytes.data(); }
  [[nodiscard]] constexpr std::uint8_t* data() noexcept { return bytes.data(); }
  [[nodiscard]] static constexpr std::size_t size() noexcept { return kBytes; }
  [[nodiscard]] constexpr std::uint8_t operator[](std::size_t i) const noexcept { return bytes[i]; }
  [[nodiscard]] constexpr std::uint8_t& operator[](std::size_t i) noexcept { return bytes[i]; }
  [[nodiscard]] constexpr bool is_nil() const noexcept {
    for (std::uint8_t b : bytes) {
      if (b != 0) return false;
    }
    return true;
  }

  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
  [[nodiscard]] std::string to_string() const {
    constexpr char kHex[] = "0123456789abcdef";
    std::string s = "GPU-";
    s.reserve(kStringLength);
    for (std::size_t i = 0; i < kBytes; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
      s.push_back(kHex[bytes[i] >> 4]);
      s.push_back(kHex[bytes[i] & 0xf]);
    }
    return s;
  }

  // The UUID `s` spells ("GPU-" optional), or nullopt.
  [[nodiscard]] static constexpr std::optional<Uuid> parse(std::string_view s) noexcept {
    if (s.substr(0, 4) == "GPU-") s.remove_prefix(4);
    if (s.size() != kStringLength - 4) return std::nullopt;
    Uuid u;
    std::size_t k = 0;
    for (std::size_t i = 0; i < s.size(); i += 2) {
      if (i == 8 || i == 13 || i == 18 || i == 23) {
        if (s[i] != '-') return std::nullopt;
        ++i;
      }
      const int hi = hex_digit(s[i]);
      const int lo = hex_digit(s[i + 1]);
      if (hi < 0 || lo < 0) return std::nullopt;
      u.bytes[k++] = static_cast<std::uint8_t>(hi * 16 + lo);
    }
    return u;
  }

  friend constexpr bool operator==(const Uuid&, const Uuid&) = default;
  friend constexpr auto operator<=>(const Uuid&, const Uuid&) = default;

 private:
  static constexpr int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
};

static_assert(sizeof(Uuid) == Uuid::kBytes);
static_assert(std::is_trivially_copyable_v<Uuid> && std::is_standard_layout_v<Uuid>);

}  // namespace vlake
