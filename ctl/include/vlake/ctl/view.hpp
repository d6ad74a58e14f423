// vlake::ctl::NodeView — what vlakectl shows, built from one consistent snapshot of vlaked's
// state segment. THIS IS THE ONE PLACE that reads state records: every command renders
// a NodeView (render.hpp), so a new column (namespace, guaranteed, over-limit flag, a counter)
// is a field here, one line in build_view() (view.cpp), and a cell in render.cpp.
//
// Contract: build_view() is pure (no I/O; `daemon_alive` is passed in), thread-safe, and never
// throws on any State content (names are cut at their NUL or the field's size; device indexes
// in grants/sessions out of range are ignored). Sizes are in bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vlake/contracts/state.hpp"

namespace vlake::ctl {

struct GpuView {
  std::uint32_t index = 0;  // device ordinal
  std::string uuid;         // "GPU-xxxxxxxx-..."
  std::string uuid_short;   // "GPU-xxxxxxxx"
  std::uint64_t total = 0;
  std::uint64_t granularity = 0;
  std::uint64_t pool_bytes = 0;  // handles the daemon holds (free + granted)
  std::uint64_t granted = 0;     // live grants with handles
  std::uint64_t free = 0;        // free in the pool
  std::uint64_t free_handles = 0;
  // The largest grant the free pool serves without a new handle (stitched; docs/pool.md, "What
  // the free pool can serve"): for the best-placed tenant, and for a tenant with no bound handle.
  std::uint64_t largest_servable = 0;
  std::uint64_t largest_servable_new_tenant = 0;
  std::uint64_t orphaned = 0;    // grants whose handle died with a previous daemon
  std::uint64_t counted = 0;     // `counted` grants (no handle)
  std::uint64_t nonpool = 0;     // sampled memory outside the pool, all tenants
  std::uint64_t unhooked = 0;    // memory of processes without a session (NVML), all tenants
  std::uint64_t nvml_used = 0;   // device memory in use as NVML reports it (0: no NVML)
  std::uint64_t unlisted = 0;    // of it, charged to no process NVML lists (DeviceRecord)
  std::uint64_t guaranteed = 0;  // sum of the namespaces' guarantees on this GPU
  std::uint64_t borrowed = 0;    // memory held above their guarantees, all namespaces
  std::uint64_t swapped = 0;     // of its processes now on the host: what their checkpoints freed (docs/swap.md)
  std::uint64_t host = 0;        // of its granted memory, what is on the host tier now (exact; docs/swap.md)
  std::uint64_t retained = 0;    // released memory tenants can still reach, charged to them (all tenants)
  // vlaked's own process (never a tenant's): NVML's figure for it (0: not listed, or no NVML),
  // and of it what is not pool memory: its CUDA context.
  std::uint64_t daemon_nvml = 0;
  std::uint64_t daemon_context = 0;
};

struct SessionView {
  std::uint64_t id = 0;
  std::uint32_t pid = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint32_t tenant = 0;
  std::string state;  // "connected" | "detached"
  std::uint32_t grants = 0;
  // Activity: its last CUDA call (as its hook reports it), grant or Hello; idle = now - that
  // (none: unknown).
  std::uint64_t last_active_unix_ns = 0;
  std::optional<double> idle_seconds;
  bool reclaim = false;     // a framework gives back its cache when asked
  bool overcommit = false;  // its namespace may swap it to host memory
  // Swapping (docs/swap.md): "gpu", "notified", "checkpointing", "host", "restoring", "lost".
  std::string swap = "gpu";
  bool swapped_out = false;  // its memory is in host memory (state::swapped_out: host, restoring, lost)
  std::uint32_t swap_gpu = 0;
  std::uint64_t swap_bytes = 0;  // going out: its memory there; on the host: what its checkpoint freed
  std::uint64_t swap_since_unix_ns = 0;
  std::optional<double> swap_seconds;  // now - swap_since (none: never swapped, or unknown)
  std::uint64_t swap_for = 0;          // the session it is being swapped out for (0: none)
  std::uint32_t swap_outs = 0;
  std::uint32_t swap_ins = 0;
  std::uint64_t host_bytes = 0;  // of its grants, bytes on the host tier now (docs/swap.md, "Host tier")
  std::uint32_t moving = 0;      // of its grants, being moved between the GPU and the host tier now
  // Waiting: "" (not), "memory" (a grant waits for memory), "restore" (it waits to come back).
  std::string wait;
  std::uint32_t wait_gpu = 0;
  std::uint64_t wait_bytes = 0;
  std::uint64_t wait_since_unix_ns = 0;
  std::optional<double> wait_seconds;  // now - wait_since (none: not waiting, or unknown)
  std::uint64_t wait_deadline_unix_ns = 0;
  std::vector<std::uint64_t> waits_for;  // session ids (the first state::kMaxWaitsFor)
};

// One tenant on one GPU.
struct TenantGpuView {
  std::uint32_t gpu = 0;
  // granted + retained + nonpool + unhooked unless `enforce: account` (what the quota counts)
  std::uint64_t used = 0;
  std::uint64_t granted = 0;
  std::uint64_t retained = 0;      // released memory it can still reach (bound free handles, kept descriptors)
  std::uint64_t ipc_held = 0;      // of granted: grants it released that other processes' IPC imports keep
  std::uint64_t ipc_imported = 0;  // memory it maps from other tenants' grants (charged to them, not here)
  std::uint64_t nonpool = 0;
  std::uint64_t unhooked = 0;  // memory of its processes without a session: memory outside vlake
  std::uint64_t limit = 0;
  std::optional<std::uint64_t> guaranteed;  // its namespace's guarantee; none: "-" / null
  bool over_limit = false;                  // above its limit: grants refused until it drops
  std::string over_reason;                  // why (state::over_reason_name): "limit_lowered", "contexts",
                                            // "outside_vlake"; "" when not over
  double share_percent = 0;                 // used / GPU total * 100
  std::uint64_t swapped = 0;                // of its processes now on the host (docs/swap.md)
  std::uint64_t host = 0;                   // of its grants, bytes on the host tier now (exact)
};

struct TenantView {
  std::uint32_t id = 0;
  std::string name;                      // the tenant name ("research/user:alice", "uid:1000")
  std::string namespace_name;            // "default" for tenants outside any namespace
  std::vector<TenantGpuView> gpus;       // one per GPU in use, in GpuView order
  std::vector<SessionView> sessions;     // by session id
  std::vector<std::uint32_t> pids;       // of `sessions`, sorted, unique
  std::uint64_t grant_count = 0;         // live + orphaned grants
  std::string enforce;                   // its namespace's `enforce`: "account" | "refuse" | "kill"
  std::uint32_t unhooked_processes = 0;  // its processes on a GPU without a session
  std::int32_t priority = 0;             // its namespace's priority
  std::optional<double> idle_seconds;    // the least idle of its sessions (none: no session, or unknown)
  // Refusals of its requests since its record was created, by reason (state::RefusalReason order,
  // named by state::refusal_reason_name).
  std::vector<std::pair<std::string, std::uint64_t>> denials;
  // Its entries pushed out of the guard event ring and of the refusal ring (kept per tenant: by
  // its own newer entries, or a tenant's holding no fewer).
  std::uint64_t guard_events_evicted = 0;
  std::uint64_t refusals_evicted = 0;
};

// One refused request from the daemon's refusal ring (state.hpp RefusalRecord).
struct RefusalView {
  std::uint64_t seq = 0;
  std::uint64_t time_unix_ns = 0;
  std::string reason;  // state::refusal_reason_name()
  std::uint32_t tenant_id = 0;
  std::string tenant;  // "" when the tenant table was full
  std::uint32_t pid = 0;
  std::optional<std::uint32_t> gpu;
  std::uint64_t bytes = 0;
  std::uint64_t used = 0;
  std::uint64_t limit = 0;
  std::uint64_t waited_ms = 0;
};

// Who waits for whom (docs/notebooks.md): a waiting process and the processes its wait depends on.
struct WaitView {
  SessionView waiter;
  std::string tenant;
  std::int32_t priority = 0;
  struct For {
    std::uint64_t session = 0;
    std::uint32_t pid = 0;  // 0: the session is gone
    std::string tenant;
    std::string why;  // "swapping out" (for this waiter) or "asked to give back"
  };
  std::vector<For> waits_for;
  std::optional<double> waited_seconds;  // now - since
  std::optional<double> left_seconds;    // deadline - now
};

// One line of `top`: a tenant on a GPU.
struct TopRow {
  std::uint32_t gpu = 0;
  std::uint32_t tenant_id = 0;
  std::string tenant;
  std::string namespace_name;
  TenantGpuView usage;
  std::vector<std::uint32_t> pids;     // the tenant's sessions (a session spans all GPUs)
  std::optional<double> idle_seconds;  // the tenant's (TenantView::idle_seconds)
};

struct DaemonView {
  std::uint32_t layout_version = 0;
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  std::uint32_t starts = 0;
  bool clean = false;  // the last daemon stopped gracefully
  bool alive = false;  // `pid` runs and has `start_time` (caller-supplied)
  std::uint64_t updated_unix_ns = 0;
};

// One out-of-bounds alarm from the daemon's guard ring (pool/state.hpp GuardEventRecord).
struct GuardEventView {
  std::uint64_t seq = 0;
  std::uint64_t time_unix_ns = 0;
  std::string kind;          // "fault" (a kernel fault), "canary", "readonly_write"; "readonly": older daemons' faults
  bool guarded = false;      // fault: the process's allocations were in guard `fault` mode
  bool maps_shared = false;  // fault: the process mapped shared read-only chunks on that GPU
  std::uint32_t tenant_id = 0;
  std::string tenant;
  std::optional<std::uint32_t> gpu;  // none: the hook named a GPU the daemon does not know
  std::uint32_t pid = 0;
  std::uint64_t grant_id = 0;
  std::uint64_t address = 0;
  std::uint64_t requested_bytes = 0;
  std::uint64_t first_bad_offset = 0;
  std::uint64_t allocated_unix_ns = 0;
  std::int32_t cuda_status = 0;
  std::uint32_t live_allocations = 0;
  std::string call;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> suspects;  // (address, bytes)
};

// The quota configuration in force (state ConfigRecord).
struct ConfigView {
  std::string path;
  bool from_file = false;
  std::uint64_t generation = 0;
  bool rejected = false;   // the file on disk is rejected: the configuration in force is older
  std::string last_error;  // the last rejected file's "<file>:<line>:<col>: <what>" ("": none)
  std::uint64_t error_unix_ns = 0;
};

struct NodeView {
  DaemonView daemon;
  ConfigView config;
  std::vector<GpuView> gpus;                                    // by index
  std::vector<TenantView> tenants;                              // by id
  std::vector<std::pair<std::string, std::uint64_t>> counters;  // stable order, stable names
  std::uint64_t sessions = 0;                                   // sessions in the table
  std::uint64_t grants = 0;                                     // grants in the table
  std::vector<GuardEventView> events;                           // the guard ring, oldest first
  std::vector<RefusalView> refusals;                            // the refusal ring, oldest first
  std::uint64_t guard_events_evicted = 0;                       // pushed out of the guard ring so far
  std::uint64_t refusals_evicted = 0;                           // pushed out of the refusal ring so far
  std::vector<WaitView> waits;                                  // by waiting time, longest first
  std::uint64_t now_unix_ns = 0;                                // what idle and wait times are measured to
};

// `now_unix_ns`: the reader's clock for idle and wait times (0: the daemon's last update).
NodeView build_view(const state::State& s, bool daemon_alive, std::uint64_t now_unix_ns = 0);

// Every session, by tenant name then session id.
std::vector<std::pair<const TenantView*, const SessionView*>> all_sessions(const NodeView& v);

// The rows of `top` for every GPU (in GPU order, then by tenant name): the tenants that use
// memory on that GPU.
std::vector<TopRow> top_rows(const NodeView& v);

// Tenants with a session but no memory on any GPU (top lists them once, after the GPUs), by name.
std::vector<TenantView> idle_tenants(const NodeView& v);

}  // namespace vlake::ctl
