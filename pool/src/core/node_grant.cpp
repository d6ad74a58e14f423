// vlake::pool::Node: grants, releases, usage, reserve reports, pressure and parked grants, the
// warm reserve, NVML's non-pool usage (docs/pool.md, docs/quota.md).
#include <cuda.h>

#include <algorithm>
#include <cstring>

#include "vlake/common/fixed_chars.hpp"
#include "vlake/contracts/codec.hpp"
#include "vlake/pool/features/dedup/dedup.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/pressure_plan.hpp"

namespace vlake::pool {

GrantOut Node::grant(ConnId conn, std::uint64_t session, const proto::GrantRequest& m, Now now) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return Malformed{"session is gone"};
  it->second.last_active = now.steady;
  touch_session(it->second);
  GrantOut out = grant_impl(conn, it->second, m, now, nullptr);
  const auto* r = std::get_if<Refused>(&out);
  if (r != nullptr && (m.flags & proto::kGrantNoWait) == 0)
    record_refused_grant(it->second, m, r->reply, now.steady, now);
  return out;
}

// Records a refusal in the refusal log and the tenant's denials (TenantId 0 and a null `dev`:
// none).
void Node::record_refusal(TenantId tid, std::uint32_t pid, const Device* dev, st::RefusalReason reason, Bytes bytes,
                          std::uint64_t used, std::uint64_t limit, std::chrono::milliseconds waited, Now now) {
  if (reason < 1 || reason > st::kRefusalReasons) return;
  Tenant* t = tid.value() != 0 ? tenant_mut(tid) : nullptr;
  st::RefusalRecord r{};
  r.time_unix_ns = now.unix_ns != 0 ? now.unix_ns : unix_of(now.steady);
  r.tenant = t != nullptr ? t->id.value() : 0;
  r.pid = pid;
  r.device = dev != nullptr ? static_cast<std::uint32_t>(dev->ordinal.value()) : st::kGuardNoDevice;
  r.reason = reason;
  r.bytes = bytes.value();
  r.used = used;
  r.limit = limit;
  r.waited_ms = static_cast<std::uint64_t>(std::max<std::int64_t>(waited.count(), 0));
  if (t != nullptr) {
    copy_chars(r.tenant_name, t->name);
    ++t->denials[reason - 1];
    touch_tenant(t->id);
  }
  // Kept per tenant: a full ring makes room with the entry of the tenant holding the most.
  if (const auto kept = rooms_.refusals.record(r); kept.evicted) touch_tenant_named(*kept.evicted);
  ++counters_.refusals_recorded;
  changes_.refusals = true;
}

// A grant answered Refused: recorded by its reply's status.
void Node::record_refused_grant(const Session& s, const proto::GrantRequest& m, const proto::GrantReply& r,
                                std::chrono::steady_clock::time_point received, Now now) {
  st::RefusalReason why = st::kRefusalInternal;
  switch (r.status) {
    case proto::Status::over_limit: why = st::kRefusalTenantLimit; break;
    case proto::Status::namespace_over_limit: why = st::kRefusalNamespaceLimit; break;
    case proto::Status::guarantee: why = st::kRefusalGuarantee; break;
    case proto::Status::out_of_memory: why = st::kRefusalOutOfMemory; break;
    case proto::Status::limit_reached: why = st::kRefusalLimitReached; break;
    case proto::Status::unknown_device: why = st::kRefusalUnknownDevice; break;
    default: break;
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now.steady - received);
  record_refusal(s.tenant, s.pid, device_by_uuid(m.device_uuid), why, Bytes{m.bytes}, r.used, r.limit, waited, now);
}

Refused Node::refuse(const Tenant& t, const Device& dev, Bytes bytes, Refusal why, proto::GrantReply reply, Now now) {
  // The reason travels as the reply's status (the hook names the quota that was hit), goes to
  // the log and to a per-reason counter.
  ++counters_.denials_over_limit;
  reply.status = proto::Status::over_limit;
  std::string detail;
  if (why == Refusal::namespace_limit) {
    ++counters_.denials_namespace_limit;
    const auto nu = acct_.namespace_usage(t.ns, dev.ordinal);
    detail = "namespace limit: namespace uses " + std::to_string(nu.held().value()) + " of " +
             std::to_string(nu.limit.value());
    reply.status = proto::Status::namespace_over_limit;
    reply.limit = nu.limit.value();
    reply.used = nu.held().value();
  } else if (why == Refusal::guarantee) {
    ++counters_.denials_guarantee;
    const auto du = acct_.device_usage(dev.ordinal);
    detail = "guarantee: memory above the namespace's guarantee is borrowed (" + std::to_string(du.borrowed.value()) +
             " bytes, less " + std::to_string(du.dedup_saved.value()) +
             " bytes dedup saves); the rest of the GPU is guaranteed to other namespaces (" +
             std::to_string(du.guaranteed.value()) + " bytes)";
    reply.status = proto::Status::guarantee;
  } else {
    ++counters_.denials_tenant_limit;
    detail = "tenant limit: used " + std::to_string(reply.used) + " of " + std::to_string(reply.limit);
  }
  // Memory outside vlake (docs/quota.md, `enforce`): the refusal is its doing when the grant
  // would have fit without it.
  if (why == Refusal::tenant_limit || why == Refusal::namespace_limit) {
    std::uint64_t outside = 0;
    bool fits_without = false;
    if (why == Refusal::tenant_limit) {
      const Accounting::Usage u = acct_.usage(t.id, dev.ordinal);
      outside = u.unhooked.value();
      fits_without = (u.granted + u.nonpool + u.reserved + bytes) <= u.limit;
    } else {
      const auto nu = acct_.namespace_usage(t.ns, dev.ordinal);
      outside = nu.unhooked.value();
      fits_without = (nu.granted + nu.nonpool + nu.reserved + bytes) <= nu.limit;
    }
    if (outside > 0) {
      detail +=
          "; " + std::to_string(outside) + " bytes of it are GPU memory outside vlake (processes without the hook)";
      if (fits_without) ++counters_.denials_unhooked;
    }
  }
  // Rate-limited per tenant (a refused flood must not flood the log).
  limited_.info("refusal " + t.name,
                "tenant " + t.name + ": " + std::to_string(bytes.value()) + " bytes on GPU " +
                    std::to_string(dev.ordinal.value()) + " refused (" + detail + ")",
                now.steady);
  return Refused{reply};
}

GrantOut Node::grant_impl(ConnId conn, Session& s, const proto::GrantRequest& m, Now now, const ParkedGrant* retry) {
  Admission a = admit(conn, s, m, now, retry);
  if (auto* answered = std::get_if<GrantOut>(&a)) return std::move(*answered);
  return serve(conn, s, m, now, retry, std::get<Admitted>(std::move(a)));
}

// Admission: the device, the grant cap, the tenant's and namespace's limits and the guarantee
// (retiring bound free handles that stand in the way), then room for an overcommit tenant's
// counted grant. Every answer it gives itself (refused, parked, malformed) is a GrantOut.
Node::Admission Node::admit(ConnId conn, Session& s, const proto::GrantRequest& m, Now now, const ParkedGrant* retry) {
  proto::GrantReply reply{};
  reply.h = proto::make_header<proto::GrantReply>(proto::MsgType::grant_reply, m.h.request_id);
  Device* dev = device_mut(m.device_uuid);
  if (dev == nullptr) {
    ++counters_.denials_unknown_device;
    reply.status = proto::Status::unknown_device;
    return GrantOut{Refused{reply}};
  }
  if (m.bytes > dev->total.value()) {
    return GrantOut{Malformed{"GrantRequest for " + std::to_string(m.bytes) + " bytes, more than the GPU's " +
                              std::to_string(dev->total.value())}};
  }
  const Tenant& t = tenants_.at(s.tenant.value());
  const Bytes bytes = round_up(Bytes{m.bytes}, dev->granularity);
  reply.bytes = bytes.value();
  last_now_ = std::max(last_now_, now.steady);
  if (const std::size_t held = grants_of(t.id) + imports_of(t.id); held >= settings_.max_grants_per_tenant) {
    // The grant cap (docs/daemon.md, "Limits"): used/limit carry the grant count and the cap.
    ++counters_.denials_grant_cap;
    reply.status = proto::Status::limit_reached;
    reply.used = held;
    reply.limit = settings_.max_grants_per_tenant;
    limited_.warn("grant cap " + t.name,
                  "tenant " + t.name + ": grant refused: grant cap: " + std::to_string(held) + " of " +
                      std::to_string(settings_.max_grants_per_tenant) + " grants (vlaked --max-grants-per-tenant)",
                  now.steady);
    return GrantOut{Refused{reply}};
  }

  Accounting::Usage before{};
  Refusal why = Refusal::none;
  std::optional<Accounting::Reservation> res = acct_.reserve(t.id, dev->ordinal, bytes, &before, &why);
  if (!res && (why == Refusal::tenant_limit || why == Refusal::namespace_limit) &&
      dev->pool->bound_free_bytes(t.id).value() > 0) {
    // Memory the tenant gave back is charged while bound to it; an honest tenant is never
    // refused for it: retire its bound free handles (least recently freed first) and retry.
    std::uint64_t over = 0;
    if (why == Refusal::tenant_limit) {
      const std::uint64_t held = (before.used() + before.reserved).value();
      over = held + bytes.value() - std::min(held + bytes.value(), before.limit.value());
    } else {
      const Accounting::NamespaceUsage nu = acct_.namespace_usage(t.ns, dev->ordinal);
      const std::uint64_t held = nu.held().value();
      over = held + bytes.value() - std::min(held + bytes.value(), nu.limit.value());
    }
    const Bytes retired = dev->pool->retire_bound(t.id, Bytes{std::max<std::uint64_t>(over, 1)});
    (void)settle_device(*dev);
    changes_.devices = true;
    log_.debug("tenant " + t.name + ": retired " + std::to_string(retired.value()) +
               " bytes of its released handles on GPU " + std::to_string(dev->ordinal.value()) + " to admit " +
               std::to_string(bytes.value()) + " bytes");
    res = acct_.reserve(t.id, dev->ordinal, bytes, &before, &why);
  }
  reply.limit = before.limit.value();
  reply.used = reported_used(t.id, *dev, before).value();
  if (!res && (why == Refusal::tenant_limit || why == Refusal::namespace_limit) &&
      dev->pool->kept_by(s.id).value() > 0) {
    // Its own kept mappings hold what it lacks (docs/hook.md, "Kept mappings"): it drops them
    // and asks again; not a refusal.
    reply.status = proto::Status::drop_kept;
    return GrantOut{Refused{reply}};
  }
  const bool no_wait = (m.flags & proto::kGrantNoWait) != 0;
  if (!res && !no_wait && (why == Refusal::guarantee || why == Refusal::namespace_limit)) {
    // The GPU is held in full (memory beyond the namespace's guarantee is not free), or the
    // tenant's namespace is at its limit. Free handles bound to other tenants (of its namespace,
    // for its limit) are memory nobody uses, charged to them as retained: released to the
    // driver, they may admit this grant (and a tenant that gave memory back under pressure is no
    // longer charged for it). Otherwise processes that can give memory back are asked (of that
    // namespace only, for its limit), as when the pool runs out.
    const bool same_namespace = why == Refusal::namespace_limit;
    if (retire_others_bound(t, *dev, bytes, same_namespace).value() > 0) {
      res = acct_.reserve(t.id, dev->ordinal, bytes, &before, &why);
      reply.limit = before.limit.value();
      reply.used = reported_used(t.id, *dev, before).value();
    }
    if (!res && (why == Refusal::guarantee || why == Refusal::namespace_limit)) {
      if (auto parked = park_or_timeout(conn, s, t, *dev, m, bytes, bytes, now, retry, same_namespace, false)) {
        return GrantOut{std::move(*parked)};
      }
    }
  }
  if (!res) return GrantOut{refuse(t, *dev, bytes, why, reply, now)};
  if (m.purpose == proto::GrantPurpose::counted && t.overcommit) {
    // The process's own driver allocates it: room on the GPU first (docs/swap.md).
    if (auto parked = make_room(conn, s, *dev, m, bytes, now, retry)) {
      res->rollback();
      return GrantOut{std::move(*parked)};
    }
  }
  return Admitted{dev, &t, bytes, std::move(*res), reply};
}

// Serving an admitted grant: a grant slot, the pool's handles (a counted grant has none), the
// canary; memory the pool lacks parks it (or refuses it out_of_memory). The reservation commits
// only when it is Granted.
GrantOut Node::serve(ConnId conn, Session& s, const proto::GrantRequest& m, Now now, const ParkedGrant* retry,
                     Admitted admitted) {
  Device* dev = admitted.dev;
  const Tenant& t = *admitted.tenant;
  const Bytes bytes = admitted.bytes;
  proto::GrantReply& reply = admitted.reply;
  Accounting::Reservation& res = admitted.res;
  // The grant table is shared fairly (fair_share.hpp): near full, a tenant holding its share
  // already is refused, so colluding tenants cannot take the last grants.
  const bool contended = rooms_.grant_share.contended(grants_.size());
  const std::size_t held = contended ? grants_of(t.id) : 0;
  const FairShare::Table table{grants_.size(), contended ? grant_holders() : std::size_t{0}};
  const FairShare::Verdict verdict = rooms_.grant_share.decide(table, held);
  const std::optional<std::uint32_t> slot =
      verdict == FairShare::Verdict::admit ? free_slot(grant_slots_) : std::nullopt;
  if (!slot) {
    const bool full = verdict != FairShare::Verdict::over_fair_share;
    const std::string text = rooms_.grant_share.describe(full ? FairShare::Verdict::table_full : verdict, "grant",
                                                         "tenant " + t.name, table, held);
    if (full) ++counters_.denials_other;
    else ++counters_.denials_grant_cap;
    limited_.write(full ? LogLevel::error : LogLevel::warn, full ? "grant table " + t.name : "grant share " + t.name,
                   "tenant " + t.name + ": grant refused: " + text, now.steady);
    // used/limit: the table's use and size, or the tenant's grants and its fair share.
    reply.status = proto::Status::limit_reached;
    reply.used = full ? grants_.size() : held;
    reply.limit = full ? st::kMaxGrants : rooms_.grant_share.fair_share(table.owners + (held == 0 ? 1 : 0));
    return Refused{reply};  // the reservation rolls back
  }
  Grant g;
  g.id = next_grant_id_;
  g.slot = *slot;
  g.session = s.id;
  g.tenant = t.id;
  g.device = dev->ordinal;
  g.bytes = bytes;
  g.purpose = m.purpose;
  g.requested = m.bytes;
  g.created_unix_ns = now.unix_ns;
  g.canary = m.purpose == proto::GrantPurpose::alloc && t.guard == quota::GuardMode::canary;
  if (m.purpose != proto::GrantPurpose::counted) {
    changes_.devices = true;
    try {
      DevicePool::Served a = dev->pool->serve(
          bytes, t.id, m.purpose == proto::GrantPurpose::create ? 1u : proto::kMaxHandlesPerGrant, s.id);
      counters_.scrubs += a.scrubbed;
      if (a.reused > 0) ++counters_.reuses;
      switch (a.kind) {
        case PlanKind::exact: ++counters_.grants_exact; break;
        case PlanKind::stitch:
          ++counters_.grants_stitched;
          counters_.handles_stitched += a.handles.size();
          if (a.cross_tenant) ++counters_.stitched_cross_tenant;
          break;
        default: ++counters_.grants_new; break;
      }
      g.handles = std::move(a.handles);
      if (a.reused > 0 || a.released > 0) sync_retained(*dev);
      // Demand for the warm stock: a grant that needed a new handle or took a clean one
      // (docs/pool.md, "Warm reserve and warm stock"); its replacement is queued at once.
      if ((m.purpose == proto::GrantPurpose::alloc || m.purpose == proto::GrantPurpose::create) &&
          (a.kind == PlanKind::create || a.kind == PlanKind::release_create || a.clean > 0)) {
        dev->stock->note(bytes, now.steady);
        if (settings_.background_builds) plan_warm(*dev, now.steady, 0, true);
      }
      if (g.canary) {
        try {
          canary_fill(g);
        } catch (...) {
          for (auto& h : g.handles) dev->pool->put_back(std::move(h), t.id);
          throw;
        }
      }
    } catch (const PoolOutOfMemory&) {
      grant_slots_[*slot] = false;
      res.rollback();
      if ((m.flags & proto::kGrantNoWait) != 0) {  // a prefetch: nothing is asked for or waited for
        reply.status = proto::Status::out_of_memory;
        return Refused{reply};
      }
      if (retry == nullptr && dev->pool->kept_by(s.id).value() > 0) {
        // Its own kept mappings hold memory the GPU lacks: it drops them and asks again.
        reply.status = proto::Status::drop_kept;
        return Refused{reply};
      }
      // Park it while flagged sessions return their reserves, or keep a retried one parked
      // until its deadline (docs/pool.md, "Pressure protocol").
      // Free handles bound to other tenants are memory nobody uses: released to the driver, they
      // may be what this grant lacks (retried at once, parked meanwhile).
      const Bytes shortfall = std::max(dev->pool->shortfall(bytes), dev->granularity);
      const bool retired = retire_others_bound(t, *dev, shortfall, false).value() > 0;
      if (retired) rooms_.parking.retry_soon();
      if (auto parked = park_or_timeout(conn, s, t, *dev, m, bytes, shortfall, now, retry, false, retired)) {
        return std::move(*parked);
      }
      ++counters_.denials_out_of_memory;
      reply.status = proto::Status::out_of_memory;
      limited_.write(LogLevel::info, "no memory " + t.name,
                     "GPU " + std::to_string(dev->ordinal.value()) + ": no memory for " +
                         std::to_string(bytes.value()) + " bytes (tenant " + t.name + ")",
                     steady_now());
      return Refused{reply};
    } catch (const std::exception& e) {
      grant_slots_[*slot] = false;
      ++counters_.denials_other;
      reply.status = proto::Status::internal;
      limited_.write(LogLevel::error, "grant failed",
                     "GPU " + std::to_string(dev->ordinal.value()) + ": grant failed: " + e.what(), steady_now());
      return Refused{reply};
    }
  }
  Granted out;
  std::uint64_t offset = 0;
  // Kept mappings (docs/hook.md): keys only for memory bound to this tenant that the hook maps.
  const bool keys = dev->pool->binding() && m.purpose == proto::GrantPurpose::alloc && !g.canary;
  for (const auto& h : g.handles) {
    reply.handles[reply.handle_count++] = proto::HandleDesc{h->size.value(), offset, keys ? h->key : 0};
    offset += h->size.value();
    out.fds.push_back(h->fd.get());
  }
  g.handle_count = static_cast<std::uint32_t>(g.handles.size());
  res.commit();
  ++next_grant_id_;
  ++counters_.grants;
  if (m.purpose == proto::GrantPurpose::counted) dev->counted += bytes;
  else dev->granted += bytes;
  if (m.purpose == proto::GrantPurpose::counted && t.overcommit) {
    // Its driver allocates it now (room() counts it until the GPU shows it); one served while the
    // process is on the host is counted by its restore (try_restore).
    if (rooms_.swaps.state(s.id) == SwapState::none) rooms_.swaps.note_counted(dev->ordinal, steady_now(), bytes);
  }
  s.grants.push_back(g.id);
  const std::uint64_t gid = g.id;
  changes_.grants.insert(g.slot);
  touch_session(s);
  touch_tenant(t.id);
  grants_.emplace(gid, std::move(g));

  reply.status = proto::Status::ok;
  reply.grant_id = gid;
  reply.used = reported_used(t.id, *dev, acct_.usage(t.id, dev->ordinal)).value();
  if (log_.enabled(LogLevel::debug)) {
    log_.debug("grant " + std::to_string(gid) + ": " + std::to_string(bytes.value()) + " bytes on GPU " +
               std::to_string(dev->ordinal.value()) + " to " + t.name + " (session " + std::to_string(s.id) + ")");
  }
  out.reply = reply;
  out.grant = gid;
  return out;
}

void Node::undo_grant(std::uint64_t grant) {
  auto it = grants_.find(grant);
  if (it == grants_.end()) return;
  finish_grant(it->second, it->second.tenant, false);
}

void Node::record_grant_latency(std::chrono::nanoseconds d) {
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(d.count(), 0));
  for (std::size_t i = 0; i < st::kGrantLatencyBuckets; ++i) {
    if (ns <= st::kGrantLatencyBoundsNs[i]) {
      ++counters_.grant_latency_bucket[i];
      break;
    }
  }
  counters_.grant_latency_sum_ns += ns;
  ++counters_.grant_latency_count;
  counters_.grant_latency_max_ns = std::max(counters_.grant_latency_max_ns, ns);
}

void Node::finish_grant(Grant& g, TenantId releaser, bool exported, std::uint64_t kept_by) {
  if (g.canary && !g.orphaned && !g.handles.empty()) {
    (void)canary_check(g, "release", env_.clock ? env_.clock().unix_ns : 0);
  }
  Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  std::vector<SharedRef> refs;  // shared chunks: drop its references, here and in the accounting
  if (dedup_) {
    refs = dedup_->refs(g.id);
    dedup_->release_grant(g.id, *dev.pool);
  }
  // CUDA IPC (docs/ipc.md): the token dies with the grant; handles another process mapped
  // are retired like exported ones, never pooled.
  exported = exported || rooms_.ipc.ever_imported(g.id);
  rooms_.ipc.forget_grant(g.id);
  // An exported release retires the handles; their descriptors stay open (and charged to the
  // releaser as retained) while another process holds them (docs/pool.md, "Handle binding").
  for (auto& h : g.handles) {
    if (exported) dev.pool->retire(std::move(h), releaser);
    else dev.pool->put_back(std::move(h), releaser, kept_by);
  }
  (void)settle_device(dev);
  // On the host tier (docs/swap.md): its pieces are released; it held nothing on the GPU.
  std::optional<HostGrant> on_host = rooms_.tier.take_grant(g.id);
  if (on_host) rooms_.tier.release(std::move(on_host->pieces));
  if (g.purpose == proto::GrantPurpose::counted) dev.counted -= g.bytes;
  else if (g.orphaned) dev.orphaned -= g.bytes;
  else if (!on_host) dev.granted -= g.bytes;
  if (!acct_.uncharge(g.tenant, g.device, g.bytes, refs)) {
    log_.error("accounting: tenant " + std::to_string(g.tenant.value()) + " had less than grant " +
               std::to_string(g.id) + "'s bytes charged");
  }
  ++counters_.releases;
  if (exported) ++counters_.releases_exported;
  grant_slots_[g.slot] = false;
  changes_.grants.insert(g.slot);
  auto sit = sessions_.find(g.session);
  if (sit != sessions_.end()) {
    auto& v = sit->second.grants;
    v.erase(std::remove(v.begin(), v.end(), g.id), v.end());
    touch_session(sit->second);
  }
  touch_tenant(g.tenant);
  rooms_.parking.memory_returned();  // the loop retries them after this event
  grants_.erase(g.id);               // g is gone from here on
}

std::variant<proto::ReleaseAck, Malformed> Node::release(std::uint64_t session, const proto::Release& m) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  Session& s = sit->second;
  proto::ReleaseAck ack = proto::make<proto::ReleaseAck>(m.h.request_id);
  if (!s.holds(m.grant_id)) return with_status(ack, proto::Status::unknown_grant);
  Grant& g = grants_.at(m.grant_id);
  const DeviceOrdinal d = g.device;
  const bool exported = (m.flags & proto::kReleaseExported) != 0;
  // Kept mappings (docs/hook.md): one handle of an alloc grant, bound to the tenant, still
  // mapped in this process; otherwise the flag is ignored.
  const bool keep = (m.flags & proto::kReleaseKeepMapped) != 0 && !exported && g.handles.size() == 1 &&
                    g.purpose == proto::GrantPurpose::alloc && !g.canary && !g.orphaned &&
                    !rooms_.ipc.ever_imported(g.id) && devices_.at(static_cast<std::size_t>(d.value())).pool->binding();
  // What a session sent Pressure gives back is measured here (docs/pool.md, "Claims and measurements").
  rooms_.reclaim.gave(s.id, d, g.bytes, steady_now());
  if (!hold_for_imports(g)) finish_grant(g, s.tenant, exported, keep ? s.id : 0);
  ack.status = proto::Status::ok;
  ack.used =
      reported_used(s.tenant, devices_.at(static_cast<std::size_t>(d.value())), acct_.usage(s.tenant, d)).value();
  return ack;
}

std::optional<Malformed> Node::dropped(std::uint64_t session, const proto::Dropped& m) {
  if (sessions_.find(session) == sessions_.end()) return Malformed{"session is gone"};
  const std::span<const std::uint64_t> keys(m.keys, m.count);
  for (Device& d : devices_) {
    if (d.pool->dropped(session, keys)) {
      if (settle_device(d)) rooms_.parking.memory_returned();
      changes_.devices = true;
    }
  }
  return std::nullopt;
}

void Node::collect_drops() {
  std::vector<DropOut> out;
  for (Device& d : devices_) {
    for (const DropNote& n : d.pool->take_drops()) {
      auto sit = sessions_.find(n.session);
      if (sit == sessions_.end() || sit->second.conn == 0) continue;
      auto it = std::find_if(out.begin(), out.end(), [&](const DropOut& o) {
        return o.session == n.session && o.msg.count < proto::kMaxDropKeys;
      });
      if (it == out.end()) {
        DropOut o;
        o.conn = sit->second.conn;
        o.session = n.session;
        o.msg = proto::make<proto::Drop>();
        out.push_back(o);
        it = out.end() - 1;
      }
      it->msg.keys[it->msg.count++] = n.key;
      ++kept_drops_;
    }
  }
  for (DropOut& o : out) fx_.drops.push_back(o);
}

Effects Node::hand_over() {
  collect_drops();
  return std::exchange(fx_, Effects{});
}

Effects Node::settle(Now now) {
  judge_reclaims(now);
  if (retry_due(now)) retry_parked(now);
  swap_tick(now);
  tier_tick(now);
  return hand_over();
}

std::variant<proto::UsageReply, Malformed> Node::usage(std::uint64_t session, const proto::UsageQuery& m) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  ++counters_.usage_queries;
  proto::UsageReply r{};
  r.h = proto::make_header<proto::UsageReply>(proto::MsgType::usage_reply, m.h.request_id);
  const Device* dev = device_by_uuid(m.device_uuid);
  if (dev == nullptr) {
    r.status = proto::Status::unknown_device;
    return r;
  }
  const Accounting::Usage u = acct_.usage(sit->second.tenant, dev->ordinal);
  r.status = proto::Status::ok;
  r.total = dev->total.value();
  r.limit = u.limit.value();
  r.used = reported_used(sit->second.tenant, *dev, u).value();
  return r;
}

std::optional<Malformed> Node::reserve_report(std::uint64_t session, const proto::ReserveReport& m) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  Session& s = sit->second;
  const Device* dev = device_by_uuid(m.device_uuid);
  if (dev == nullptr) return Malformed{"ReserveReport for a GPU this node does not have"};
  if (m.bytes > dev->total.value()) return Malformed{"ReserveReport bytes exceed the GPU's memory"};
  if (m.blocks > m.bytes) return Malformed{"ReserveReport has more blocks than bytes"};
  // A reserve is part of what the session holds on that GPU: clamp (a Release may be in flight).
  std::uint64_t held = 0;
  for (std::uint64_t gid : s.grants) {
    const Grant& g = grants_.at(gid);
    if (g.device == dev->ordinal) held += g.bytes.value();
  }
  s.reserve[static_cast<std::size_t>(dev->ordinal.value())] = std::min(m.bytes, held);
  s.reclaim = (m.flags & proto::kReportReclaim) != 0;
  if ((m.flags & proto::kReportActive) != 0) {
    s.last_active = steady_now();
    touch_session(s);
  }
  ++counters_.reserve_reports;
  touch_tenant(s.tenant);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// pressure and parked grants (docs/pool.md, "Pressure protocol")

// A grant no memory can serve now: parked while the sessions plan_pressure() picks are asked
// for `shortfall` (Parked, with their Pressure notes); a retried one stays Parked until its
// deadline. `retired`: the caller just released memory to the driver (park it even with nobody
// to ask: the retry comes at once). nullopt: refuse it (nobody to ask and nothing returned,
// parking off, or the deadline passed).
std::optional<GrantOut> Node::park_or_timeout(ConnId conn, const Session& s, const Tenant& t, Device& dev,
                                              const proto::GrantRequest& m, Bytes bytes, Bytes shortfall, Now now,
                                              const ParkedGrant* retry, bool same_namespace, bool retired) {
  // The longer of vlaked's pressure wait and the session's own wait for memory.
  const std::chrono::milliseconds own = wait_of(s);
  const std::chrono::milliseconds wait = std::max(settings_.pressure_wait, own);
  if (retry != nullptr) {
    if (now.steady < retry->deadline) return GrantOut{Parked{}};
    ++counters_.parked_timeouts;
    limited_.write(
        LogLevel::info, "parked " + t.name,
        "GPU " + std::to_string(dev.ordinal.value()) + ": parked grant of " + std::to_string(bytes.value()) +
            " bytes (session " + std::to_string(s.id) + ") waited " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::milliseconds>(now.steady - retry->received).count()) +
            " ms; no memory came back: out of memory",
        steady_now());
    return std::nullopt;
  }
  if (wait.count() <= 0) return std::nullopt;
  if (auto capped = over_parked_cap(s, t, dev, m, bytes, now)) return capped;
  std::vector<PressureNote> notes = pressure_for(s, dev, shortfall, {}, same_namespace);
  // Kept mappings other processes are dropping (docs/hook.md) return memory as well (the
  // requester's own come back when it drops them after this refusal and asks again).
  // A session that waits for memory waits whether or not anyone can be asked now: a release of
  // any tenant retries it.
  if (notes.empty() && !retired && own.count() == 0 && dev.pool->pinned_bytes(s.id).value() == 0) {
    return std::nullopt;
  }
  rooms_.parking.park(conn, s.id, m, now.steady, wait, asked_of(notes), same_namespace, t.id, dev.ordinal, bytes);
  ++counters_.grants_parked;
  // Nobody holds caches to give back: the host tier moves idle allocations out at once instead
  // of at the first retry (docs/swap.md, "Host tier").
  if (notes.empty() && !same_namespace) (void)start_demotes(s, dev, bytes, now);
  limited_.write(LogLevel::info, "parked " + t.name,
                 "GPU " + std::to_string(dev.ordinal.value()) + ": grant of " + std::to_string(bytes.value()) +
                     " bytes (session " + std::to_string(s.id) + ") parked for up to " + std::to_string(wait.count()) +
                     " ms while memory is given back",
                 steady_now());
  return GrantOut{Parked{std::move(notes)}};
}

// A grant about to park while its tenant has max_parked_per_tenant grants parked already:
// refused limit_reached (used/limit: its parked grants and the cap), so that one tenant's waits
// cannot make every release's retry work large. nullopt: it may park.
std::optional<GrantOut> Node::over_parked_cap(const Session& s, const Tenant& t, const Device& dev,
                                              const proto::GrantRequest& m, Bytes bytes, Now now) {
  const std::size_t parked = rooms_.parking.parked_of(t.id);
  if (parked < settings_.max_parked_per_tenant) return std::nullopt;
  ++counters_.denials_grant_cap;
  proto::GrantReply reply{};
  reply.h = proto::make_header<proto::GrantReply>(proto::MsgType::grant_reply, m.h.request_id);
  reply.status = proto::Status::limit_reached;
  reply.bytes = bytes.value();
  reply.used = parked;
  reply.limit = settings_.max_parked_per_tenant;
  limited_.warn("parked cap " + t.name,
                "tenant " + t.name + ": GPU " + std::to_string(dev.ordinal.value()) + ": grant of " +
                    std::to_string(bytes.value()) + " bytes (session " + std::to_string(s.id) +
                    ") refused: parked cap: " + std::to_string(parked) + " of " +
                    std::to_string(settings_.max_parked_per_tenant) +
                    " grants wait for memory already (vlaked --max-parked-per-tenant)",
                now.steady);
  return GrantOut{Refused{reply}};
}

// Retires free handles bound to tenants other than `t` (of t's namespace only with
// `same_namespace`) on `dev` until `bytes` were retired; returns the bytes retired.
Bytes Node::retire_others_bound(const Tenant& t, Device& dev, Bytes bytes, bool same_namespace) {
  Bytes retired{0};
  for (const auto& [id, other] : tenants_) {
    if (retired >= bytes) break;
    if (other.id == t.id || (same_namespace && other.ns != t.ns)) continue;
    if (dev.pool->bound_free_bytes(other.id).value() == 0) continue;
    retired += dev.pool->retire_bound(other.id, Bytes{bytes.value() - retired.value()});
  }
  if (retired.value() > 0) {
    (void)settle_device(dev);
    changes_.devices = true;
    log_.debug("tenant " + t.name + ": retired " + std::to_string(retired.value()) +
               " bytes of other tenants' released handles on GPU " + std::to_string(dev.ordinal.value()) +
               " to admit " + std::to_string(bytes.value()) + " bytes");
  }
  return retired;
}

// How long a grant of `s` that no memory can serve waits: its Hello's own wait, else its
// tenant's namespace's `wait` (docs/quota.md, "Waiting for memory").
std::chrono::milliseconds Node::wait_of(const Session& s) const {
  auto it = tenants_.find(s.tenant.value());
  std::chrono::milliseconds w =
      s.wait ? *s.wait : (it == tenants_.end() ? std::chrono::milliseconds(0) : it->second.wait);
  // Overcommit (docs/swap.md): making room means checkpointing other processes (about a second
  // per GiB) and a swapped process waits for its restore: never less than kOvercommitWait.
  if (it != tenants_.end() && it->second.overcommit) w = std::max(w, kOvercommitWait);
  return w;
}

// The priority of a tenant's namespace (quota file `priority`; 0 when it has none).
std::int32_t Node::priority_of(TenantId t) const {
  auto it = tenants_.find(t.value());
  if (it == tenants_.end()) return 0;
  for (const auto& [name, n] : namespaces_) {
    if (n.id == it->second.ns) return n.spec.priority;
  }
  return 0;
}

// `same_namespace`: only sessions of the requester's namespace (what the others give back
// does not lower its namespace's usage).
std::vector<PressureNote> Node::pressure_for(const Session& requester, const Device& dev, Bytes shortfall,
                                             const std::vector<std::uint64_t>& exclude, bool same_namespace,
                                             bool trust_claims) {
  const auto d = static_cast<std::size_t>(dev.ordinal.value());
  const auto now = steady_now();
  judge_reclaims(Now{now, 0});
  std::vector<PressureCandidate> candidates;
  std::vector<const Session*> of;
  for (const auto& [sid, ss] : sessions_) {
    if (sid == requester.id || !ss.pressure || ss.conn == 0 || rooms_.swaps.state(sid) != SwapState::none) continue;
    if (ss.reserve[d] == 0 && !ss.reclaim) continue;
    // It gave nothing the last time it was asked: it has lost its turn for a while.
    if (!rooms_.reclaim.askable(sid, now)) continue;
    if (std::find(exclude.begin(), exclude.end(), sid) != exclude.end()) continue;
    if (same_namespace && tenants_.at(ss.tenant.value()).ns != tenants_.at(requester.tenant.value()).ns) continue;
    // A session waiting for a grant of its own is busy, and its callbacks may need what its
    // waiting thread holds (Python's interpreter lock): asking it could only stall both.
    if (rooms_.parking.of_session(sid) != nullptr) continue;
    PressureCandidate c;
    c.session = sid;
    c.reserve = Bytes{ss.reserve[d]};
    for (std::uint64_t gid : ss.grants) {
      const Grant& g = grants_.at(gid);
      if (g.device == dev.ordinal) c.held += g.bytes;
    }
    c.reclaim = ss.reclaim;
    c.priority = priority_of(ss.tenant);
    c.last_active = ss.last_active;
    c.credible = rooms_.reclaim.credible(sid, pressure_claim(c), trust_claims);
    candidates.push_back(c);
    of.push_back(&ss);
  }
  std::vector<PressureNote> notes;
  for (std::size_t i : plan_pressure(candidates, priority_of(requester.tenant), shortfall)) {
    const Session& ss = *of[i];
    PressureNote n;
    n.conn = ss.conn;
    n.session = ss.id;
    n.msg.h = proto::make_header<proto::Pressure>(proto::MsgType::pressure, 0);
    std::memcpy(n.msg.device_uuid, dev.uuid.data(), sizeof n.msg.device_uuid);
    n.msg.bytes = shortfall.value();
    n.msg.reason = proto::PressureReason::pool_exhausted;
    notes.push_back(n);
    rooms_.reclaim.asked(ss.id, dev.ordinal, now);
    limited_.write(LogLevel::info, "pressure",
                   "GPU " + std::to_string(d) + ": pressure: asked session " + std::to_string(ss.id) + " (pid " +
                       std::to_string(ss.pid) + ", reserve " + std::to_string(ss.reserve[d]) + " bytes" +
                       (ss.reclaim ? ", reclaim" : "") + ", priority " + std::to_string(candidates[i].priority) +
                       ") for " + std::to_string(shortfall.value()) + " bytes",
                   steady_now());
  }
  counters_.pressure_sent += notes.size();
  return notes;
}

bool Node::retry_due(Now now) const { return rooms_.parking.due(now.steady); }

void Node::judge_reclaims(Now now) {
  for (const ReclaimTrust::Verdict& v : rooms_.reclaim.expire(now.steady)) {
    const Session* s = session(v.session);
    if (s == nullptr) continue;
    const std::string who = "session " + std::to_string(v.session) + " (pid " + std::to_string(s->pid) + ", tenant " +
                            tenants_.at(s->tenant.value()).name + ")";
    if (v.skipped) {
      limited_.write(LogLevel::info, "reclaim skip " + tenants_.at(s->tenant.value()).name,
                     "GPU " + std::to_string(v.device.value()) + ": " + who + " gave nothing back within " +
                         std::to_string(rooms_.reclaim.deadline().count()) + " ms of a Pressure: not asked again for " +
                         std::to_string(rooms_.reclaim.skip().count()) +
                         " ms, its reserve and reclaim figures not counted on",
                     now.steady);
    } else {
      log_.debug("GPU " + std::to_string(v.device.value()) + ": " + who + " gave back " +
                 std::to_string(v.gave.value()) + " bytes when asked: counted on for at most that much");
    }
  }
}

void Node::retry_parked(Now now) {
  // What each GPU could serve now (its free pool and the driver's free memory): a release only
  // retries the parked grants that fit in it (ParkingLot::begin_retry).
  std::vector<Bytes> servable;
  for (Device& d : devices_) {
    const auto i = static_cast<std::size_t>(d.ordinal.value());
    if (servable.size() <= i) servable.resize(i + 1, Bytes{0});
    servable[i] = d.pool->free_bytes() + device_free(d);
  }
  const std::vector<ParkedGrant> todo = rooms_.parking.begin_retry(now.steady, servable);
  std::vector<Completion>& done = fx_.completions;
  for (std::size_t i = 0; i < todo.size(); ++i) {
    const ParkedGrant& p = todo[i];
    auto sit = sessions_.find(p.session);
    if (sit == sessions_.end() || sit->second.conn != p.conn) continue;  // gone
    GrantOut out;
    try {
      out = grant_impl(p.conn, sit->second, p.req, now, &p);
    } catch (...) {
      for (std::size_t j = i + 1; j < todo.size(); ++j) rooms_.parking.park_again(todo[j]);
      throw;
    }
    if (std::holds_alternative<Parked>(out)) {
      ParkedGrant again = p;
      if (ParkingLot::ask_due(p, now.steady)) {
        // Still short: the next sessions in the plan's order are asked (docs/pool.md).
        again.next_ask = now.steady + settings_.reclaim_deadline;
        std::vector<PressureNote> notes;
        if (const Device* dev = device_by_uuid(p.req.device_uuid)) {
          const Bytes want = round_up(Bytes{p.req.bytes}, dev->granularity);
          // Sessions whose own grants wait are not asked (pressure_for skips those in the parking lot;
          // the ones not retried yet are still in `todo`).
          std::vector<std::uint64_t> waiting;
          for (std::size_t j = i + 1; j < todo.size(); ++j) waiting.push_back(todo[j].session);
          std::vector<std::uint64_t> skip = waiting;
          skip.insert(skip.end(), p.asked.begin(), p.asked.end());
          // Those asked had a deadline to give something back and the grant is still short:
          // every other session that may give is asked now, at once; claims of sessions never
          // asked are no longer counted on (docs/pool.md, "Claims and measurements").
          notes = pressure_for(sit->second, *dev, want, skip, p.same_namespace, false);
          if (notes.empty() && ParkingLot::new_round_due(again, now.steady)) {
            // Everyone was asked: what they cached since may cover it; a new round.
            again.asked.clear();
            again.round_at = now.steady;
            notes = pressure_for(sit->second, *dev, want, waiting, p.same_namespace, false);
          }
          // The GPU itself is short: whole grants of idle processes of overcommit namespaces
          // move to the host tier (docs/swap.md, "Host tier"), whichever namespace waits.
          if (!p.same_namespace) (void)start_demotes(sit->second, *dev, want, now);
          // Processes of overcommit namespaces go to host memory (docs/swap.md).
          if (!p.same_namespace && swaps_possible()) {
            const Bytes need = want + settings_.swap_margin;
            const Bytes free = room(*dev);
            const Bytes coming = rooms_.swaps.swapping_out(dev->ordinal);
            if (free + coming < need) (void)start_swaps(sit->second, *dev, need - free - coming, now);
          }
        }
        for (const PressureNote& n : notes) again.asked.push_back(n.session);
        if (!notes.empty()) {
          Completion& c = done.emplace_back();
          c.conn = p.conn;
          c.received = p.received;
          c.out.emplace<Parked>().pressure = std::move(notes);
        }
      }
      rooms_.parking.park_again(std::move(again));
      continue;
    }
    if (const auto* r = std::get_if<Refused>(&out)) record_refused_grant(sit->second, p.req, r->reply, p.received, now);
    Completion c;
    c.conn = p.conn;
    c.received = p.received;
    c.out = std::move(out);
    done.push_back(std::move(c));
  }
}

std::optional<std::chrono::steady_clock::time_point> Node::next_deadline() const {
  return rooms_.parking.next_wakeup();
}

// ---------------------------------------------------------------------------------------------
// periodic work

// Warm reserve and stock of one GPU (warm_stock.hpp): releases surplus clean handles and
// queues (`queue`: for Effects::builds, at most kMaxBuildsInFlight per GPU) or builds inline (at
// most max_inline) what it lacks.
void Node::plan_warm(Device& d, std::chrono::steady_clock::time_point now, std::size_t max_inline, bool queue) {
  if (d.stock->budget().value() == 0) return;
  WarmStock::View view{d.pool->clean_stock(), d.building};
  std::size_t in_flight = 0;
  for (const auto& [size, n] : d.building) in_flight += n;
  std::size_t max_make = queue ? (in_flight < kMaxBuildsInFlight ? kMaxBuildsInFlight - in_flight : 0) : max_inline;
  // Nothing is built while grants wait for memory or right after a build found no room.
  if (!rooms_.parking.empty() || now < d.builds_paused_until) max_make = 0;
  const WarmStock::Plan p = d.stock->plan(view, now, max_make);
  for (Bytes size : p.release) {
    std::optional<BuiltHandle> b = d.pool->take_clean(size);
    if (!b) continue;
    changes_.devices = true;
    if (queue) fx_.discards.push_back(DiscardOut{d.ordinal, std::move(*b)});  // released on the builder
    else release_built(driver_, *b);
  }
  std::uint64_t made = 0;
  for (Bytes size : p.make) {
    if (queue) {
      fx_.builds.push_back(BuildOut{d.ordinal, size});
      ++d.building[size.value()];
      continue;
    }
    try {
      d.pool->adopt(build_handle(driver_, d.ordinal, size, d.granularity, true));
      ++made;
      changes_.devices = true;
    } catch (const DriverError& e) {
      if (e.code() != CUDA_ERROR_OUT_OF_MEMORY) throw;
      d.builds_paused_until = now + std::chrono::seconds(1);
      break;
    }
  }
  if (made > 0) {
    log_.debug("GPU " + std::to_string(d.ordinal.value()) + ": warm reserve and stock: " + std::to_string(made) +
               " handle(s) created, " + std::to_string(d.pool->free_bytes().value()) + " bytes free in the pool");
  }
}

void Node::adopt(DeviceOrdinal device, BuiltHandle h) {
  Device* d = device_by_ordinal(device);
  if (d == nullptr) {
    release_built(driver_, h);  // not a GPU of this node
    return;
  }
  auto it = d->building.find(h.size.value());
  if (it != d->building.end() && --it->second == 0) d->building.erase(it);
  d->pool->adopt(std::move(h));
  changes_.devices = true;
}

void Node::build_failed(DeviceOrdinal device, Bytes size, bool no_room) {
  Device* d = device_by_ordinal(device);
  if (d == nullptr) return;
  auto it = d->building.find(size.value());
  if (it != d->building.end() && --it->second == 0) d->building.erase(it);
  if (no_room) d->builds_paused_until = steady_now() + std::chrono::seconds(1);
}

void Node::tick(Now now) {
  // Warm reserve and stock: back to what they want, off the request path (a bounded step per
  // tick when built inline).
  for (Device& d : devices_) {
    try {
      plan_warm(d, now.steady, 16, settings_.background_builds);
    } catch (const std::exception& e) {
      log_.warn(std::string("warm reserve refill failed: ") + e.what());
    }
  }
  release_idle(now);
  // Retired handles still held by another process: scan again.
  for (Device& d : devices_) {
    if (d.pool->held_fds() > 0 && settle_device(d, true)) rooms_.parking.memory_returned();
  }
  if (rooms_.guard.sweep_due(now.steady, settings_.canary_interval)) {
    canary_sweep(now.unix_ns);
  }
  changes_.all = true;
}

// Idle release of every GPU's free pool (tick).
void Node::release_idle(Now now) {
  if (settings_.pool_idle_release.count() <= 0) return;
  for (Device& d : devices_) {
    // The clean handles the warm reserve and stock want now are kept, size by size; --pool-keep
    // counts them.
    const WarmStock::Counts want = d.stock->want(now.steady);
    const Bytes keep = settings_.pool_keep - std::min(settings_.pool_keep, WarmStock::bytes(want));
    const DevicePool::IdleReleased r = d.pool->release_idle(now.steady, settings_.pool_idle_release, keep, want);
    if (r.handles == 0) continue;
    log_.info("GPU " + std::to_string(d.ordinal.value()) + ": " + std::to_string(r.bytes.value() >> 20) + " MiB in " +
              std::to_string(r.handles) + " handle(s) free for " + std::to_string(settings_.pool_idle_release.count()) +
              " ms went back to the driver (" + std::to_string(r.bound) + " bound to a tenant)");
    // Bound handles were retired: their descriptors close (and their tenants' retained charge
    // goes) once nobody else holds them.
    settle_device(d);
    rooms_.parking.memory_returned();
    changes_.devices = true;
  }
}

// Scans the device's newly retired (`all`: every) held descriptors and records every tenant's
// retained bytes there (accounting, changes, counters). Returns true if memory came back.
bool Node::settle_device(Device& d, bool all) {
  const bool closed = d.pool->settle(all);
  sync_retained(d);
  return closed;
}

// Records every tenant's retained bytes on `d` (no scan).
void Node::sync_retained(Device& d) {
  const std::map<std::uint32_t, Bytes> r = d.pool->retained_all();
  for (const auto& [tid, t] : tenants_) {
    const auto it = r.find(tid);
    if (acct_.set_retained(t.id, d.ordinal, it == r.end() ? Bytes{0} : it->second)) touch_tenant(t.id);
  }
  const std::uint64_t held = d.pool->retired_held();
  if (held > d.retired_held_seen) {
    counters_.handles_retired_held += held - d.retired_held_seen;
    d.retired_held_seen = held;
  }
  changes_.devices = true;
}

NonpoolInputs Node::nonpool_inputs() const {
  NonpoolInputs in;
  in.daemon_pid = settings_.daemon_pid;
  for (const Device& d : devices_) in.devices.emplace_back(d.ordinal, d.uuid);
  for (const auto& [id, sess] : sessions_) {
    in.pid_tenant.emplace(sess.pid, sess.tenant);
    for (std::uint64_t gid : sess.grants) {
      const Grant& g = grants_.at(gid);
      // Already charged as granted: orphaned grants (NVML now charges their memory to the
      // process) and counted grants (memory the process's driver allocated itself).
      if (g.orphaned || g.purpose == proto::GrantPurpose::counted) in.orphaned[{sess.pid, g.device.value()}] += g.bytes;
    }
  }
  return in;
}

void Node::set_nonpool(const NonpoolResult& r) {
  for (const auto& [tid, t] : tenants_) {
    for (const Device& d : devices_) {
      const auto it = r.find({tid, d.ordinal.value()});
      rooms_.contexts.measured(t.id, d.ordinal, it == r.end() ? Bytes{0} : it->second);
      // NVML's figure, or more where admitted contexts are not (all) in it yet (node_contexts.cpp).
      acct_.set_nonpool(t.id, d.ordinal, rooms_.contexts.charge(t.id, d.ordinal));
    }
  }
  ++counters_.nvml_samples;
  changes_.all = true;
}

}  // namespace vlake::pool
