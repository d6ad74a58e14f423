// vlake::pool::Node: out-of-bounds guards (canary slack, the hook's fault reports; docs/guard.md)
// and dedup of read-only chunks (docs/dedup.md; the table and the planning are in dedup.cpp).
#include <algorithm>
#include <cstring>

#include <sstream>
#include "vlake/common/fixed_chars.hpp"

#include "vlake/contracts/codec.hpp"
#include "vlake/pool/features/dedup/dedup.hpp"
#include "vlake/pool/node.hpp"

namespace vlake::pool {

namespace {

// The canary pattern: every slack byte holds kCanaryByte (docs/guard.md).
constexpr std::uint8_t kCanaryByte = 0xCB;
// A sweep checks at most this much slack (then resumes there on the next tick).
constexpr std::uint64_t kCanarySweepBytes = 64ull << 20;

const char* guard_kind_name(std::uint32_t k) {
  switch (static_cast<proto::GuardKind>(k)) {
    case proto::GuardKind::fault: return "fault";
    case proto::GuardKind::canary: return "canary";
    case proto::GuardKind::fault_maps_shared: return "fault";  // never recorded as such
    case proto::GuardKind::readonly_write: return "readonly_write";
  }
  return "unknown";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// guards

void Node::canary_fill(const Grant& g) {
  std::uint64_t base = 0;
  for (const auto& h : g.handles) {
    const std::uint64_t end = base + h->size.value();
    const std::uint64_t from = std::max(base, g.requested);
    if (from < end) driver_.fill_u8(DevicePtr{h->va.value() + (from - base)}, kCanaryByte, Bytes{end - from});
    base = end;
  }
  driver_.synchronize();
}

// Checks g's slack; on a changed byte records a canary alarm and re-arms the pattern. Returns
// false when a changed byte was found. Never throws (driver failures are logged).
bool Node::canary_check(const Grant& g, const char* when, std::uint64_t now_unix_ns) {
  std::uint64_t bad = UINT64_MAX;
  try {
    std::vector<std::uint8_t> buf;
    std::uint64_t base = 0;
    for (const auto& h : g.handles) {
      const std::uint64_t end = base + h->size.value();
      std::uint64_t from = std::max(base, g.requested);
      while (from < end && bad == UINT64_MAX) {
        const std::uint64_t n = std::min<std::uint64_t>(end - from, 4ull << 20);
        buf.resize(n);
        driver_.copy_to_host(buf.data(), DevicePtr{h->va.value() + (from - base)}, Bytes{n});
        for (std::uint64_t i = 0; i < n; ++i) {
          if (buf[i] != kCanaryByte) {
            bad = from + i;
            break;
          }
        }
        from += n;
      }
      base = end;
    }
  } catch (const std::exception& e) {
    log_.warn("grant " + std::to_string(g.id) + ": canary check failed: " + e.what());
    return true;
  }
  if (bad == UINT64_MAX) return true;
  st::GuardEventRecord e{};
  e.kind = static_cast<std::uint32_t>(proto::GuardKind::canary);
  e.tenant = g.tenant.value();
  e.device = static_cast<std::uint32_t>(g.device.value());
  const Session* s = session(g.session);
  e.pid = s != nullptr ? s->pid : 0;
  if (const Tenant* t = tenant(g.tenant)) copy_chars(e.tenant_name, t->name);
  e.grant_id = g.id;
  e.requested_bytes = g.requested;
  e.first_bad_offset = bad;
  e.allocated_unix_ns = g.created_unix_ns;
  copy_chars(e.call, when);
  record_guard_event(e, now_unix_ns);
  // Re-arm, so a later overrun of the same allocation is seen again (and this one only once).
  try {
    canary_fill(g);
  } catch (const std::exception& ex) {
    log_.warn("grant " + std::to_string(g.id) + ": canary re-arm failed: " + ex.what());
  }
  return false;
}

// Checks up to a bounded amount of canary slack, resuming where the last sweep stopped.
void Node::canary_sweep(std::uint64_t now_unix_ns) {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, g] : grants_) {
    if (g.canary && !g.orphaned && !g.handles.empty()) ids.push_back(id);
  }
  std::uint64_t budget = 0;
  for (std::uint64_t id : rooms_.guard.sweep_order(std::move(ids))) {
    if (budget >= kCanarySweepBytes) break;
    const Grant& g = grants_.at(id);
    budget += g.bytes.value() > g.requested ? g.bytes.value() - g.requested : 0;
    (void)canary_check(g, "sweep", now_unix_ns);
    rooms_.guard.swept(g.id);
  }
}

void Node::record_guard_event(st::GuardEventRecord e, std::uint64_t now_unix_ns) {
  e.time_unix_ns = now_unix_ns;
  // Kept per tenant: a full ring makes room with the event of the tenant holding the most.
  const auto kept = rooms_.guard.record(e);
  e = kept.record;
  if (kept.evicted) touch_tenant_named(*kept.evicted);
  changes_.guard = true;
  // Guard violations are what a guard established (canary damage, a refused write into a shared
  // range); a kernel fault is counted as what it is, with what is known (docs/guard.md).
  const auto kind = static_cast<proto::GuardKind>(e.kind);
  switch (kind) {
    case proto::GuardKind::fault:
    case proto::GuardKind::fault_maps_shared: {
      const std::uint32_t i = e.flags & (st::kFaultGuarded | st::kFaultMapsShared);
      ++counters_.kernel_faults[i];
      if (auto it = tenants_.find(e.tenant); it != tenants_.end()) {
        rooms_.guard.count_fault(it->second.id, i);
        changes_.tenants.insert(it->second.slot);
      }
      break;
    }
    case proto::GuardKind::canary: ++counters_.guard_violations_canary; break;
    case proto::GuardKind::readonly_write: ++counters_.guard_violations_readonly_write; break;
  }
  std::ostringstream l;
  l << (kind == proto::GuardKind::fault ? "kernel fault" : "guard event") << " kind=" << guard_kind_name(e.kind)
    << " tenant=" << e.tenant_name << " gpu=";
  if (e.device == st::kGuardNoDevice) l << "?";
  else l << e.device;
  if (kind == proto::GuardKind::canary) {
    l << " grant=" << e.grant_id << " size=" << e.requested_bytes << " first_bad_offset=" << e.first_bad_offset
      << " allocated_at=" << e.allocated_unix_ns << " check=" << e.call;
  } else if (kind == proto::GuardKind::readonly_write) {
    l << " call=" << e.call << " cuda_status=" << e.cuda_status << " dst=0x" << std::hex << e.address << std::dec
      << " bytes=" << e.requested_bytes << " grant=" << e.grant_id << " allocation=0x" << std::hex
      << e.suspects[0].address << std::dec << ":" << e.suspects[0].bytes << " shared_offset=" << e.first_bad_offset;
  } else {
    l << " guarded=" << ((e.flags & st::kFaultGuarded) != 0 ? "true" : "false")
      << " maps_shared=" << ((e.flags & st::kFaultMapsShared) != 0 ? "true" : "false") << " call=" << e.call
      << " cuda_status=" << e.cuda_status << " live_allocations=" << e.live_allocations
      << " suspects=" << e.suspect_count;
    for (std::uint32_t i = 0; i < e.suspect_count && i < st::kGuardEventSuspects; ++i) {
      l << (i == 0 ? " suspect_list=" : ",") << "0x" << std::hex << e.suspects[i].address << std::dec << ":"
        << e.suspects[i].bytes;
    }
  }
  l << " pid=" << e.pid << " seq=" << e.seq;
  // Recorded events are bounded by the per-tenant rate; the line is rate-limited as well.
  limited_.warn(std::string("guard event ") + e.tenant_name, l.str(), steady_now());
}

std::optional<Malformed> Node::guard_event(std::uint64_t session, const proto::GuardEvent& m, Now now) {
  const Session* s = this->session(session);
  if (s == nullptr) return Malformed{"session is gone"};
  // A client can only report on itself: tenant and pid are the session's.
  const Tenant& t = tenants_.at(s->tenant.value());
  const Device* dev = device_by_uuid(m.device_uuid);
  // The event must name memory this session holds. The daemon cannot see the process's
  // addresses; it checks that the GPU is one where the session holds grants and that the
  // suspects (at least one, non-null, distinct, no more than the live allocations reported)
  // fit in the bytes the session holds there.
  std::string bad;
  std::uint64_t held = 0;
  if (dev != nullptr) {
    for (std::uint64_t gid : s->grants) {
      const Grant& g = grants_.at(gid);
      if (g.device == dev->ordinal) held += g.bytes.value();
    }
  }
  std::uint64_t suspected = 0;
  if (dev == nullptr) {
    bad = "names a GPU this node does not have";
  } else if (held == 0) {
    bad = "names GPU " + std::to_string(dev->ordinal.value()) + ", where the session holds no grant";
  } else if (m.suspect_count == 0 || m.suspect_count > m.live_allocations) {
    bad = "has " + std::to_string(m.suspect_count) + " suspect(s) for " + std::to_string(m.live_allocations) +
          " live allocation(s)";
  } else {
    for (std::uint32_t i = 0; i < m.suspect_count && bad.empty(); ++i) {
      const proto::GuardSuspect& x = m.suspects[i];
      if (x.address == 0 || x.bytes == 0) bad = "has a null suspect";
      for (std::uint32_t j = 0; j < i && bad.empty(); ++j) {
        if (m.suspects[j].address == x.address) bad = "names one suspect twice";
      }
      suspected += std::min<std::uint64_t>(x.bytes, UINT64_MAX / proto::kMaxGuardSuspects);
    }
    if (bad.empty() && suspected > held) {
      bad = "names " + std::to_string(suspected) + " suspect bytes, more than the " + std::to_string(held) +
            " the session holds on GPU " + std::to_string(dev->ordinal.value());
    }
  }
  if (!guard_admitted(t, *s, "guard event", bad, now)) return std::nullopt;
  st::GuardEventRecord e{};
  // A kernel fault, with what is known: the hook says whether the process maps shared chunks
  // on that GPU (kind fault_maps_shared; older hooks called it `readonly`); the daemon adds
  // what it knows itself (a shared grant of this session there; the session's guard mode).
  e.kind = static_cast<std::uint32_t>(proto::GuardKind::fault);
  bool maps_shared = m.kind == proto::GuardKind::fault_maps_shared;
  for (std::uint64_t gid : s->grants) {
    const Grant& g = grants_.at(gid);
    if (!maps_shared && g.device == dev->ordinal && dedup_ && dedup_->is_shared(gid)) maps_shared = true;
  }
  e.flags = (maps_shared ? std::uint32_t{st::kFaultMapsShared} : 0u) |
            (s->guard == proto::GuardMode::fault ? std::uint32_t{st::kFaultGuarded} : 0u);
  e.tenant = t.id.value();
  e.device = dev != nullptr ? static_cast<std::uint32_t>(dev->ordinal.value()) : st::kGuardNoDevice;
  e.pid = s->pid;
  copy_chars(e.tenant_name, t.name);
  e.cuda_status = m.cuda_status;
  e.suspect_count = m.suspect_count;
  e.live_allocations = m.live_allocations;
  std::memcpy(e.call, m.call, sizeof e.call);
  for (std::uint32_t i = 0; i < m.suspect_count && i < st::kGuardEventSuspects; ++i) e.suspects[i] = m.suspects[i];
  if (m.suspect_count > 0) {
    e.address = m.suspects[0].address;
    e.requested_bytes = m.suspects[0].bytes;
    e.allocated_unix_ns = m.suspects[0].age_ns < now.unix_ns ? now.unix_ns - m.suspects[0].age_ns : 0;
  }
  record_guard_event(e, now.unix_ns);
  return std::nullopt;
}

// A guard event (`what`) a session sent: rejected (counted, logged) when `bad` says why it does
// not fit what the session holds; else it takes one token of the tenant's guard event bucket,
// dropped (counted, logged) when empty. True: record it.
bool Node::guard_admitted(const Tenant& t, const Session& s, const char* what, const std::string& bad, Now now) {
  last_now_ = std::max(last_now_, now.steady);
  if (!bad.empty()) {
    ++counters_.guard_events_rejected;
    limited_.warn("guard rejected " + t.name,
                  "tenant " + t.name + " (pid " + std::to_string(s.pid) + "): " + what + " rejected: it " + bad,
                  now.steady);
    return false;
  }
  // Rate per tenant (a token bucket): excess events are counted, not recorded, so that one
  // tenant cannot push the other tenants' alarms out of the ring.
  if (!rooms_.guard.admit(t.id, now.steady)) {
    ++counters_.guard_events_limited;
    limited_.warn("guard limited " + t.name,
                  "tenant " + t.name + " (pid " + std::to_string(s.pid) +
                      "): guard event dropped: over the tenant's rate (vlaked --guard-event-rate)",
                  now.steady);
    return false;
  }
  return true;
}

std::optional<Malformed> Node::readonly_write(std::uint64_t session, const proto::ReadOnlyWrite& m, Now now) {
  const Session* s = this->session(session);
  if (s == nullptr) return Malformed{"session is gone"};
  // It must name a grant of this session on that GPU that holds shared chunks, and a shared range
  // that fits in it (the daemon cannot see the process's addresses).
  const Grant* g = s->holds(m.grant_id) ? &grants_.at(m.grant_id) : nullptr;
  const Tenant& t = tenants_.at(s->tenant.value());
  const Device* dev = device_by_uuid(m.device_uuid);
  std::string bad;
  if (dev == nullptr) {
    bad = "names a GPU this node does not have";
  } else if (g == nullptr || g->device != dev->ordinal) {
    bad = "names grant " + std::to_string(m.grant_id) + ", which the session does not hold on GPU " +
          std::to_string(dev->ordinal.value());
  } else if (!dedup_ || !dedup_->is_shared(g->id)) {
    bad = "names grant " + std::to_string(m.grant_id) + ", which holds no shared chunks";
  } else if (m.alloc_bytes > g->bytes.value() || m.shared_offset > g->bytes.value() ||
             m.shared_bytes > g->bytes.value() - m.shared_offset) {
    bad = "names a range larger than grant " + std::to_string(m.grant_id);
  }
  if (!guard_admitted(t, *s, "readonly_write event", bad, now)) return std::nullopt;
  st::GuardEventRecord e{};
  e.kind = static_cast<std::uint32_t>(proto::GuardKind::readonly_write);
  e.tenant = t.id.value();
  e.device = static_cast<std::uint32_t>(dev->ordinal.value());
  e.pid = s->pid;
  copy_chars(e.tenant_name, t.name);
  e.grant_id = g->id;
  e.address = m.address;
  e.requested_bytes = m.bytes;
  e.first_bad_offset = m.shared_offset;
  e.allocated_unix_ns = m.alloc_age_ns < now.unix_ns ? now.unix_ns - m.alloc_age_ns : 0;
  e.cuda_status = m.cuda_status;
  e.suspect_count = 1;
  e.suspects[0] = proto::GuardSuspect{m.alloc_address, m.alloc_bytes, m.alloc_age_ns};
  std::memcpy(e.call, m.call, sizeof e.call);
  record_guard_event(e, now.unix_ns);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// dedup of read-only chunks

Dedup& Node::dedup() {
  if (!dedup_) dedup_ = std::make_unique<Dedup>(driver_, log_);
  return *dedup_;
}

std::variant<ShareOut, Malformed> Node::share_request(std::uint64_t session, const proto::ShareRequest& m) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  Session& s = sit->second;
  ShareOut out;
  proto::ShareReply& reply = out.reply;
  reply.h = proto::make_header<proto::ShareReply>(proto::MsgType::share_reply, m.h.request_id);
  reply.grant_id = m.grant_id;
  auto answer = [&](proto::Status status) {
    reply.status = status;
    return out;
  };
  if (!s.holds(m.grant_id)) return answer(proto::Status::unknown_grant);
  Grant& g = grants_.at(m.grant_id);
  // Another process maps its handles through CUDA IPC (docs/ipc.md): the layout stays.
  if (rooms_.ipc.imports_open(g.id) > 0) return answer(proto::Status::bad_request);
  Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  const std::uint64_t gran = dev.granularity.value();
  if (m.bytes == 0 || m.offset % gran != 0 || m.bytes % gran != 0 || m.offset > g.bytes.value() ||
      m.bytes > g.bytes.value() - m.offset) {
    return Malformed{"ShareRequest range is not chunk-aligned inside grant " + std::to_string(g.id)};
  }
  const Tenant& t = tenants_.at(s.tenant.value());
  if ((m.flags & proto::kShareTransparent) != 0 && m.first_piece == 0 && t.dedup != quota::DedupMode::transparent) {
    // Transparent mode (docs/dedup.md): only for tenants of a `dedup: transparent` namespace.
    // Cheap: nothing is planned. The hook asks once per connection and then stops.
    limited_.write(LogLevel::info, "share " + t.name,
                   "tenant " + t.name + ": transparent share of grant " + std::to_string(g.id) +
                       " refused: its namespace is not in dedup transparent mode",
                   steady_now());
    return answer(proto::Status::dedup_disabled);
  }
  const Dedup::Plan* plan = nullptr;
  if (m.first_piece == 0) {
    if (g.purpose != proto::GrantPurpose::alloc || g.orphaned || g.canary || g.handles.empty() ||
        dedup().is_shared(g.id)) {
      limited_.write(LogLevel::info, "share " + t.name,
                     "tenant " + t.name + ": grant " + std::to_string(g.id) +
                         " cannot be shared (not a live alloc grant, canary guard, or shared already)",
                     steady_now());
      return answer(proto::Status::bad_request);
    }
    changes_.devices = true;
    try {
      // Chunks match only inside the tenant's trust domain (docs/dedup.md, "Trust domains"); a
      // tenant without one matches only its own chunks (':' never appears in a domain name).
      const std::string domain = t.dedup_domain.empty() ? "tenant:" + std::to_string(t.id.value()) : t.dedup_domain;
      plan = &dedup().plan(s.id, g.id, *dev.pool, s.tenant, domain, g.handles, Bytes{m.offset}, Bytes{m.bytes});
      sync_retained(dev);  // the copies may have taken the tenant's bound free handles
    } catch (const PoolOutOfMemory&) {
      limited_.write(LogLevel::info, "share " + t.name,
                     "tenant " + t.name + ": share of grant " + std::to_string(g.id) + ": no memory for the copies",
                     steady_now());
      return answer(proto::Status::out_of_memory);
    } catch (const std::exception& e) {
      limited_.write(LogLevel::error, "share " + t.name,
                     "tenant " + t.name + ": share of grant " + std::to_string(g.id) + " failed: " + e.what(),
                     steady_now());
      return answer(proto::Status::internal);
    }
  } else {
    plan = dedup().pending(s.id);
    if (plan == nullptr || plan->grant_id != g.id || m.first_piece >= plan->pieces.size()) {
      return Malformed{"ShareRequest for a batch of no pending share"};
    }
  }
  const auto total = static_cast<std::uint32_t>(plan->pieces.size());
  reply.first_piece = m.first_piece;
  reply.total_pieces = total;
  reply.shared_bytes = plan->shared.value();
  reply.merged_bytes = plan->merged.value();
  reply.copied_bytes = plan->copied.value();
  for (std::uint32_t i = m.first_piece; i < total && reply.piece_count < proto::kMaxHandlesPerGrant; ++i) {
    const Dedup::Piece& p = plan->pieces[i];
    proto::SharePiece& piece = reply.pieces[reply.piece_count++];
    piece.size = p.size.value();
    piece.offset = p.offset.value();
    if (p.kind == Dedup::PieceKind::keep) {
      piece.flags = proto::kShareKeep;
      piece.keep_index = p.keep_index;
    } else if (p.kind == Dedup::PieceKind::shared) {
      piece.flags = proto::kShareReadOnly;
      out.fds.push_back(dedup_->chunk_fd(p.chunk));
    } else {
      out.fds.push_back(p.fd());
    }
  }
  return answer(proto::Status::ok);
}

void Node::share_undeliverable(std::uint64_t session) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end() || !dedup_) return;
  const Dedup::Plan* plan = dedup_->pending(session);
  if (plan == nullptr) return;
  Device& dev = devices_.at(static_cast<std::size_t>(plan->device.value()));
  dedup_->abort(session, *dev.pool, sit->second.tenant);
  (void)settle_device(dev);  // chunks that lost their last reference were retired
  changes_.devices = true;
}

std::variant<proto::ShareAck, Malformed> Node::share_commit(std::uint64_t session, const proto::ShareCommit& m) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  Session& s = sit->second;
  proto::ShareAck ack = proto::make<proto::ShareAck>(m.h.request_id);
  const Dedup::Plan* plan = dedup().pending(s.id);
  if (plan == nullptr || plan->grant_id != m.grant_id || !s.holds(m.grant_id)) {
    ack.status = proto::Status::unknown_grant;
    return ack;
  }
  Grant& g = grants_.at(m.grant_id);
  Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  const Tenant& t = tenants_.at(s.tenant.value());
  const std::uint64_t shared = plan->shared.value();
  const std::uint64_t merged = plan->merged.value();
  const std::uint64_t copied = plan->copied.value();
  if (m.commit == 1) {
    dedup().commit(s.id, g.handles, *dev.pool, s.tenant);
    // The guarantee rule counts what exists: each chunk once per saving group (docs/quota.md).
    acct_.share(s.tenant, dev.ordinal, dedup_->refs(g.id));
    g.handle_count = static_cast<std::uint32_t>(g.handles.size());
    ack.shared_bytes = shared;
    limited_.write(LogLevel::info, "share " + t.name,
                   "tenant " + t.name + ": grant " + std::to_string(g.id) + " shares " + std::to_string(shared) +
                       " bytes read-only on GPU " + std::to_string(dev.ordinal.value()) + " (" +
                       std::to_string(merged) + " merged with existing chunks, " + std::to_string(copied) +
                       " copied privately)",
                   steady_now());
  } else {
    dedup().abort(s.id, *dev.pool, s.tenant);
    limited_.write(LogLevel::info, "share " + t.name,
                   "tenant " + t.name + ": share of grant " + std::to_string(g.id) + " aborted by the hook",
                   steady_now());
  }
  (void)settle_device(dev);  // replaced handles and unused chunks were retired: closed unless held
  changes_.grants.insert(g.slot);
  changes_.devices = true;
  ack.status = proto::Status::ok;
  return ack;
}

}  // namespace vlake::pool
