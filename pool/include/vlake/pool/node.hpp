// vlake::pool::Node — vlaked's decisions, without I/O: tenants, sessions, grants, namespaces,
// accounting, the device pools, dedup, guards and parked grants of one node.
//
// What it does
//   The daemon's event loop decodes a message, calls one typed operation here and encodes
//   what comes back; watchers (quota file, Kubernetes allocation directories, process exits,
//   timers) call the matching operation. A Node has no socket, no file descriptor of its own
//   (the exported handle descriptors belong to its DevicePools), no clock (every operation
//   that needs time takes a `Now`) and never calls back into the loop. Identity is what the
//   loop observed (Peer: SO_PEERCRED, /proc, the socket a connection came through), never what
//   a message says.
//   - open_session(peer, hello): a new session, or the process's previous one re-bound.
//   - grant(conn, session, request, now) -> Granted | Refused | Parked | Malformed. A grant the
//     pool cannot serve is parked (Pressure to flagged sessions holding reserve) until memory
//     comes back (retry_parked) or its deadline passes (then out_of_memory).
//   - release, usage, reserve_report, guard_event, readonly_write, share_request/share_commit.
//   - ipc_export/ipc_open/ipc_close (node_ipc.cpp, docs/ipc.md): CUDA IPC of alloc grants. An
//     exported grant gets a token and a secret (getrandom); IpcOpen{token, secret} from a session
//     of the owner's tenant, or of a tenant whose namespace declares the owner's `ipc_domain`,
//     answers the grant's handles (one descriptor each) and an import id. An import counts
//     against the importer's grant cap. The memory stays charged to the owner: a grant released
//     (or whose session ended) while imports are open is held until the last import closes or
//     its importer's session ends; an imported grant's handles are then retired, never pooled.
//   - connection_closed / end_session (process exited): a session's grants return to the pool.
//   - validate/apply(config), config_rejected: the quota file; apply retargets every tenant.
//   - allocation_added/owner/removed: Kubernetes allocations, resolved through quota/.
//   - tick(now): warm reserve and stock, idle release of the free pools and the canary sweep;
//     set_nonpool: NVML's view of session pids; observe_gpus: NVML's view of every process
//     (memory outside vlake, docs/daemon.md), which answers the processes to kill under
//     `enforce: kill`.
//   - free_idle_tenants(): tenant records holding nothing are freed (see "Tenant records").
//
// Bounds (docs/daemon.md, "Limits"): every table is fixed (state.hpp). A tenant holds at most
//   settings.max_sessions_per_tenant sessions and max_grants_per_tenant grants; at a cap, and
//   when a table is full, the Hello is answered Fatal{limit_reached, "<which>: <n> of <max> …"}
//   and a grant Refused with status limit_reached (GrantReply used/limit then carry the grant
//   count and the cap), each counted under its reason (Counters layout 6). GuardEvents are
//   checked against the sender's grants and rate-limited per tenant; log lines a tenant can
//   trigger go through log_limiter() (Counters::log_suppressed).
// Tenant records: a tenant is freed (slot, id and name reusable, Counters::tenants_freed) as soon
//   as it has no session, no grant, no usage (granted, reserved, non-pool) and, for an
//   allocation's tenant, no live allocation: at session end, at allocation removal, after
//   resume (tenants of dead processes are not resurrected) and on free_idle_tenants().
//   - resume(old state): the accounting of a previous daemon (state segment), see docs/daemon.md.
//   What changed since the last publish is recorded (take_changes) so that one publisher
//   (publisher.hpp) writes exactly that to the state segment after each event.
//
// Ownership: the Node owns its tenants, sessions, grants (and their handles), namespaces,
//   pools and the dedup table; it borrows the Driver and the Logger (both must outlive it).
//   Descriptors in a Granted or ShareOut are borrowed: valid until the next call on the Node.
// Errors: operations answer bad input with Malformed (the loop drops the connection) or a
//   Status in the reply; they throw only on internal failures (std::exception), after which
//   the Node is still consistent. validate() throws quota::ConfigError.
// Thread-safety: none; one thread (the event loop) calls every method.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/allocation.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/pool/accounting.hpp"
#include "vlake/pool/device_pool.hpp"
#include "vlake/pool/nvml_source.hpp"
#include "vlake/pool/proc_identity.hpp"
#include "vlake/pool/warm_stock.hpp"
#include "vlake/quota/quota_config.hpp"

namespace vlake::pool {

class Dedup;
namespace st = vlake::state;

// The time an operation runs at (the loop reads its clocks once per event).
struct Now {
  std::chrono::steady_clock::time_point steady{};
  std::uint64_t unix_ns = 0;  // CLOCK_REALTIME, for records operators read
};

// The loop's name for a connection (never reused while the daemon runs); 0: none.
using ConnId = std::uint64_t;

// Who is on a connection, as the loop observed it.
struct Peer {
  ConnId conn = 0;
  std::uint32_t pid = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint64_t start_time = 0;  // /proc/<pid>/stat start time; 0: the process is gone
  std::string alloc_id;          // the Kubernetes allocation socket it came through; "": host socket
};

struct NodeSettings {
  Bytes bulk_size{64ull << 20};  // --bulk-size
  Bytes warm_reserve{0};         // --warm-reserve, per GPU
  Bytes warm_stock{0};           // --warm-stock, per GPU (warm_stock.hpp)
  // Warm reserve and stock builds: false: inline, bounded, in tick() (tests); true: queued for
  // take_builds() (vlaked's HandleBuilder workers), also right after a grant that used the
  // stock or needed a new handle; the results come back through adopt()/build_failed().
  bool background_builds = false;
  std::chrono::milliseconds pressure_wait{500};  // --pressure-wait-ms (0: never park)
  // Swapping idle processes of overcommit namespaces to host memory (docs/swap.md): a process is
  // idle after this long without a CUDA call or request (--swap-idle; 0: never swap), and the
  // GPU keeps this much free beyond what a grant or a restore needs (--swap-margin).
  std::chrono::milliseconds swap_idle{30000};
  Bytes swap_margin{256ull << 20};
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
  double guard_event_rate = 10;                 // --guard-event-rate: GuardEvents per second per tenant
  double guard_event_burst = 20;                // --guard-event-burst
  double log_rate = 5;                          // lines per second per tenant-triggered log site and key
  double log_burst = 20;
};

// Device memory NVML charges to no process ("unlisted": a process that creates memory without
// a CUDA context is not in NVML's process list, docs/daemon.md) is attributed only above this:
// below it, rounding and the driver's own bookkeeping are not worth charging anyone for.
inline constexpr Bytes kUnlistedTolerance{64ull << 20};

// A process to kill under `enforce: kill`: its tenant stayed over a limit for kill_grace while
// the process used GPU memory without a session. The loop kills (pid, start_time) only, and
// reports with Node::unhooked_killed().
struct KillOrder {
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  TenantId tenant;
  std::string tenant_name;
  Bytes bytes{0};  // its NVML figure, all GPUs
};

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

// ---- outcomes ------------------------------------------------------------------------------

// The message broke a rule that needs the node's state to see; the loop drops the connection.
struct Malformed {
  std::string reason;
};
// The request cannot be served and the connection ends: an Error(status, text), then close.
struct Fatal {
  proto::Status status = proto::Status::internal;
  std::string text;
};

struct HelloOut {
  std::variant<proto::HelloAck, Malformed, Fatal> answer;
  std::uint64_t session = 0;  // the session now bound to the connection
  bool opened = false;        // a new session (the loop starts watching its process)
  ConnId close = 0;           // the session's previous connection, to close
};

// A Pressure message for a session's connection.
struct PressureNote {
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::Pressure msg{};
};

// A handle the warm reserve or stock wants built (the loop hands it to its HandleBuilder).
struct BuildOut {
  DeviceOrdinal device{0};
  Bytes size{0};
};

// A clean handle the warm stock no longer wants, out of the pool: the loop has it released
// (HandleBuilder::discard), off the event loop.
struct DiscardOut {
  DeviceOrdinal device{0};
  BuiltHandle handle;
};

// A Drop for one session (docs/hook.md, "Kept mappings"): the loop sends `msg` on `conn`.
struct DropOut {
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::Drop msg{};
};

// Swapping idle processes to host memory (node_swap.cpp, docs/swap.md).
enum class SwapState : std::uint8_t {
  none,           // on the GPU
  notified,       // SwapNotice{out} sent; waiting for its SwapReady
  checkpointing,  // a SwapJob{out} runs (lock + checkpoint)
  swapped,        // on the host
  restoring,      // a SwapJob{restore} runs (restore + unlock)
  lost,           // the driver could not restore it: it never runs again (docs/swap.md)
};
const char* to_string(SwapState s) noexcept;
// A SwapNotice for a session's connection.
struct SwapNoticeOut {
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::SwapNotice msg{};
};
// Driver work for the loop's swap thread: checkpoint (lock + checkpoint) or restore (restore +
// unlock) process `pid`; the result comes back through Node::swap_done().
struct SwapJob {
  std::uint64_t session = 0;
  std::uint32_t pid = 0;
  DeviceOrdinal device{0};  // where the memory it makes or needs room on is
  bool restore = false;
};
// A SwapIn's answer, for the connection that asked.
struct SwapInOut {
  ConnId conn = 0;
  proto::SwapInReply reply{};
};
struct Granted {
  proto::GrantReply reply{};
  std::vector<int> fds;  // borrowed, one per handle, in reply order
  std::uint64_t grant = 0;
};
struct Refused {
  proto::GrantReply reply{};  // status says why (over_limit, namespace_over_limit, guarantee,
                              // out_of_memory, unknown_device, internal, limit_reached: the
                              // tenant's grant cap or the grant table, used/limit = grants/cap)
};
struct Parked {
  std::vector<PressureNote> pressure;  // to send now (empty when a retried grant stays parked)
};
using GrantOut = std::variant<Granted, Refused, Parked, Malformed>;

// A parked grant's answer, for the connection that asked.
struct Completion {
  ConnId conn = 0;
  std::chrono::steady_clock::time_point received{};
  GrantOut out;
};

struct ShareOut {
  proto::ShareReply reply{};
  std::vector<int> fds;  // borrowed
};

// A Kubernetes allocation (docs/device-plugin.md) as the loop read it from its directory.
struct AllocationInfo {
  std::string id;
  DeviceOrdinal device{0};
  Bytes bytes{0};
  std::optional<alloc::Owner> owner;
};

// What changed since the last take_changes(): what the publisher writes.
struct Changes {
  bool all = false;                    // everything (start-up, resume, reload, tick)
  std::set<std::uint32_t> tenants;     // tenant slots
  std::set<std::uint32_t> sessions;    // session slots (free slots are cleared)
  std::set<std::uint32_t> grants;      // grant slots (free slots are cleared)
  std::set<std::uint32_t> namespaces;  // namespace slots (free slots are cleared)
  bool devices = false;
  bool guard = false;     // the guard event log
  bool refusals = false;  // the refusal log
  [[nodiscard]] bool empty() const noexcept {
    return !all && !devices && !guard && !refusals && tenants.empty() && sessions.empty() && grants.empty() &&
           namespaces.empty();
  }
};

class Node {
 public:
  struct Tenant {
    TenantId id;
    std::uint32_t slot = 0;
    std::string name;
    quota::Limit limit = quota::Limit::bytes(Bytes{0});
    NamespaceId ns{0};
    bool have_ids = false;  // uid/gid known (created by a session of this daemon)
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    quota::GuardMode guard = quota::GuardMode::off;
    quota::DedupMode dedup = quota::DedupMode::off;
    std::string dedup_domain;  // its namespace's dedup trust domain; "": shares only with itself
    std::string ipc_domain;    // its namespace's CUDA IPC domain (docs/ipc.md); "": only itself
    std::string alloc_id;      // a Kubernetes allocation's tenant; "": a uid/gid tenant
    double guard_tokens = -1;  // GuardEvent token bucket (-1: full, not yet used)
    std::chrono::steady_clock::time_point guard_last{};
    // Memory outside vlake (docs/quota.md): its namespace's policy, and the latest NVML figure of
    // its processes without a session (per GPU, and the processes).
    quota::Enforce enforce = quota::Enforce::refuse;
    std::chrono::milliseconds kill_grace = quota::kDefaultKillGrace;
    bool allow_disable = false;
    bool overcommit = false;            // its processes allocate their own memory and may be swapped out
    std::chrono::milliseconds wait{0};  // its namespace's `wait` for memory
    std::array<std::uint64_t, st::kMaxDevices> unhooked{};
    struct UnhookedProcess {
      std::uint32_t pid = 0;
      std::uint64_t start_time = 0;
      Bytes bytes{0};
    };
    std::vector<UnhookedProcess> unhooked_procs;
    // Under `enforce: kill`: since when it has been over a limit with unhooked processes.
    std::optional<std::chrono::steady_clock::time_point> over_since;
    std::array<std::uint32_t, 4> kernel_faults{};              // by st::FaultAttributes bits (docs/guard.md)
    std::array<std::uint64_t, st::kRefusalReasons> denials{};  // by st::RefusalReason - 1
  };
  struct Namespace {
    NamespaceId id;
    std::uint32_t slot = 0;
    quota::NamespaceSpec spec;
  };
  struct Session {
    std::uint64_t id = 0;
    std::uint32_t slot = 0;
    std::uint32_t pid = 0;
    std::uint64_t start_time = 0;
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    TenantId tenant;
    ConnId conn = 0;  // 0: detached
    std::vector<std::uint64_t> grants;
    std::string alloc_id;                                  // opened through that allocation's socket
    bool pressure = false;                                 // its latest Hello set kHelloPressure
    proto::GuardMode guard = proto::GuardMode::off;        // the mode its latest HelloAck gave
    std::array<std::uint64_t, st::kMaxDevices> reserve{};  // last ReserveReport per GPU
    bool reclaim = false;  // its last ReserveReport said kReportReclaim (a framework gives back its cache)
    // Its last GrantRequest, its Hello, or a ReserveReport saying kReportActive (a CUDA call).
    std::chrono::steady_clock::time_point last_active{};
    std::optional<std::chrono::milliseconds> wait;  // its Hello's own wait (kHelloWait)
    // Swapping to host memory (node_swap.cpp, docs/swap.md).
    SwapState swap = SwapState::none;
    std::uint64_t swap_id = 0;
    DeviceOrdinal swap_device{0};
    Bytes swap_bytes{0};  // estimate while going out; what its checkpoint freed once out
    // While restoring: what the restore takes back (its counted grants and its context).
    Bytes swap_extra{0};
    Bytes swap_context{0};                               // its tenant's non-pool bytes (NVML) when it was chosen
    std::chrono::steady_clock::time_point swap_since{};  // when the current state began
    ConnId swap_in_conn = 0;                             // a SwapIn waits for its answer (0: none)
    std::uint64_t swap_in_request = 0;
    std::chrono::steady_clock::time_point swap_in_at{};
    // Not chosen again before this: it did not get ready in time, or its checkpoint failed.
    std::chrono::steady_clock::time_point swap_skip_until{};
    std::uint64_t swap_for = 0;  // being swapped out to make room for this session (0: none)
    std::uint32_t swap_outs = 0;
    std::uint32_t swap_ins = 0;
  };
  struct Grant {
    std::uint64_t id = 0;
    std::uint32_t slot = 0;
    std::uint64_t session = 0;
    TenantId tenant;
    DeviceOrdinal device{0};
    Bytes bytes{0};
    proto::GrantPurpose purpose = proto::GrantPurpose::alloc;
    bool orphaned = false;  // its handles died with a previous daemon
    std::vector<std::unique_ptr<PoolHandle>> handles;
    std::uint32_t handle_count = 0;  // handles the tenant mapped (kept when orphaned)
    std::uint64_t requested = 0;     // GrantRequest::bytes
    std::uint64_t created_unix_ns = 0;
    bool canary = false;  // its slack holds the canary pattern (docs/guard.md)
    // CUDA IPC (node_ipc.cpp): token and secret once exported (0: never), open imports, whether
    // it was ever imported (its handles are then retired at the end, never pooled), and whether
    // its owner released it (held for its imports; no longer in its session's list).
    std::uint64_t ipc_token = 0;
    std::uint64_t ipc_secret = 0;
    std::uint32_t imports = 0;
    bool ipc_imported = false;
    bool released = false;
  };
  // An open IPC import: `session` (of `tenant`) maps grant `grant` (docs/ipc.md).
  struct Import {
    std::uint64_t id = 0;
    std::uint64_t session = 0;
    TenantId tenant;
    std::uint64_t grant = 0;
  };
  struct Device {
    DeviceOrdinal ordinal{0};
    Uuid uuid{};
    Bytes total{0};
    Bytes granularity{0};
    std::unique_ptr<DevicePool> pool;
    Bytes granted{0};                     // grants with handles
    Bytes orphaned{0};                    // grants whose handles died with a previous daemon
    Bytes counted{0};                     // `counted` grants
    std::uint64_t pool_peak = 0;          // highest pool bytes ever published (across restarts)
    Bytes nvml_used{0};                   // NVML's used memory at the latest sample (0: none)
    Bytes unlisted{0};                    // of it, charged to no process NVML lists (observe_gpus)
    std::uint64_t retired_held_seen = 0;  // pool->retired_held() already in the counters
    // A previous daemon's idle_released_bytes (resume).
    std::uint64_t idle_released_base = 0;
    std::unique_ptr<WarmStock> stock;                             // warm reserve and stock (warm_stock.hpp)
    WarmStock::Counts building;                                   // queued builds by size (background_builds)
    std::chrono::steady_clock::time_point builds_paused_until{};  // a build found no room
  };

  // Opens a pool on every GPU of `driver` (throws std::runtime_error: none, or too many).
  Node(Driver& driver, const Logger& log, NodeSettings settings, NodeEnv env);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // ---- start-up
  // Creates one handle per GPU and, with a warm reserve, fills it (throws on failure).
  void warm_up();
  // Takes a previous daemon's accounting: tenants keep their ids, sessions in `alive` (by id)
  // are kept detached with their grants (orphaned: their handles died with that daemon), the
  // rest is dropped. Counters, the guard log, ids and the config generation carry on. Returns
  // the kept session ids.
  std::vector<std::uint64_t> resume(const st::State& old, const std::set<std::uint64_t>& alive);

  // ---- sessions
  HelloOut open_session(const Peer& peer, const proto::Hello& m);
  // The connection closed. The process lives on (`exited` false): its session is detached
  // and keeps its grants; otherwise the session ends.
  void connection_closed(ConnId conn, std::uint64_t session, bool exited);
  // The session's process exited: its grants return. Returns its connection (0: none) to close.
  ConnId end_session(std::uint64_t session, const char* why);

  // A well-formed message arrived / a connection was dropped for a malformed one (counters).
  void count_request() noexcept { ++counters_.requests; }
  void count_malformed() noexcept { ++counters_.malformed; }
  // Connections the loop closed for a cap (docs/daemon.md, "Limits"): over a uid's connection
  // cap (or no descriptor left), or awaiting Hello (over the caps, or past the Hello timeout).
  void count_connection_cap() noexcept { ++counters_.denials_connection_cap; }
  void count_unauthenticated() noexcept { ++counters_.denials_unauthenticated; }
  // The rate limiter for log lines a tenant or peer can trigger (counts Counters::log_suppressed).
  LogLimiter& log_limiter() noexcept { return limited_; }
  // Sessions and grants a tenant holds now (what the caps count).
  [[nodiscard]] std::size_t sessions_of(TenantId t) const;
  [[nodiscard]] std::size_t grants_of(TenantId t) const;

  // ---- requests of a bound session (`session` is the connection's)
  GrantOut grant(ConnId conn, std::uint64_t session, const proto::GrantRequest& m, Now now);
  // The reply of a Granted could not be delivered: the grant is undone.
  void undo_grant(std::uint64_t grant);
  // Receive-to-reply-sent time of a delivered grant (the grant-latency histogram).
  void record_grant_latency(std::chrono::nanoseconds d);
  std::variant<proto::ReleaseAck, Malformed> release(std::uint64_t session, const proto::Release& m);
  std::variant<proto::UsageReply, Malformed> usage(std::uint64_t session, const proto::UsageQuery& m);
  // Kept mappings (docs/hook.md): the session unmapped and closed these kept handles.
  std::optional<Malformed> dropped(std::uint64_t session, const proto::Dropped& m);
  // The Drop messages to send after this event (kept handles retired or handed elsewhere),
  // grouped per session, at most kMaxDropKeys keys each; detached sessions are skipped (their
  // process drops everything when it reconnects).
  std::vector<DropOut> take_drops();
  // Warm reserve and stock (settings.background_builds): the handles to build since the last
  // call; each comes back as adopt() (built, zeroed) or build_failed() (no_room: the GPU lacked
  // room; builds for that GPU pause for a second).
  std::vector<BuildOut> take_builds() { return std::exchange(builds_, {}); }
  // Surplus clean handles to release (background_builds; inline otherwise).
  std::vector<DiscardOut> take_discards() { return std::exchange(discards_, {}); }
  void adopt(DeviceOrdinal device, BuiltHandle h);
  void build_failed(DeviceOrdinal device, Bytes size, bool no_room);
  // Keys sent in Drop messages since start.
  [[nodiscard]] std::uint64_t kept_drops() const noexcept { return kept_drops_; }
  std::optional<Malformed> reserve_report(std::uint64_t session, const proto::ReserveReport& m);
  // ---- swapping idle processes to host memory (node_swap.cpp, docs/swap.md)
  // The session's hooked calls now wait: its checkpoint is queued (take_swap_jobs()). A
  // SwapReady for another swap id, or in another state, is ignored.
  std::optional<Malformed> swap_ready(std::uint64_t session, const proto::SwapReady& m);
  // Answers now, or nullopt: the answer comes later from take_swap_replies().
  std::optional<proto::SwapInReply> swap_in(ConnId conn, std::uint64_t session, const proto::SwapIn& m, Now now);
  // A SwapJob finished: `bytes` is what the checkpoint freed (0 unknown) or, for a restore,
  // unused; `error` is the driver's message when !ok.
  void swap_done(const SwapJob& job, bool ok, Bytes bytes, std::chrono::nanoseconds took, const std::string& error,
                 Now now);
  // Restores waiting for room, notices nobody answered: called by the loop after every event.
  void swap_tick(Now now);
  std::vector<SwapNoticeOut> take_swap_notices() { return std::exchange(swap_notices_, {}); }
  std::vector<SwapJob> take_swap_jobs() { return std::exchange(swap_jobs_, {}); }
  std::vector<SwapInOut> take_swap_replies() { return std::exchange(swap_replies_, {}); }
  // Bytes of GPU `d`'s processes now on the host (what their checkpoints freed; restoring and
  // lost ones included). Swap counters are in counters() (swap_outs, swap_ins, ...).
  [[nodiscard]] Bytes swapped_bytes(DeviceOrdinal d) const;
  std::optional<Malformed> guard_event(std::uint64_t session, const proto::GuardEvent& m, Now now);
  // A copy or memset into a shared range of one of the session's grants was refused
  // (docs/guard.md): recorded as a readonly_write event; one naming no grant of the session
  // with shared chunks on that GPU is rejected (counted), over the tenant's rate dropped.
  std::optional<Malformed> readonly_write(std::uint64_t session, const proto::ReadOnlyWrite& m, Now now);
  std::variant<ShareOut, Malformed> share_request(std::uint64_t session, const proto::ShareRequest& m);
  // The ShareReply could not be delivered: the pending share is aborted.
  void share_undeliverable(std::uint64_t session);
  std::variant<proto::ShareAck, Malformed> share_commit(std::uint64_t session, const proto::ShareCommit& m);
  // CUDA IPC (node_ipc.cpp, docs/ipc.md). Descriptors in an IpcOpened are borrowed (valid until
  // the next call on the Node); an IpcOpenReply that could not be delivered is undone with
  // ipc_undeliverable(import id).
  std::variant<proto::IpcExportReply, Malformed> ipc_export(std::uint64_t session, const proto::IpcExport& m);
  struct IpcOpened {
    proto::IpcOpenReply reply{};
    std::vector<int> fds;
  };
  std::variant<IpcOpened, Malformed> ipc_open(std::uint64_t session, const proto::IpcOpen& m, Now now);
  void ipc_undeliverable(std::uint64_t import_id);
  std::variant<proto::IpcCloseAck, Malformed> ipc_close(std::uint64_t session, const proto::IpcClose& m);
  [[nodiscard]] const std::unordered_map<std::uint64_t, Import>& imports() const noexcept { return imports_; }
  // Imports a tenant's sessions hold (they count against its grant cap).
  [[nodiscard]] std::size_t imports_of(TenantId t) const;

  // ---- parked grants (docs/pool.md, "Pressure protocol")
  // True when memory came back since the last retry or a deadline passed at `now`.
  [[nodiscard]] bool retry_due(Now now) const;
  // Serves, keeps or times out every parked grant. Answers for gone connections are dropped. A
  // grant still parked kAskAgain after its last asks asks the next sessions: its Completion then
  // holds Parked with their Pressure notes (the grant stays parked).
  std::vector<Completion> retry_parked(Now now);
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> next_deadline() const;

  // ---- quota file
  // Throws quota::ConfigError when `cfg` does not fit this node (namespace table, GPU sizes).
  void validate(const quota::QuotaConfig& cfg) const;
  // Applies a validated configuration: namespaces, every tenant re-resolved (sessions move,
  // grants and all), namespaces gone from it dropped. `source`: the file ("" for built-in).
  void apply(quota::QuotaConfig cfg, const std::string& source, bool from_file, Now now, const std::string& why);
  // A file that could not be applied (the configuration in force stays).
  void config_rejected(const std::string& error, Now now);
  [[nodiscard]] const quota::QuotaConfig& config() const noexcept { return config_; }

  // ---- Kubernetes allocations
  void allocation_added(const AllocationInfo& a);
  void allocation_owner(const std::string& id, const alloc::Owner& owner);
  void allocation_removed(const std::string& id);

  // ---- periodic work
  // Warm reserve and stock (release the surplus, build or queue what is missing), idle release
  // (settings.pool_idle_release) and, when due, a canary sweep.
  void tick(Now now);
  // Frees every tenant record that holds nothing (after NVML sampling, a reload). Returns how many.
  std::size_t free_idle_tenants();
  [[nodiscard]] NonpoolInputs nonpool_inputs() const;
  void set_nonpool(const NonpoolResult& r);
  // One NVML reading of every process (docs/daemon.md, "Memory outside vlake"): pids holding a
  // session get set_nonpool's rule; every other pid but the daemon's is attributed to a tenant
  // (its Kubernetes allocation, else its uid/gid through the quota file's rules, creating the
  // tenant as a session would) as unhooked memory, charged per its namespace's `enforce`.
  // Pids without an identity in `ids` (gone, unreadable) are not attributed. Records NVML's used
  // figure per GPU. Returns the processes to kill now under `enforce: kill`.
  // Unlisted memory, per GPU: NVML's used − Σ what NVML charges to the processes it lists −
  // held_fd_bytes (retired handles alive through a descriptor, charged as retained) − what vlake
  // already knows is charged to no listed process (the pool, when NVML does not list the daemon;
  // orphaned and `counted` grants of session pids it does not list), clamped at 0
  // (Device::unlisted). Above kUnlistedTolerance it is split equally among `users`' processes
  // that NVML lists on no GPU (`users`: the processes with the driver's device files open, the
  // daemon excluded, session pids included), each share being its tenant's unhooked memory like
  // a listed process's figure (a session pid's share goes to its session's tenant and is never
  // killed). With no such process it stays unattributed.
  std::vector<KillOrder> observe_gpus(const std::vector<GpuSample>& sample, const std::vector<ProcessIdentity>& ids,
                                      Now now, const std::vector<ProcessIdentity>& users = {});
  // The unlisted memory of one GPU's reading, as observe_gpus computes it (the loop scans for
  // device-file users only when some GPU has more than kUnlistedTolerance).
  [[nodiscard]] Bytes unlisted_memory(const GpuSample& g) const;
  // What became of a KillOrder (`killed` false: it was already gone or could not be signalled).
  void unhooked_killed(const KillOrder& k, bool killed);

  // ---- shutdown: every handle released (tenants' imports keep granted memory alive). Returns
  // the number of grants still held by live processes.
  std::size_t shutdown();

  // ---- views (for the publisher, tests and logs)
  [[nodiscard]] const Device* device_by_uuid(const std::uint8_t* uuid) const;
  [[nodiscard]] const std::vector<Device>& devices() const noexcept { return devices_; }
  [[nodiscard]] const std::map<std::uint32_t, Tenant>& tenants() const noexcept { return tenants_; }
  [[nodiscard]] const std::map<std::string, Namespace>& namespaces() const noexcept { return namespaces_; }
  [[nodiscard]] const std::unordered_map<std::uint64_t, Session>& sessions() const noexcept { return sessions_; }
  [[nodiscard]] const std::unordered_map<std::uint64_t, Grant>& grants() const noexcept { return grants_; }
  [[nodiscard]] const Accounting& accounting() const noexcept { return acct_; }
  [[nodiscard]] const st::Counters& counters() const noexcept { return counters_; }
  [[nodiscard]] const st::GuardLog& guard_log() const noexcept { return guard_; }
  [[nodiscard]] const st::RefusalLog& refusal_log() const noexcept { return refusals_; }
  // CLOCK_REALTIME of a steady-clock time point, through NodeEnv::clock (0 without one).
  [[nodiscard]] std::uint64_t unix_of(std::chrono::steady_clock::time_point t) const;
  // What a session waits for now (a parked grant, else a restore), for the publisher and tests.
  struct Wait {
    std::uint32_t kind = st::kWaitNone;  // st::SessionWait
    DeviceOrdinal device{0};
    Bytes bytes{0};
    std::chrono::steady_clock::time_point since{};
    std::chrono::steady_clock::time_point deadline{};
    std::vector<std::uint64_t> waits_for;  // sessions asked to give back, or swapped out, for it
  };
  [[nodiscard]] Wait wait_of_session(const Session& s) const;
  [[nodiscard]] const st::ConfigRecord& config_record() const noexcept { return config_record_; }
  [[nodiscard]] std::uint64_t next_session_id() const noexcept { return next_session_id_; }
  [[nodiscard]] std::uint64_t next_grant_id() const noexcept { return next_grant_id_; }
  [[nodiscard]] std::uint32_t starts() const noexcept { return starts_; }
  [[nodiscard]] const NodeSettings& settings() const noexcept { return settings_; }
  [[nodiscard]] const Tenant* tenant(TenantId id) const;
  [[nodiscard]] const Session* session(std::uint64_t id) const;
  [[nodiscard]] Bytes dedup_logical(DeviceOrdinal d) const;
  [[nodiscard]] Bytes dedup_physical(DeviceOrdinal d) const;
  [[nodiscard]] std::size_t parked() const noexcept { return parked_.size(); }
  // Everything that changed since the last call (the publisher's), and a look without taking. The
  // sessions waiting for memory (parked grants) now or at the previous call are always included.
  Changes take_changes();
  [[nodiscard]] const Changes& pending_changes() const noexcept { return changes_; }

 private:
  struct ParkedGrant {
    ConnId conn = 0;
    std::uint64_t session = 0;
    proto::GrantRequest req{};
    std::chrono::steady_clock::time_point received{};
    std::chrono::steady_clock::time_point deadline{};
    std::vector<std::uint64_t> asked;                  // sessions sent Pressure for it
    std::chrono::steady_clock::time_point next_ask{};  // when the next sessions are asked
    bool same_namespace = false;                       // refused by its namespace's limit: only its namespace is asked
    std::chrono::steady_clock::time_point round_at{};  // when the current round of asks began
  };
  // A parked grant that memory has not served this long after its last Pressure asks the next
  // sessions in plan_pressure's order (those asked may have had less cached than they held).
  static constexpr std::chrono::milliseconds kAskAgain{250};
  // Once everyone was asked, a new round (what they cached since) starts this long after the last.
  static constexpr std::chrono::milliseconds kNewRound{1000};
  // The least wait for memory of an overcommit tenant's session (docs/swap.md).
  static constexpr std::chrono::milliseconds kOvercommitWait{120000};

  // tenants (node.cpp)
  Tenant& tenant_for(const quota::TenantSpec& spec, std::uint32_t uid, std::uint32_t gid, const AllocationInfo* alloc);
  Tenant& tenant_for_uid(std::uint32_t uid, std::uint32_t gid);
  Tenant& tenant_for_alloc(const AllocationInfo& a);
  void move_session(Session& s, Tenant& to);
  void retarget_tenants();
  void apply_namespaces();
  void charge_unhooked(Tenant& t);
  [[nodiscard]] bool over_a_limit(const Tenant& t) const;
  Tenant* unhooked_tenant(const ProcessIdentity& p);
  void reattribute(const AllocationInfo& a);
  [[nodiscard]] NamespaceId namespace_id(const std::string& name) const;
  [[nodiscard]] NamespaceId namespace_of_name(const std::string& tenant_name) const;
  Tenant* tenant_mut(TenantId id);
  Device* device_mut(const std::uint8_t* uuid);
  Device* device_by_ordinal(DeviceOrdinal d);
  [[nodiscard]] proto::DeviceQuota device_quota(const Tenant& t, const Device& d) const;
  // What replies call `used`: usage minus the tenant's bound free handles (retired on demand
  // when it needs the room, so they are not memory it cannot have); retained descriptors count.
  [[nodiscard]] Bytes reported_used(TenantId t, const Device& d, const Accounting::Usage& u) const;
  void finish_grant(Grant& g, TenantId releaser, bool exported, std::uint64_t kept_by = 0);
  std::uint64_t kept_drops_ = 0;
  std::vector<BuildOut> builds_;  // take_builds()
  std::vector<SwapNoticeOut> swap_notices_;
  // Counted grants of overcommit tenants served lately, per device ordinal: their drivers may
  // not have allocated them yet, so the GPU's free memory does not show them (room()).
  std::vector<std::pair<std::chrono::steady_clock::time_point, Bytes>> recent_counted_[st::kMaxDevices];
  std::vector<SwapJob> swap_jobs_;
  std::vector<SwapInOut> swap_replies_;
  std::uint64_t next_swap_id_ = 1;
  std::vector<DiscardOut> discards_;  // take_discards()
  // Scans the device's newly retired (`all`: every) held descriptors and records every tenant's
  // retained bytes there (accounting, changes, counters). Returns true if memory came back.
  bool settle_device(Device& d, bool all = false);
  // Records every tenant's retained bytes on `d` (no scan).
  void sync_retained(Device& d);
  void end_session_locked(Session& s, const char* why);
  std::optional<std::uint32_t> free_slot(std::vector<bool>& used);
  void touch_tenant(TenantId id);
  void touch_session(const Session& s) { changes_.sessions.insert(s.slot); }
  [[nodiscard]] bool tenant_idle(const Tenant& t) const;
  bool free_tenant_if_idle(TenantId id);
  [[nodiscard]] std::chrono::steady_clock::time_point steady_now() const;

  // grants (node_grant.cpp)
  GrantOut grant_impl(ConnId conn, Session& s, const proto::GrantRequest& m, Now now, const ParkedGrant* retry);
  Refused refuse(const Tenant& t, const Device& dev, Bytes bytes, Refusal why, proto::GrantReply reply, Now now);
  // Records a refusal in the refusal log and the tenant's denials (TenantId 0 and a null `dev`:
  // none).
  void record_refusal(TenantId t, std::uint32_t pid, const Device* dev, st::RefusalReason reason, Bytes bytes,
                      std::uint64_t used, std::uint64_t limit, std::chrono::milliseconds waited, Now now);
  // A grant answered Refused: recorded by its reply's status.
  void record_refused_grant(const Session& s, const proto::GrantRequest& m, const proto::GrantReply& r,
                            std::chrono::steady_clock::time_point received, Now now);
  // `same_namespace`: only sessions of the requester's namespace (what the others give back
  // does not lower its namespace's usage).
  std::vector<PressureNote> pressure_for(const Session& requester, const Device& dev, Bytes shortfall,
                                         const std::vector<std::uint64_t>& exclude = {}, bool same_namespace = false);
  // A grant no memory can serve now: parked while the sessions plan_pressure() picks are asked
  // for `shortfall` (Parked, with their Pressure notes); a retried one stays Parked until its
  // deadline. `retired`: the caller just released memory to the driver (park it even with nobody
  // to ask: the retry comes at once). nullopt: refuse it (nobody to ask and nothing returned,
  // parking off, or the deadline passed).
  std::optional<GrantOut> park_or_timeout(ConnId conn, const Session& s, const Tenant& t, Device& dev,
                                          const proto::GrantRequest& m, Bytes bytes, Bytes shortfall, Now now,
                                          const ParkedGrant* retry, bool same_namespace, bool retired);
  // Overcommit (node_swap.cpp): a counted grant of an overcommit tenant that the GPU has no room
  // for now. Parks it while caches are reclaimed and, from the first retry on, idle processes
  // are swapped out; nullopt: go on and grant (room, or nothing more to do: the process's own
  // driver decides).
  std::optional<GrantOut> make_room(ConnId conn, const Session& s, Device& dev, const proto::GrantRequest& m,
                                    Bytes bytes, Now now, const ParkedGrant* retry);
  // Starts swapping out idle processes (not `requester`) to make `need` bytes of room on `dev`;
  // returns the bytes their counted grants hold there (0: none eligible, nothing started).
  Bytes start_swaps(const Session& requester, const Device& dev, Bytes need, Now now);
  // Bytes on `dev` of processes being swapped out now (notified or checkpointing).
  [[nodiscard]] Bytes swapping_out(const Device& dev) const;
  // The GPU's free memory as its driver reports it now, and that less what restores under way
  // take back (room), and those restores' bytes.
  [[nodiscard]] Bytes device_free(const Device& dev);
  [[nodiscard]] Bytes room(const Device& dev);
  [[nodiscard]] Bytes restoring(const Device& dev) const;
  void note_counted(const Device& dev, Bytes bytes);
  // The bytes of the session's counted grants on GPU `d`.
  [[nodiscard]] Bytes counted_on(const Session& s, DeviceOrdinal d) const;
  // Swapping is on and some session is of an overcommit namespace (else nothing can be moved:
  // no driver query is worth making).
  [[nodiscard]] bool swaps_possible() const;
  void try_restore(Session& s, Now now);
  // Queues a SwapNotice of `phase` for the session's connection (none when detached).
  void notify(const Session& s, proto::SwapPhase phase);
  // Retires free handles bound to tenants other than `t` (of t's namespace only with
  // `same_namespace`) on `dev` until `bytes` were retired; returns the bytes retired.
  Bytes retire_others_bound(const Tenant& t, Device& dev, Bytes bytes, bool same_namespace);
  // How long a grant of `s` that no memory can serve waits: its Hello's own wait, else its
  // tenant's namespace's `wait` (docs/quota.md, "Waiting for memory").
  [[nodiscard]] std::chrono::milliseconds wait_of(const Session& s) const;
  // The priority of a tenant's namespace (quota file `priority`; 0 when it has none).
  [[nodiscard]] std::int32_t priority_of(TenantId t) const;
  // Warm reserve and stock of one GPU (warm_stock.hpp): releases surplus clean handles and
  // queues (`queue`: for take_builds(), at most kMaxBuildsInFlight per GPU) or builds inline (at
  // most max_inline) what it lacks.
  void plan_warm(Device& d, std::chrono::steady_clock::time_point now, std::size_t max_inline, bool queue);
  static constexpr std::size_t kMaxBuildsInFlight = 4;
  // Idle release of every GPU's free pool (tick).
  void release_idle(Now now);

  // CUDA IPC (node_ipc.cpp)
  // Drops one import; a released grant whose last import this was is finished (retired).
  void drop_import(std::uint64_t import_id);
  // Every import of the session (it ended).
  void drop_imports_of(std::uint64_t session);
  // A grant that is being released (by its owner, or at its session's end): true if it is held
  // for open imports (marked released, out of its session's list) instead of being finished.
  bool hold_for_imports(Grant& g);

  // guards and dedup (node_guard.cpp)
  void canary_fill(const Grant& g);
  bool canary_check(const Grant& g, const char* when, std::uint64_t now_unix_ns);
  void canary_sweep(std::uint64_t now_unix_ns);
  void record_guard_event(st::GuardEventRecord e, std::uint64_t now_unix_ns);
  // Takes one token of the tenant's guard event bucket; false (counted, logged) when empty.
  bool guard_rate_ok(Tenant& t, const Session& s, Now now);
  Dedup& dedup();

  Driver& driver_;
  const Logger& log_;
  NodeSettings settings_;
  NodeEnv env_;
  quota::QuotaConfig config_;
  Accounting acct_;
  std::vector<Device> devices_;
  std::map<std::string, Namespace> namespaces_;  // by name
  std::unordered_map<std::string, TenantId> tenant_ids_;
  std::map<std::uint32_t, Tenant> tenants_;  // by TenantId value
  std::unordered_map<std::uint64_t, Session> sessions_;
  std::unordered_map<std::uint64_t, Grant> grants_;
  std::map<std::string, AllocationInfo> allocs_;                 // by allocation id
  std::unique_ptr<Dedup> dedup_;                                 // created on first use
  std::unordered_map<std::uint64_t, Import> imports_;            // by import id
  std::unordered_map<std::uint64_t, std::uint64_t> ipc_tokens_;  // token -> grant id
  std::uint64_t next_import_id_ = 1;
  std::vector<ParkedGrant> parked_;  // FIFO
  // Tenants of processes without a session by (pid, start time), so that a sample does not
  // resolve (user and group databases) every process again; cleared when the quota file or the
  // allocations change, pruned to the processes of the latest sample.
  std::map<std::pair<std::uint32_t, std::uint64_t>, TenantId> unhooked_tenants_;
  bool memory_returned_ = false;  // a release since the last retry of parked grants

  // slot tables (mirroring the state segment's)
  std::vector<bool> tenant_slots_ = std::vector<bool>(st::kMaxTenants);
  std::vector<bool> namespace_slots_ = std::vector<bool>(st::kMaxNamespaces);
  std::vector<bool> session_slots_ = std::vector<bool>(st::kMaxSessions);
  std::vector<bool> grant_slots_ = std::vector<bool>(st::kMaxGrants);

  // what the state segment carries across restarts
  st::Counters counters_{};
  LogLimiter limited_;                                // counts into counters_.log_suppressed
  std::chrono::steady_clock::time_point last_now_{};  // the latest Now seen (for untimed operations)
  st::GuardLog guard_{};
  st::RefusalLog refusals_{};
  std::set<std::uint32_t> waiting_slots_;  // session slots waiting at the last take_changes()
  st::ConfigRecord config_record_{};
  std::uint64_t next_session_id_ = 1;
  std::uint64_t next_grant_id_ = 1;
  std::uint32_t starts_ = 1;
  std::uint64_t handles_created_base_ = 0;
  std::uint64_t handles_released_base_ = 0;

  std::chrono::steady_clock::time_point last_canary_sweep_{};
  std::uint64_t canary_cursor_ = 0;  // the sweep resumes after this grant id
  Changes changes_;

  friend class StatePublisher;
};

}  // namespace vlake::pool
