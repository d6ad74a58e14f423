// vlake::pool::plan_idle_release — which free-pool handles go back to the driver because they
// stayed free too long (docs/pool.md, "Idle release").
//
// Contract: given the free handles (their size, binding, cleanliness, LRU order and the time
// they entered the free pool), the current time, the idle period and the keep bound, returns
// the indices (into `free`) of the handles to release, least recently freed first:
//   - only handles free for at least `idle` (now - freed_at >= idle) are candidates;
//   - a handle bound to a tenant (`--handle-reuse tenant`) that is idle is always released: it
//     serves only that tenant, and what it keeps is charged to that tenant as retained;
//   - unbound idle handles are released oldest first while the unbound free bytes left stay at
//     or above `keep` (the warm reserve, or --pool-keep); a handle that would take them below
//     is skipped (a smaller, younger one may still fit). Dirty handles go before clean ones
//     (the warm reserve's zeroed handles are the last to go: they save a scrub), and a clean
//     handle goes only while the clean bytes left stay at or above `warm` (the warm reserve
//     is kept as it is).
// `idle` of 0 releases nothing (the rule is off). Pure; thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

struct IdleHandleView {
  Bytes size{0};
  bool bound = false;  // bound to a tenant (serves only it)
  bool clean = false;  // warm reserve: known zeros
  std::uint64_t freed_seq = 0;
  std::chrono::steady_clock::time_point freed_at{};  // when it entered the free pool
};

std::vector<std::size_t> plan_idle_release(const std::vector<IdleHandleView>& free,
                                           std::chrono::steady_clock::time_point now, std::chrono::milliseconds idle,
                                           Bytes keep, Bytes warm = Bytes{0});

}  // namespace vlake::pool
