// vlake_bench_replay: replays a recorded allocation trace (bench/traces/*.trace, format in
// docs/benchmarks.md) through cuMemAlloc_v2 / cuMemFree_v2, so that under LD_PRELOAD of the
// hook the pool serves it, and reports per-call latency and the replay's own peak.
//
// Output (stdout, one JSON object):
//   {"bench":"replay","label","trace","events","allocs","frees","failed_allocs",
//    "alloc":S,"free":S,"peak_bytes","peak_granted_bytes","granularity","duration_s"}
// peak_bytes: highest sum of live requested bytes; peak_granted_bytes: the same with every
// allocation rounded up to `granularity` (what a pool of 2 MiB chunks must hold for it).
// Blocks the trace leaves live are freed at the end (not timed).
//
// Errors: parse() throws std::invalid_argument; run() throws std::runtime_error for an
// unreadable or malformed trace (file:line) or a driver failure other than out-of-memory
// (out-of-memory allocations are counted in failed_allocs and their frees skipped).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::bench {

struct TraceEvent {
  std::uint64_t dt_us;  // since the previous event
  bool alloc;
  std::uint64_t id;
  std::uint64_t bytes;  // alloc only
};

// Reads a trace file; throws std::runtime_error("<path>:<line>: ...") on a malformed line.
std::vector<TraceEvent> read_trace(const std::string& path);

struct ReplayOptions {
  std::string trace;
  std::string driver = "libcuda.so.1";
  DeviceOrdinal device{0};
  double pace = 0;                // 0: back to back; 1: the recorded timing; 0.5: twice as fast
  std::uint64_t scale_div = 1;    // bytes / scale_div (at least 1 byte)
  std::uint64_t max_events = 0;   // 0: all
  std::uint64_t start_at_ms = 0;  // wall-clock start (epoch ms), to start several replays together
  Bytes granularity{2ULL << 20};
  std::string label = "run";
};

class ReplayBench {
 public:
  static ReplayOptions parse(const std::vector<std::string>& args);
  static const char* usage() noexcept;
  explicit ReplayBench(ReplayOptions o) : o_(std::move(o)) {}
  std::string run();

 private:
  ReplayOptions o_;
};

int replay_main(int argc, char** argv);

}  // namespace vlake::bench
