// vlake::pool settings of a Node: what vlaked's options decide (NodeSettings) and the small
// functions it asks the system through (NodeEnv, faked in tests).
//
// Plain values; no thread-safety of their own. NodeEnv's functions are called on the event loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/pool/core/outcomes.hpp"
#include "vlake/pool/device_pool.hpp"

namespace vlake::pool {

namespace st = vlake::state;

// Bounds (docs/daemon.md, "Limits"): every table is fixed (state.hpp). A tenant holds at most
// max_sessions_per_tenant sessions and max_grants_per_tenant grants; at a cap, and when a table
// is full, the Hello is answered Fatal{limit_reached, "<which>: <n> of <max> …"} and a grant
// Refused with status limit_reached (GrantReply used/limit then carry the grant count and the
// cap), each counted under its reason (Counters layout 6). GuardEvents are checked against the
// sender's grants and rate-limited per tenant; log lines a tenant can trigger go through
// Node::log_limiter() (Counters::log_suppressed).
// What a CUDA context is charged before anything was measured (an H100 context: ~518 MiB).
inline constexpr Bytes kDefaultContextMemory{512ull << 20};

struct NodeSettings {
  Bytes bulk_size{64ull << 20};  // --bulk-size
  Bytes warm_reserve{0};         // --warm-reserve, per GPU
  Bytes warm_stock{0};           // --warm-stock, per GPU (warm_stock.hpp)
  // Warm reserve and stock builds: false: inline, bounded, in tick() (tests); true: queued for
  // take_builds() (vlaked's HandleBuilder workers), also right after a grant that used the
  // stock or needed a new handle; the results come back through adopt()/build_failed().
  bool background_builds = false;
  std::chrono::milliseconds pressure_wait{500};  // --pressure-wait-ms (0: never park)
  // Claims and measurements (docs/pool.md, "Pressure protocol"): a session sent Pressure has
  // reclaim_deadline to give something back; one that gave nothing is not asked again for
  // reclaim_skip (--reclaim-deadline, --reclaim-skip). A parked grant still short
  // reclaim_deadline after its last asks asks the others. Both > 0.
  std::chrono::milliseconds reclaim_deadline{250};
  std::chrono::milliseconds reclaim_skip{60000};
  // Counted grants are measured (docs/swap.md): one not in NVML's figure of its process this
  // long after it was served is revoked (--counted-realize; 0: never), and a session that had
  // one revoked makes nobody move out for counted_skip.
  std::chrono::milliseconds counted_realize{5000};
  std::chrono::milliseconds counted_skip{60000};
  // Swapping idle processes of overcommit namespaces to host memory (docs/swap.md): a process is
  // idle after this long without a CUDA call or request (--swap-idle; 0: never swap), and the
  // GPU keeps this much free beyond what a grant or a restore needs (--swap-margin).
  std::chrono::milliseconds swap_idle{30000};
  Bytes swap_margin{256ull << 20};
  // The host tier (docs/swap.md, "Host tier"): pinned host memory made ahead, up to this bound
  // for the node (--host-tier; 0: off), in pieces of --host-tier-piece.
  Bytes host_tier{0};
  Bytes host_tier_piece{1ull << 30};
  std::chrono::milliseconds canary_interval{10000};  // --canary-interval-ms (0: at release only)
  std::uint32_t daemon_pid = 0;                      // never attributed non-pool usage
  // --handle-reuse: true (`tenant`, the default): a handle whose descriptor went to a tenant is
  // bound to it and never served to another tenant (docs/pool.md, "Handle binding"); false
  // (`node`): freed handles serve any tenant after a scrub (a tenant that keeps a descriptor can
  // read and write the memory's next owner's data).
  bool bind_handles = true;
  // Idle release (docs/pool.md): free handles free for this long go back to the driver, except
  // the clean ones the warm reserve and stock want, down to pool_keep unbound free bytes per GPU
  // (bound ones all go). 0: off (the daemon's default is 30 s: --pool-idle-release).
  std::chrono::milliseconds pool_idle_release{0};
  Bytes pool_keep{0};  // --pool-keep, per GPU
  // Caps against hostile tenants (docs/daemon.md, "Limits"). A tenant at a cap is refused with
  // Status::limit_reached; other tenants are unaffected.
  std::uint32_t max_sessions_per_tenant = 128;  // --max-sessions-per-tenant (of kMaxSessions 1024)
  std::uint32_t max_grants_per_tenant = 2048;   // --max-grants-per-tenant (of kMaxGrants 16384)
  // Grants of one tenant parked at once (waiting for memory); one more that would park is
  // refused limit_reached (docs/daemon.md, "Limits").
  std::uint32_t max_parked_per_tenant = 32;  // --max-parked-per-tenant
  double guard_event_rate = 10;              // --guard-event-rate: GuardEvents per second per tenant
  double guard_event_burst = 20;             // --guard-event-burst
  // CUDA contexts (docs/quota.md, "Contexts"): what each admitted context is charged. A size:
  // that, always (--context-memory SIZE); nullopt: measured per GPU (context_book.hpp), and
  // context_fallback until something was measured (--context-memory auto, the default).
  std::optional<Bytes> context_memory;
  Bytes context_fallback{kDefaultContextMemory};
  double log_rate = 5;  // lines per second per tenant-triggered log site and key
  double log_burst = 20;
};

// Device memory NVML charges to no process ("unlisted": a process that creates memory without
// a CUDA context is not in NVML's process list, docs/daemon.md) is attributed only above this:
// below it, rounding and the driver's own bookkeeping are not worth charging anyone for.
inline constexpr Bytes kUnlistedTolerance{64ull << 20};

// Effects the Node needs from the system, as small functions (tests pass fakes).
struct NodeEnv {
  // Supplementary groups of a uid (with its primary gid), for the quota's group rules.
  std::function<std::vector<gid_t>(uid_t, gid_t)> groups;
  // The time, for timestamps of records written outside a timed operation (a canary alarm at
  // a release). Unset: 0.
  std::function<Now()> clock;
  // Which other processes hold the daemon's exported descriptors (holder_scan.hpp: /proc and
  // kcmp). A retired handle's descriptor stays open, and its bytes charged as retained, until
  // this finds no holder. Unset: retired descriptors are closed at once (no scan).
  HolderScan holders;
};
}  // namespace vlake::pool
