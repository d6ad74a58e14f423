// vlake_bench_poolwatch: samples vlaked's state segment (read-only) while benchmarks run and
// reports the pool's peak and the daemon's message counters.
//
//   vlake_bench_poolwatch --state NAME [--interval-ms 20] [--duration-ms N | --once]
//
// Runs until SIGTERM/SIGINT (or --duration-ms), then prints one JSON object:
//   {"samples":n,"counters":{"requests","grants","releases"},
//    "devices":[{"ordinal","pool_bytes","pool_bytes_max","granted_bytes_max",
//                "pool_peak_bytes"}]}
// pool_bytes_max / granted_bytes_max: the highest values sampled; pool_peak_bytes: the
// daemon's own high-water mark (DeviceRecord.pool_peak_bytes, layout 5).
// Errors: exit 2 for bad options, 1 when the segment cannot be read (message on stderr).
#pragma once

#include <string>
#include <vector>

namespace vlake::bench {

int poolwatch_main(int argc, char** argv);

}  // namespace vlake::bench
