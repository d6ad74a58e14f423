// vlake::state — the daemon's state segment: node accounting that survives a daemon
// restart and that read-only mappers (vlakectl, the exporter, the device plugin, tests) can
// inspect. Hooks never map it.
//
// Location: a file in a directory only vlaked's user (or root) can create names in, mapped with
// mmap: `--state NAME` is <state_dir()>/NAME (default /run/vlake/state/vlake-state), `--state
// /ABS/PATH` that file. state_dir() is $VLAKE_STATE_DIR or kDefaultStateDir. The daemon and every
// reader check the directory and each directory above it (check_state_dir) before touching the
// file, so no other local user can pre-create, replace or plant the segment (docs/daemon.md,
// "State segment"). It used to be POSIX shared memory /dev/shm/<name>, where any user could
// pre-create the name and keep vlaked from starting.
//
// Layout: one fixed-layout struct `State` — Header (magic, layout version, sizes, a
// seqlock generation), Counters, ConfigRecord (the quota file in force, reloads), then
// fixed-capacity tables of DeviceRecord, NamespaceRecord, TenantRecord, SessionRecord and
// GrantRecord. Every record is trivially copyable and refers to others by id
// or index, never by pointer. A record is in use when its `in_use`/`state` field is non-zero.
//
// Concurrency: only the daemon writes, on one thread, inside StateSegment::Write brackets
// (generation odd while writing, even when consistent). Readers copy the whole struct and retry
// until they saw the same even generation before and after (StateReader::snapshot()).
//
// Trust: the segment holds every tenant's names, pids and usage, so the daemon creates it
// exclusively with mode 0600 (0640 with a group for vlakectl users) and resumes only a segment
// its own uid created that nobody else can write (StateSegment below).
//
// Compatibility: a layout change bumps kLayoutVersion. A daemon finding a segment with another
// magic, version or size refuses to start and says how to reset it (remove the segment when no
// tenant holds memory).
//
// Errors: StateSegment/StateReader throw StateError (std::runtime_error) with a full message.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "vlake/contracts/protocol.hpp"

namespace vlake::state {

inline constexpr std::uint64_t kMagic = 0x4554415453454b4cULL;  // "LKESTATE"
inline constexpr std::uint32_t kLayoutVersion = 11;
inline constexpr std::uint32_t kMaxDevices = proto::kMaxDevices;
inline constexpr std::uint32_t kMaxTenants = 256;
inline constexpr std::uint32_t kMaxNamespaces = 256;
inline constexpr std::uint32_t kMaxSessions = 1024;
inline constexpr std::uint32_t kMaxGrants = 16384;
inline constexpr std::size_t kTenantNameBytes = 128;    // "<namespace>/user:<name>" fits
inline constexpr std::size_t kNamespaceNameBytes = 64;  // a DNS label (<= 63) + NUL
inline constexpr std::size_t kConfigPathBytes = 256;
inline constexpr std::size_t kConfigErrorBytes = 512;

// Layout 3: the grant-latency histogram (vlake_grant_duration_seconds, docs/metrics.md).
// Counters::grant_latency_bucket[i] counts grants that took more than the previous bound and at
// most kGrantLatencyBoundsNs[i] (NOT cumulative); grants above the last bound are only in
// grant_latency_count. Readers make them cumulative.
inline constexpr std::size_t kGrantLatencyBuckets = 13;
inline constexpr std::uint64_t kGrantLatencyBoundsNs[kGrantLatencyBuckets] = {
    50'000,     100'000,    250'000,    500'000,     1'000'000,   2'500'000,    5'000'000,
    10'000'000, 25'000'000, 50'000'000, 100'000'000, 250'000'000, 1'000'000'000};

struct Header {
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t header_bytes;  // sizeof(Header)
  std::uint64_t total_bytes;   // sizeof(State)
  std::uint64_t generation;    // seqlock: odd while the daemon writes
  std::uint64_t next_session_id;
  std::uint64_t next_grant_id;
  std::uint32_t daemon_pid;  // the daemon that last wrote
  std::uint32_t device_count;
  std::uint64_t daemon_start_time;  // /proc/<pid>/stat start time of that daemon
  std::uint64_t updated_unix_ns;    // last sample (CLOCK_REALTIME)
  std::uint32_t max_tenants;
  std::uint32_t max_sessions;
  std::uint32_t max_grants;
  std::uint32_t max_devices;
  std::uint32_t starts;  // daemon starts on this segment (1 = never restarted)
  std::uint32_t clean;   // 1 after a graceful stop, 0 while running
  std::uint32_t max_namespaces;
  std::uint32_t sample_interval_ms;  // layout 3: --sample-interval-ms (updated_unix_ns refresh period)
};

struct Counters {
  std::uint64_t grants;              // successful grants
  std::uint64_t denials_over_limit;  // all quota refusals (the three reasons below together)
  std::uint64_t denials_out_of_memory;
  std::uint64_t denials_unknown_device;
  std::uint64_t denials_other;      // internal errors, table full
  std::uint64_t releases;           // grants returned (client release or process exit)
  std::uint64_t releases_exported;  // releases that retired their handles
  std::uint64_t process_exits;      // sessions ended by their process dying
  std::uint64_t scrubs;             // handles zeroed before a grant
  std::uint64_t reuses;             // grants served from the free pool
  std::uint64_t handles_created;
  std::uint64_t handles_released;
  std::uint64_t malformed;  // connections dropped for a malformed message
  std::uint64_t sessions_opened;
  std::uint64_t sessions_rebound;
  std::uint64_t nvml_samples;
  // Layout 2: quota reasons and reloads.
  std::uint64_t denials_tenant_limit;     // the tenant's own limit
  std::uint64_t denials_namespace_limit;  // its namespace's limit
  std::uint64_t denials_guarantee;        // would use memory guaranteed to other namespaces
  std::uint64_t config_reloads;           // new quota files applied (SIGHUP included)
  std::uint64_t config_reload_errors;     // new quota files rejected (old one kept)
  // Layout 3: grant latency (receive -> reply sent, successful grants; see kGrantLatencyBoundsNs)
  // and guard violations by kind (docs/guard.md).
  std::uint64_t grant_latency_bucket[kGrantLatencyBuckets];
  std::uint64_t grant_latency_sum_ns;
  std::uint64_t grant_latency_count;
  // guard_violations_fault and guard_violations_readonly are no longer counted (kept for
  // readers; 0 on a fresh segment): a kernel fault is not a guard violation, see kernel_faults.
  std::uint64_t guard_violations_fault;
  std::uint64_t guard_violations_canary;
  std::uint64_t guard_violations_readonly;
  // Layout 5: pool performance (docs/pool.md).
  std::uint64_t requests;  // well-formed messages handled (all types)
  std::uint64_t usage_queries;
  std::uint64_t grants_exact;           // served by one free handle of the grant's size
  std::uint64_t grants_stitched;        // served by several free handles mapped as one range
  std::uint64_t grants_new;             // served by creating a handle (maybe after releasing free ones)
  std::uint64_t handles_stitched;       // handles in stitched grants
  std::uint64_t stitched_cross_tenant;  // stitched grants using a handle another tenant freed
  std::uint64_t pressure_sent;          // Pressure messages sent
  std::uint64_t grants_parked;          // grants that waited for reserves to be returned
  std::uint64_t parked_timeouts;        // of those, refused when the wait ended
  std::uint64_t reserve_reports;
  // Were reserved_counters[5] of layout 5 (always 0 there); docs/guard.md.
  std::uint64_t guard_violations_readonly_write;  // copies/memsets into shared read-only ranges, refused
  // Kernel faults the hooks reported (recorded events), by kFault* attribute bits (index 0..3).
  std::uint64_t kernel_faults[4];
  // Layout 6: hostile tenants (docs/security.md). Every refusal names its reason.
  std::uint64_t denials_session_cap;      // Hello refused: the tenant holds its session cap
  std::uint64_t denials_grant_cap;        // grants refused: the tenant holds its grant cap
  std::uint64_t denials_connection_cap;   // connections closed at accept: the uid holds its connection cap
  std::uint64_t denials_unauthenticated;  // connections closed: too many awaiting Hello, or no Hello in time
  std::uint64_t denials_tenant_table;     // Hello refused: the tenant table is full
  std::uint64_t denials_unhooked;         // grants refused: memory outside vlake puts the tenant over its limit
  std::uint64_t guard_events_rejected;    // guard events naming nothing the sender holds
  std::uint64_t guard_events_limited;     // guard events over the per-tenant rate
  std::uint64_t log_suppressed;           // log lines dropped by rate limits
  std::uint64_t unhooked_kills;           // processes killed under `enforce: kill`
  std::uint64_t tenants_freed;            // tenant records freed (no session, grant or memory left)
  std::uint64_t handles_retired_held;     // retired handles whose descriptor another process still held
  std::uint64_t passthrough_refused;      // VLAKE_DISABLE requests the quota file does not allow
  // CUDA IPC of pool memory (docs/ipc.md); were reserved6[3] of layout 6 (always 0 there).
  std::uint64_t ipc_exports;  // IpcExport answered with a token (first export of a grant)
  std::uint64_t ipc_opens;    // IpcOpen answered with the memory
  std::uint64_t ipc_refused;  // IpcOpen refused: unknown token or secret, or another tenant not allowed
  // Layout 8: the longest grant (receive -> reply sent) counted in the histogram above, in
  // nanoseconds (the histogram only bounds it by a bucket); kept over restarts like the others.
  std::uint64_t grant_latency_max_ns;
  // Layout 9: swapping idle processes to host memory (docs/swap.md). Bytes are what the
  // checkpoints freed (out) and what the restores took back (in: the process's counted grants and
  // context when it was restored); seconds are the driver calls' time.
  std::uint64_t swap_outs;      // processes checkpointed to host memory
  std::uint64_t swap_ins;       // processes restored
  std::uint64_t swap_failures;  // checkpoints or restores the driver failed
  std::uint64_t swap_timeouts;  // restores refused: no room within the process's wait
  std::uint64_t swap_out_bytes;
  std::uint64_t swap_in_bytes;
  std::uint64_t swap_out_ns;
  std::uint64_t swap_in_ns;
  std::uint64_t refusals_recorded;  // refusals written to the refusal log (RefusalLog::next_seq - 1)
  // Layout 11: the host tier (docs/swap.md, "Host tier"). Counts and bytes are whole grants moved
  // to host memory (demotes) and back (promotes); seconds are the moves' time, notice to last
  // step. host_stock_bytes and host_bound_bytes are gauges: pinned host memory made ahead and
  // not in use, and --host-tier (0: off).
  std::uint64_t tier_demotes;
  std::uint64_t tier_promotes;
  std::uint64_t tier_demoted_bytes;
  std::uint64_t tier_promoted_bytes;
  std::uint64_t tier_demote_ns;
  std::uint64_t tier_promote_ns;
  std::uint64_t tier_declined;        // grants a process declined or failed to move
  std::uint64_t tier_busy;            // moves a busy process turned down
  std::uint64_t tier_made_on_demand;  // pieces the stock lacked, made during a move
  std::uint64_t host_stock_bytes;
  std::uint64_t host_bound_bytes;
};

// The quota configuration in force.
struct ConfigRecord {
  char path[kConfigPathBytes];         // --config as given
  char last_error[kConfigErrorBytes];  // the last rejected file's "<file>:<line>:<col>: <what>"; "" = none
  std::uint64_t generation;            // 1: the configuration loaded at start; +1 per applied reload
  std::uint64_t loaded_unix_ns;        // when the configuration in force was applied
  std::uint64_t error_unix_ns;         // when last_error was recorded (0: never)
  std::uint32_t rejected;              // 1 while the file on disk is rejected (last attempt failed)
  std::uint32_t from_file;             // 0: built-in default (no file), 1: from the file
  std::uint32_t namespace_count;       // in use in the namespace table
  std::uint32_t reserved;
};

struct DeviceRecord {
  std::uint8_t uuid[16];
  std::uint64_t total;
  std::uint64_t granularity;
  std::uint64_t pool_bytes;  // handles this daemon holds: free + granted (not orphaned)
  std::uint64_t free_bytes;
  std::uint64_t free_handles;
  std::uint64_t granted_bytes;   // bytes of live grants with handles
  std::uint64_t orphaned_bytes;  // bytes of grants whose handle died with a previous daemon
  std::uint64_t counted_bytes;   // bytes of `counted` grants (no handle)
  std::uint64_t nonpool_bytes;   // sampled, summed over tenants
  std::uint32_t in_use;
  std::uint32_t ordinal;
  std::uint64_t guaranteed_bytes;  // sum of the namespaces' guarantees on this GPU
  std::uint64_t borrowed_bytes;    // sum over namespaces of max(0, used - guaranteed), shared
                                   // (dedup) chunks counted once per saving group (docs/quota.md)
  // Layout 3.
  std::uint64_t largest_free_handle;   // size of the largest free-pool handle (0: none): no
                                       // one-handle (cuMemCreate) grant above it is served
                                       // without creating a handle
  std::uint64_t dedup_logical_bytes;   // shared read-only weights as tenants see them (0 until dedup)
  std::uint64_t dedup_physical_bytes;  // what those take on the GPU (0 until dedup)
  // Layout 5.
  std::uint64_t free_small_handles;  // free handles of the granularity (tails, fragments)
  std::uint64_t free_bulk_handles;   // free handles of the bulk size
  std::uint64_t warm_target_bytes;   // --warm-reserve on this GPU
  std::uint64_t hook_reserve_bytes;  // sum of the hooks' reported local reserves
  std::uint64_t pool_peak_bytes;     // highest pool_bytes since start
  // Bytes of free handles given back to the driver by the idle release (--pool-idle-release),
  // across restarts; was reserved5[0] of layout 5 (always 0 there).
  std::uint64_t idle_released_bytes;
  // Layout 11 (was reserved5[0]): this GPU's grants whose memory is on the host tier now
  // (docs/swap.md, "Host tier"); exact: the bytes of those grants.
  std::uint64_t host_bytes;
  std::uint64_t reserved5;
  // Layout 6 (docs/security.md).
  std::uint64_t retained_bytes;   // sum of the tenants' retained[] on this GPU
  std::uint64_t unhooked_bytes;   // sum of the tenants' unhooked[] on this GPU
  std::uint64_t nvml_used_bytes;  // device memory in use as NVML reports it (0: no NVML)
  std::uint64_t held_fd_bytes;    // retired handles still alive through another process's descriptor
  // Of nvml_used_bytes, what NVML charges to no process it lists, less held_fd_bytes and the
  // memory vlake knows is charged to no listed process (docs/daemon.md, "Memory outside vlake").
  std::uint64_t unlisted_bytes;
  // Layout 7 (were reserved6[0..1]): the largest grant (up to kMaxHandlesPerGrant handles) the
  // free pool serves without creating a handle, stitching included (docs/pool.md, "What the
  // free pool can serve"): for the best-placed tenant, and for a tenant with no handle bound
  // to it (a new one; equal with --handle-reuse node). vlake_pool_fragmentation_ratio is
  // 1 - largest_servable_bytes / free_bytes.
  std::uint64_t largest_servable_bytes;
  std::uint64_t largest_servable_unbound_bytes;
  // Layout 9 (was reserved6[0]): memory of this GPU's processes now on the host (docs/swap.md):
  // what their checkpoints freed.
  std::uint64_t swapped_bytes;
  // Layout 10: vlaked's own use of this GPU (docs/vlakectl.md, "The daemon's row"), never a
  // tenant's: NVML's figure for vlaked's process (0: NVML does not list it, or no NVML), and of
  // it what is not pool memory — its own CUDA context (and driver allocations).
  std::uint64_t daemon_nvml_bytes;
  std::uint64_t daemon_context_bytes;
};

enum NamespaceFlags : std::uint32_t {
  kNamespaceHasLimit = 1,  // `limit` configured (else limit[] is the GPU's total)
  kNamespaceImplicit = 2,  // the implicit "default" namespace (not declared in the file)
};

struct NamespaceRecord {
  std::uint32_t in_use;
  std::uint32_t id;  // index + 1; TenantRecord::namespace_id refers to it
  char name[kNamespaceNameBytes];
  std::int32_t priority;
  std::uint32_t flags;                    // NamespaceFlags
  std::uint64_t limit[kMaxDevices];       // per GPU, bytes (percentages resolved on each GPU)
  std::uint64_t guaranteed[kMaxDevices];  // per GPU, bytes
  std::uint64_t used[kMaxDevices];        // granted + non-pool of its tenants
  std::uint32_t over_limit;               // bit d: used[d] > limit[d] (a lowered limit; no revocation)
  std::uint32_t tenant_count;             // tenants in it
};

struct TenantRecord {
  std::uint32_t in_use;
  std::uint32_t id;  // TenantId: index + 1
  char name[kTenantNameBytes];
  std::uint64_t limit[kMaxDevices];
  std::uint64_t granted[kMaxDevices];
  std::uint64_t nonpool[kMaxDevices];
  std::uint32_t namespace_id;  // NamespaceRecord id of its namespace
  std::uint32_t over_limit;    // bit d: its usage (granted, nonpool, retained, charged unhooked) > limit[d]
  // Layout 5: of granted[d], what its processes keep unused in their local reserves.
  std::uint64_t reserve[kMaxDevices];
  // Layout 6 (docs/security.md).
  std::uint64_t retained[kMaxDevices];  // released memory it can still reach (descriptors it kept,
                                        // handles bound to it): charged like granted
  std::uint64_t unhooked[kMaxDevices];  // NVML's figure for its processes without a session
  std::uint32_t enforce;                // quota::Enforce of its namespace (0 account, 1 refuse, 2 kill)
  std::uint32_t unhooked_processes;     // processes on a GPU without a session
  // Kernel faults of its processes, by kFault* attribute bits (index 0..3); were reserved6[2]
  // (always 0 there). Gone with the record when the tenant is freed.
  std::uint32_t kernel_faults[4];
  // Layout 9: refusals of its requests by RefusalReason (index = reason - 1), since the record was
  // created (gone with the record when the tenant is freed).
  std::uint64_t denials[8];
  // Layout 10: CUDA IPC (docs/ipc.md). ipc_held: of granted[d], grants it released that another
  // process's open import keeps alive (still charged to it until the last import closes).
  // ipc_imported: memory it maps through imports of other tenants' grants (charged to their owners,
  // not to it).
  std::uint64_t ipc_held[kMaxDevices];
  std::uint64_t ipc_imported[kMaxDevices];
  // Layout 10: why bit d of over_limit is set (OverLimitReason; 0 when it is not).
  std::uint32_t over_reason[kMaxDevices];
  // Layout 10: its entries pushed out of the guard event ring and of the refusal ring (kept per
  // tenant: only its own newer entries, or those of a tenant holding no fewer, push them out; see
  // GuardLog), since the record was created (gone with the record when the tenant is freed).
  std::uint64_t guard_events_evicted;
  std::uint64_t refusals_evicted;
};

// Layout 10: why a tenant's usage is above its limit on a GPU (TenantRecord::over_reason), the
// first that explains it: its pool memory (granted + retained) alone is above the limit, which
// vlaked never grants, so the limit was lowered (a reload, or a guarantee elsewhere);
// else its processes' memory outside the pool (their CUDA contexts and driver allocations,
// nonpool) takes it above; else memory of its processes without a vlake session (unhooked).
enum OverLimitReason : std::uint32_t {
  kOverNone = 0,
  kOverLowered = 1,   // "limit_lowered"
  kOverContexts = 2,  // "contexts"
  kOverOutside = 3,   // "outside_vlake"
};
// "limit_lowered", "contexts", "outside_vlake"; "" for kOverNone and unknown values.
const char* over_reason_name(std::uint32_t reason) noexcept;

// What is known about a kernel fault (docs/guard.md): index bits of Counters::kernel_faults and
// TenantRecord::kernel_faults, and GuardEventRecord::flags of a fault.
enum FaultAttributes : std::uint32_t {
  kFaultGuarded = 1u << 0,     // the process's grants on that GPU were placed in guard `fault` mode
  kFaultMapsShared = 1u << 1,  // the process maps shared read-only chunks on that GPU
};

enum SessionState : std::uint32_t { kSessionFree = 0, kSessionConnected = 1, kSessionDetached = 2 };

// Layout 9: where a session's process is (docs/swap.md); SessionRecord::swap.
enum SessionSwap : std::uint32_t {
  kSwapNone = 0,           // on the GPU
  kSwapNotified = 1,       // told to get ready to be swapped out
  kSwapCheckpointing = 2,  // being checkpointed to host memory
  kSwapHost = 3,           // on the host
  kSwapRestoring = 4,      // being restored
  kSwapLost = 5,           // its restore failed: it never runs on the GPU again
};
// Layout 9: what a session waits for (docs/notebooks.md, "Who waits for whom"); SessionRecord::wait.
enum SessionWait : std::uint32_t {
  kWaitNone = 0,
  kWaitMemory = 1,   // a grant no memory can serve yet is parked
  kWaitRestore = 2,  // its process, on the host, waits to be restored
};
enum SessionFlags : std::uint32_t {
  kSessionReclaim = 1u << 0,     // a framework gives back its cache when asked (reclaim callback)
  kSessionOvercommit = 1u << 1,  // its namespace has `overcommit: true`
};
inline constexpr std::uint32_t kMaxWaitsFor = 4;

// A SessionSwap whose process's memory is in host memory: on the host, being restored, or lost
// (a failed restore leaves it there). What DeviceRecord::swapped_bytes and the readers count.
constexpr bool swapped_out(std::uint32_t swap) noexcept {
  return swap == kSwapHost || swap == kSwapRestoring || swap == kSwapLost;
}

struct SessionRecord {
  std::uint64_t id;
  std::uint64_t start_time;  // /proc/<pid>/stat field 22
  std::uint32_t pid;
  std::uint32_t uid;
  std::uint32_t gid;
  std::uint32_t tenant;  // TenantId
  std::uint32_t state;   // SessionState
  std::uint32_t grant_count;
  // Layout 9.
  // Its last CUDA call as its hook reports it (at most a second late), its last grant or its Hello;
  // 0: unknown.
  std::uint64_t last_active_unix_ns;
  std::uint32_t swap;                // SessionSwap
  std::uint32_t swap_device;         // ordinal its swap is about (kSwapNone: the last one)
  std::uint64_t swap_bytes;          // going out: its counted grants there; on the host: what its checkpoint freed
  std::uint64_t swap_since_unix_ns;  // when `swap` took its value (0: never swapped)
  std::uint64_t swap_for;            // being swapped out to make room for this session (0: none)
  std::uint32_t swap_outs;           // its checkpoints
  std::uint32_t swap_ins;            // its restores
  std::uint32_t wait;                // SessionWait
  std::uint32_t wait_device;         // ordinal
  std::uint64_t wait_bytes;          // the grant it waits for, or what its restore needs
  std::uint64_t wait_since_unix_ns;
  std::uint64_t wait_deadline_unix_ns;  // when the wait ends with out_of_memory
  std::uint32_t waits_for_count;        // entries of waits_for (more may exist: the first kMaxWaitsFor)
  std::uint32_t flags;                  // SessionFlags
  // Sessions whose memory it waits for: asked to give back cached memory, or being swapped out for it.
  std::uint64_t waits_for[kMaxWaitsFor];
};

enum GrantState : std::uint32_t { kGrantFree = 0, kGrantLive = 1, kGrantOrphaned = 2 };

struct GrantRecord {
  std::uint64_t id;
  std::uint64_t session;
  std::uint64_t bytes;
  std::uint32_t tenant;
  std::uint32_t device;   // ordinal at grant time (uuid in devices[device])
  std::uint32_t purpose;  // proto::GrantPurpose
  std::uint32_t handle_count;
  std::uint32_t state;  // GrantState
  std::uint32_t guard;  // layout 4: proto::GuardMode in force for this grant
  // Layout 4.
  std::uint64_t requested;        // the bytes the client asked for (GrantRequest::bytes)
  std::uint64_t created_unix_ns;  // when it was granted (CLOCK_REALTIME)
  // Layout 11: where its memory is (GrantLocation); what a session's and a tenant's host bytes
  // are summed from (docs/swap.md, "Host tier").
  std::uint32_t location;
  std::uint32_t reserved;
};

enum GrantLocation : std::uint32_t {
  kGrantOnGpu = 0,
  kGrantOnHost = 1,  // on the host tier: the process reaches it over PCIe
  kGrantToHost = 2,  // being moved there
  kGrantToGpu = 3,   // being moved back
};

// Layout 4: out-of-bounds guard alarms (docs/guard.md), a ring of the last kGuardEvents.
inline constexpr std::uint32_t kGuardEvents = 256;
inline constexpr std::uint32_t kGuardEventSuspects = 4;  // the hook's first suspects kept
inline constexpr std::uint32_t kGuardNoDevice = 0xffffffffu;

struct GuardEventRecord {
  std::uint64_t seq;           // 1-based event number; 0: slot never written
  std::uint64_t time_unix_ns;  // when the daemon recorded it
  std::uint32_t kind;          // proto::GuardKind (fault_maps_shared: recorded as fault + flag)
  std::uint32_t tenant;        // TenantId
  std::uint32_t device;        // ordinal; kGuardNoDevice: the hook named an unknown GPU
  std::uint32_t pid;           // the tenant process (canary: the grant's session's pid)
  char tenant_name[kTenantNameBytes];
  std::uint64_t grant_id;           // canary, readonly_write: the grant; fault: 0
  std::uint64_t address;            // fault: the first suspect's pointer; canary: 0 (unknown);
                                    // readonly_write: the call's destination
  std::uint64_t requested_bytes;    // canary: the allocation's size; fault: the first suspect's;
                                    // readonly_write: the bytes the call writes
  std::uint64_t first_bad_offset;   // canary: offset of the first changed byte from the grant's start;
                                    // readonly_write: of the first shared byte hit, from the allocation's pointer
  std::uint64_t allocated_unix_ns;  // canary: the grant's creation time; fault, readonly_write: now - suspect age
  std::int32_t cuda_status;         // fault, readonly_write: the CUresult the application sees; else 0
  std::uint32_t suspect_count;      // fault: suspects the hook sent (<= proto::kMaxGuardSuspects);
                                    // readonly_write: 1 (the allocation hit)
  std::uint32_t live_allocations;   // fault: the process's live allocations
  std::uint32_t flags;              // fault: FaultAttributes; else 0 (was `reserved`, always 0)
  char call[32];                    // fault, readonly_write: the driver call; canary: "release" or "sweep"
  proto::GuardSuspect suspects[kGuardEventSuspects];  // readonly_write: [0] = the allocation hit
};

// Layout 10: the ring is kept per tenant (docs/security.md, "Rings per tenant"). While a slot is
// free a new event takes one; once the ring is full it replaces the oldest event of the tenant
// (told apart by tenant_name: ids are reused) holding the most (counting the new one as its
// tenant's; a tie: the oldest of the tied tenants' events), so one tenant's flood only pushes
// out its own events. Events are therefore not in
// slot order: a slot is NOT (seq - 1) % kGuardEvents. Readers take the slots in seq order
// (ring_order below) and follow seq: every event after a seq a reader saw has a larger seq, so a
// cursor on seq misses nothing still in the ring. The newest is `next_seq - 1` (if still kept).
struct GuardLog {
  std::uint64_t next_seq;  // 1 + events recorded so far (0 or 1: none)
  std::uint64_t evicted;   // layout 10 (was reserved): events pushed out of the ring so far
  GuardEventRecord events[kGuardEvents];
};

// Layout 9: refused requests (docs/vlakectl.md, "events"), a ring of the last kRefusalEvents.
inline constexpr std::uint32_t kRefusalEvents = 256;
enum RefusalReason : std::uint32_t {
  kRefusalTenantLimit = 1,     // the tenant's limit
  kRefusalNamespaceLimit = 2,  // its namespace's limit
  kRefusalGuarantee = 3,       // memory guaranteed to other namespaces
  kRefusalOutOfMemory = 4,     // no memory on the GPU within the wait (a grant, or a restore)
  kRefusalLimitReached = 5,    // a cap: sessions or grants per tenant, a full table
  kRefusalUnknownDevice = 6,   // a GPU this node does not have
  kRefusalInternal = 7,        // an internal error
  kRefusalRestoreTimeout = 8,  // a swapped-out process could not be restored within its wait
};
inline constexpr std::uint32_t kRefusalReasons = 8;  // TenantRecord::denials[reason - 1]

// The name of a RefusalReason, as vlakectl, the metrics (`reason` label) and Kubernetes Events
// spell it: "tenant_limit", "namespace_limit", "guarantee", "out_of_memory", "limit_reached",
// "unknown_device", "internal", "restore_timeout"; "unknown" for any other value.
const char* refusal_reason_name(std::uint32_t reason) noexcept;

struct RefusalRecord {
  std::uint64_t seq;           // 1-based; 0: slot never written
  std::uint64_t time_unix_ns;  // when it was refused
  std::uint32_t tenant;        // TenantId (0: none, e.g. the tenant table was full)
  std::uint32_t pid;
  std::uint32_t device;     // ordinal; kGuardNoDevice: none or unknown
  std::uint32_t reason;     // RefusalReason
  std::uint64_t bytes;      // asked for (a restore: what it needs)
  std::uint64_t used;       // at the refusal: the limit's usage, or the GPU's free memory (out of memory)
  std::uint64_t limit;      // the limit, the cap, or 0
  std::uint64_t waited_ms;  // how long it waited for memory before the refusal
  char tenant_name[kTenantNameBytes];
};

// Layout 10: kept per tenant as the guard ring is (GuardLog above; refusals of no tenant, an
// empty tenant_name, count as one tenant there): a slot is NOT (seq - 1) % kRefusalEvents;
// readers use ring_order.
struct RefusalLog {
  std::uint64_t next_seq;  // 1 + refusals recorded so far (0 or 1: none)
  std::uint64_t evicted;   // layout 10 (was reserved): refusals pushed out of the ring so far
  RefusalRecord refusals[kRefusalEvents];
};

// Layout 10: the records a ring holds, oldest first (by seq; slots never written left out).
// Pointers into the log given (a snapshot's copy).
std::vector<const GuardEventRecord*> ring_order(const GuardLog& log);
std::vector<const RefusalRecord*> ring_order(const RefusalLog& log);

struct State {
  Header header;
  Counters counters;
  ConfigRecord config;
  DeviceRecord devices[kMaxDevices];
  NamespaceRecord namespaces[kMaxNamespaces];
  TenantRecord tenants[kMaxTenants];
  SessionRecord sessions[kMaxSessions];
  GrantRecord grants[kMaxGrants];
  GuardLog guard;       // layout 4
  RefusalLog refusals;  // layout 9
};

#define VLAKE_STATE_CHECK(T, bytes)                                    \
  static_assert(std::is_trivially_copyable_v<T>, #T " must be POD");   \
  static_assert(std::is_standard_layout_v<T>, #T " must be standard"); \
  static_assert(sizeof(T) == (bytes), #T " changed size: bump kLayoutVersion")
VLAKE_STATE_CHECK(Header, 104);
VLAKE_STATE_CHECK(Counters, 440 + 8 * 17 + 8 * 9 + 8 * 11);
VLAKE_STATE_CHECK(ConfigRecord, 808);
VLAKE_STATE_CHECK(DeviceRecord, 200 + 64 + 16);
VLAKE_STATE_CHECK(NamespaceRecord, 472);
VLAKE_STATE_CHECK(TenantRecord, 656 + 128 * 2 + 8 + 16 + 64 + 128 * 2 + 64 + 16);
VLAKE_STATE_CHECK(SessionRecord, 40 + 120);
VLAKE_STATE_CHECK(GrantRecord, 72);
VLAKE_STATE_CHECK(GuardEventRecord, 344);
VLAKE_STATE_CHECK(GuardLog, 16 + 344 * 256);
VLAKE_STATE_CHECK(RefusalRecord, 64 + 128);
VLAKE_STATE_CHECK(RefusalLog, 16 + 192 * 256);
VLAKE_STATE_CHECK(State, 104 + 736 + 808 + 280 * 16 + 472 * 256 + 1336 * 256 + 160 * 1024 + 72 * 16384 + 16 +
                             344 * 256 + 16 + 192 * 256);
#undef VLAKE_STATE_CHECK

class StateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where state segments live unless --state names an absolute path (docs/daemon.md): a directory
// root owns (created 0755 by vlaked when missing), and the variable that overrides it.
inline constexpr const char* kDefaultStateDir = "/run/vlake/state";
inline constexpr const char* kStateDirEnv = "VLAKE_STATE_DIR";

// $VLAKE_STATE_DIR when set and non-empty, else kDefaultStateDir. Reads the environment (getenv):
// call it from main-thread set-up, not concurrently with setenv.
std::string state_dir();

// "" if `spec` is a valid --state value: a name (1..200 characters, no '/', not "." or "..") or
// an absolute path (at most 4000 characters, not ending in '/'); else what is wrong with it.
std::string check_state_spec(const std::string& spec);

// The file of state `spec`: an absolute path as is, a name in state_dir(). Does not validate.
std::string segment_path(const std::string& spec);

// Throws StateError unless nobody but root and `owner` can create, remove or rename names in
// `dir` (an absolute path): every directory from / down to `dir` (symbolic links resolved) is
// owned by root or `owner` and is not writable by group or others — directories above `dir` may
// be group/other-writable with the sticky bit (e.g. /tmp), `dir` itself may not. The message says
// which directory is unsafe and how to fix it.
void check_state_dir(const std::string& dir, unsigned owner);

// vlaked's side: creates `dir` and any missing parent with mode 0755 (owned by the effective
// uid), then check_state_dir(dir, geteuid()). Throws StateError.
void prepare_state_dir(const std::string& dir);

// The daemon's read-write mapping.
class StateSegment {
 public:
  enum class Origin { created, resumed };

  // `name` is a --state value (check_state_spec; segment_path gives the file). Prepares and
  // checks its directory (prepare_state_dir: throws StateError if another user could create names
  // there), then creates the segment exclusively (O_CREAT|O_EXCL|O_NOFOLLOW: never through a name that
  // already exists), zeroed, header filled; or resumes an existing one after checking that
  // nobody but this process's user can have written it (a regular file, not a symlink, owned
  // by the effective uid, no group/other write, one hard link) and its magic, layout version
  // and size. Throws StateError saying what is wrong and how to reset (remove the segment when
  // no tenant holds memory) on any of these, and when another daemon holds the segment (an
  // exclusive flock, held for this object's life: two daemons never write one segment). `mode`
  // (owner read-write, no group/other write; e.g. 0600, or 0640 with a group) and `gid` (-1:
  // unchanged) set who may map it read-only (vlakectl), on creation and on resume.
  explicit StateSegment(const std::string& name, unsigned mode = 0600, long gid = -1);
  ~StateSegment();
  StateSegment(const StateSegment&) = delete;
  StateSegment& operator=(const StateSegment&) = delete;

  [[nodiscard]] Origin origin() const noexcept { return origin_; }
  [[nodiscard]] State& state() noexcept { return *state_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  // A seqlock write bracket; nests (only the outermost bumps the generation).
  class Write {
   public:
    explicit Write(StateSegment& s) noexcept;
    ~Write();
    Write(const Write&) = delete;
    Write& operator=(const Write&) = delete;

   private:
    StateSegment& s_;
  };

  // Removes the segment's name (the mapping stays valid until destruction).
  void remove() noexcept;

 private:
  void release() noexcept;

  std::string name_;
  int fd_ = -1;  // open for this object's life: holds the flock
  void* base_ = nullptr;
  std::size_t mapped_ = 0;
  State* state_ = nullptr;
  Origin origin_ = Origin::created;
  int depth_ = 0;
};

// A read-only mapping for observers. The constructor checks the directory as vlaked does
// (check_state_dir with the directory's owner: a reader trusts whoever owns a safe directory),
// that the file is a regular file of that owner or root that nobody else can write, and its
// magic, layout version and size; throws StateError if absent, unsafe or mismatched.
class StateReader {
 public:
  explicit StateReader(const std::string& name);
  ~StateReader();
  StateReader(const StateReader&) = delete;
  StateReader& operator=(const StateReader&) = delete;

  // A consistent copy (retries while the daemon writes; throws StateError after ~1 s of
  // never seeing a stable generation).
  [[nodiscard]] std::unique_ptr<State> snapshot() const;

 private:
  const void* base_ = nullptr;
  std::size_t mapped_ = 0;
  const State* state_ = nullptr;
};

}  // namespace vlake::state
