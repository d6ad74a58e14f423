#include "vlake/ctl/view.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "vlake/ctl/format.hpp"

namespace vlake::ctl {

namespace st = vlake::state;

namespace {

std::string bounded(const char* p, std::size_t n) { return std::string(p, strnlen(p, n)); }

// Seconds from `then` to `now` (none when either is unknown; 0 when `then` is later).
std::optional<double> seconds_between(std::uint64_t then, std::uint64_t now) {
  if (then == 0 || now == 0) return std::nullopt;
  return now > then ? static_cast<double>(now - then) / 1e9 : 0.0;
}

const char* swap_name(std::uint32_t swap) {
  switch (swap) {
    case st::kSwapNone: return "gpu";
    case st::kSwapNotified: return "notified";
    case st::kSwapCheckpointing: return "checkpointing";
    case st::kSwapHost: return "host";
    case st::kSwapRestoring: return "restoring";
    case st::kSwapLost: return "lost";
    default: return "unknown";
  }
}

}  // namespace

NodeView build_view(const st::State& s, bool daemon_alive, std::uint64_t now_unix_ns) {
  NodeView v;
  v.now_unix_ns = now_unix_ns != 0 ? now_unix_ns : s.header.updated_unix_ns;
  const st::Header& h = s.header;
  v.daemon.layout_version = h.layout_version;
  v.daemon.pid = h.daemon_pid;
  v.daemon.start_time = h.daemon_start_time;
  v.daemon.starts = h.starts;
  v.daemon.clean = h.clean != 0;
  v.daemon.alive = daemon_alive;
  v.daemon.updated_unix_ns = h.updated_unix_ns;
  v.config.path = bounded(s.config.path, sizeof s.config.path);
  v.config.from_file = s.config.from_file != 0;
  v.config.generation = s.config.generation;
  v.config.rejected = s.config.rejected != 0;
  v.config.last_error = bounded(s.config.last_error, sizeof s.config.last_error);
  v.config.error_unix_ns = s.config.error_unix_ns;

  for (std::uint32_t d = 0; d < st::kMaxDevices; ++d) {
    const st::DeviceRecord& r = s.devices[d];
    if (r.in_use == 0) continue;
    GpuView g;
    g.index = d;
    const Uuid uuid = Uuid::from_bytes(r.uuid);
    g.uuid = uuid.to_string();
    g.uuid_short = uuid_short(uuid);
    g.total = r.total;
    g.granularity = r.granularity;
    g.pool_bytes = r.pool_bytes;
    g.granted = r.granted_bytes;
    g.free = r.free_bytes;
    g.free_handles = r.free_handles;
    g.largest_servable = r.largest_servable_bytes;
    g.largest_servable_new_tenant = r.largest_servable_unbound_bytes;
    g.orphaned = r.orphaned_bytes;
    g.counted = r.counted_bytes;
    g.nonpool = r.nonpool_bytes;
    g.unhooked = r.unhooked_bytes;
    g.nvml_used = r.nvml_used_bytes;
    g.unlisted = r.unlisted_bytes;
    g.guaranteed = r.guaranteed_bytes;
    g.borrowed = r.borrowed_bytes;
    g.swapped = r.swapped_bytes;
    g.host = r.host_bytes;
    g.retained = r.retained_bytes;
    g.daemon_nvml = r.daemon_nvml_bytes;
    g.daemon_context = r.daemon_context_bytes;
    v.gpus.push_back(std::move(g));
  }

  // The host tier (layout 11): per session and per (tenant, GPU), summed from the grants on it.
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> session_host;  // id -> (bytes, moving)
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t> tenant_host;
  for (const st::GrantRecord& r : s.grants) {
    if (r.state == st::kGrantFree) continue;
    if (r.location == st::kGrantOnHost) {
      session_host[r.session].first += r.bytes;
      tenant_host[{r.tenant, r.device}] += r.bytes;
    } else if (r.location == st::kGrantToHost || r.location == st::kGrantToGpu) {
      ++session_host[r.session].second;
    }
  }
  // Sessions and grants per tenant id.
  std::map<std::uint32_t, std::vector<SessionView>> sessions;
  for (const st::SessionRecord& r : s.sessions) {
    if (r.state == st::kSessionFree) continue;
    ++v.sessions;
    SessionView x;
    x.id = r.id;
    x.pid = r.pid;
    x.uid = r.uid;
    x.gid = r.gid;
    x.tenant = r.tenant;
    x.state = r.state == st::kSessionConnected ? "connected" : r.state == st::kSessionDetached ? "detached" : "unknown";
    x.grants = r.grant_count;
    x.last_active_unix_ns = r.last_active_unix_ns;
    x.idle_seconds = seconds_between(r.last_active_unix_ns, v.now_unix_ns);
    x.reclaim = (r.flags & st::kSessionReclaim) != 0;
    x.overcommit = (r.flags & st::kSessionOvercommit) != 0;
    x.swap = swap_name(r.swap);
    x.swapped_out = st::swapped_out(r.swap);
    x.swap_gpu = r.swap_device;
    x.swap_bytes = r.swap_bytes;
    x.swap_since_unix_ns = r.swap_since_unix_ns;
    x.swap_seconds = seconds_between(r.swap_since_unix_ns, v.now_unix_ns);
    x.swap_for = r.swap_for;
    x.swap_outs = r.swap_outs;
    x.swap_ins = r.swap_ins;
    if (auto sh = session_host.find(r.id); sh != session_host.end()) {
      x.host_bytes = sh->second.first;
      x.moving = sh->second.second;
    }
    x.wait = r.wait == st::kWaitMemory ? "memory" : r.wait == st::kWaitRestore ? "restore" : "";
    if (!x.wait.empty()) {
      x.wait_gpu = r.wait_device;
      x.wait_bytes = r.wait_bytes;
      x.wait_since_unix_ns = r.wait_since_unix_ns;
      x.wait_seconds = seconds_between(r.wait_since_unix_ns, v.now_unix_ns);
      x.wait_deadline_unix_ns = r.wait_deadline_unix_ns;
      for (std::uint32_t i = 0; i < std::min(r.waits_for_count, st::kMaxWaitsFor); ++i) {
        x.waits_for.push_back(r.waits_for[i]);
      }
    }
    sessions[r.tenant].push_back(std::move(x));
  }
  std::map<std::uint32_t, std::uint64_t> grants;
  for (const st::GrantRecord& r : s.grants) {
    if (r.state == st::kGrantFree) continue;
    ++v.grants;
    ++grants[r.tenant];
  }

  std::map<std::uint32_t, const st::NamespaceRecord*> namespaces;
  for (const st::NamespaceRecord& n : s.namespaces) {
    if (n.in_use != 0) namespaces[n.id] = &n;
  }

  for (const st::TenantRecord& r : s.tenants) {
    if (r.in_use == 0) continue;
    TenantView t;
    t.id = r.id;
    t.name = bounded(r.name, sizeof r.name);
    const auto ns = namespaces.find(r.namespace_id);
    const st::NamespaceRecord* nsr = ns == namespaces.end() ? nullptr : ns->second;
    t.namespace_name = nsr != nullptr ? bounded(nsr->name, sizeof nsr->name) : "default";
    t.enforce = r.enforce == 0 ? "account" : r.enforce == 2 ? "kill" : "refuse";
    t.unhooked_processes = r.unhooked_processes;
    t.priority = nsr != nullptr ? nsr->priority : 0;
    for (std::uint32_t i = 0; i < st::kRefusalReasons; ++i)
      t.denials.emplace_back(st::refusal_reason_name(i + 1), r.denials[i]);
    t.guard_events_evicted = r.guard_events_evicted;
    t.refusals_evicted = r.refusals_evicted;
    for (const GpuView& g : v.gpus) {
      TenantGpuView u;
      u.gpu = g.index;
      u.granted = r.granted[g.index];
      u.nonpool = r.nonpool[g.index];
      u.unhooked = r.unhooked[g.index];
      u.retained = r.retained[g.index];
      u.ipc_held = r.ipc_held[g.index];
      u.ipc_imported = r.ipc_imported[g.index];
      u.used = u.granted + u.retained + u.nonpool + (r.enforce != 0 ? u.unhooked : 0);
      u.limit = r.limit[g.index];
      if (nsr != nullptr && nsr->guaranteed[g.index] != 0) u.guaranteed = nsr->guaranteed[g.index];
      u.over_limit = (r.over_limit & (1u << g.index)) != 0;
      u.over_reason = u.over_limit ? st::over_reason_name(r.over_reason[g.index]) : "";
      if (u.over_limit && u.over_reason.empty()) u.over_reason = "unknown";
      u.share_percent = share_percent(Bytes{u.used}, Bytes{g.total});
      if (auto th = tenant_host.find({r.id, g.index}); th != tenant_host.end()) u.host = th->second;
      t.gpus.push_back(u);
    }
    if (auto it = sessions.find(r.id); it != sessions.end()) {
      t.sessions = std::move(it->second);
      std::sort(t.sessions.begin(), t.sessions.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
      for (const auto& x : t.sessions) {
        t.pids.push_back(x.pid);
        if (x.idle_seconds && (!t.idle_seconds || *x.idle_seconds < *t.idle_seconds)) t.idle_seconds = x.idle_seconds;
        for (TenantGpuView& u : t.gpus) {
          if (x.swapped_out && u.gpu == x.swap_gpu) u.swapped += x.swap_bytes;
        }
      }
      std::sort(t.pids.begin(), t.pids.end());
      t.pids.erase(std::unique(t.pids.begin(), t.pids.end()), t.pids.end());
    }
    if (auto it = grants.find(r.id); it != grants.end()) t.grant_count = it->second;
    v.tenants.push_back(std::move(t));
  }
  std::sort(v.tenants.begin(), v.tenants.end(), [](const auto& a, const auto& b) { return a.id < b.id; });

  // The guard ring, oldest first (kept per tenant: not in slot order).
  v.guard_events_evicted = s.guard.evicted;
  v.refusals_evicted = s.refusals.evicted;
  for (const st::GuardEventRecord* ep : st::ring_order(s.guard)) {
    const st::GuardEventRecord& e = *ep;
    GuardEventView x;
    x.seq = e.seq;
    x.time_unix_ns = e.time_unix_ns;
    // Kind 3 ("readonly") only in records of older daemons: a fault in a process mapping shared chunks.
    x.kind = e.kind == 1   ? "fault"
             : e.kind == 2 ? "canary"
             : e.kind == 3 ? "readonly"
             : e.kind == 4 ? "readonly_write"
                           : "unknown";
    if (e.kind == 1) {
      x.guarded = (e.flags & st::kFaultGuarded) != 0;
      x.maps_shared = (e.flags & st::kFaultMapsShared) != 0;
    }
    x.tenant_id = e.tenant;
    x.tenant = bounded(e.tenant_name, sizeof e.tenant_name);
    if (e.device != st::kGuardNoDevice) x.gpu = e.device;
    x.pid = e.pid;
    x.grant_id = e.grant_id;
    x.address = e.address;
    x.requested_bytes = e.requested_bytes;
    x.first_bad_offset = e.first_bad_offset;
    x.allocated_unix_ns = e.allocated_unix_ns;
    x.cuda_status = e.cuda_status;
    x.live_allocations = e.live_allocations;
    x.call = bounded(e.call, sizeof e.call);
    for (std::uint32_t i = 0; i < std::min(e.suspect_count, st::kGuardEventSuspects); ++i) {
      x.suspects.emplace_back(e.suspects[i].address, e.suspects[i].bytes);
    }
    v.events.push_back(std::move(x));
  }

  // The refusal ring, as the guard ring.
  for (const st::RefusalRecord* ep : st::ring_order(s.refusals)) {
    const st::RefusalRecord& e = *ep;
    RefusalView x;
    x.seq = e.seq;
    x.time_unix_ns = e.time_unix_ns;
    x.reason = st::refusal_reason_name(e.reason);
    x.tenant_id = e.tenant;
    x.tenant = bounded(e.tenant_name, sizeof e.tenant_name);
    x.pid = e.pid;
    if (e.device != st::kGuardNoDevice) x.gpu = e.device;
    x.bytes = e.bytes;
    x.used = e.used;
    x.limit = e.limit;
    x.waited_ms = e.waited_ms;
    v.refusals.push_back(std::move(x));
  }

  // Who waits for whom.
  std::map<std::uint64_t, std::pair<const TenantView*, const SessionView*>> by_id;
  for (const TenantView& t : v.tenants) {
    for (const SessionView& x : t.sessions) by_id[x.id] = {&t, &x};
  }
  for (const auto& [id, ts] : by_id) {
    const auto& [t, x] = ts;
    if (x->wait.empty()) continue;
    WaitView w;
    w.waiter = *x;
    w.tenant = t->name;
    w.priority = t->priority;
    w.waited_seconds = x->wait_seconds;
    if (x->wait_deadline_unix_ns != 0 && v.now_unix_ns != 0) {
      w.left_seconds = x->wait_deadline_unix_ns > v.now_unix_ns
                           ? static_cast<double>(x->wait_deadline_unix_ns - v.now_unix_ns) / 1e9
                           : 0.0;
    }
    for (std::uint64_t f : x->waits_for) {
      WaitView::For o;
      o.session = f;
      if (auto it = by_id.find(f); it != by_id.end()) {
        o.pid = it->second.second->pid;
        o.tenant = it->second.first->name;
        o.why = it->second.second->swap_for == id ? "swapping out" : "asked to give back";
      } else {
        o.why = "gone";
      }
      w.waits_for.push_back(std::move(o));
    }
    v.waits.push_back(std::move(w));
  }
  std::stable_sort(v.waits.begin(), v.waits.end(), [](const WaitView& a, const WaitView& b) {
    return a.waiter.wait_since_unix_ns < b.waiter.wait_since_unix_ns;
  });

  const st::Counters& c = s.counters;
  v.counters = {
      {"grants", c.grants},
      {"denials_over_limit", c.denials_over_limit},
      {"denials_out_of_memory", c.denials_out_of_memory},
      {"denials_unknown_device", c.denials_unknown_device},
      {"denials_other", c.denials_other},
      {"releases", c.releases},
      {"releases_exported", c.releases_exported},
      {"process_exits", c.process_exits},
      {"scrubs", c.scrubs},
      {"reuses", c.reuses},
      {"handles_created", c.handles_created},
      {"handles_released", c.handles_released},
      {"malformed", c.malformed},
      {"sessions_opened", c.sessions_opened},
      {"sessions_rebound", c.sessions_rebound},
      {"nvml_samples", c.nvml_samples},
      {"denials_tenant_limit", c.denials_tenant_limit},
      {"denials_namespace_limit", c.denials_namespace_limit},
      {"denials_guarantee", c.denials_guarantee},
      {"denials_unhooked", c.denials_unhooked},
      {"unhooked_kills", c.unhooked_kills},
      {"passthrough_refused", c.passthrough_refused},
      {"config_reloads", c.config_reloads},
      {"config_reload_errors", c.config_reload_errors},
      {"denials_session_cap", c.denials_session_cap},
      {"denials_grant_cap", c.denials_grant_cap},
      {"denials_tenant_table", c.denials_tenant_table},
      {"denials_connection_cap", c.denials_connection_cap},
      {"denials_unauthenticated", c.denials_unauthenticated},
      {"guard_events_rejected", c.guard_events_rejected},
      {"guard_events_limited", c.guard_events_limited},
      {"guard_violations_canary", c.guard_violations_canary},
      {"guard_readonly_writes", c.guard_violations_readonly_write},
      {"kernel_faults", c.kernel_faults[0] + c.kernel_faults[1] + c.kernel_faults[2] + c.kernel_faults[3]},
      {"kernel_faults_guarded", c.kernel_faults[st::kFaultGuarded] + c.kernel_faults[3]},
      {"kernel_faults_shared", c.kernel_faults[st::kFaultMapsShared] + c.kernel_faults[3]},
      {"log_suppressed", c.log_suppressed},
      {"tenants_freed", c.tenants_freed},
      {"swap_outs", c.swap_outs},
      {"swap_ins", c.swap_ins},
      {"swap_failures", c.swap_failures},
      {"swap_timeouts", c.swap_timeouts},
      {"swap_out_bytes", c.swap_out_bytes},
      {"swap_in_bytes", c.swap_in_bytes},
      {"swap_out_ns", c.swap_out_ns},
      {"swap_in_ns", c.swap_in_ns},
      {"refusals_recorded", c.refusals_recorded},
  };
  return v;
}

std::vector<std::pair<const TenantView*, const SessionView*>> all_sessions(const NodeView& v) {
  std::vector<std::pair<const TenantView*, const SessionView*>> out;
  for (const TenantView& t : v.tenants) {
    for (const SessionView& x : t.sessions) out.emplace_back(&t, &x);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first->name != b.first->name ? a.first->name < b.first->name : a.second->id < b.second->id;
  });
  return out;
}

std::vector<TopRow> top_rows(const NodeView& v) {
  std::vector<TopRow> rows;
  for (std::size_t gi = 0; gi < v.gpus.size(); ++gi) {
    std::vector<TopRow> here;
    for (const TenantView& t : v.tenants) {
      const TenantGpuView& u = t.gpus[gi];
      if (u.used == 0 && u.unhooked == 0) continue;
      TopRow r;
      r.gpu = v.gpus[gi].index;
      r.tenant_id = t.id;
      r.tenant = t.name;
      r.namespace_name = t.namespace_name;
      r.usage = u;
      r.pids = t.pids;
      r.idle_seconds = t.idle_seconds;
      here.push_back(std::move(r));
    }
    std::sort(here.begin(), here.end(), [](const TopRow& a, const TopRow& b) {
      return a.tenant != b.tenant ? a.tenant < b.tenant : a.tenant_id < b.tenant_id;
    });
    rows.insert(rows.end(), here.begin(), here.end());
  }
  return rows;
}

std::vector<TenantView> idle_tenants(const NodeView& v) {
  std::vector<TenantView> out;
  for (const TenantView& t : v.tenants) {
    if (t.sessions.empty()) continue;
    bool uses = false;
    for (const TenantGpuView& u : t.gpus) uses = uses || u.used != 0 || u.unhooked != 0;
    if (!uses) out.push_back(t);
  }
  std::sort(out.begin(), out.end(),
            [](const TenantView& a, const TenantView& b) { return a.name != b.name ? a.name < b.name : a.id < b.id; });
  return out;
}

}  // namespace vlake::ctl
