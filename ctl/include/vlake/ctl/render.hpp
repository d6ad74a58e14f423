// vlake::ctl rendering: a NodeView as text (for people) or JSON (for scripts; stable keys,
// sizes in bytes, one document). Text sizes are human (MiB/GiB with one decimal).
//
// JSON documents (keys are stable; new keys may be added, none removed or renamed):
//   top:     {state, daemon{...}, gpus[{index, uuid, total, pool_bytes, granted, free, nonpool,
//             tenants[{id, name, used, granted, nonpool, unhooked, limit, guaranteed|null,
//             share_percent, swapped, idle_seconds|null, sessions, pids[]}]}],
//             idle_tenants[{id, name, sessions, pids[]}], waits[...as `waits`]}
//            (gpus[].tenants: tenants holding memory on that GPU; idle_tenants: connected
//            tenants holding none anywhere)
//   tenants: {state, tenants[{id, name, enforce, unhooked_processes, grant_count, priority,
//             idle_seconds|null, denials{tenant_limit, ..., restore_timeout}, pids[],
//             sessions[{...as `processes`}], gpus[{index, used, granted, nonpool,
//             unhooked, limit, guaranteed|null, share_percent, swapped}]}]}
//   pool:    {state, daemon{...}, sessions, grants, gpus[{index, uuid, total, granularity,
//             pool_bytes, granted, free, free_handles, largest_servable,
//             largest_servable_new_tenant, orphaned, counted, nonpool, unhooked,
//             nvml_used, unlisted, guaranteed, borrowed}],
//             counters{grants, denials_over_limit, ...}}
//   daemon{} = {layout_version, pid, start_time, starts, clean, running, updated_unix_ns}
//
// Contract: pure functions of their arguments; thread-safe; no errors.
#pragma once

#include <string>

#include "vlake/ctl/view.hpp"

namespace vlake::ctl {

// `stamp`: a time to show in the heading ("" for none; --watch passes the wall clock).
std::string render_top_text(const NodeView& v, const std::string& state, const std::string& stamp = "");
std::string render_top_json(const NodeView& v, const std::string& state);
std::string render_tenants_text(const NodeView& v, const std::string& state);
std::string render_tenants_json(const NodeView& v, const std::string& state);
std::string render_pool_text(const NodeView& v, const std::string& state);
std::string render_pool_json(const NodeView& v, const std::string& state);
// Every process with a session: activity (IDLE), reclaim, swap state and what it waits for; or
// {"state", "daemon", "now_unix_ns", "processes": [{tenant_id, tenant, namespace, id, pid, uid,
// gid, state, grants, last_active_unix_ns, idle_seconds|null, reclaim, overcommit,
// swap{state, gpu, bytes, since_unix_ns, for_session, swap_outs, swap_ins},
// wait: null|{for, gpu, bytes, since_unix_ns, deadline_unix_ns, waits_for[]}}]}.
std::string render_processes_text(const NodeView& v, const std::string& state);
std::string render_processes_json(const NodeView& v, const std::string& state);
// Who waits for whom (docs/notebooks.md): {"state", "daemon", "now_unix_ns", "waits":
// [{session, pid, tenant, priority, for, gpu, bytes, since_unix_ns, deadline_unix_ns,
// waited_seconds, left_seconds, waits_for[{session, pid, tenant, why}]}]}.
std::string render_waits_text(const NodeView& v, const std::string& state);
std::string render_waits_json(const NodeView& v, const std::string& state);
// The guard alarms, then the refused requests, oldest first: tables, or {"state", "daemon",
// "events": [...], "refusals": [{seq, time_unix_ns, reason, tenant_id, tenant, gpu|null, pid,
// bytes, used, limit, waited_ms}]}.
std::string render_events_text(const NodeView& v, const std::string& state);
std::string render_events_json(const NodeView& v, const std::string& state);

}  // namespace vlake::ctl
