// vlake::exporter::StateCollector — the Prometheus view of vlaked's state segment
// (docs/metrics.md is the contract: names, types, labels, meanings).
//
// Contract: Collect() takes ONE consistent snapshot from its SnapshotSource and builds every
// metric family from it; nothing is pushed by the daemon. When no snapshot can be had (the
// segment is gone, the daemon is rewriting it for > 1 s) Collect() still answers, with
// vlake_build_info and vlake_daemon_up 0 only. health() answers whether vlake_daemon_up would
// be 1, with the reason when not.
//
// build_families()/evaluate_health() are the pure core (a State and "now" in, families out):
// the unit tests drive them over an in-memory State.
//
// Thread-safety: Collect() and health() may run concurrently (civetweb's worker threads) as
// long as the SnapshotSource is thread-safe (StateReader::snapshot() is). Errors: Collect() and
// health() never throw; for_segment() throws state::StateError when the segment cannot
// be mapped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "vlake/contracts/state.hpp"

namespace vlake::exporter {

// Returns a consistent copy of the state; throws (any std::exception) when it cannot.
using SnapshotSource = std::function<std::unique_ptr<state::State>()>;
// CLOCK_REALTIME in nanoseconds (the clock of Header::updated_unix_ns).
using Clock = std::function<std::uint64_t()>;

std::uint64_t realtime_ns();

// vlake_build_info's labels.
struct BuildInfo {
  std::string version;
  std::string revision;
};
BuildInfo this_build();

struct Health {
  bool up = false;
  std::string reason;  // why not up ("" when up)
};

// Up: a daemon runs on the segment (not cleanly stopped) and refreshed it within 3 sample
// intervals of `now_ns`.
Health evaluate_health(const state::State& s, std::uint64_t now_ns);

// vlake_pool_fragmentation_ratio (docs/pool.md, "What the free pool can serve"): the share of
// the free pool that the largest grant servable from it without a new handle
// (DeviceRecord::largest_servable_bytes, stitching included) cannot use:
// 1 - largest_servable / free_bytes, clamped to [0, 1]; 0 when the pool is empty.
double fragmentation_ratio(std::uint64_t largest_servable, std::uint64_t free_bytes);

// What a scrape shows beyond the node, GPU, namespace and tenant families (docs/metrics.md,
// "Per-process series"). The endpoint answers whoever reaches it (loopback: every local user),
// while the state segment itself is root-only (0600): series that name processes are opt-in.
struct Exposure {
  // vlake_process_idle_seconds: one series per process with a session, labelled with its pid and
  // giving its idle time. Off by default (vlaked --metrics-process-series on).
  bool process_series = false;
};

// Every family of docs/metrics.md, from one snapshot.
std::vector<prometheus::MetricFamily> build_families(const state::State& s, std::uint64_t now_ns,
                                                     const BuildInfo& build, const Exposure& exposure = {});

class StateCollector : public prometheus::Collectable {
 public:
  explicit StateCollector(SnapshotSource source, Clock clock = realtime_ns, BuildInfo build = this_build(),
                          Exposure exposure = {});

  // A collector over the daemon's segment `name` (state::segment_path; a read-only StateReader mapping).
  static std::shared_ptr<StateCollector> for_segment(const std::string& name, Exposure exposure = {});

  std::vector<prometheus::MetricFamily> Collect() const override;
  [[nodiscard]] Health health() const;

 private:
  SnapshotSource source_;
  Clock clock_;
  BuildInfo build_;
  Exposure exposure_;
};

}  // namespace vlake::exporter
