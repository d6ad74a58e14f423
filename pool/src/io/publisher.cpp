#include "vlake/pool/publisher.hpp"

#include <algorithm>
#include <cstring>

#include <map>
#include <set>
#include <type_traits>
#include <utility>
#include "vlake/common/fixed_chars.hpp"

namespace vlake::pool {

namespace {
const std::decay_t<decltype(std::declval<const Node&>().grants())> kNoGrants;
const std::decay_t<decltype(std::declval<const Node&>().sessions())> kNoSessions;
}  // namespace

StatePublisher::StatePublisher(st::StateSegment& seg, std::uint32_t daemon_pid, std::uint64_t daemon_start_time,
                               std::uint32_t sample_interval_ms) noexcept
    : seg_(seg),
      daemon_pid_(daemon_pid),
      daemon_start_time_(daemon_start_time),
      sample_interval_ms_(sample_interval_ms) {}

void StatePublisher::publish(Node& node, std::uint64_t now_unix_ns) noexcept {
  const Changes c = node.changes_to_publish();
  write(node, c, now_unix_ns);
}

void StatePublisher::publish_all(Node& node, std::uint64_t now_unix_ns) noexcept {
  Changes c = node.changes_to_publish();
  c.all = true;
  write(node, c, now_unix_ns);
}

void StatePublisher::mark_clean(std::uint64_t now_unix_ns) noexcept {
  st::StateSegment::Write w(seg_);
  seg_.state().header.clean = 1;
  seg_.state().header.updated_unix_ns = now_unix_ns;
}

void StatePublisher::write(Node& node, const Changes& c, std::uint64_t now_unix_ns) noexcept {
  st::StateSegment::Write w(seg_);
  st::State& s = seg_.state();
  st::Header& h = s.header;
  h.next_session_id = node.next_session_id();
  h.next_grant_id = node.next_grant_id();
  h.daemon_pid = daemon_pid_;
  h.daemon_start_time = daemon_start_time_;
  h.device_count = static_cast<std::uint32_t>(node.devices().size());
  h.starts = node.starts();
  h.clean = 0;
  h.max_namespaces = st::kMaxNamespaces;
  h.sample_interval_ms = sample_interval_ms_;
  if (now_unix_ns != 0) h.updated_unix_ns = now_unix_ns;
  s.counters = node.counters();
  // Handle counters accumulate over daemon restarts: this daemon's pools count from a base.
  s.counters.handles_created = node.handles_created_base_;
  s.counters.handles_released = node.handles_released_base_;
  for (const Node::Device& d : node.devices()) {
    s.counters.handles_created += d.pool->handles_created();
    s.counters.handles_released += d.pool->handles_released();
  }
  s.counters.host_stock_bytes = node.rooms().tier.stock_bytes().value();
  s.counters.host_bound_bytes = node.rooms().tier.bound().value();
  s.config = node.config_record();
  if (c.all || c.guard) s.guard = node.rooms().guard.log();
  if (c.all || c.refusals) s.refusals = node.rooms().refusals.log();

  // Grants and sessions: the changed slots (or all), zeroed when free.
  if (c.all) {
    std::memset(s.grants, 0, sizeof s.grants);
    std::memset(s.sessions, 0, sizeof s.sessions);
  } else {
    for (std::uint32_t slot : c.grants) std::memset(&s.grants[slot], 0, sizeof s.grants[slot]);
    for (std::uint32_t slot : c.sessions) std::memset(&s.sessions[slot], 0, sizeof s.sessions[slot]);
  }
  // The record loops below walk the Node's tables only for a kind that changed: an event changes
  // a grant or two, and the state is published after every event.
  for (const auto& [id, g] : (c.all || !c.grants.empty()) ? node.grants() : kNoGrants) {
    if (!c.all && c.grants.count(g.slot) == 0) continue;
    const Node::Tenant* t = node.tenant(g.tenant);
    const std::uint32_t guard = static_cast<std::uint32_t>(g.canary       ? quota::GuardMode::canary
                                                           : t != nullptr ? t->guard
                                                                          : quota::GuardMode::off);
    const std::uint32_t state = g.orphaned ? st::kGrantOrphaned : st::kGrantLive;
    s.grants[g.slot] = st::GrantRecord{g.id,
                                       g.session,
                                       g.bytes.value(),
                                       g.tenant.value(),
                                       static_cast<std::uint32_t>(g.device.value()),
                                       static_cast<std::uint32_t>(g.purpose),
                                       g.handle_count,
                                       state,
                                       guard,
                                       g.requested,
                                       g.created_unix_ns,
                                       node.rooms().tier.location(g.id),
                                       0};
  }
  for (const auto& [id, sess] : (c.all || !c.sessions.empty()) ? node.sessions() : kNoSessions) {
    if (!c.all && c.sessions.count(sess.slot) == 0) continue;
    st::SessionRecord& r = s.sessions[sess.slot];
    r.id = sess.id;
    r.start_time = sess.start_time;
    r.pid = sess.pid;
    r.uid = sess.uid;
    r.gid = sess.gid;
    r.tenant = sess.tenant.value();
    r.state = sess.conn != 0 ? st::kSessionConnected : st::kSessionDetached;
    r.grant_count = static_cast<std::uint32_t>(sess.grants.size());
    session_activity(node, sess, r);
  }

  // Tenants, then namespaces (their usage and tenant counts follow the tenants').
  if (!c.all && c.tenants.empty() && c.namespaces.empty()) {
    if (c.devices) devices(node, s);
    return;
  }
  std::map<std::uint32_t, const Node::Namespace*> ns_by_id;  // by NamespaceId value
  for (const auto& [name, n] : node.namespaces()) ns_by_id[n.id.value()] = &n;
  std::set<std::uint32_t> ns_slots = c.namespaces;
  if (c.all) std::memset(s.tenants, 0, sizeof s.tenants);
  for (const std::uint32_t slot : c.tenants) std::memset(&s.tenants[slot], 0, sizeof s.tenants[slot]);
  for (const auto& [tid, t] : node.tenants()) {
    if (!c.all && c.tenants.count(t.slot) == 0) continue;
    tenant(node, t, s);
    auto n = ns_by_id.find(t.ns.value());
    if (n != ns_by_id.end()) ns_slots.insert(n->second->slot);
  }
  if (c.all) {
    std::memset(s.namespaces, 0, sizeof s.namespaces);
    for (const auto& [name, n] : node.namespaces()) ns_slots.insert(n.slot);
  }
  for (std::uint32_t slot : ns_slots) std::memset(&s.namespaces[slot], 0, sizeof s.namespaces[slot]);
  for (const auto& [id, n] : ns_by_id) {
    if (ns_slots.count(n->slot) != 0) namespace_record(node, *n, s);
  }
  if (c.all) std::memset(s.devices, 0, sizeof s.devices);
  if (c.all || c.devices || !c.tenants.empty()) devices(node, s);
}

void StatePublisher::tenant(const Node& node, const Node::Tenant& tn, st::State& s) noexcept {
  const Node::Tenant* t = &tn;
  st::TenantRecord& r = s.tenants[t->slot];
  std::uint32_t over = 0;
  r.in_use = 1;
  r.id = t->id.value();
  copy_chars(r.name, t->name);
  for (const Node::Device& d : node.devices()) {
    const Accounting::Usage u = node.accounting().usage(t->id, d.ordinal);
    const auto i = static_cast<std::size_t>(d.ordinal.value());
    r.limit[i] = u.limit.value();
    r.granted[i] = u.granted.value();
    r.nonpool[i] = u.nonpool.value();
    r.unhooked[i] =
        node.rooms().unhooked.of(t->id).bytes[i];  // NVML's figure, charged (in used()) unless `enforce: account`
    r.retained[i] = u.retained.value();
    r.over_reason[i] = st::kOverNone;
    if (u.used() > u.limit) {
      over |= 1u << i;
      // The first that explains it (state.hpp OverLimitReason).
      const Bytes pooled = u.granted + u.retained;
      r.over_reason[i] = pooled > u.limit               ? st::kOverLowered
                         : pooled + u.nonpool > u.limit ? st::kOverContexts
                                                        : st::kOverOutside;
    }
    r.ipc_held[i] = 0;
    r.ipc_imported[i] = 0;
    r.reserve[i] = 0;
  }
  // One walk over the sessions for every GPU's reserve; the IPC figures from the registry's
  // indexes (released grants, imports per importing session), never a walk over every grant or
  // import: this runs for each tenant a change touches, after every event.
  for (const auto& [sid, ss] : node.sessions()) {
    if (ss.tenant != t->id) continue;
    for (const Node::Device& d : node.devices()) {
      const auto i = static_cast<std::size_t>(d.ordinal.value());
      r.reserve[i] += ss.reserve[i];
    }
  }
  // CUDA IPC (docs/ipc.md): its released grants that imports keep, and what it imports from others.
  const IpcRegistry& ipc = node.rooms().ipc;
  for (const std::uint64_t gid : ipc.released_grants()) {
    const auto git = node.grants().find(gid);
    if (git == node.grants().end() || git->second.tenant != t->id) continue;
    const auto i = static_cast<std::size_t>(git->second.device.value());
    if (i < st::kMaxDevices) r.ipc_held[i] += git->second.bytes.value();
  }
  std::set<std::uint64_t> imported;  // a grant mapped by several of its processes counts once
  for (const auto& [sid, si] : ipc.per_session()) {
    const Node::Session* importer = node.session(sid);
    if ((importer != nullptr ? importer->tenant : si.tenant) != t->id) continue;
    for (const auto& [gid, open] : si.grants) {
      if (!imported.insert(gid).second) continue;
      const auto git = node.grants().find(gid);
      if (git == node.grants().end() || git->second.tenant == t->id) continue;
      const auto i = static_cast<std::size_t>(git->second.device.value());
      if (i < st::kMaxDevices) r.ipc_imported[i] += git->second.bytes.value();
    }
  }
  r.namespace_id = t->ns.value();
  r.over_limit = over;
  r.enforce = static_cast<std::uint32_t>(t->enforce);
  r.unhooked_processes = static_cast<std::uint32_t>(node.rooms().unhooked.of(t->id).procs.size());
  const GuardBook::Faults faults = node.rooms().guard.kernel_faults(t->id);
  std::copy(faults.begin(), faults.end(), std::begin(r.kernel_faults));
  std::copy(t->denials.begin(), t->denials.end(), std::begin(r.denials));
  r.guard_events_evicted = node.rooms().guard.guard_events_evicted(t->name);
  r.refusals_evicted = node.rooms().refusals.evicted(t->name);
}

void StatePublisher::session_activity(const Node& node, const Node::Session& sess, st::SessionRecord& r) noexcept {
  r.last_active_unix_ns = node.unix_of(sess.last_active);
  const SwapRecord sw = node.rooms().swaps.get(sess.id);
  switch (sw.state) {
    case SwapState::none: r.swap = st::kSwapNone; break;
    case SwapState::notified: r.swap = st::kSwapNotified; break;
    case SwapState::checkpointing: r.swap = st::kSwapCheckpointing; break;
    case SwapState::swapped: r.swap = st::kSwapHost; break;
    case SwapState::restoring: r.swap = st::kSwapRestoring; break;
    case SwapState::lost: r.swap = st::kSwapLost; break;
  }
  r.swap_device = static_cast<std::uint32_t>(sw.device.value());
  r.swap_bytes = sw.state == SwapState::none ? 0 : sw.bytes.value();
  r.swap_since_unix_ns = node.unix_of(sw.since);
  r.swap_for = sw.for_session;
  r.swap_outs = sw.outs;
  r.swap_ins = sw.ins;
  const Node::Tenant* t = node.tenant(sess.tenant);
  r.flags = (sess.reclaim ? st::kSessionReclaim : 0u) | (t != nullptr && t->overcommit ? st::kSessionOvercommit : 0u);
  try {
    const Node::Wait w = node.wait_of_session(sess);
    r.wait = w.kind;
    r.wait_device = static_cast<std::uint32_t>(w.device.value());
    r.wait_bytes = w.bytes.value();
    r.wait_since_unix_ns = node.unix_of(w.since);
    r.wait_deadline_unix_ns = node.unix_of(w.deadline);
    r.waits_for_count = static_cast<std::uint32_t>(std::min<std::size_t>(w.waits_for.size(), st::kMaxWaitsFor));
    for (std::uint32_t i = 0; i < r.waits_for_count; ++i) r.waits_for[i] = w.waits_for[i];
  } catch (...) {
    // No memory for the list: published without it (the next publish has it).
  }
}

void StatePublisher::namespace_record(const Node& node, const Node::Namespace& ns, st::State& s) noexcept {
  const Node::Namespace* n = &ns;
  st::NamespaceRecord& r = s.namespaces[n->slot];
  r.in_use = 1;
  r.id = n->id.value();
  copy_chars(r.name, n->spec.name);
  r.priority = n->spec.priority;
  r.flags = (n->spec.limit ? st::kNamespaceHasLimit : 0u) | (n->spec.declared ? 0u : st::kNamespaceImplicit);
  std::uint32_t over = 0;
  for (const Node::Device& d : node.devices()) {
    const auto i = static_cast<std::size_t>(d.ordinal.value());
    const Accounting::NamespaceUsage u = node.accounting().namespace_usage(n->id, d.ordinal);
    r.limit[i] = n->spec.limit_on(d.total).value();
    r.guaranteed[i] = n->spec.guaranteed_on(d.total).value();
    r.used[i] = u.used().value();
    if (u.used().value() > r.limit[i]) over |= 1u << i;
  }
  r.over_limit = over;
  std::uint32_t count = 0;
  for (const auto& [id, t] : node.tenants()) count += t.ns == n->id ? 1 : 0;
  r.tenant_count = count;
}

void StatePublisher::devices(const Node& node, st::State& s) noexcept {
  for (const Node::Device& d : node.devices()) {
    st::DeviceRecord& r = s.devices[d.ordinal.value()];
    const DevicePool& pool = *d.pool;
    std::memcpy(r.uuid, d.uuid.data(), sizeof r.uuid);
    r.total = d.total.value();
    r.granularity = d.granularity.value();
    r.pool_bytes = pool.pool_bytes().value();
    r.free_bytes = pool.free_bytes().value();
    r.free_handles = pool.free_handles();
    r.largest_free_handle = pool.largest_free_handle().value();
    try {
      const Servable sv = pool.servable(proto::kMaxHandlesPerGrant);
      r.largest_servable_bytes = sv.largest.value();
      r.largest_servable_unbound_bytes = sv.unbound.value();
    } catch (...) {
      // No memory for the sort: the previous figures stay until the next publish.
    }
    r.granted_bytes = d.granted.value();
    r.free_small_handles = pool.free_small_handles();
    r.free_bulk_handles = pool.free_bulk_handles();
    r.warm_target_bytes = node.settings().warm_reserve.value();
    r.pool_peak_bytes = std::max({r.pool_peak_bytes, pool.peak_bytes().value(), d.pool_peak});
    r.idle_released_bytes = d.idle_released_base + pool.idle_released_bytes().value();
    r.dedup_logical_bytes = node.dedup_logical(d.ordinal).value();
    r.dedup_physical_bytes = node.dedup_physical(d.ordinal).value();
    const auto i = static_cast<std::size_t>(d.ordinal.value());
    std::uint64_t hook_reserve = 0;
    for (const auto& [sid, ss] : node.sessions()) hook_reserve += ss.reserve[i];
    r.hook_reserve_bytes = hook_reserve;
    r.orphaned_bytes = d.orphaned.value();
    r.counted_bytes = d.counted.value();
    // Sums over the tenants of their sampled and retained figures on this GPU.
    std::uint64_t nonpool = 0;
    std::uint64_t unhooked = 0;
    std::uint64_t retained = 0;
    for (const auto& [tid, t] : node.tenants()) {
      const Accounting::Usage u = node.accounting().usage(t.id, d.ordinal);
      nonpool += u.nonpool.value();
      retained += u.retained.value();
      unhooked += node.rooms().unhooked.of(t.id).bytes[i];  // NVML's figure, whether or not `enforce` charges it
    }
    r.nonpool_bytes = nonpool;
    r.unhooked_bytes = unhooked;
    r.retained_bytes = retained;
    r.nvml_used_bytes = d.nvml_used.value();
    r.unlisted_bytes = d.unlisted.value();
    r.held_fd_bytes = pool.held_fd_bytes().value();
    // vlaked's own process: its pool handles and, beyond them, its CUDA context (never a tenant's).
    r.daemon_nvml_bytes = d.daemon_nvml.value();
    r.daemon_context_bytes = d.daemon_nvml > pool.pool_bytes() ? (d.daemon_nvml - pool.pool_bytes()).value() : 0;
    r.in_use = 1;
    r.ordinal = static_cast<std::uint32_t>(d.ordinal.value());
    r.swapped_bytes = node.rooms().swaps.on_host(d.ordinal).value();
    r.host_bytes = node.rooms().tier.host_bytes(d.ordinal).value();
    const Accounting::DeviceEntry du = node.accounting().device_usage(d.ordinal);
    r.guaranteed_bytes = du.guaranteed.value();
    r.borrowed_bytes = du.borrowed.value();
  }
}

}  // namespace vlake::pool
