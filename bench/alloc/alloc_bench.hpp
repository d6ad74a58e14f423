// vlake_bench_alloc: latency of cuMemAlloc_v2 / cuMemFree_v2 per size (docs/benchmarks.md).
//
// One process (default) or K processes (--tenants K) forked before any CUDA call, each with its
// own primary context, running the same loop in step: before each size every process waits at
// a shared-memory barrier. Each timed iteration is alloc, free (steady_clock around each call);
// `warmup` untimed pairs per size come first (so under the hook the timed loop is the warm path
// unless VLAKE_RESERVE=0). Prints one JSON object on stdout (`run()` returns it):
//
//   {"bench":"alloc","label":...,"tenants":K,"iterations":N,"warmup":W,"sim_counts":bool,
//    "sizes":[{"size":"2MiB","bytes":2097152,"alloc":S,"free":S,"pair":S,
//              "vmm_calls_per_pair":x|null}, ...],          // pooled over the K processes
//    "processes":[{"pid":p,"sizes":[...same per process...]}, ...]}
//   S = {"n","p50_us","p99_us","mean_us","min_us","max_us"}
//
// vmm_calls_per_pair comes from the simulator's vlake_sim_vmm_call_count (null on a real GPU).
// Errors: AllocBench::parse throws std::invalid_argument for bad options; run() throws
// std::runtime_error when the driver or an allocation fails (message names the call and size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::bench {

struct AllocOptions {
  std::string driver = "libcuda.so.1";
  DeviceOrdinal device{0};
  std::vector<Bytes> sizes;  // default 2MiB, 20MiB, 256MiB, 1GiB
  int iterations = 200;
  int warmup = 1;
  int tenants = 1;
  std::string label = "run";
};

class AllocBench {
 public:
  // argv without the program name. --help: returns nullopt-like empty label "help".
  static AllocOptions parse(const std::vector<std::string>& args);
  static const char* usage() noexcept;

  explicit AllocBench(AllocOptions o) : o_(std::move(o)) {}
  // Runs the benchmark and returns the JSON text.
  std::string run();

 private:
  AllocOptions o_;
};

// main(): parse, run, print; exit 0, 1 (run failed), 2 (bad options).
int alloc_main(int argc, char** argv);

}  // namespace vlake::bench
