// vlake::pool::Node: construction, sessions, tenants, namespaces and the quota file, Kubernetes
// allocations, resume after a restart, shutdown. Grants are in node_grant.cpp, guards and
// dedup in node_guard.cpp.
#include "vlake/pool/node.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include <stdexcept>
#include "vlake/common/fixed_chars.hpp"

#include "vlake/pool/features/dedup/dedup.hpp"

namespace vlake::pool {

namespace {

std::string cut_name(const std::string& name) { return name.substr(0, st::kTenantNameBytes - 1); }

// The tenant table is full: a Hello is refused with limit_reached (not an internal error).
class TenantTableFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace

Node::Node(Driver& driver, const Logger& log, NodeSettings settings, NodeEnv env)
    : driver_(driver),
      log_(log),
      settings_(settings),
      env_(std::move(env)),
      rooms_(settings),
      limited_(log, settings.log_rate, settings.log_burst, &counters_.log_suppressed) {
  const int n = driver_.device_count();
  if (n <= 0) throw std::runtime_error("no GPU found");
  if (static_cast<std::uint32_t>(n) > st::kMaxDevices) {
    throw std::runtime_error(std::to_string(n) + " GPUs found; this vlaked supports at most " +
                             std::to_string(st::kMaxDevices));
  }
  for (int i = 0; i < n; ++i) {
    Device d;
    d.ordinal = DeviceOrdinal{i};
    d.uuid = Uuid(driver_.device_uuid(d.ordinal));
    d.total = driver_.total_memory(d.ordinal);
    d.granularity = driver_.granularity(d.ordinal);
    d.pool = std::make_unique<DevicePool>(driver_, d.ordinal, log_, settings_.bulk_size);
    d.pool->set_binding(settings_.bind_handles);
    d.pool->set_holder_scan(env_.holders);
    d.pool->set_clock([this] { return steady_now(); });
    d.stock =
        std::make_unique<WarmStock>(settings_.warm_reserve, settings_.warm_stock, d.granularity, d.pool->bulk_size());
    acct_.set_capacity(d.ordinal, d.total);
    devices_.push_back(std::move(d));
  }
  config_record_.generation = 0;
  changes_.all = true;
}

Node::~Node() {
  // Normal paths go through shutdown(); after a failed start-up, release what this process
  // holds (grants first: their handles go back to the pools).
  grants_.clear();
  dedup_.reset();
  for (DiscardOut& d : fx_.discards) release_built(driver_, d.handle);  // never handed to the loop
  devices_.clear();
}

void Node::warm_up() {
  for (Device& d : devices_) {
    try {
      d.pool->warm();
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot create pool memory on GPU " + std::to_string(d.ordinal.value()) + ": " +
                               e.what());
    }
  }
  if (settings_.warm_reserve.value() == 0) return;
  // The warm reserve is built here, before serving (no demand yet: the stock starts empty).
  try {
    for (Device& d : devices_) plan_warm(d, steady_now(), SIZE_MAX, false);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("cannot create the warm reserve: ") + e.what());
  }
  for (const Device& d : devices_) {
    log_.info("GPU " + std::to_string(d.ordinal.value()) + ": warm reserve " +
              std::to_string(d.pool->free_bytes().value() >> 20) + " MiB of " +
              std::to_string(settings_.warm_reserve.value() >> 20) + " MiB (" +
              std::to_string(d.pool->free_bulk_handles()) + " bulk, " + std::to_string(d.pool->free_small_handles()) +
              " small handles)");
  }
}

// ---------------------------------------------------------------------------------------------
// lookups and bookkeeping

const Node::Device* Node::device_by_uuid(const std::uint8_t* uuid) const {
  for (const Device& d : devices_) {
    if (std::memcmp(d.uuid.data(), uuid, 16) == 0) return &d;
  }
  return nullptr;
}

Node::Device* Node::device_mut(const std::uint8_t* uuid) { return const_cast<Device*>(device_by_uuid(uuid)); }

Node::Device* Node::device_by_ordinal(DeviceOrdinal o) {
  for (Device& d : devices_) {
    if (d.ordinal == o) return &d;
  }
  return nullptr;
}

const Node::Tenant* Node::tenant(TenantId id) const {
  auto it = tenants_.find(id.value());
  return it == tenants_.end() ? nullptr : &it->second;
}

Node::Tenant* Node::tenant_mut(TenantId id) { return const_cast<Tenant*>(tenant(id)); }

const Node::Session* Node::session(std::uint64_t id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

NamespaceId Node::namespace_id(const std::string& name) const {
  auto it = namespaces_.find(name);
  return it == namespaces_.end() ? NamespaceId{0} : it->second.id;
}

// The namespace a tenant's name says ("<ns>/…"; no slash: default), if still configured.
NamespaceId Node::namespace_of_name(const std::string& tenant_name) const {
  const auto slash = tenant_name.find('/');
  NamespaceId ns =
      namespace_id(slash == std::string::npos ? std::string(quota::kDefaultNamespace) : tenant_name.substr(0, slash));
  if (ns.value() == 0) ns = namespace_id(quota::kDefaultNamespace);
  return ns;
}

std::optional<std::uint32_t> Node::free_slot(std::vector<bool>& used) {
  for (std::uint32_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      used[i] = true;
      return i;
    }
  }
  return std::nullopt;
}

void Node::touch_tenant(TenantId id) {
  if (const Tenant* t = tenant(id)) changes_.tenants.insert(t->slot);
  changes_.devices = true;
}

void Node::touch_tenant_named(const std::string& name) {
  if (auto it = tenant_ids_.find(name); it != tenant_ids_.end()) touch_tenant(it->second);
}

std::chrono::steady_clock::time_point Node::steady_now() const { return env_.clock ? env_.clock().steady : last_now_; }

std::uint64_t Node::unix_of(std::chrono::steady_clock::time_point t) const {
  if (!env_.clock || t == std::chrono::steady_clock::time_point{}) return 0;
  const Now n = env_.clock();
  const auto ago = std::chrono::duration_cast<std::chrono::nanoseconds>(n.steady - t).count();
  if (ago <= 0) return n.unix_ns;
  return n.unix_ns > static_cast<std::uint64_t>(ago) ? n.unix_ns - static_cast<std::uint64_t>(ago) : 0;
}

std::size_t Node::sessions_of(TenantId t) const {
  std::size_t n = 0;
  for (const auto& [id, s] : sessions_) n += s.tenant == t ? 1 : 0;
  return n;
}

std::size_t Node::session_holders() const {
  std::set<TenantId> held;
  for (const auto& [id, s] : sessions_) held.insert(s.tenant);
  return held.size();
}

std::size_t Node::grant_holders() const {
  // By the sessions' grant lists, as grants_of() counts (grants held only for IPC imports after
  // their owner released them are not counted).
  std::set<TenantId> held;
  for (const auto& [id, s] : sessions_) {
    if (!s.grants.empty()) held.insert(s.tenant);
  }
  return held.size();
}

std::size_t Node::grants_of(TenantId t) const {
  std::size_t n = 0;
  for (const auto& [id, s] : sessions_) n += s.tenant == t ? s.grants.size() : 0;
  return n;
}

// Holds nothing: no session (grants belong to sessions), no usage on any GPU (memory outside
// vlake included), no process without a session on a GPU, and for an allocation's tenant, no
// live allocation.
bool Node::tenant_idle(const Tenant& t) const {
  if (!t.alloc_id.empty() && allocs_.count(t.alloc_id) != 0) return false;
  if (!rooms_.unhooked.of(t.id).empty()) return false;
  for (const auto& [id, s] : sessions_) {
    if (s.tenant == t.id) return false;
  }
  for (const auto& [id, g] : grants_) {
    if (g.tenant == t.id) return false;
  }
  for (const Device& d : devices_) {
    const Accounting::Usage u = acct_.usage(t.id, d.ordinal);
    // Retained memory included: a descriptor it kept, or handles bound to it, keep it alive.
    if ((u.used() + u.reserved).value() != 0) return false;
    if (d.pool->bound_free_bytes(t.id).value() != 0) return false;
  }
  return true;
}

bool Node::free_tenant_if_idle(TenantId id) {
  auto it = tenants_.find(id.value());
  if (it == tenants_.end() || !tenant_idle(it->second)) return false;
  if (!acct_.remove_tenant(id)) return false;
  const Tenant& t = it->second;
  for (const auto& [name, n] : namespaces_) {
    if (n.id == t.ns) changes_.namespaces.insert(n.slot);  // its tenant count
  }
  changes_.tenants.insert(t.slot);
  changes_.devices = true;
  // Its id may be reused by another tenant: memory it freed must be scrubbed for anyone.
  for (Device& d : devices_) d.pool->forget_tenant(id);
  tenant_slots_[t.slot] = false;
  tenant_ids_.erase(t.name);
  log_.debug("tenant " + t.name + " (id " + std::to_string(id.value()) + ") freed: holds nothing");
  rooms_.guard.forget(id, t.name);
  rooms_.refusals.forget(t.name);
  rooms_.unhooked.forget(id);
  tenants_.erase(it);
  ++counters_.tenants_freed;
  return true;
}

std::size_t Node::free_idle_tenants() {
  // One pass over sessions and grants; only tenants holding neither are checked further.
  std::set<std::uint32_t> busy;
  for (const auto& [id, sess] : sessions_) busy.insert(sess.tenant.value());
  for (const auto& [id, g] : grants_) busy.insert(g.tenant.value());
  std::vector<TenantId> ids;
  for (const auto& [tid, t] : tenants_) {
    if (busy.count(tid) == 0) ids.push_back(t.id);
  }
  std::size_t n = 0;
  for (TenantId id : ids) n += free_tenant_if_idle(id) ? 1 : 0;
  return n;
}

Changes Node::changes_to_publish() {
  // Waits are drawn from the parked grants (a handful): their sessions' records change with
  // every ask and retry, and once more when the wait ends.
  std::set<std::uint32_t> waiting;
  for (const ParkedGrant& p : rooms_.parking.grants()) {
    auto it = sessions_.find(p.session);
    if (it != sessions_.end()) waiting.insert(it->second.slot);
  }
  changes_.sessions.insert(waiting.begin(), waiting.end());
  changes_.sessions.insert(waiting_slots_.begin(), waiting_slots_.end());
  waiting_slots_ = std::move(waiting);
  Changes c = std::move(changes_);
  changes_ = Changes{};
  return c;
}

Bytes Node::dedup_logical(DeviceOrdinal d) const { return dedup_ ? dedup_->logical_bytes(d) : Bytes{0}; }
Bytes Node::dedup_physical(DeviceOrdinal d) const { return dedup_ ? dedup_->physical_bytes(d) : Bytes{0}; }

proto::DeviceQuota Node::device_quota(const Tenant& t, const Device& d) const {
  proto::DeviceQuota q{};
  std::memcpy(q.uuid, d.uuid.data(), sizeof q.uuid);
  const Accounting::Usage u = acct_.usage(t.id, d.ordinal);
  q.total = d.total.value();
  q.limit = u.limit.value();
  q.used = reported_used(t.id, d, u).value();
  return q;
}

// What replies call `used`: usage minus the tenant's bound free handles (retired on demand
// when it needs the room, so they are not memory it cannot have); retained descriptors count.
Bytes Node::reported_used(TenantId t, const Device& d, const Accounting::Usage& u) const {
  const Bytes used = u.used();
  return used - std::min(used, d.pool->bound_free_bytes(t));
}

// ---------------------------------------------------------------------------------------------
// tenants

// `alloc`: a Kubernetes allocation's tenant: spec.limit applies on the allocation's GPU only
// (0 on the others), and the tenant has no uid/gid of its own.
Node::Tenant& Node::tenant_for(const quota::TenantSpec& spec, std::uint32_t uid, std::uint32_t gid,
                               const AllocationInfo* alloc) {
  const std::string name = cut_name(spec.name);
  auto it = tenant_ids_.find(name);
  Tenant* t = nullptr;
  if (it != tenant_ids_.end()) {
    t = &tenants_.at(it->second.value());
  } else {
    const std::optional<std::uint32_t> slot = free_slot(tenant_slots_);
    if (!slot) {
      throw TenantTableFull("tenant table full: " + std::to_string(tenants_.size()) + " of " +
                            std::to_string(st::kMaxTenants) + " tenants in use; tenant " + name + " cannot be added");
    }
    const TenantId id{*slot + 1};
    tenant_ids_[name] = id;
    Tenant fresh;
    fresh.id = id;
    fresh.slot = *slot;
    fresh.name = name;
    t = &tenants_.emplace(id.value(), std::move(fresh)).first->second;
  }
  t->limit = spec.limit;
  t->guard = spec.guard;
  t->dedup = spec.dedup;
  t->enforce = spec.enforce;
  t->kill_grace = spec.kill_grace;
  t->wait = spec.wait;
  t->allow_disable = spec.allow_disable;
  t->overcommit = spec.overcommit;
  t->dedup_domain = spec.dedup_domain;
  t->ipc_domain = spec.ipc_domain;
  t->have_ids = alloc == nullptr;
  t->uid = uid;
  t->gid = gid;
  t->alloc_id = alloc != nullptr ? alloc->id : std::string();
  const NamespaceId old_ns = t->ns;
  t->ns = namespace_id(spec.ns);
  acct_.assign(t->id, t->ns);
  for (const Device& d : devices_) {
    const bool here = alloc == nullptr || alloc->device == d.ordinal;
    acct_.set_limit(t->id, d.ordinal, here ? spec.limit.on_device(d.total) : Bytes{0});
  }
  charge_unhooked(*t);  // its policy may have changed
  touch_tenant(t->id);
  if (old_ns != t->ns) {
    for (const auto& [ns_name, n] : namespaces_) {
      if (n.id == old_ns) changes_.namespaces.insert(n.slot);
    }
  }
  return *t;
}

Node::Tenant& Node::tenant_for_uid(std::uint32_t uid, std::uint32_t gid) {
  const std::vector<gid_t> groups = env_.groups ? env_.groups(uid, gid) : std::vector<gid_t>{gid};
  return tenant_for(config_.resolve(uid, gid, groups), uid, gid, nullptr);
}

Node::Tenant& Node::tenant_for_alloc(const AllocationInfo& a) {
  const Device& d = devices_.at(static_cast<std::size_t>(a.device.value()));
  const quota::TenantSpec spec =
      config_.resolve_allocation(alloc::tenant_name(a.id, a.owner),
                                 a.owner ? a.owner->ns : std::string(quota::kDefaultNamespace), a.bytes, d.total);
  return tenant_for(spec, 0, 0, &a);
}

void Node::move_session(Session& s, Tenant& to) {
  const TenantId from = s.tenant;
  for (std::uint64_t gid : s.grants) {
    Grant& g = grants_.at(gid);
    // Its shared chunks' references move along (docs/quota.md: each saving group counts its own).
    const std::vector<SharedRef> refs = dedup_ ? dedup_->refs(g.id) : std::vector<SharedRef>{};
    acct_.uncharge(g.tenant, g.device, g.bytes, refs);
    acct_.restore(to.id, g.device, g.bytes);  // already held: may exceed the new limit
    acct_.share(to.id, g.device, refs);
    g.tenant = to.id;
    // The process holding these handles' descriptors is now `to`'s: they are bound to it.
    for (auto& h : g.handles) {
      if (h->bound) h->bound = to.id;
    }
    changes_.grants.insert(g.slot);
  }
  s.tenant = to.id;
  rooms_.contexts.move(s.id, to.id);  // its admitted contexts follow (docs/quota.md, "Contexts")
  charge_contexts(from);
  charge_contexts(to.id);
  touch_session(s);
  if (const Tenant* old = tenant(from)) {
    log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) + ") moves from tenant " +
              old->name + " to " + to.name + " with " + std::to_string(s.grants.size()) + " grant(s)");
    touch_tenant(from);
  }
  touch_tenant(to.id);
}

// ---------------------------------------------------------------------------------------------
// sessions

HelloOut Node::open_session(const Peer& peer, const proto::Hello& m) {
  HelloOut out;
  if (peer.start_time == 0) {
    out.answer = Malformed{"peer process is gone"};
    return out;
  }
  Session* sess = nullptr;
  if (m.old_session != 0) {
    auto it = sessions_.find(m.old_session);
    if (it != sessions_.end() && it->second.pid == peer.pid && it->second.start_time == peer.start_time &&
        it->second.alloc_id == peer.alloc_id) {
      sess = &it->second;
      // The process reconnected before the loop saw its old connection close.
      if (sess->conn != 0 && sess->conn != peer.conn) out.close = sess->conn;
    } else {
      limited_.warn("rebind uid " + std::to_string(peer.uid),
                    "connection " + std::to_string(peer.conn) + " (pid " + std::to_string(peer.pid) +
                        "): cannot re-bind session " + std::to_string(m.old_session) +
                        " (unknown, or opened by another process); opening a new session",
                    steady_now());
    }
  }
  if (sess == nullptr) {
    const std::chrono::steady_clock::time_point when = steady_now();
    const std::string who = "pid " + std::to_string(peer.pid) + " uid " + std::to_string(peer.uid) +
                            (peer.alloc_id.empty() ? std::string() : " allocation " + peer.alloc_id);
    Tenant* t = nullptr;
    try {
      if (!peer.alloc_id.empty()) {
        // Kubernetes: the allocation whose socket it came through is its identity.
        auto a = allocs_.find(peer.alloc_id);
        if (a == allocs_.end()) throw std::runtime_error("allocation " + peer.alloc_id + " is gone");
        t = &tenant_for_alloc(a->second);
      } else {
        t = &tenant_for_uid(peer.uid, peer.gid);
      }
    } catch (const TenantTableFull& e) {
      ++counters_.denials_tenant_table;
      record_refusal(TenantId{0}, peer.pid, nullptr, st::kRefusalLimitReached, Bytes{0}, tenants_.size(),
                     st::kMaxTenants, std::chrono::milliseconds{0}, Now{when, 0});
      limited_.warn("tenant table uid " + std::to_string(peer.uid), "session refused for " + who + ": " + e.what(),
                    when);
      out.answer = Fatal{proto::Status::limit_reached, e.what()};
      return out;
    } catch (const std::exception& e) {
      limited_.write(LogLevel::error, "session error", "session refused for " + who + ": " + e.what(), when);
      out.answer = Fatal{proto::Status::internal, e.what()};
      return out;
    }
    if ((m.flags & proto::kHelloPassthrough) != 0) {
      // VLAKE_DISABLE=1: only where the quota file allows it; the process then has no session
      // and its memory is attributed through NVML like any process without the hook.
      if (t->allow_disable) {
        limited_.info("passthrough " + t->name,
                      "pid " + std::to_string(peer.pid) + " (tenant " + t->name +
                          "): VLAKE_DISABLE allowed (allow_disable: true): passing through, no session",
                      when);
        proto::HelloAck ack{};
        ack.h = proto::make_header<proto::HelloAck>(proto::MsgType::hello_ack, m.h.request_id);
        ack.status = proto::Status::passthrough;
        ack.tenant_id = t->id.value();
        copy_chars(ack.tenant_name, t->name);
        out.answer = ack;
        return out;
      }
      ++counters_.passthrough_refused;
      limited_.info("passthrough " + t->name,
                    "pid " + std::to_string(peer.pid) + " (tenant " + t->name +
                        "): VLAKE_DISABLE refused: the quota file does not allow it (allow_disable) for this tenant's "
                        "namespace; the hook stays on",
                    when);
    }
    const TenantId tid = t->id;
    const std::size_t held = sessions_of(tid);
    if (held >= settings_.max_sessions_per_tenant) {
      ++counters_.denials_session_cap;
      const std::string text = "session cap: tenant " + t->name + " holds " + std::to_string(held) + " of " +
                               std::to_string(settings_.max_sessions_per_tenant) +
                               " sessions (vlaked --max-sessions-per-tenant)";
      record_refusal(t->id, peer.pid, nullptr, st::kRefusalLimitReached, Bytes{0}, held,
                     settings_.max_sessions_per_tenant, std::chrono::milliseconds{0}, Now{when, 0});
      limited_.warn("session cap " + t->name, "session refused for " + who + ": " + text, when);
      out.answer = Fatal{proto::Status::limit_reached, text};
      return out;
    }
    // The session table is shared fairly (fair_share.hpp): near full, a tenant holding its
    // share already is refused, so colluding tenants cannot take the last sessions.
    const FairShare::Table table{sessions_.size(),
                                 rooms_.session_share.contended(sessions_.size()) ? session_holders() : std::size_t{0}};
    const FairShare::Verdict verdict = rooms_.session_share.decide(table, held);
    const std::optional<std::uint32_t> slot =
        verdict == FairShare::Verdict::admit ? free_slot(session_slots_) : std::nullopt;
    if (!slot) {
      const bool full = verdict != FairShare::Verdict::over_fair_share;
      if (full) ++counters_.denials_other;
      else ++counters_.denials_session_cap;
      const std::string text = rooms_.session_share.describe(full ? FairShare::Verdict::table_full : verdict, "session",
                                                             "tenant " + t->name, table, held);
      record_refusal(t->id, peer.pid, nullptr, st::kRefusalLimitReached, Bytes{0}, full ? sessions_.size() : held,
                     full ? st::kMaxSessions : rooms_.session_share.fair_share(table.owners + (held == 0 ? 1 : 0)),
                     std::chrono::milliseconds{0}, Now{when, 0});
      limited_.write(full ? LogLevel::error : LogLevel::warn,
                     full ? "session table " + t->name : "session share " + t->name,
                     "session refused for " + who + ": " + text, when);
      out.answer = Fatal{proto::Status::limit_reached, text};
      free_tenant_if_idle(tid);
      return out;
    }
    Session ns;
    ns.id = next_session_id_++;
    ns.slot = *slot;
    ns.pid = peer.pid;
    ns.start_time = peer.start_time;
    ns.uid = peer.uid;
    ns.gid = peer.gid;
    ns.tenant = t->id;
    ns.alloc_id = peer.alloc_id;
    sess = &sessions_.emplace(ns.id, std::move(ns)).first->second;
    ++counters_.sessions_opened;
    out.opened = true;
    limited_.info("session",
                  "session " + std::to_string(sess->id) + ": pid " + std::to_string(peer.pid) + " uid " +
                      std::to_string(peer.uid) + " -> tenant " + t->name + " (limit " + t->limit.to_string() + ")",
                  when);
  } else {
    ++counters_.sessions_rebound;
    limited_.info("session",
                  "session " + std::to_string(sess->id) + ": re-bound by pid " + std::to_string(peer.pid) + " (" +
                      std::to_string(sess->grants.size()) + " grant(s))",
                  steady_now());
  }
  sess->conn = peer.conn;
  // Pressure is sent only to sessions whose (latest) Hello asked for it.
  sess->pressure = (m.flags & proto::kHelloPressure) != 0;
  sess->last_active = steady_now();
  sess->wait.reset();
  if ((m.flags & proto::kHelloWait) != 0) sess->wait = std::chrono::milliseconds(m.wait_ms);
  touch_session(*sess);
  out.session = sess->id;

  const Tenant& t = tenants_.at(sess->tenant.value());
  proto::HelloAck ack{};
  ack.h = proto::make_header<proto::HelloAck>(proto::MsgType::hello_ack, m.h.request_id);
  ack.status = proto::Status::ok;
  ack.tenant_id = t.id.value();
  ack.session_id = sess->id;
  ack.granularity = devices_.front().granularity.value();
  ack.device_count = static_cast<std::uint32_t>(devices_.size());
  ack.guard_mode = static_cast<proto::GuardMode>(t.guard);
  sess->guard = ack.guard_mode;  // how the hook places this process's allocations from now on
  copy_chars(ack.tenant_name, t.name);
  for (const Device& d : devices_) ack.devices[d.ordinal.value()] = device_quota(t, d);
  ack.wait_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(wait_of(*sess).count(), proto::kMaxWaitMs));
  // With the host tier, overcommit namespaces keep the pool: their grants move to host memory
  // instead of their processes being checkpointed (docs/swap.md, "Host tier").
  if (t.overcommit && !rooms_.tier.enabled()) ack.flags |= proto::kAckOvercommit;
  out.answer = ack;
  return out;
}

void Node::connection_closed(ConnId conn, std::uint64_t session, bool exited) {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || it->second.conn != conn) return;
  Session& s = it->second;
  s.conn = 0;
  if (exited) {
    end_session_locked(s, "process exited");
    return;
  }
  touch_session(s);
  end_move(s.id, Now{steady_now(), 0});  // its hook opens its gate when vlaked is gone
  limited_.info("session",
                "session " + std::to_string(s.id) + ": connection closed, process " + std::to_string(s.pid) +
                    " alive: detached with " + std::to_string(s.grants.size()) + " grant(s)",
                steady_now());
}

ConnId Node::end_session(std::uint64_t session, const char* why) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return 0;
  const ConnId conn = it->second.conn;
  end_session_locked(it->second, why);
  return conn;
}

void Node::end_session_locked(Session& s, const char* why) {
  const std::uint64_t id = s.id;
  drop_imports_of(id);  // CUDA IPC imports it held (docs/ipc.md)
  // Kept mappings died with the process (or, for a live one, are dropped when it reconnects).
  for (Device& d : devices_) {
    if (d.pool->forget_session(id)) {
      if (settle_device(d)) rooms_.parking.memory_returned();
    }
  }
  // A host tier move under way ends: its new memory goes back (docs/swap.md, "Host tier").
  end_move(id, Now{steady_now(), 0});
  const std::vector<std::uint64_t> grant_ids = s.grants;
  for (std::uint64_t gid : grant_ids) {
    auto it = grants_.find(gid);
    if (it != grants_.end() && !hold_for_imports(it->second)) finish_grant(it->second, s.tenant, false);
  }
  // A tenant with no session left holds nothing it gave back unless a descriptor survives:
  // its bound free handles are retired now (docs/pool.md, "Handle binding").
  const TenantId tenant = s.tenant;
  const bool last = std::none_of(sessions_.begin(), sessions_.end(),
                                 [&](const auto& kv) { return kv.first != id && kv.second.tenant == tenant; });
  if (last) {
    for (Device& d : devices_) {
      if (d.pool->bound_free_bytes(tenant).value() == 0 && d.pool->held_fds() == 0) continue;
      (void)d.pool->retire_bound(tenant, Bytes{~0ULL});
      if (settle_device(d)) rooms_.parking.memory_returned();
    }
  }
  session_slots_[s.slot] = false;
  changes_.sessions.insert(s.slot);
  // Its reserve leaves the tenant's and the GPU's figures.
  touch_tenant(s.tenant);
  ++counters_.process_exits;
  limited_.info("session",
                "session " + std::to_string(id) + " (pid " + std::to_string(s.pid) + ") ended: " + why + "; " +
                    std::to_string(grant_ids.size()) + " grant(s) returned",
                steady_now());
  rooms_.swaps.forget(id);
  rooms_.reclaim.forget(id);
  rooms_.counted.forget(id);
  bring_back_victims_of(id, std::nullopt);  // the pressure it made is gone
  if (const std::optional<TenantId> charged = rooms_.contexts.forget(id)) charge_contexts(*charged);
  sessions_.erase(id);
  free_tenant_if_idle(tenant);
}

// ---------------------------------------------------------------------------------------------
// quota configuration

void Node::validate(const quota::QuotaConfig& cfg) const {
  if (cfg.namespaces().size() > st::kMaxNamespaces) {
    throw quota::ConfigError(cfg.file(), 0, 0,
                             std::to_string(cfg.namespaces().size()) +
                                 " namespaces (with 'default'); this vlaked supports " +
                                 std::to_string(st::kMaxNamespaces));
  }
  for (const Device& d : devices_) cfg.check_device(d.total);
}

// Brings the namespace table in line with config_: existing namespaces keep their id, new ones
// get a free slot. Namespaces no longer configured stay until retarget_tenants() moved their
// tenants away (then apply() drops them).
void Node::apply_namespaces() {
  for (const quota::NamespaceSpec& spec : config_.namespaces()) {
    auto it = namespaces_.find(spec.name);
    if (it == namespaces_.end()) {
      // validate() bounds the count; a full table here means stale namespaces remain.
      const std::optional<std::uint32_t> slot = free_slot(namespace_slots_);
      if (!slot) throw std::runtime_error("namespace table full (" + std::to_string(st::kMaxNamespaces) + ")");
      it = namespaces_.emplace(spec.name, Namespace{NamespaceId{*slot + 1}, *slot, spec}).first;
    }
    it->second.spec = spec;
    // Overcommit (docs/swap.md): its tenants' limits may add up to more than the GPU, so its own
    // limit is what the file says (even above the GPU), and none when absent.
    const bool overcommit = config_.overcommit_of(spec);
    for (const Device& d : devices_) {
      Bytes limit = spec.limit_on(d.total);
      if (overcommit) limit = spec.limit ? spec.limit->on_device(d.total) : Accounting::kUnlimited;
      acct_.set_namespace(it->second.id, d.ordinal, limit, spec.guaranteed_on(d.total), overcommit);
    }
    changes_.namespaces.insert(it->second.slot);
  }
}

// Re-resolves every tenant against config_: live sessions by their uid/gid or allocation (a
// session whose tenant changed moves, grants and all), session-less tenants by the ids or the
// allocation that created them.
void Node::retarget_tenants() {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, sess] : sessions_) ids.push_back(id);
  std::set<std::uint32_t> resolved;
  for (std::uint64_t id : ids) {
    Session& sess = sessions_.at(id);
    try {
      Tenant* t = nullptr;
      if (!sess.alloc_id.empty()) {
        // A Kubernetes allocation's session: re-resolved from its allocation (namespace,
        // pod_limit may have changed); an allocation already gone keeps its tenant.
        auto a = allocs_.find(sess.alloc_id);
        t = a != allocs_.end() ? &tenant_for_alloc(a->second) : &tenants_.at(sess.tenant.value());
      } else {
        t = &tenant_for_uid(sess.uid, sess.gid);
      }
      resolved.insert(t->id.value());
      if (t->id != sess.tenant) move_session(sess, *t);
    } catch (const std::exception& e) {
      log_.error("session " + std::to_string(id) + ": keeps its tenant: " + e.what());
    }
  }
  std::vector<std::uint32_t> rest;
  for (const auto& [tid, t] : tenants_) {
    if (resolved.count(tid) == 0) rest.push_back(tid);
  }
  for (std::uint32_t tid : rest) {
    Tenant& t = tenants_.at(tid);
    if (t.have_ids) {
      const std::vector<gid_t> groups = env_.groups ? env_.groups(t.uid, t.gid) : std::vector<gid_t>{t.gid};
      const quota::TenantSpec spec = config_.resolve(t.uid, t.gid, groups);
      if (cut_name(spec.name) == t.name) {
        tenant_for(spec, t.uid, t.gid, nullptr);
        continue;
      }
    }
    if (!t.alloc_id.empty()) {
      auto a = allocs_.find(t.alloc_id);
      if (a != allocs_.end() && alloc::tenant_name(a->first, a->second.owner) == t.name) {
        tenant_for_alloc(a->second);
        continue;
      }
    }
    // Holds nothing (no session): keep it, in the namespace its name says if still there.
    t.ns = namespace_of_name(t.name);
    acct_.assign(t.id, t.ns);
    touch_tenant(t.id);
  }
}

void Node::apply(quota::QuotaConfig cfg, const std::string& source, bool from_file, Now now, const std::string& why) {
  config_ = std::move(cfg);
  apply_namespaces();
  rooms_.unhooked.clear_cache();
  retarget_tenants();
  // Namespaces gone from the file: their tenants have moved; drop them.
  std::vector<std::string> gone;
  for (const auto& [name, n] : namespaces_) {
    if (config_.find_namespace(name) == nullptr) gone.push_back(name);
  }
  for (const std::string& name : gone) {
    const Namespace& n = namespaces_.at(name);
    acct_.remove_namespace(n.id);
    namespace_slots_[n.slot] = false;
    changes_.namespaces.insert(n.slot);
    namespaces_.erase(name);
  }
  changes_.all = true;
  ++config_record_.generation;
  config_record_.loaded_unix_ns = now.unix_ns;
  config_record_.rejected = 0;
  copy_chars(config_record_.path, source);
  config_record_.from_file = from_file ? 1 : 0;
  config_record_.namespace_count = static_cast<std::uint32_t>(namespaces_.size());
  if (!why.empty()) {
    ++counters_.config_reloads;
    log_.info("config reloaded (" + why + "): " + source + ", generation " + std::to_string(config_record_.generation) +
              ", " + std::to_string(namespaces_.size()) + " namespace(s), " + std::to_string(gone.size()) + " removed");
  }
}

void Node::config_rejected(const std::string& error, Now now) {
  ++counters_.config_reload_errors;
  copy_chars(config_record_.last_error, error);
  config_record_.error_unix_ns = now.unix_ns;
  config_record_.rejected = 1;
}

// ---------------------------------------------------------------------------------------------
// Kubernetes allocations (docs/device-plugin.md)

void Node::allocation_added(const AllocationInfo& a) {
  rooms_.unhooked.clear_cache();
  allocs_[a.id] = a;
  // Sessions resumed from a previous vlaked that came through this allocation (by tenant name).
  const std::string tname = alloc::tenant_name(a.id, a.owner);
  const std::string aname = alloc::tenant_name(a.id, std::nullopt);
  bool resumed = false;
  for (auto& [sid, sess] : sessions_) {
    const Tenant* old = tenant(sess.tenant);
    if (sess.alloc_id.empty() && old != nullptr && (old->name == tname || old->name == aname)) sess.alloc_id = a.id;
    resumed = resumed || sess.alloc_id == a.id;
  }
  if (resumed) reattribute(a);
}

void Node::allocation_owner(const std::string& id, const alloc::Owner& owner) {
  rooms_.unhooked.clear_cache();
  auto it = allocs_.find(id);
  if (it == allocs_.end() || it->second.owner == owner) return;
  it->second.owner = owner;
  reattribute(it->second);
}

// Sessions opened through it keep their tenant until they end; a tenant left holding nothing
// is freed.
void Node::allocation_removed(const std::string& id) {
  rooms_.unhooked.clear_cache();
  allocs_.erase(id);
  std::vector<TenantId> ids;
  for (const auto& [tid, t] : tenants_) {
    if (t.alloc_id == id) ids.push_back(t.id);
  }
  for (TenantId t : ids) free_tenant_if_idle(t);
}

void Node::reattribute(const AllocationInfo& a) {
  Tenant& t = tenant_for_alloc(a);
  log_.info("allocation " + a.id + " belongs to " + t.name);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, s] : sessions_) {
    if (s.alloc_id == a.id && s.tenant != t.id) ids.push_back(id);
  }
  for (std::uint64_t id : ids) move_session(sessions_.at(id), t);
}

// ---------------------------------------------------------------------------------------------
// resume after a restart

std::vector<std::uint64_t> Node::resume(const st::State& s, const std::set<std::uint64_t>& alive) {
  handles_created_base_ = s.counters.handles_created;
  handles_released_base_ = s.counters.handles_released;
  counters_ = s.counters;
  rooms_.guard.resume(s.guard);
  rooms_.refusals.resume(s.refusals);
  const std::uint64_t generation = config_record_.generation;
  const std::uint64_t loaded = config_record_.loaded_unix_ns;
  const st::ConfigRecord applied = config_record_;
  config_record_ = s.config;
  // The configuration this daemon applied at start stays in force (path, namespaces, error
  // state); the generation counts on from the previous daemon's.
  std::memcpy(config_record_.path, applied.path, sizeof applied.path);
  config_record_.from_file = applied.from_file;
  config_record_.namespace_count = applied.namespace_count;
  config_record_.rejected = 0;
  config_record_.generation = s.config.generation + generation;
  config_record_.loaded_unix_ns = loaded;
  next_session_id_ = std::max<std::uint64_t>(s.header.next_session_id, 1);
  next_grant_id_ = std::max<std::uint64_t>(s.header.next_grant_id, 1);
  starts_ = s.header.starts + 1;
  for (std::uint32_t i = 0; i < st::kMaxDevices; ++i) {
    if (s.devices[i].in_use == 0) continue;
    for (Device& d : devices_) {
      if (std::memcmp(d.uuid.data(), s.devices[i].uuid, 16) == 0) {
        d.pool_peak = std::max(d.pool_peak, s.devices[i].pool_peak_bytes);
        d.idle_released_base = s.devices[i].idle_released_bytes;
      }
    }
  }

  // Old device ordinal -> current device (by UUID).
  std::vector<Device*> old_to_new(st::kMaxDevices, nullptr);
  for (std::uint32_t i = 0; i < st::kMaxDevices; ++i) {
    if (s.devices[i].in_use != 0) old_to_new[i] = device_mut(s.devices[i].uuid);
  }

  // Tenants keep their ids; usage is rebuilt from the grants below.
  for (std::uint32_t i = 0; i < st::kMaxTenants; ++i) {
    const st::TenantRecord& r = s.tenants[i];
    if (r.in_use == 0) continue;
    Tenant t;
    t.id = TenantId{i + 1};
    t.slot = i;
    t.name = std::string(r.name, strnlen(r.name, sizeof r.name));
    GuardBook::Faults faults{};
    std::copy(std::begin(r.kernel_faults), std::end(r.kernel_faults), faults.begin());
    rooms_.guard.set_faults(t.id, faults);
    rooms_.guard.set_evicted(t.name, r.guard_events_evicted);
    rooms_.refusals.set_evicted(t.name, r.refusals_evicted);
    std::copy(std::begin(r.denials), std::end(r.denials), t.denials.begin());
    // Until a live session re-resolves it: the namespace its name says, if still configured.
    t.ns = namespace_of_name(t.name);
    acct_.assign(t.id, t.ns);
    tenant_slots_[i] = true;
    tenant_ids_[t.name] = t.id;
    tenants_[t.id.value()] = t;
  }

  std::vector<std::uint64_t> kept;
  std::size_t dropped_sessions = 0;
  for (std::uint32_t i = 0; i < st::kMaxSessions; ++i) {
    const st::SessionRecord& r = s.sessions[i];
    if (r.state == st::kSessionFree) continue;
    if (alive.count(r.id) == 0) {
      ++dropped_sessions;
      continue;
    }
    // A Kubernetes allocation's session keeps its tenant; allocation_added() binds it to its
    // allocation again (by tenant name) once the allocation directories are read.
    auto old = tenants_.find(r.tenant);
    const bool pod_tenant =
        old != tenants_.end() && (old->second.name.rfind("pod:", 0) == 0 || old->second.name.rfind("alloc:", 0) == 0);
    Tenant& t = pod_tenant ? old->second : tenant_for_uid(r.uid, r.gid);
    Session sess;
    sess.id = r.id;
    sess.slot = i;
    sess.pid = r.pid;
    sess.start_time = r.start_time;
    sess.uid = r.uid;
    sess.gid = r.gid;
    sess.tenant = t.id;
    SwapRecord& sw = rooms_.swaps.of(sess.id);
    sw.outs = r.swap_outs;
    sw.ins = r.swap_ins;
    session_slots_[i] = true;
    sessions_.emplace(sess.id, std::move(sess));
    kept.push_back(r.id);
  }

  std::size_t kept_grants = 0;
  std::size_t dropped_grants = 0;
  for (std::uint32_t i = 0; i < st::kMaxGrants; ++i) {
    const st::GrantRecord& r = s.grants[i];
    if (r.state == st::kGrantFree) continue;
    auto sit = sessions_.find(r.session);
    Device* dev = r.device < st::kMaxDevices ? old_to_new[r.device] : nullptr;
    if (sit == sessions_.end() || dev == nullptr) {
      if (sit != sessions_.end()) {
        log_.warn("grant " + std::to_string(r.id) + " was on a GPU this node no longer has; dropped");
      }
      ++counters_.releases;
      ++dropped_grants;
      continue;
    }
    Session& sess = sit->second;
    Grant g;
    g.id = r.id;
    g.slot = i;
    g.session = sess.id;
    g.tenant = sess.tenant;
    g.device = dev->ordinal;
    g.bytes = Bytes{r.bytes};
    g.purpose = static_cast<proto::GrantPurpose>(r.purpose);
    g.handle_count = r.handle_count;
    g.requested = r.requested;
    g.created_unix_ns = r.created_unix_ns;
    if (g.purpose == proto::GrantPurpose::counted) {
      dev->counted += g.bytes;
    } else {
      g.orphaned = true;
      dev->orphaned += g.bytes;
    }
    acct_.restore(sess.tenant, dev->ordinal, g.bytes);
    sess.grants.push_back(g.id);
    grant_slots_[i] = true;
    grants_.emplace(g.id, std::move(g));
    ++kept_grants;
  }
  changes_.all = true;
  // Tenants of dead processes are not resurrected: those left holding nothing are freed.
  const std::size_t freed = free_idle_tenants();

  log_.info(std::string("resumed the state of a previous vlaked") +
            (s.header.clean != 0 ? " (graceful stop)" : " (previous daemon died)") + ": " +
            std::to_string(kept.size()) + " live session(s) detached, " + std::to_string(dropped_sessions) +
            " of dead processes dropped; " + std::to_string(kept_grants) + " grant(s) kept (orphaned), " +
            std::to_string(dropped_grants) + " dropped; " + std::to_string(freed) + " idle tenant(s) freed");
  return kept;
}

// ---------------------------------------------------------------------------------------------
// shutdown

std::size_t Node::shutdown() {
  // The daemon's handles go; granted memory lives on in the tenants that imported it.
  std::size_t held = 0;
  for (auto& [id, g] : grants_) {
    ++held;
    Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
    for (auto& h : g.handles) dev.pool->retire(std::move(h));
    g.handles.clear();
  }
  if (dedup_) {
    std::map<int, DevicePool*> pools;
    for (Device& d : devices_) pools[d.ordinal.value()] = d.pool.get();
    dedup_->retire_all(pools);
  }
  for (Device& d : devices_) d.pool->release_free();
  changes_.devices = true;
  return held;
}

}  // namespace vlake::pool
