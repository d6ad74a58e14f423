// vlake_bench_launch: kernel launches per second through the driver API (docs/benchmarks.md,
// "Launches").
//
// One context, one module (vlake's own PTX, JIT-compiled by the driver; the simulator runs the
// same entry on the host) and one non-blocking stream. The kernel is `vlake_fill_u32` with
// n = 0: one block of 32 threads that return at once, so a launch costs what the launch path
// costs (the driver, and under LD_PRELOAD=libvlake-hook.so the hook's pass-through and swap
// gate). Two measurements, each after an untimed warm-up (1000 launches, 10 graph replays: a
// worker of a pair sits idle while the other side measures):
//   loop N     N cuLaunchKernel calls back to back, then cuStreamSynchronize: launches/s
//   graph N G  a graph of G kernel nodes captured once from the stream (cached per G), then
//              ceil(N / G) cuGraphLaunch calls and one synchronize: kernel nodes per second
// Each measurement prints one JSON line:
//   {"bench":"launch","op":"loop"|"graph","launches":n,"graph_nodes":G,"ns":t,"value":n/s,
//    "unit":"launches/s","label":...}
// One-shot (`--op loop|graph`) or `--serve`: prints {"ready":true,...} once the context and the
// module are up, then answers each line read from stdin ("loop N", "graph N G"; "quit" or end
// of input ends) with one JSON line; a failed measurement answers {"error":"..."} and the
// worker goes on. Errors: parse throws std::invalid_argument; run() throws std::runtime_error
// naming the driver call.
#pragma once

#include <string>
#include <vector>

namespace vlake::bench {

struct LaunchOptions {
  std::string driver = "libcuda.so.1";
  std::string op = "loop";  // loop | graph
  long launches = 20000;
  int graph_nodes = 100;
  bool serve = false;
  std::string label = "run";
};

class LaunchBench {
 public:
  static LaunchOptions parse(const std::vector<std::string>& args);
  static const char* usage() noexcept;

  explicit LaunchBench(LaunchOptions o) : o_(std::move(o)) {}
  // One-shot: the measurement's JSON. --serve: serves stdin, then returns {"done":true}.
  std::string run();

 private:
  LaunchOptions o_;
};

int launch_main(int argc, char** argv);

}  // namespace vlake::bench
