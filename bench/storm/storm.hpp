// vlake_bench_storm: many tenants missing the local reserve at once (docs/benchmarks.md, "Storm").
//
// The parent starts K tenant processes (--tenants, default 64; as root each runs under its own
// uid, --uid-base + i, so that each is its own tenant under the default quota rule) of T threads
// each (--threads, default 4). Every tenant loads the hook (--hook: LD_PRELOAD, VLAKE_RESERVE=0:
// every allocation and free reaches vlaked) and each thread allocates and frees random sizes
// (seeded; --min-size..--max-size in 2 MiB steps) through cuMemAlloc_v2/cuMemFree_v2, keeping
// at most --hold allocations live and pausing a random 0..2×--think-us between calls, until
// --duration-ms has passed. At --stop-at-ms one tenant (--stop-tenant, default K/2) gets
// SIGSTOP; --stop-ms later it gets SIGCONT (or SIGKILL with --stop-end kill). On the simulator
// the stop lands outside the simulator's machine lock (a stop on a GPU never holds a driver
// lock; see stop_outside_driver in storm.cpp): "stop_retries" counts the stops taken again.
//
// Output: one JSON line on stdout:
//   {"bench":"storm","label","tenants","threads","distinct_uids","duration_ms","seed",
//    "stopped":{"tenant","stop_retries","stop_at_ms","stop_ms","end"},
//    "client":{"ops","errors","alloc":{"all":S,"before":S,"during":S,"after":S},"free":{...}},
//    "daemon":{"all":H,"before":H,"during":H,"after":H,"max_us"} | null,
//    "finished":bool}
//   S = {"n","p50_us","p99_us","mean_us","min_us","max_us"} (bench_support's Summary)
//   H = {"n","p50_us","p99_us","mean_us"} from the daemon's grant-latency histogram (state
//       segment, --state), differences between snapshots taken at the phase boundaries
// A phase holds the calls that started in it: before the stop, while the tenant is stopped, after.
// The phases' client figures leave the stopped tenant out ("all" has everyone). `finished` is
// false when a tenant did not end within --duration-ms + 60 s (it is killed): a stall.
//
// Errors: parse_storm() throws std::invalid_argument; run_storm() throws std::runtime_error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "vlake/common/strong_types.hpp"

namespace vlake::bench {

struct StormOptions {
  std::string driver = "libcuda.so.1";
  std::string hook;   // preloaded into the tenants; empty: they inherit this process's environment
  std::string state;  // vlaked's state segment name; empty: no daemon figures
  int tenants = 64;
  int threads = 4;
  std::uint64_t duration_ms = 10000;
  std::uint64_t stop_at_ms = 4000;  // 0: no tenant is stopped
  std::uint64_t stop_ms = 3000;
  bool stop_kill = false;  // --stop-end kill: SIGKILL instead of SIGCONT
  int stop_tenant = -1;    // -1: tenants / 2
  Bytes min_size{2ULL << 20};
  Bytes max_size{64ULL << 20};
  int hold = 2;
  std::uint32_t think_us = 1000;
  std::uint64_t seed = 1;
  long uid_base = 20000;  // as root, tenant i runs as uid uid_base + i (gid unchanged); -1: as this user
  std::string label = "storm";
  // Internal: a tenant process (set by the parent on the command line it execs).
  int child = -1;
  std::string out_dir;
};

StormOptions parse_storm(const std::vector<std::string>& args);
const char* storm_usage() noexcept;

// One timed call of a tenant thread.
struct StormSample {
  std::uint64_t start_ns;  // since the common start
  std::uint64_t latency_ns;
  std::uint32_t tenant;
  std::uint8_t op;  // kOpAlloc, kOpFree, kOpFailed (an allocation that failed)
  std::uint8_t pad[3];
};
inline constexpr std::uint8_t kOpAlloc = 0;
inline constexpr std::uint8_t kOpFree = 1;
inline constexpr std::uint8_t kOpFailed = 2;

// The phase of a call that started at `start_ns`: 0 before the stop, 1 during, 2 after. With no
// stop (stop_at_ms 0) everything is "before".
int storm_phase(std::uint64_t start_ns, const StormOptions& o) noexcept;

// A grant-latency histogram as the state segment keeps it (non-cumulative buckets, bounds
// vlake::state::kGrantLatencyBoundsNs, count including grants above the last bound).
struct LatencyHistogram {
  std::vector<std::uint64_t> buckets;
  std::uint64_t count = 0;
  std::uint64_t sum_ns = 0;
};
// b - a, bucket by bucket.
LatencyHistogram histogram_delta(const LatencyHistogram& b, const LatencyHistogram& a);
// The q-quantile (0 < q <= 1) in microseconds, interpolated linearly inside its bucket as
// Prometheus' histogram_quantile does (0 for an empty histogram; the last bound when the
// quantile lies above it).
double histogram_quantile_us(const LatencyHistogram& h, double q);

// main(): parse, run, print; exit 0, 1 (run failed or a tenant stalled), 2 (bad options).
int storm_main(int argc, char** argv);

}  // namespace vlake::bench
