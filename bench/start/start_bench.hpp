// vlake_bench_start: how long many processes take to start on one GPU (docs/benchmarks.md,
// "Cold start").
//
// The parent spawns `--processes` copies of its own executable (posix_spawn of /proc/self/exe,
// environment inherited: under LD_PRELOAD=libvlake-hook.so every child loads the hook and opens
// its session with vlaked) as fast as it can. Each child dlopens the driver, initializes CUDA
// (cuInit, primary context), allocates `--bytes` (default 64 MiB), sets them with cuMemsetD8_v2
// and synchronizes, then reports "ready" on a pipe and waits, holding its memory, until every
// child is ready (so all of them are alive at once, as a node's pods are). The time runs from the
// first spawn to the last ready report. Prints one JSON line:
//   {"bench":"start","processes":N,"bytes":B,"ready_s":s,"first_s":s,"median_s":s,
//    "teardown_s":s,"failed":0,"value":ready_s,"unit":"s","label":...}
// Errors: parse throws std::invalid_argument; run() throws std::runtime_error when a child
// fails (its own message is on stderr) or not every child is ready within --timeout-s (120);
// every child is killed and reaped before run() returns or throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::bench {

struct StartOptions {
  std::string driver = "libcuda.so.1";
  int processes = 32;
  Bytes bytes{64ULL << 20};
  int timeout_s = 120;
  bool child = false;  // internal: this process is one of the spawned children
  std::string label = "run";
};

class StartBench {
 public:
  static StartOptions parse(const std::vector<std::string>& args);
  static const char* usage() noexcept;

  explicit StartBench(StartOptions o) : o_(std::move(o)) {}
  std::string run();

 private:
  StartOptions o_;
};

int start_main(int argc, char** argv);

}  // namespace vlake::bench
