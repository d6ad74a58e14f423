// vlake::pool::Node: memory outside vlake — NVML's view of every process on the node's GPUs,
// attributed to tenants whether or not the process holds a session, and the `enforce` policy
// (account, refuse, kill) of docs/quota.md. See docs/daemon.md, "Memory outside vlake".
#include <algorithm>
#include <set>
#include <unordered_set>

#include "vlake/pool/node.hpp"

namespace vlake::pool {

void Node::charge_unhooked(Tenant& t) {
  for (const Device& d : devices_) {
    const auto i = static_cast<std::size_t>(d.ordinal.value());
    const bool charged = t.enforce != quota::Enforce::account;
    acct_.set_unhooked(t.id, d.ordinal, Bytes{charged ? rooms_.unhooked.of(t.id).bytes[i] : 0});
  }
}

// Over its own limit on a GPU, or its namespace over its limit on a GPU where this tenant has
// memory outside vlake (tenants of the namespace that use none are not what broke it).
bool Node::over_a_limit(const Tenant& t) const {
  for (const Device& d : devices_) {
    const Accounting::Usage u = acct_.usage(t.id, d.ordinal);
    if (u.used() > u.limit) return true;
    if (rooms_.unhooked.of(t.id).bytes[static_cast<std::size_t>(d.ordinal.value())] == 0) continue;
    const Accounting::NamespaceUsage nu = acct_.namespace_usage(t.ns, d.ordinal);
    if (nu.used() > nu.limit) return true;
  }
  return false;
}

Bytes Node::unlisted_memory(const GpuSample& g) const {
  const Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  std::set<std::uint32_t> here;
  std::uint64_t known = 0;
  for (const ProcessUsage& p : g.processes) {
    here.insert(p.pid);
    known += p.used.value();
  }
  known += dev.pool->held_fd_bytes().value();
  if (here.count(settings_.daemon_pid) == 0) known += dev.pool->pool_bytes().value();
  for (const auto& [gid, gr] : grants_) {
    if (gr.device != g.device || (!gr.orphaned && gr.purpose != proto::GrantPurpose::counted)) continue;
    const auto s = sessions_.find(gr.session);
    if (s == sessions_.end() || here.count(s->second.pid) == 0) known += gr.bytes.value();
  }
  return Bytes{g.used.value() > known ? g.used.value() - known : 0};
}

Node::Tenant* Node::unhooked_tenant(const ProcessIdentity& p) {
  if (const std::optional<TenantId> known = rooms_.unhooked.cached(p.pid, p.start_time)) {
    if (Tenant* t = tenant_mut(*known)) return t;
  }
  Tenant* t = nullptr;
  for (const std::string& a : p.alloc_ids) {
    if (auto it = allocs_.find(a); it != allocs_.end()) {
      t = &tenant_for_alloc(it->second);
      break;
    }
  }
  if (t == nullptr) t = &tenant_for_uid(p.uid, p.gid);
  rooms_.unhooked.remember(p.pid, p.start_time, t->id);
  return t;
}

void Node::observe_gpus(const std::vector<GpuSample>& sample, const std::vector<ProcessIdentity>& ids, Now now,
                        const std::vector<ProcessIdentity>& users) {
  // Pids holding a session (connected or detached): today's non-pool rule, with their admitted
  // contexts (node_contexts.cpp).
  observe_contexts(sample);
  set_nonpool(attribute_nonpool(sample, nonpool_inputs()));
  std::unordered_set<std::uint32_t> session_pids;
  for (const auto& [sid, s] : sessions_) session_pids.insert(s.pid);
  std::unordered_map<std::uint32_t, const ProcessIdentity*> by_pid;
  for (const ProcessIdentity& id : ids) by_pid[id.pid] = &id;
  for (const ProcessIdentity& id : users) by_pid.emplace(id.pid, &id);

  // Every other pid: its tenant, as a session of that process would resolve.
  std::map<std::uint32_t, std::array<std::uint64_t, st::kMaxDevices>> unhooked;  // by tenant id
  std::map<std::uint32_t, std::map<std::uint32_t, UnhookedProcess>> procs;
  for (const GpuSample& g : sample) {
    Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
    dev.nvml_used = g.used;
    Bytes daemon{0};
    for (const ProcessUsage& p : g.processes) {
      if (p.pid == settings_.daemon_pid) daemon += p.used;
    }
    if (daemon != dev.daemon_nvml) changes_.devices = true;
    dev.daemon_nvml = daemon;
    for (const ProcessUsage& p : g.processes) {
      if (p.pid == settings_.daemon_pid || session_pids.count(p.pid) != 0) continue;
      const auto id = by_pid.find(p.pid);
      if (id == by_pid.end()) continue;
      const ProcessIdentity& pi = *id->second;
      Tenant* t = nullptr;
      try {
        t = unhooked_tenant(pi);
      } catch (const std::exception& e) {
        log_.warn("pid " + std::to_string(p.pid) + " uses GPU memory outside vlake but has no tenant: " + e.what());
        continue;
      }
      unhooked[t->id.value()][static_cast<std::size_t>(g.device.value())] += p.used.value();
      UnhookedProcess& up = procs[t->id.value()][p.pid];
      up.pid = p.pid;
      up.start_time = pi.start_time;
      up.bytes += p.used;
    }
  }

  // Memory NVML charges to no process: split among the GPU users it does not list.
  std::set<std::uint32_t> listed;
  for (const GpuSample& g : sample) {
    for (const ProcessUsage& p : g.processes) listed.insert(p.pid);
  }
  std::unordered_map<std::uint32_t, TenantId> session_tenant;
  for (const auto& [sid, s] : sessions_) session_tenant.emplace(s.pid, s.tenant);
  std::vector<const ProcessIdentity*> unlisted_users;
  for (const ProcessIdentity& u : users) {
    if (u.pid != settings_.daemon_pid && listed.count(u.pid) == 0) unlisted_users.push_back(&u);
  }
  for (const GpuSample& g : sample) {
    Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
    const Bytes unlisted = unlisted_memory(g);
    if (unlisted != dev.unlisted) changes_.devices = true;
    dev.unlisted = unlisted;
    if (unlisted <= kUnlistedTolerance || unlisted_users.empty()) continue;
    const std::uint64_t share = unlisted.value() / unlisted_users.size();
    for (const ProcessIdentity* u : unlisted_users) {
      Tenant* t = nullptr;
      const auto st = session_tenant.find(u->pid);
      try {
        t = st != session_tenant.end() ? tenant_mut(st->second) : unhooked_tenant(*u);
      } catch (const std::exception& e) {
        log_.warn("pid " + std::to_string(u->pid) +
                  " may use GPU memory NVML does not list but has no tenant: " + e.what());
      }
      if (t == nullptr) continue;
      unhooked[t->id.value()][static_cast<std::size_t>(g.device.value())] += share;
      if (st != session_tenant.end()) continue;  // a session's process is never killed
      UnhookedProcess& up = procs[t->id.value()][u->pid];
      up.pid = u->pid;
      up.start_time = u->start_time;
      up.bytes += Bytes{share};
    }
  }

  // Forget processes that left the GPUs.
  rooms_.unhooked.prune([&](std::uint32_t pid, std::uint64_t start_time) {
    const auto p = by_pid.find(pid);
    return p != by_pid.end() && p->second->start_time == start_time;
  });

  std::vector<KillOrder>& kills = fx_.kills;
  for (auto& [tid, t] : tenants_) {
    std::array<std::uint64_t, st::kMaxDevices> now_bytes{};
    if (auto it = unhooked.find(tid); it != unhooked.end()) now_bytes = it->second;
    std::vector<UnhookedProcess> now_procs;
    if (auto it = procs.find(tid); it != procs.end()) {
      for (const auto& [pid, up] : it->second) now_procs.push_back(up);
    }
    for (const UnhookedProcess& up : rooms_.unhooked.newcomers(t.id, now_procs)) {
      log_.info("tenant " + t.name + ": pid " + std::to_string(up.pid) + " uses " + std::to_string(up.bytes.value()) +
                " bytes of GPU memory outside vlake (enforce: " + quota::enforce_name(t.enforce) + ")");
    }
    if (rooms_.unhooked.record(t.id, now_bytes, std::move(now_procs))) touch_tenant(t.id);
    charge_unhooked(t);

    // enforce: kill — over a limit for kill_grace with processes outside vlake: they go.
    const UnhookedUse& use = rooms_.unhooked.of(t.id);
    const bool over = t.enforce == quota::Enforce::kill && !use.procs.empty() && over_a_limit(t);
    if (over && !use.over_since) {
      log_.warn("tenant " + t.name + " is over its limit with " + std::to_string(use.procs.size()) +
                " process(es) using GPU memory outside vlake; they are killed in " +
                std::to_string(t.kill_grace.count()) + " ms unless it gets back under (enforce: kill)");
    }
    if (rooms_.unhooked.over_limit(t.id, over, now.steady, t.kill_grace) != UnhookedBook::Verdict::kill) continue;
    for (const UnhookedProcess& up : use.procs) {
      kills.push_back(KillOrder{up.pid, up.start_time, t.id, t.name, up.bytes});
    }
  }
  audit_counted(sample, now);  // counted grants against what NVML shows (node_swap.cpp)
  changes_.devices = true;
}

void Node::unhooked_killed(const KillOrder& k, bool killed) {
  if (killed) {
    ++counters_.unhooked_kills;
    log_.warn("killed pid " + std::to_string(k.pid) + " of tenant " + k.tenant_name + ": " +
              std::to_string(k.bytes.value()) +
              " bytes of GPU memory outside vlake while the tenant stayed over its limit (enforce: kill)");
  } else {
    log_.info("pid " + std::to_string(k.pid) + " of tenant " + k.tenant_name +
              " was to be killed (enforce: kill) but is gone or could not be signalled");
  }
  changes_.all = true;
}

}  // namespace vlake::pool
