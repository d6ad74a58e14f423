// vlake::ctl rendering: a NodeView as text (for people) or JSON (for scripts; stable keys,
// sizes in bytes, one document). Text sizes are human (MiB/GiB with one decimal).
//
// JSON documents (keys are stable; new keys may be added, none removed or renamed):
//   top:     {state, daemon{...}, gpus[{index, uuid, total, pool_bytes, granted, free, nonpool,
//             tenants[{id, name, used, granted, nonpool, unhooked, limit, guaranteed|null,
//             share_percent, sessions, pids[]}]}], idle_tenants[{id, name, sessions, pids[]}]}
//            (gpus[].tenants: tenants holding memory on that GPU; idle_tenants: connected
//            tenants holding none anywhere)
//   tenants: {state, tenants[{id, name, enforce, unhooked_processes, grant_count, pids[],
//             sessions[{id, pid, uid, gid, state, grants}], gpus[{index, used, granted, nonpool,
//             unhooked, limit, guaranteed|null,
//             share_percent}]}]}
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
// The guard alarms, oldest first: a table, or {"state", "daemon", "events": [...]}.
std::string render_events_text(const NodeView& v, const std::string& state);
std::string render_events_json(const NodeView& v, const std::string& state);

}  // namespace vlake::ctl
