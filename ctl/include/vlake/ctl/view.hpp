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
};

struct SessionView {
  std::uint64_t id = 0;
  std::uint32_t pid = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint32_t tenant = 0;
  std::string state;  // "connected" | "detached"
  std::uint32_t grants = 0;
};

// One tenant on one GPU.
struct TenantGpuView {
  std::uint32_t gpu = 0;
  std::uint64_t used = 0;  // granted + nonpool + unhooked unless `enforce: account` (what the quota counts)
  std::uint64_t granted = 0;
  std::uint64_t nonpool = 0;
  std::uint64_t unhooked = 0;  // memory of its processes without a session: memory outside vlake
  std::uint64_t limit = 0;
  std::optional<std::uint64_t> guaranteed;  // its namespace's guarantee; none: "-" / null
  bool over_limit = false;                  // a lowered limit left it above: grants refused until it drops
  double share_percent = 0;                 // used / GPU total * 100
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
};

// One line of `top`: a tenant on a GPU.
struct TopRow {
  std::uint32_t gpu = 0;
  std::uint32_t tenant_id = 0;
  std::string tenant;
  std::string namespace_name;
  TenantGpuView usage;
  std::vector<std::uint32_t> pids;  // the tenant's sessions (a session spans all GPUs)
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

struct NodeView {
  DaemonView daemon;
  std::vector<GpuView> gpus;                                    // by index
  std::vector<TenantView> tenants;                              // by id
  std::vector<std::pair<std::string, std::uint64_t>> counters;  // stable order, stable names
  std::uint64_t sessions = 0;                                   // sessions in the table
  std::uint64_t grants = 0;                                     // grants in the table
  std::vector<GuardEventView> events;                           // the guard ring, oldest first
};

NodeView build_view(const state::State& s, bool daemon_alive);

// The rows of `top` for every GPU (in GPU order, then by tenant name): the tenants that use
// memory on that GPU.
std::vector<TopRow> top_rows(const NodeView& v);

// Tenants with a session but no memory on any GPU (top lists them once, after the GPUs), by name.
std::vector<TenantView> idle_tenants(const NodeView& v);

}  // namespace vlake::ctl
