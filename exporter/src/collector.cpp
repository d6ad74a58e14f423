#include "vlake/exporter/collector.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>

#include "vlake/common/uuid.hpp"

namespace vlake::exporter {

namespace st = vlake::state;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

namespace {

std::string bounded(const char* p, std::size_t n) { return std::string(p, strnlen(p, n)); }

double d(std::uint64_t v) { return static_cast<double>(v); }

class Families {
 public:
  MetricFamily& add(const std::string& name, MetricType type, const std::string& help) {
    MetricFamily f;
    f.name = name;
    f.type = type;
    f.help = help;
    out_.push_back(std::move(f));
    return out_.back();
  }
  MetricFamily& gauge(const std::string& name, const std::string& help) { return add(name, MetricType::Gauge, help); }
  MetricFamily& counter(const std::string& name, const std::string& help) {
    return add(name, MetricType::Counter, help);
  }
  std::vector<MetricFamily> take() {
    return std::vector<MetricFamily>(std::make_move_iterator(out_.begin()), std::make_move_iterator(out_.end()));
  }

 private:
  std::deque<MetricFamily> out_;  // references stay valid while families are added
};

void set(MetricFamily& f, Labels labels, double v) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) m.counter.value = v;
  else m.gauge.value = v;
  f.metric.push_back(std::move(m));
}

struct Gpu {
  std::uint32_t index;
  Labels labels;
  const st::DeviceRecord* rec;
};

Labels join(const Labels& a, const Labels& b) {
  Labels r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

// Labels of kernel fault counter i (st::FaultAttributes bits).
Labels fault_labels(std::uint32_t i) {
  return {{"guarded", (i & st::kFaultGuarded) != 0 ? "true" : "false"},
          {"maps_shared", (i & st::kFaultMapsShared) != 0 ? "true" : "false"}};
}

std::uint64_t interval_ns(const st::Header& h) {
  return static_cast<std::uint64_t>(h.sample_interval_ms == 0 ? 1000 : h.sample_interval_ms) * 1'000'000ULL;
}

}  // namespace

std::uint64_t realtime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<std::uint64_t>(ts.tv_nsec);
}

BuildInfo this_build() {
#ifndef VLAKE_VERSION
#define VLAKE_VERSION "unknown"
#endif
#ifndef VLAKE_REVISION
#define VLAKE_REVISION "unknown"
#endif
  return BuildInfo{VLAKE_VERSION, VLAKE_REVISION};
}

Health evaluate_health(const st::State& s, std::uint64_t now_ns) {
  const st::Header& h = s.header;
  if (h.daemon_pid == 0) return {false, "no daemon has written the state segment"};
  if (h.clean != 0) return {false, "the daemon stopped (graceful shutdown)"};
  const std::uint64_t limit = 3 * interval_ns(h);
  const std::uint64_t age = now_ns > h.updated_unix_ns ? now_ns - h.updated_unix_ns : 0;
  if (age > limit) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "the daemon (pid %u) has not refreshed its state for %.3f s (limit %.3f s)",
                  h.daemon_pid, d(age) / 1e9, d(limit) / 1e9);
    return {false, buf};
  }
  return {true, ""};
}

double fragmentation_ratio(std::uint64_t largest_servable, std::uint64_t free_bytes) {
  if (free_bytes == 0) return 0.0;
  const double r = 1.0 - d(std::min(largest_servable, free_bytes)) / d(free_bytes);
  return std::clamp(r, 0.0, 1.0);
}

std::vector<MetricFamily> build_families(const st::State& s, std::uint64_t now_ns, const BuildInfo& build,
                                         const Exposure& exposure) {
  Families F;
  const st::Header& h = s.header;
  const st::Counters& c = s.counters;

  set(F.gauge("vlake_build_info", "vlake build (always 1)"), {{"version", build.version}, {"revision", build.revision}},
      1);
  set(F.gauge("vlake_daemon_up", "1 if the daemon refreshed its state within 3 sample intervals"), {},
      evaluate_health(s, now_ns).up ? 1 : 0);
  set(F.gauge("vlake_daemon_starts", "daemon starts on this state segment"), {}, h.starts);
  set(F.gauge("vlake_state_age_seconds", "seconds since the daemon last refreshed the state"), {},
      now_ns > h.updated_unix_ns ? d(now_ns - h.updated_unix_ns) / 1e9 : 0.0);

  // GPUs
  std::vector<Gpu> gpus;
  for (std::uint32_t i = 0; i < st::kMaxDevices; ++i) {
    const st::DeviceRecord& r = s.devices[i];
    if (r.in_use == 0) continue;
    gpus.push_back(Gpu{i, {{"gpu", Uuid::from_bytes(r.uuid).to_string()}, {"gpu_index", std::to_string(i)}}, &r});
  }
  auto per_gpu = [&](const std::string& name, const std::string& help, auto value) {
    MetricFamily& f = F.gauge(name, help);
    for (const Gpu& g : gpus) set(f, g.labels, value(*g.rec));
  };
  per_gpu("vlake_gpu_memory_total_bytes", "GPU capacity", [](const st::DeviceRecord& r) { return d(r.total); });
  per_gpu("vlake_pool_reserved_bytes", "memory the pool holds as handles (free + granted)",
          [](const st::DeviceRecord& r) { return d(r.pool_bytes); });
  per_gpu("vlake_pool_free_bytes", "free in the pool", [](const st::DeviceRecord& r) { return d(r.free_bytes); });
  per_gpu("vlake_pool_granted_bytes", "granted to tenants (with handles)",
          [](const st::DeviceRecord& r) { return d(r.granted_bytes); });
  per_gpu("vlake_pool_orphaned_bytes", "grants whose handle died with an earlier daemon",
          [](const st::DeviceRecord& r) { return d(r.orphaned_bytes); });
  per_gpu("vlake_pool_free_handles", "handles in the free pool",
          [](const st::DeviceRecord& r) { return d(r.free_handles); });
  per_gpu("vlake_pool_fragmentation_ratio",
          "share of the free pool the largest grant servable from it without a new handle cannot use: 1 - "
          "largest servable / free bytes (stitching, the 32-handle limit and tenant binding included); 0 when empty",
          [](const st::DeviceRecord& r) { return fragmentation_ratio(r.largest_servable_bytes, r.free_bytes); });
  per_gpu("vlake_pool_largest_servable_bytes",
          "largest grant one tenant can be served from the free pool without a new handle (stitched)",
          [](const st::DeviceRecord& r) { return d(r.largest_servable_bytes); });
  per_gpu("vlake_pool_largest_servable_new_tenant_bytes",
          "largest grant a tenant with no handle bound to it can be served from the free pool without a new handle",
          [](const st::DeviceRecord& r) { return d(r.largest_servable_unbound_bytes); });
  per_gpu("vlake_pool_guaranteed_bytes", "sum of namespace guarantees",
          [](const st::DeviceRecord& r) { return d(r.guaranteed_bytes); });
  per_gpu("vlake_pool_borrowed_bytes", "memory held above guarantees",
          [](const st::DeviceRecord& r) { return d(r.borrowed_bytes); });
  per_gpu("vlake_gpu_nvml_used_bytes", "device memory in use as NVML reports it (0 without NVML)",
          [](const st::DeviceRecord& r) { return d(r.nvml_used_bytes); });
  per_gpu("vlake_gpu_unlisted_bytes",
          "device memory NVML charges to no process it lists (memory created without a CUDA context)",
          [](const st::DeviceRecord& r) { return d(r.unlisted_bytes); });
  per_gpu("vlake_gpu_unhooked_bytes", "memory of processes without a vlake session (NVML), all tenants",
          [](const st::DeviceRecord& r) { return d(r.unhooked_bytes); });
  per_gpu("vlake_gpu_retained_bytes", "released memory tenants can still reach, all tenants",
          [](const st::DeviceRecord& r) { return d(r.retained_bytes); });
  per_gpu("vlake_gpu_held_descriptor_bytes",
          "retired handles another process keeps alive through a descriptor (part of retained)",
          [](const st::DeviceRecord& r) { return d(r.held_fd_bytes); });
  per_gpu("vlake_pool_peak_bytes", "highest vlake_pool_reserved_bytes since the daemon started",
          [](const st::DeviceRecord& r) { return d(r.pool_peak_bytes); });
  {
    MetricFamily& f = F.gauge("vlake_pool_free_handles_by_class",
                              "free handles by size class (small: the "
                              "granularity, bulk: --bulk-size)");
    for (const Gpu& g : gpus) {
      set(f, join(g.labels, {{"class", "small"}}), d(g.rec->free_small_handles));
      set(f, join(g.labels, {{"class", "bulk"}}), d(g.rec->free_bulk_handles));
    }
  }
  per_gpu("vlake_pool_warm_target_bytes", "warm reserve target (--warm-reserve)",
          [](const st::DeviceRecord& r) { return d(r.warm_target_bytes); });
  {
    MetricFamily& f = F.counter("vlake_pool_idle_released_bytes_total",
                                "free pool memory given back to the driver after staying unused for "
                                "--pool-idle-release");
    for (const Gpu& g : gpus) set(f, g.labels, d(g.rec->idle_released_bytes));
  }
  per_gpu("vlake_hook_reserve_bytes", "granted memory the hooks keep unused in their local reserves",
          [](const st::DeviceRecord& r) { return d(r.hook_reserve_bytes); });

  // Namespaces by id; tenants' sessions.
  std::map<std::uint32_t, const st::NamespaceRecord*> namespaces;
  for (const st::NamespaceRecord& n : s.namespaces) {
    if (n.in_use != 0) namespaces[n.id] = &n;
  }
  std::map<std::uint32_t, std::uint64_t> tenant_sessions;
  std::uint64_t connected = 0;
  std::uint64_t detached = 0;
  // Layout 9: activity, swap and waits per tenant (docs/metrics.md, "Idle, swapped and waiting").
  std::map<std::uint32_t, std::uint64_t> tenant_last_active;  // the most recent of its sessions
  std::map<std::uint32_t, std::uint64_t> tenant_waiting;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t> tenant_swapped;  // (tenant, gpu)
  std::uint64_t waiting_memory = 0;
  std::uint64_t waiting_restore = 0;
  // Layout 11: the host tier, per tenant and per session, summed from the grants on it (exact).
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t> tenant_host;  // (tenant, gpu)
  std::map<std::uint64_t, std::uint64_t> session_host;                           // by session id
  for (const st::GrantRecord& g : s.grants) {
    if (g.state == st::kGrantFree || g.location != st::kGrantOnHost) continue;
    tenant_host[{g.tenant, g.device}] += g.bytes;
    session_host[g.session] += g.bytes;
  }
  for (const st::SessionRecord& r : s.sessions) {
    if (r.state == st::kSessionFree) continue;
    ++tenant_sessions[r.tenant];
    if (r.state == st::kSessionConnected) ++connected;
    else if (r.state == st::kSessionDetached) ++detached;
    auto& last = tenant_last_active[r.tenant];
    last = std::max(last, r.last_active_unix_ns);
    if (r.wait != st::kWaitNone) ++tenant_waiting[r.tenant];
    if (r.wait == st::kWaitMemory) ++waiting_memory;
    if (r.wait == st::kWaitRestore) ++waiting_restore;
    if (st::swapped_out(r.swap)) {
      tenant_swapped[{r.tenant, r.swap_device}] += r.swap_bytes;
    }
  }
  auto idle_seconds = [now_ns](std::uint64_t last) { return now_ns > last ? d(now_ns - last) / 1e9 : 0.0; };

  // Tenants
  MetricFamily& t_used =
      F.gauge("vlake_tenant_used_bytes",
              "what the quota counts: granted + retained + non-pool + unhooked (unless enforce: account)");
  MetricFamily& t_granted = F.gauge("vlake_tenant_granted_bytes", "pool memory granted");
  MetricFamily& t_nonpool =
      F.gauge("vlake_tenant_nonpool_bytes", "sampled device memory of its processes outside the pool");
  MetricFamily& t_unhooked = F.gauge("vlake_tenant_unhooked_bytes",
                                     "memory of its processes without a vlake session (NVML): memory outside vlake");
  MetricFamily& t_retained = F.gauge("vlake_tenant_retained_bytes",
                                     "released memory it can still reach (handles bound to it, descriptors kept)");
  MetricFamily& t_ipc_held = F.gauge("vlake_tenant_ipc_held_bytes",
                                     "of its granted memory, grants it released that other processes' CUDA IPC "
                                     "imports keep alive (charged to it until they close)");
  MetricFamily& t_ipc_imported = F.gauge("vlake_tenant_ipc_imported_bytes",
                                         "memory it maps through CUDA IPC imports of other tenants' grants (charged "
                                         "to their owners)");
  MetricFamily& t_unhooked_procs =
      F.gauge("vlake_tenant_unhooked_processes", "its processes on a GPU without a vlake session");
  MetricFamily& t_limit = F.gauge("vlake_tenant_limit_bytes", "its limit");
  MetricFamily& t_over = F.gauge("vlake_tenant_over_limit", "1 when its usage is above its limit (grants refused)");
  MetricFamily& t_over_reason =
      F.gauge("vlake_tenant_over_limit_reason",
              "1 for why it is above its limit (limit_lowered, contexts, outside_vlake); no series when it is not");
  MetricFamily& t_sessions = F.gauge("vlake_tenant_sessions", "connected or detached processes");
  MetricFamily& t_reserve =
      F.gauge("vlake_tenant_reserve_bytes", "of its granted memory, what its processes keep unused in local reserves");
  MetricFamily& t_faults = F.counter("vlake_tenant_kernel_faults_total",
                                     "sticky kernel faults of its processes, by what is known (docs/guard.md)");
  MetricFamily& t_denials = F.counter("vlake_tenant_denials_total",
                                      "its refused requests by reason, since its record was created (vlakectl events)");
  MetricFamily& t_idle = F.gauge("vlake_tenant_idle_seconds",
                                 "seconds since the last CUDA call, grant or Hello of its most recent process");
  MetricFamily& t_swapped = F.gauge("vlake_tenant_swapped_bytes",
                                    "of its processes now in host memory: what their checkpoints freed (docs/swap.md)");
  MetricFamily& t_host = F.gauge("vlake_tenant_host_bytes",
                                 "of its granted memory, what is on the host tier now (docs/swap.md, \"Host tier\")");
  MetricFamily& t_waiting = F.gauge("vlake_tenant_waiting_processes",
                                    "its processes waiting for memory or for their restore (vlakectl waits)");
  std::uint64_t tenants = 0;
  for (const st::TenantRecord& r : s.tenants) {
    if (r.in_use == 0) continue;
    ++tenants;
    const auto ns = namespaces.find(r.namespace_id);
    const std::string ns_name = ns == namespaces.end() ? "default" : bounded(ns->second->name, sizeof ns->second->name);
    // Kubernetes tenants ("pod:<namespace>/<pod>/<container>", docs/device-plugin.md) carry
    // their pod and container; every other tenant has them empty. The labels are tenant_*, not
    // namespace/pod/container: Prometheus sets those on the target (vlaked's own pod), and a
    // scrape would rename or drop ours (docs/metrics.md, "Labels").
    const std::string tname = bounded(r.name, sizeof r.name);
    std::string pod, container;
    if (tname.rfind("pod:", 0) == 0) {
      const auto a = tname.find('/', 4);
      const auto b = a == std::string::npos ? a : tname.find('/', a + 1);
      if (b != std::string::npos) {
        pod = tname.substr(a + 1, b - a - 1);
        container = tname.substr(b + 1);
      }
    }
    const Labels tl{
        {"tenant", tname}, {"tenant_namespace", ns_name}, {"tenant_pod", pod}, {"tenant_container", container}};
    for (const Gpu& g : gpus) {
      const Labels l = join(g.labels, tl);
      // Memory outside vlake counts unless its namespace only accounts it (enforce: account).
      const std::uint64_t outside = r.enforce != 0 ? r.unhooked[g.index] : 0;
      set(t_used, l, d(r.granted[g.index] + r.retained[g.index] + r.nonpool[g.index] + outside));
      set(t_ipc_held, l, d(r.ipc_held[g.index]));
      set(t_ipc_imported, l, d(r.ipc_imported[g.index]));
      if ((r.over_limit & (1u << g.index)) != 0) {
        const char* why = st::over_reason_name(r.over_reason[g.index]);
        set(t_over_reason, join(l, {{"reason", *why != '\0' ? why : "unknown"}}), 1);
      }
      set(t_unhooked, l, d(r.unhooked[g.index]));
      set(t_retained, l, d(r.retained[g.index]));
      set(t_granted, l, d(r.granted[g.index]));
      set(t_nonpool, l, d(r.nonpool[g.index]));
      set(t_limit, l, d(r.limit[g.index]));
      set(t_reserve, l, d(r.reserve[g.index]));
      set(t_over, l, (r.over_limit & (1u << g.index)) != 0 ? 1 : 0);
      const auto sw = tenant_swapped.find({r.id, g.index});
      set(t_swapped, l, sw == tenant_swapped.end() ? 0 : d(sw->second));
      const auto ht = tenant_host.find({r.id, g.index});
      set(t_host, l, ht == tenant_host.end() ? 0 : d(ht->second));
    }
    for (std::uint32_t i = 0; i < st::kRefusalReasons; ++i) {
      set(t_denials, join(tl, {{"reason", st::refusal_reason_name(i + 1)}}), d(r.denials[i]));
    }
    if (const auto la = tenant_last_active.find(r.id); la != tenant_last_active.end() && la->second != 0) {
      set(t_idle, tl, idle_seconds(la->second));
    }
    const auto wt = tenant_waiting.find(r.id);
    set(t_waiting, tl, wt == tenant_waiting.end() ? 0 : d(wt->second));
    const auto it = tenant_sessions.find(r.id);
    set(t_sessions, tl, it == tenant_sessions.end() ? 0 : d(it->second));
    set(t_unhooked_procs, tl, d(r.unhooked_processes));
    for (std::uint32_t i = 0; i < 4; ++i) set(t_faults, join(tl, fault_labels(i)), d(r.kernel_faults[i]));
  }

  // Namespaces
  MetricFamily& n_used = F.gauge("vlake_namespace_used_bytes", "sum of its tenants' usage");
  MetricFamily& n_limit = F.gauge("vlake_namespace_limit_bytes", "its limit (the GPU's size when it has none)");
  MetricFamily& n_guar = F.gauge("vlake_namespace_guaranteed_bytes", "its guarantee");
  MetricFamily& n_over = F.gauge("vlake_namespace_over_limit", "1 when above a lowered limit");
  for (const auto& [id, n] : namespaces) {
    const Labels nl{{"tenant_namespace", bounded(n->name, sizeof n->name)}};
    for (const Gpu& g : gpus) {
      const Labels l = join(g.labels, nl);
      set(n_used, l, d(n->used[g.index]));
      set(n_limit, l, d(n->limit[g.index]));
      set(n_guar, l, d(n->guaranteed[g.index]));
      set(n_over, l, (n->over_limit & (1u << g.index)) != 0 ? 1 : 0);
    }
  }

  // Processes: idle time each (bounded by the session table, state.hpp kMaxSessions); opt-in,
  // since the labels name other tenants' pids (Exposure).
  if (exposure.process_series) {
    std::map<std::uint32_t, std::string> names;
    for (const st::TenantRecord& r : s.tenants) {
      if (r.in_use != 0) names[r.id] = bounded(r.name, sizeof r.name);
    }
    MetricFamily& f = F.gauge("vlake_process_idle_seconds",
                              "seconds since the process's last CUDA call (as its hook reports it), grant or Hello");
    MetricFamily& ph =
        F.gauge("vlake_process_host_bytes", "of the process's granted memory, what is on the host tier now");
    for (const st::SessionRecord& r : s.sessions) {
      if (r.state == st::kSessionFree) continue;
      const auto n = names.find(r.tenant);
      const Labels l{{"tenant", n == names.end() ? "" : n->second}, {"pid", std::to_string(r.pid)}};
      const auto hb = session_host.find(r.id);
      set(ph, l, hb == session_host.end() ? 0 : d(hb->second));
      if (r.last_active_unix_ns == 0) continue;
      set(f, l, idle_seconds(r.last_active_unix_ns));
    }
  }
  set(F.gauge("vlake_tenants", "tenants known to the daemon"), {}, d(tenants));
  {
    MetricFamily& f = F.gauge("vlake_waiting_processes", "processes waiting for memory or for their restore");
    set(f, {{"for", "memory"}}, d(waiting_memory));
    set(f, {{"for", "restore"}}, d(waiting_restore));
  }
  // Swapping idle processes to host memory (docs/swap.md).
  // vlaked's own process, never a tenant's (docs/metrics.md, "The daemon's memory").
  per_gpu("vlake_daemon_context_bytes",
          "NVML's figure for vlaked's own process beyond its pool handles: its CUDA context (0: not listed)",
          [](const st::DeviceRecord& r) { return d(r.daemon_context_bytes); });
  per_gpu("vlake_daemon_gpu_used_bytes", "NVML's figure for vlaked's own process: pool handles and context",
          [](const st::DeviceRecord& r) { return d(r.daemon_nvml_bytes); });
  per_gpu("vlake_swapped_bytes", "memory of this GPU's processes now in host memory (what their checkpoints freed)",
          [](const st::DeviceRecord& r) { return d(r.swapped_bytes); });
  set(F.counter("vlake_swap_outs_total", "processes checkpointed to host memory"), {}, d(c.swap_outs));
  set(F.counter("vlake_swap_ins_total", "processes restored from host memory"), {}, d(c.swap_ins));
  set(F.counter("vlake_swap_failures_total", "checkpoints or restores the driver failed"), {}, d(c.swap_failures));
  set(F.counter("vlake_swap_timeouts_total", "restores refused: no room on the GPU within the process's wait"), {},
      d(c.swap_timeouts));
  set(F.counter("vlake_swap_out_bytes_total", "bytes the checkpoints freed on the GPU"), {}, d(c.swap_out_bytes));
  set(F.counter("vlake_swap_in_bytes_total", "bytes the restores took back on the GPU"), {}, d(c.swap_in_bytes));
  set(F.counter("vlake_swap_out_seconds_total", "time spent checkpointing"), {}, d(c.swap_out_ns) / 1e9);
  set(F.counter("vlake_swap_in_seconds_total", "time spent restoring"), {}, d(c.swap_in_ns) / 1e9);
  // The host tier (docs/swap.md, "Host tier").
  per_gpu("vlake_host_tier_bytes", "this GPU's granted memory now on the host tier (exact: whole grants)",
          [](const st::DeviceRecord& r) { return d(r.host_bytes); });
  set(F.gauge("vlake_host_tier_stock_bytes", "pinned host memory made ahead for the host tier, not in use"), {},
      d(c.host_stock_bytes));
  set(F.gauge("vlake_host_tier_bound_bytes", "the host tier's bound (--host-tier; 0: off)"), {}, d(c.host_bound_bytes));
  set(F.counter("vlake_host_tier_demotes_total", "grants moved to the host tier"), {}, d(c.tier_demotes));
  set(F.counter("vlake_host_tier_promotes_total", "grants moved back to the GPU"), {}, d(c.tier_promotes));
  set(F.counter("vlake_host_tier_demoted_bytes_total", "bytes of the grants moved to the host tier"), {},
      d(c.tier_demoted_bytes));
  set(F.counter("vlake_host_tier_promoted_bytes_total", "bytes of the grants moved back to the GPU"), {},
      d(c.tier_promoted_bytes));
  set(F.counter("vlake_host_tier_demote_seconds_total", "time of the moves to the host tier, notice to last step"), {},
      d(c.tier_demote_ns) / 1e9);
  set(F.counter("vlake_host_tier_promote_seconds_total", "time of the moves back to the GPU, notice to last step"), {},
      d(c.tier_promote_ns) / 1e9);
  set(F.counter("vlake_host_tier_declined_total", "grants a process declined or failed to move"), {},
      d(c.tier_declined));
  set(F.counter("vlake_host_tier_busy_total", "moves a busy process turned down"), {}, d(c.tier_busy));
  MetricFamily& sessions = F.gauge("vlake_sessions", "tenant processes");
  set(sessions, {{"state", "connected"}}, d(connected));
  set(sessions, {{"state", "detached"}}, d(detached));

  // Counters
  set(F.counter("vlake_grants_total", "successful grants"), {}, d(c.grants));
  MetricFamily& denials = F.counter("vlake_grant_denials_total", "refused grants");
  set(denials, {{"reason", "tenant_limit"}}, d(c.denials_tenant_limit));
  set(denials, {{"reason", "namespace_limit"}}, d(c.denials_namespace_limit));
  set(denials, {{"reason", "guarantee"}}, d(c.denials_guarantee));
  set(denials, {{"reason", "out_of_memory"}}, d(c.denials_out_of_memory));
  set(denials, {{"reason", "unknown_device"}}, d(c.denials_unknown_device));
  set(denials, {{"reason", "other"}}, d(c.denials_other));
  set(denials, {{"reason", "grant_cap"}}, d(c.denials_grant_cap));
  set(F.counter("vlake_grant_denials_unhooked_total",
                "of the refused grants, those memory outside vlake caused (also counted under their limit's reason)"),
      {}, d(c.denials_unhooked));
  set(F.counter("vlake_unhooked_kills_total", "processes killed under enforce: kill"), {}, d(c.unhooked_kills));
  set(F.counter("vlake_passthrough_refused_total", "VLAKE_DISABLE requests the quota file does not allow"), {},
      d(c.passthrough_refused));
  set(F.counter("vlake_releases_total", "grants returned"), {}, d(c.releases));
  set(F.counter("vlake_process_exits_total", "sessions ended by their process dying"), {}, d(c.process_exits));
  set(F.counter("vlake_scrubs_total", "handles zeroed before changing tenant"), {}, d(c.scrubs));
  set(F.counter("vlake_pool_reuses_total", "grants served from the free pool"), {}, d(c.reuses));
  set(F.counter("vlake_pool_handles_created_total", "pool handles created"), {}, d(c.handles_created));
  set(F.counter("vlake_pool_handles_released_total", "pool handles released"), {}, d(c.handles_released));
  set(F.counter("vlake_malformed_messages_total", "connections dropped for malformed messages"), {}, d(c.malformed));
  set(F.counter("vlake_requests_total", "well-formed client messages handled"), {}, d(c.requests));
  set(F.counter("vlake_usage_queries_total", "UsageQuery messages"), {}, d(c.usage_queries));
  {
    MetricFamily& f = F.counter("vlake_pool_grants_total", "grants with handles, by how the pool served them");
    set(f, {{"path", "exact"}}, d(c.grants_exact));
    set(f, {{"path", "stitched"}}, d(c.grants_stitched));
    set(f, {{"path", "new"}}, d(c.grants_new));
  }
  set(F.counter("vlake_pool_stitched_handles_total", "handles in stitched grants"), {}, d(c.handles_stitched));
  set(F.counter("vlake_pool_stitched_cross_tenant_total", "stitched grants using a handle another tenant freed"), {},
      d(c.stitched_cross_tenant));
  set(F.counter("vlake_pool_pressure_messages_total", "Pressure messages sent to hooks"), {}, d(c.pressure_sent));
  set(F.counter("vlake_pool_parked_grants_total", "grants that waited for reserves to be returned"), {},
      d(c.grants_parked));
  set(F.counter("vlake_pool_parked_timeouts_total", "parked grants refused when the wait ended"), {},
      d(c.parked_timeouts));
  set(F.counter("vlake_reserve_reports_total", "ReserveReport messages"), {}, d(c.reserve_reports));

  {
    MetricFamily& f = F.add("vlake_grant_duration_seconds", MetricType::Histogram,
                            "daemon time to serve a grant (receive -> reply sent)");
    ClientMetric m;
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < st::kGrantLatencyBuckets; ++i) {
      cumulative += c.grant_latency_bucket[i];
      ClientMetric::Bucket b;
      b.cumulative_count = cumulative;
      b.upper_bound = d(st::kGrantLatencyBoundsNs[i]) / 1e9;
      m.histogram.bucket.push_back(b);
    }
    m.histogram.sample_count = std::max(c.grant_latency_count, cumulative);
    m.histogram.sample_sum = d(c.grant_latency_sum_ns) / 1e9;
    f.metric.push_back(std::move(m));
  }
  set(F.gauge("vlake_grant_duration_max_seconds", "the longest grant the histogram counted (receive -> reply sent)"),
      {}, d(c.grant_latency_max_ns) / 1e9);

  set(F.counter("vlake_config_reloads_total", "applied reloads of the quota file"), {}, d(c.config_reloads));
  set(F.counter("vlake_config_reload_errors_total", "rejected quota files"), {}, d(c.config_reload_errors));
  set(F.gauge("vlake_config_rejected", "1 while the file on disk is rejected (old config in force)"), {},
      s.config.rejected != 0 ? 1 : 0);
  per_gpu("vlake_dedup_logical_bytes", "bytes tenants see as shared read-only chunks (docs/dedup.md)",
          [](const st::DeviceRecord& r) { return d(r.dedup_logical_bytes); });
  per_gpu("vlake_dedup_physical_bytes", "bytes the shared chunks take on the GPU (stored once)",
          [](const st::DeviceRecord& r) { return d(r.dedup_physical_bytes); });
  MetricFamily& guard = F.counter("vlake_guard_violations_total",
                                  "what a guard established: canary damage, writes into shared memory (docs/guard.md)");
  set(guard, {{"kind", "canary"}}, d(c.guard_violations_canary));
  set(guard, {{"kind", "readonly_write"}}, d(c.guard_violations_readonly_write));
  {
    // A kernel fault is not a guard violation: what is known about it are these attributes.
    MetricFamily& f = F.counter("vlake_kernel_faults_total",
                                "sticky kernel faults the hooks reported, by what is known (docs/guard.md)");
    for (std::uint32_t i = 0; i < 4; ++i) set(f, fault_labels(i), d(c.kernel_faults[i]));
  }
  // Limits against hostile tenants (docs/daemon.md, "Limits").
  MetricFamily& refused =
      F.counter("vlake_connection_denials_total", "Hellos and connections refused by a limit (docs/daemon.md)");
  set(refused, {{"reason", "session_cap"}}, d(c.denials_session_cap));
  set(refused, {{"reason", "tenant_table"}}, d(c.denials_tenant_table));
  set(refused, {{"reason", "connection_cap"}}, d(c.denials_connection_cap));
  set(refused, {{"reason", "unauthenticated"}}, d(c.denials_unauthenticated));
  MetricFamily& dropped = F.counter("vlake_guard_events_dropped_total", "guard events from hooks not recorded");
  set(dropped, {{"reason", "rejected"}}, d(c.guard_events_rejected));
  set(dropped, {{"reason", "limited"}}, d(c.guard_events_limited));
  set(F.counter("vlake_log_lines_suppressed_total", "log lines dropped by rate limits"), {}, d(c.log_suppressed));
  set(F.counter("vlake_tenants_freed_total", "tenant records freed (nothing held)"), {}, d(c.tenants_freed));
  // CUDA IPC of pool memory (docs/ipc.md).
  set(F.counter("vlake_ipc_exports_total", "grants exported for CUDA IPC"), {}, d(c.ipc_exports));
  set(F.counter("vlake_ipc_opens_total", "CUDA IPC imports served"), {}, d(c.ipc_opens));
  set(F.counter("vlake_ipc_refused_total", "CUDA IPC opens refused (unknown handle, wrong secret, another tenant)"), {},
      d(c.ipc_refused));
  return F.take();
}

StateCollector::StateCollector(SnapshotSource source, Clock clock, BuildInfo build, Exposure exposure)
    : source_(std::move(source)), clock_(std::move(clock)), build_(std::move(build)), exposure_(exposure) {}

std::shared_ptr<StateCollector> StateCollector::for_segment(const std::string& name, Exposure exposure) {
  auto reader = std::make_shared<st::StateReader>(name);
  return std::make_shared<StateCollector>([reader] { return reader->snapshot(); }, realtime_ns, this_build(), exposure);
}

std::vector<MetricFamily> StateCollector::Collect() const {
  std::unique_ptr<st::State> s;
  try {
    s = source_();
  } catch (...) {
    s.reset();
  }
  if (s) {
    try {
      return build_families(*s, clock_(), build_, exposure_);
    } catch (...) {
      // fall through: allocation failure; answer the minimal set
    }
  }
  std::vector<MetricFamily> out;
  try {
    MetricFamily info;
    info.name = "vlake_build_info";
    info.type = MetricType::Gauge;
    info.help = "vlake build (always 1)";
    set(info, {{"version", build_.version}, {"revision", build_.revision}}, 1);
    out.push_back(std::move(info));
    MetricFamily up;
    up.name = "vlake_daemon_up";
    up.type = MetricType::Gauge;
    up.help = "1 if the daemon refreshed its state within 3 sample intervals";
    set(up, {}, 0);
    out.push_back(std::move(up));
  } catch (...) {
  }
  return out;
}

Health StateCollector::health() const {
  try {
    const std::unique_ptr<st::State> s = source_();
    if (!s) return {false, "no state snapshot"};
    return evaluate_health(*s, clock_());
  } catch (const std::exception& e) {
    return {false, std::string("cannot read the state segment: ") + e.what()};
  } catch (...) {
    return {false, "cannot read the state segment"};
  }
}

}  // namespace vlake::exporter
