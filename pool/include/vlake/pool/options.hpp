// vlake::pool::DaemonOptions — vlaked's command line.
//
// Contract: parse() returns the options, or throws OptionsError with a one-line message naming
// the offending option; `--help` sets `help` (the caller prints usage() and exits 0). Every
// option takes one value, as `--opt VALUE` or `--opt=VALUE`. Pure; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "vlake/common/log.hpp"

namespace vlake::pool {

class OptionsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DaemonOptions {
  std::string config = "/etc/vlake/vlake.yaml";  // missing file: built-in default (100%)
  std::string socket = "/run/vlake/vlaked.sock";
  std::string state = "vlake-state";  // POSIX shm name, /dev/shm/<state>
  std::string driver = "libcuda.so.1";
  std::string nvml = "libnvidia-ml.so.1";  // "" or "none": no NVML
  LogLevel log_level = LogLevel::info;
  std::chrono::milliseconds sample_interval{1000};
  std::chrono::milliseconds canary_interval{10000};  // canary sweep period; 0: only at release
  unsigned state_mode = 0600;                        // who may read the state (vlakectl)
  long state_gid = -1;                               // group of the state segment; -1: unchanged
  std::string metrics_address = "127.0.0.1:19400";   // exporter [HOST]:PORT (default loopback only: metrics name
                                                     // tenants); "" (--metrics-address none): off.
                                                     // Port 19400: outside the exporters' 9100-9999
                                                     // (docs/metrics.md, "Port")
  bool metrics_process_series = false;  // --metrics-process-series on: per-process series (pids; docs/metrics.md)
  bool metrics_address_given = false;   // explicit --metrics-address: failing to listen is fatal
                                        // (the default only warns: see docs/metrics.md)
  // Pool performance (docs/pool.md).
  std::uint64_t bulk_size = 64ull << 20;         // --bulk-size: bulk handle size class
  std::uint64_t warm_reserve = 0;                // --warm-reserve: per GPU, created at start-up
  std::uint64_t warm_stock = 0;                  // --warm-stock: per GPU, sizes in demand (warm_stock.hpp)
  std::chrono::milliseconds pressure_wait{500};  // --pressure-wait-ms: parked grant's longest wait
  // Claims and measurements (docs/pool.md, "Pressure protocol"): --reclaim-deadline DURATION (a
  // session sent Pressure gives something back within it, or loses its turn) and
  // --reclaim-skip DURATION (for how long).
  std::chrono::milliseconds reclaim_deadline{250};
  std::chrono::milliseconds reclaim_skip{60'000};
  // --pool-idle-release DURATION|off: free pool memory idle this long goes back to the driver
  // (0: off); --pool-keep SIZE: unbound free bytes kept per GPU (counting the warm reserve and stock).
  std::chrono::milliseconds pool_idle_release{30'000};
  std::uint64_t pool_keep = 0;
  // Swapping idle processes of overcommit namespaces to host memory (docs/swap.md):
  // --swap-idle DURATION|off (idle this long: may be swapped out; 0: never), --swap-margin SIZE.
  std::chrono::milliseconds swap_idle{30'000};
  // --counted-realize DURATION|off: a counted grant NVML does not show in its process's figure
  // this long after it was served is revoked (docs/swap.md; at least two sampling periods).
  std::chrono::milliseconds counted_realize{5'000};
  std::uint64_t swap_margin = 256ull << 20;
  // --host-tier SIZE (0: off), --host-tier-piece SIZE: the host tier (docs/swap.md, "Host tier").
  std::uint64_t host_tier = 0;
  std::uint64_t host_tier_piece = 1ull << 30;
  // --context-memory auto|SIZE (docs/quota.md, "Contexts"): what each CUDA context a hooked
  // process creates is charged before NVML shows it. nullopt (auto): vlaked's own context on each
  // GPU as NVML shows it (never a tenant's reading); without NVML, contexts are not charged.
  std::optional<std::uint64_t> context_memory;
  // --handle-reuse tenant (true, default) | node (false): docs/pool.md, "Handle binding".
  bool bind_handles = true;
  std::string alloc_root;  // Kubernetes allocation directories (docs/device-plugin.md); "": off
  // Limits against hostile tenants (docs/daemon.md, "Limits").
  std::uint32_t max_sessions_per_tenant = 128;     // of the 1,024-session table
  std::uint32_t max_grants_per_tenant = 2048;      // of the 16,384-grant table
  std::uint32_t max_parked_per_tenant = 32;        // grants waiting for memory at once
  std::uint32_t max_connections_per_uid = 256;     // per uid (per allocation on its socket)
  std::uint32_t max_unauthenticated = 512;         // connections awaiting Hello, in all
  std::uint32_t max_unauthenticated_per_uid = 64;  // connections awaiting Hello, per uid
  std::chrono::milliseconds hello_timeout{5000};   // a connection's Hello must come within this
  std::uint32_t guard_event_rate = 10;             // GuardEvents per second per tenant
  std::uint32_t guard_event_burst = 20;            // GuardEvents in a row per tenant
  bool help = false;

  static DaemonOptions parse(int argc, const char* const* argv);
  static std::string usage();
  [[nodiscard]] std::string lock_path() const { return socket + ".lock"; }
};

}  // namespace vlake::pool
