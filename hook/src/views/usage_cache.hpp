// UsageCache: the daemon's usage answers (UsageQuery -> limit, used, total per GPU), kept for a
// short time so that memory queries (cuMemGetInfo_v2, cuDeviceTotalMem_v2, NVML's memory info)
// asked in a loop do not each cost a daemon round trip (docs/hook.md, "Memory queries").
//
// Contract
// - Plain data structure: no daemon call, no clock of its own (callers pass the time).
// - get(device, generation, now) answers only an entry stored for `device` with the same
//   `generation` (the caller's count of this process's requests that may change its usage —
//   grants, releases, shares, IPC: any change makes every entry stale), less than `ttl` before
//   `now`, whose free figure (limit - used) is at least exact_margin(limit) = max(exact_floor,
//   limit / exact_divisor). Near the limit the caller asks the daemon every time, so a process
//   sees exactly what another process of its tenant took a moment ago.
// - put() stores an answer with the generation read *before* the request was sent and the time
//   it was sent: a change that raced the request leaves it stale.
// - At most kSlots devices are kept (more: not cached). Thread-safety: one internal mutex.
//   Fork: lock_all()/unlock_all() bracket fork() in the parent; clear_after_fork() in the child.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

#include "fork_lock.hpp"
#include "vlake/common/uuid.hpp"

namespace vlake::hook {

struct UsageFigures {
  std::uint64_t total = 0;
  std::uint64_t limit = 0;
  std::uint64_t used = 0;
};

struct UsageCachePolicy {
  std::chrono::nanoseconds ttl = std::chrono::milliseconds(100);
  std::uint64_t exact_floor = std::uint64_t{256} << 20;  // 256 MiB
  std::uint64_t exact_divisor = 20;                      // 5 % of the limit
};

class UsageCache : public ForkLock {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kSlots = 32;

  explicit UsageCache(UsageCachePolicy policy = {}) : policy_(policy) {}

  [[nodiscard]] std::optional<UsageFigures> get(const Uuid& device, std::uint64_t generation,
                                                Clock::time_point now) const;
  void put(const Uuid& device, const UsageFigures& u, std::uint64_t generation, Clock::time_point asked);
  // Free bytes below which the daemon is asked every time.
  [[nodiscard]] std::uint64_t exact_margin(std::uint64_t limit) const noexcept;
  [[nodiscard]] const UsageCachePolicy& policy() const noexcept { return policy_; }

  void clear_after_fork() noexcept;

 private:
  struct Slot {
    bool used = false;
    Uuid device{};
    UsageFigures figures;
    std::uint64_t generation = 0;
    Clock::time_point asked{};
  };

  const UsageCachePolicy policy_;
  std::array<Slot, kSlots> slots_{};
};

}  // namespace vlake::hook
