// LocalReserve: memory this process freed but keeps mapped for reuse (docs/hook.md, "Local
// reserve"). A block is one former allocation of the alloc path: its VA reservation, the
// imported handles mapped in it and the grant that charged them. A warm cuMemAlloc takes a
// block (no driver VMM call, no daemon message); cuMemFree puts it back.
//
// Contract
// - Plain data structure: no driver or daemon call. Blocks that leave the reserve for good
//   (evicted over the byte cap, expired by age, drained on pressure or on a refusal) are
//   returned to the caller, who unmaps them and releases their grants.
// - Fit: take(device, need) returns the smallest block on that device whose mapped size is in
//   [need, need + slack(need)] with slack(need) = need / 8 rounded down to `granularity`
//   (exact fit for sizes under 8 granules), preferring the most recently freed among equals.
//   A larger waste is never accepted: the grant behind a block stays charged to the tenant.
// - Byte cap: put() keeps the reserve at most `max_bytes` (all devices together), evicting the
//   least recently freed blocks; a block larger than the cap is returned at once.
// - Reuse statistics (reserve_stats.hpp): off unless enable_stats() was called (once, at
//   initialization); when off they cost one branch per call.
// - Thread-safety: every method may be called from any thread (one internal mutex). Fork:
//   lock_all()/unlock_all() bracket fork() in the parent; clear_after_fork() in the child forgets
//   every block (they belong to the parent's grants) and unlocks.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "fork_lock.hpp"
#include "reserve_stats.hpp"
#include "tables.hpp"

namespace vlake::hook {

struct ReserveBlock {
  LogicalAlloc alloc;  // base, reserved, mapped, handles, grant_id, device, ctx; ptr/requested stale
  std::chrono::steady_clock::time_point freed{};
  bool prefetched = false;  // fetched ahead by the worker (prefetch.hpp), never used yet
};

class LocalReserve : public ForkLock {
 public:
  using Clock = std::chrono::steady_clock;

  LocalReserve(std::uint64_t max_bytes, std::chrono::milliseconds max_age) noexcept
      : max_bytes_(max_bytes), max_age_(max_age) {}

  [[nodiscard]] bool enabled() const noexcept { return max_bytes_ > 0; }
  [[nodiscard]] std::uint64_t max_bytes() const noexcept { return max_bytes_; }
  [[nodiscard]] std::chrono::milliseconds max_age() const noexcept { return max_age_; }

  // The largest mapped size a request of `need` bytes accepts.
  [[nodiscard]] static std::uint64_t fit_limit(std::uint64_t need, std::uint64_t granularity) noexcept;

  [[nodiscard]] bool take(int device, std::uint64_t need, std::uint64_t granularity, ReserveBlock& out);
  // Adds a freed block; returns what had to leave to respect the byte cap.
  [[nodiscard]] std::vector<ReserveBlock> put(ReserveBlock b);
  // Blocks freed more than max_age before `now`.
  [[nodiscard]] std::vector<ReserveBlock> expire(Clock::time_point now);
  // Least recently freed blocks on `device` until at least `bytes` are out (0: all of them).
  [[nodiscard]] std::vector<ReserveBlock> drain(int device, std::uint64_t bytes);
  // The block of grant `grant_id` leaves the reserve (the host tier: a grant vlaked wants to move
  // that this process does not use is given back instead); false when no block holds it.
  bool take_grant(std::uint64_t grant_id, ReserveBlock& out);

  [[nodiscard]] std::uint64_t bytes(int device) const;
  [[nodiscard]] std::uint64_t blocks(int device) const;
  [[nodiscard]] std::uint64_t total_bytes() const;

  void enable_stats() noexcept;
  // Counts an allocation served without asking take() (statistics only).
  void note_miss(std::uint64_t bytes) noexcept;
  [[nodiscard]] bool stats_enabled() const noexcept;
  [[nodiscard]] ReuseStats stats() const;

  void clear_after_fork() noexcept;

 private:
  using Key = std::pair<int, std::uint64_t>;  // device, mapped bytes
  std::vector<ReserveBlock> evict_locked(int device, std::uint64_t bytes, bool any_device);
  void count_leaving(const std::vector<ReserveBlock>& out, std::uint64_t& blocks, std::uint64_t& bytes) noexcept;

  const std::uint64_t max_bytes_;
  const std::chrono::milliseconds max_age_;
  std::multimap<Key, ReserveBlock> blocks_;
  std::uint64_t total_ = 0;
  bool stats_on_ = false;
  ReuseStats stats_;
};

}  // namespace vlake::hook
