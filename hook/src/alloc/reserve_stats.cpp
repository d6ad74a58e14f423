#include "reserve_stats.hpp"

#include <bit>

namespace vlake::hook {

std::size_t ReuseStats::gap_bucket(std::chrono::nanoseconds gap) noexcept {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(gap).count();
  if (ms <= 0) return 0;
  const auto i = static_cast<std::size_t>(std::bit_width(static_cast<std::uint64_t>(ms)));  // [2^(i-1), 2^i)
  return i < kGapBuckets ? i : kGapBuckets - 1;
}

std::size_t ReuseStats::stack_bucket(std::uint64_t bytes) noexcept {
  constexpr std::uint64_t kMiB = 1ULL << 20;
  const std::uint64_t mib = (bytes + kMiB - 1) / kMiB;  // rounded up
  if (mib <= 1) return 0;
  const auto i = static_cast<std::size_t>(std::bit_width(mib - 1));  // (2^(i-1), 2^i]
  return i < kStackBuckets ? i : kStackBuckets - 1;
}

void ReuseStats::record_reuse(std::chrono::nanoseconds gap, std::uint64_t stack_bytes, std::uint64_t bytes) noexcept {
  ++reuses[gap_bucket(gap)][stack_bucket(stack_bytes)];
  reuse_bytes += bytes;
}

std::string ReuseStats::to_json(std::uint64_t reserve_cap, std::chrono::milliseconds reserve_age) const {
  auto num = [](std::uint64_t v) { return std::to_string(v); };
  std::string j = "{\"reserve_cap\":" + num(reserve_cap) +
                  ",\"reserve_age_ms\":" + num(static_cast<std::uint64_t>(reserve_age.count()));
  const std::pair<const char*, std::uint64_t> fields[] = {
      {"reuse_bytes", reuse_bytes}, {"misses", misses},
      {"miss_bytes", miss_bytes},   {"puts", puts},
      {"expired", expired},         {"expired_bytes", expired_bytes},
      {"evicted", evicted},         {"evicted_bytes", evicted_bytes},
      {"drained", drained},         {"drained_bytes", drained_bytes},
      {"peak_bytes", peak_bytes}};
  for (const auto& [k, v] : fields) j += ",\"" + std::string(k) + "\":" + num(v);
  j += ",\"gap_ms_upper\":[";
  for (std::size_t i = 0; i < kGapBuckets; ++i) j += (i ? "," : "") + num(1ULL << i);
  j += "],\"stack_mib_upper\":[";
  for (std::size_t i = 0; i < kStackBuckets; ++i) j += (i ? "," : "") + num(1ULL << i);
  j += "],\"reuses\":[";
  bool first = true;
  for (std::size_t g = 0; g < kGapBuckets; ++g) {
    for (std::size_t s = 0; s < kStackBuckets; ++s) {
      if (reuses[g][s] == 0) continue;
      j += (first ? "[" : ",[") + num(g) + "," + num(s) + "," + num(reuses[g][s]) + "]";
      first = false;
    }
  }
  j += "]}";
  return j;
}

}  // namespace vlake::hook
