// ReuseStats: how a process reuses its local reserve (docs/hook.md, "Choosing the reserve's
// defaults"), for choosing VLAKE_RESERVE and VLAKE_RESERVE_AGE from measurements. Recorded only
// with VLAKE_RESERVE_STATS=<path>; written as JSON to "<path>.<pid>.json" at process exit.
//
// Contract
// - Plain data: LocalReserve records into it under its own mutex; snapshot() copies it out.
// - Every reuse (a warm allocation taken from the reserve) is counted in a 2-D histogram of
//   (gap, stack): `gap` is how long the block was idle in the reserve; `stack` is the bytes of
//   the blocks freed at or after it that were still in the reserve, itself included: the
//   smallest byte cap under which least-recently-freed eviction would have kept it (an
//   estimate, as any LRU stack distance: a smaller cap changes what is in the reserve later).
//   A reuse survives the settings (age A, cap C) when gap < A and stack <= C.
// - Bucket i of the gap covers [2^(i-1), 2^i) milliseconds (bucket 0: under 1 ms); bucket i of
//   the stack covers (2^(i-1), 2^i] MiB (bucket 0: up to 1 MiB). The last bucket of each also
//   holds everything above.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace vlake::hook {

struct ReuseStats {
  static constexpr std::size_t kGapBuckets = 24;    // up to 2^23 ms (2.3 h)
  static constexpr std::size_t kStackBuckets = 20;  // up to 2^19 MiB (512 GiB)

  std::array<std::array<std::uint64_t, kStackBuckets>, kGapBuckets> reuses{};  // [gap][stack]
  std::uint64_t reuse_bytes = 0;                                               // Σ mapped bytes of the reused blocks
  std::uint64_t misses = 0;      // allocations the reserve could not serve (a daemon grant)
  std::uint64_t miss_bytes = 0;  // Σ bytes asked by those
  std::uint64_t puts = 0;        // frees into the reserve
  std::uint64_t expired = 0;     // blocks that left by age
  std::uint64_t expired_bytes = 0;
  std::uint64_t evicted = 0;  // blocks that left over the byte cap (or larger than it)
  std::uint64_t evicted_bytes = 0;
  std::uint64_t drained = 0;  // blocks that left on pressure or a refusal
  std::uint64_t drained_bytes = 0;
  std::uint64_t peak_bytes = 0;  // the reserve's largest size

  [[nodiscard]] static std::size_t gap_bucket(std::chrono::nanoseconds gap) noexcept;
  [[nodiscard]] static std::size_t stack_bucket(std::uint64_t bytes) noexcept;
  void record_reuse(std::chrono::nanoseconds gap, std::uint64_t stack_bytes, std::uint64_t bytes) noexcept;

  // One JSON object: the counters, "gap_ms_upper" and "stack_mib_upper" (bucket upper bounds)
  // and "reuses" as [[gap bucket, stack bucket, count], ...] for the non-zero cells.
  [[nodiscard]] std::string to_json(std::uint64_t reserve_cap, std::chrono::milliseconds reserve_age) const;
};

}  // namespace vlake::hook
