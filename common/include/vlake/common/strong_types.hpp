// Strong types for the quantities vlake passes around: byte counts, device ordinals, tenant and
// chunk ids. Each is a distinct type, so a tenant id can never be passed where a device ordinal
// or a size is expected.
//
// Contract: value types, trivially copyable (safe in shared memory and on the socket), no
// implicit conversions from or to the underlying integer; `.value()` reads it. Thread-safe as
// any plain value.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <type_traits>

namespace vlake {

template <class Tag, class Rep>
class StrongId {
 public:
  using rep_type = Rep;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) noexcept : value_(v) {}
  [[nodiscard]] constexpr Rep value() const noexcept { return value_; }
  friend constexpr auto operator<=>(StrongId, StrongId) = default;

 private:
  Rep value_{};
};

struct DeviceOrdinalTag {};
struct TenantIdTag {};
using DeviceOrdinal = StrongId<DeviceOrdinalTag, std::int32_t>;
using TenantId = StrongId<TenantIdTag, std::uint32_t>;

// A number of bytes. Supports the arithmetic sizes need (sum, difference, scaling, ratio) and
// nothing that mixes it with unrelated integers by accident.
class Bytes {
 public:
  constexpr Bytes() = default;
  constexpr explicit Bytes(std::uint64_t v) noexcept : value_(v) {}
  [[nodiscard]] constexpr std::uint64_t value() const noexcept { return value_; }
  friend constexpr auto operator<=>(Bytes, Bytes) = default;
  constexpr Bytes& operator+=(Bytes o) noexcept {
    value_ += o.value_;
    return *this;
  }
  constexpr Bytes& operator-=(Bytes o) noexcept {
    value_ -= o.value_;
    return *this;
  }
  friend constexpr Bytes operator+(Bytes a, Bytes b) noexcept { return Bytes{a.value_ + b.value_}; }
  friend constexpr Bytes operator-(Bytes a, Bytes b) noexcept { return Bytes{a.value_ - b.value_}; }
  friend constexpr Bytes operator*(Bytes a, std::uint64_t k) noexcept { return Bytes{a.value_ * k}; }
  friend constexpr Bytes operator*(std::uint64_t k, Bytes a) noexcept { return Bytes{a.value_ * k}; }
  friend constexpr Bytes operator/(Bytes a, std::uint64_t k) noexcept { return Bytes{a.value_ / k}; }
  friend constexpr std::uint64_t operator/(Bytes a, Bytes b) noexcept { return a.value_ / b.value_; }
  friend constexpr Bytes operator%(Bytes a, Bytes b) noexcept { return Bytes{a.value_ % b.value_}; }

 private:
  std::uint64_t value_ = 0;
};

// Rounds `b` up to a multiple of `unit` (unit > 0).
[[nodiscard]] constexpr Bytes round_up(Bytes b, Bytes unit) noexcept {
  return Bytes{(b.value() + unit.value() - 1) / unit.value() * unit.value()};
}

namespace literals {
constexpr Bytes operator""_B(unsigned long long v) noexcept { return Bytes{v}; }
constexpr Bytes operator""_KiB(unsigned long long v) noexcept { return Bytes{v << 10}; }
constexpr Bytes operator""_MiB(unsigned long long v) noexcept { return Bytes{v << 20}; }
constexpr Bytes operator""_GiB(unsigned long long v) noexcept { return Bytes{v << 30}; }
}  // namespace literals

static_assert(std::is_trivially_copyable_v<Bytes> && sizeof(Bytes) == 8);
static_assert(std::is_trivially_copyable_v<DeviceOrdinal> && sizeof(DeviceOrdinal) == 4);
static_assert(std::is_trivially_copyable_v<TenantId> && sizeof(TenantId) == 4);

}  // namespace vlake

template <class Tag, class Rep>
struct std::hash<vlake::StrongId<Tag, Rep>> {
  std::size_t operator()(vlake::StrongId<Tag, Rep> v) const noexcept { return std::hash<Rep>{}(v.value()); }
};
