// vlake::pool::Accounting — per (tenant, device) quota bookkeeping.
//
// What it tracks, per (tenant, device): the limit, pool bytes granted (committed), non-pool
// bytes (sampled from NVML: contexts, modules, passthrough allocations) and bytes reserved by
// grants in flight. The tenant's usage is granted + nonpool.
//
// Contract
// - reserve(t, d, n) succeeds only if granted + nonpool + reserved + n <= limit, atomically
//   with respect to every other call; it returns a Reservation (RAII token). Committing moves
//   the bytes from reserved to granted; rolling back (explicitly, or by destroying the token
//   uncommitted) returns them. No interleaving of calls can make granted + reserved + nonpool
//   exceed the limit through reserve() (set_nonpool() and restore() record facts and may).
// - uncharge(t, d, n) returns committed bytes (clamped at 0; a clamp is reported as false).
// - A (tenant, device) never given a limit has limit 0: every reserve fails.
//
// Thread-safety: every method may be called from any thread (one internal mutex). A
// Reservation must not outlive its Accounting; it is move-only and not itself thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

class Accounting {
 public:
  struct Usage {
    Bytes limit;
    Bytes granted;
    Bytes nonpool;
    Bytes reserved;
    [[nodiscard]] Bytes used() const noexcept { return granted + nonpool; }
  };
  struct Entry {
    TenantId tenant;
    DeviceOrdinal device;
    Usage usage;
  };

  class Reservation {
   public:
    Reservation() = default;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { rollback(); }

    void commit() noexcept;
    void rollback() noexcept;
    [[nodiscard]] bool active() const noexcept { return owner_ != nullptr; }
    [[nodiscard]] Bytes bytes() const noexcept { return bytes_; }
    [[nodiscard]] TenantId tenant() const noexcept { return tenant_; }
    [[nodiscard]] DeviceOrdinal device() const noexcept { return device_; }

   private:
    friend class Accounting;
    Reservation(Accounting* a, TenantId t, DeviceOrdinal d, Bytes b) noexcept
        : owner_(a), tenant_(t), device_(d), bytes_(b) {}
    Accounting* owner_ = nullptr;
    TenantId tenant_{};
    DeviceOrdinal device_{};
    Bytes bytes_{};
  };

  void set_limit(TenantId t, DeviceOrdinal d, Bytes limit);
  // nullopt when the bytes do not fit; `usage_out` (optional) receives the usage seen.
  [[nodiscard]] std::optional<Reservation> reserve(TenantId t, DeviceOrdinal d, Bytes n,
                                                   Usage* usage_out = nullptr);
  void commit(Reservation& r) noexcept { r.commit(); }
  void rollback(Reservation& r) noexcept { r.rollback(); }
  // Returns false if fewer than `n` bytes were granted (granted is then set to 0).
  bool uncharge(TenantId t, DeviceOrdinal d, Bytes n);
  // Charges bytes that are already held (state recovered after a restart), limit or not.
  void restore(TenantId t, DeviceOrdinal d, Bytes n);
  void set_nonpool(TenantId t, DeviceOrdinal d, Bytes n);

  [[nodiscard]] Usage usage(TenantId t, DeviceOrdinal d) const;
  // A consistent copy of every entry (one lock).
  [[nodiscard]] std::vector<Entry> snapshot() const;

 private:
  struct Key {
    TenantId t;
    DeviceOrdinal d;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return (static_cast<std::size_t>(k.t.value()) << 8) ^ static_cast<std::size_t>(k.d.value());
    }
  };
  void finish(const Reservation& r, bool commit) noexcept;

  mutable std::mutex mu_;
  std::unordered_map<Key, Usage, KeyHash> map_;
};

}  // namespace vlake::pool
