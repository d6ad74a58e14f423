// Node: swapping idle processes of overcommit namespaces to host memory (docs/swap.md).
//
// A counted grant of an overcommit tenant that the GPU has no room for (the driver's free memory
// less --swap-margin) is parked: caches are reclaimed first (Pressure, as for the pool), and
// from its first retry on, idle processes (plan_swap) are told SwapNotice{out}. Each answers
// SwapReady once its hooked calls wait; the loop's swap thread then locks and checkpoints it
// (SwapJob), and swap_done() retries the parked grants. A swapped process's next hooked call
// sends SwapIn; it is restored once the GPU has room for what its checkpoint freed (plus the
// margin), swapping out others if need be, within its wait.
//
// Counted grants are measured (CountedAudit, docs/swap.md): at every NVML reading a session's
// counted grants are compared with what NVML charges to its process; one left unrealized is
// revoked, the victims moved out for its session go back as soon as there is room, and a
// session with unrealized or revoked grants makes nobody move out; plan_swap counts what NVML
// shows a candidate holding, not what it was granted.
#include <algorithm>
#include <cstring>

#include "vlake/contracts/codec.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/pressure_plan.hpp"

namespace vlake::pool {

namespace {

std::uint64_t ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return b > a ? static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count()) : 0;
}

}  // namespace

// Queues a SwapNotice of `phase` for the session's connection (none when detached).
void Node::notify(const Session& s, proto::SwapPhase phase) {
  if (s.conn == 0) return;  // detached: its process hears nothing until it reconnects
  SwapNoticeOut n;
  const SwapRecord sw = rooms_.swaps.get(s.id);
  n.conn = s.conn;
  n.session = s.id;
  n.msg = proto::make<proto::SwapNotice>();
  n.msg.phase = phase;
  n.msg.swap_id = sw.id;
  fx_.swap_notices.push_back(n);
}

// The GPU's free memory as its driver reports it now, and that less what restores under way
// and counted grants served lately take back (SwapBook).
Bytes Node::device_free(const Device& dev) {
  try {
    return driver_.memory_info(dev.ordinal).free;
  } catch (const DriverError& e) {
    limited_.warn("swap free", std::string("cannot read the GPU's free memory: ") + e.what(), steady_now());
    return Bytes{0};
  }
}

// The bytes of the session's counted grants on GPU `d`.
Bytes Node::counted_on(const Session& s, DeviceOrdinal d) const {
  Bytes held{0};
  for (std::uint64_t gid : s.grants) {
    const Grant& g = grants_.at(gid);
    if (g.device == d && g.purpose == proto::GrantPurpose::counted) held += g.bytes;
  }
  return held;
}

// Swapping is on and some session is of an overcommit namespace (else nothing can be moved:
// no driver query is worth making).
bool Node::swaps_possible() const {
  if (settings_.swap_idle.count() <= 0 || !driver_.checkpoint_supported()) return false;
  return std::any_of(sessions_.begin(), sessions_.end(),
                     [&](const auto& kv) { return tenants_.at(kv.second.tenant.value()).overcommit; });
}

Bytes Node::room(const Device& dev) {
  const Bytes free = device_free(dev);
  // Restores under way take memory back, and so do the drivers of processes just granted some.
  const Bytes taken = rooms_.swaps.restoring(dev.ordinal) + rooms_.swaps.recent_counted(dev.ordinal, steady_now());
  return free > taken ? free - taken : Bytes{0};
}

Node::Wait Node::wait_of_session(const Session& s) const {
  Wait w;
  const SwapRecord sw = rooms_.swaps.get(s.id);
  const bool restoring_wait =
      sw.in_conn != 0 &&
      (sw.state == SwapState::swapped || sw.state == SwapState::checkpointing || sw.state == SwapState::restoring);
  const bool parked = rooms_.parking.of_session(s.id) != nullptr;
  if (!parked && !restoring_wait) return w;  // most sessions: no walk over the others
  // Sessions being swapped out for it.
  const std::vector<std::uint64_t> swapping = rooms_.swaps.swapping_for(s.id);
  if (const ParkedGrant* oldest = rooms_.parking.of_session(s.id)) {
    const ParkedGrant& p = *oldest;
    const Device* dev = device_by_uuid(p.req.device_uuid);
    w.kind = st::kWaitMemory;
    w.device = dev != nullptr ? dev->ordinal : DeviceOrdinal{0};
    w.bytes = Bytes{p.req.bytes};
    w.since = p.received;
    w.deadline = p.deadline;
    w.waits_for = p.asked;
  }
  if (w.kind == st::kWaitNone && restoring_wait) {
    w.kind = st::kWaitRestore;
    w.device = sw.device;
    w.bytes = counted_on(s, sw.device) + sw.context;
    w.since = sw.in_at;
    w.deadline = sw.in_at + wait_of(s);
  }
  if (w.kind != st::kWaitNone) {
    for (std::uint64_t id : swapping) {
      if (std::find(w.waits_for.begin(), w.waits_for.end(), id) == w.waits_for.end()) w.waits_for.push_back(id);
    }
  }
  return w;
}

// Starts swapping out idle processes (not `requester`) to make `need` bytes of room on `dev`;
// returns the bytes their counted grants hold there (0: none eligible, nothing started).
Bytes Node::start_swaps(const Session& requester, const Device& dev, Bytes need, Now now) {
  if (!swaps_possible()) return Bytes{0};
  std::vector<SwapCandidate> candidates;
  std::vector<Session*> of;
  for (auto& [sid, ss] : sessions_) {
    if (sid == requester.id || rooms_.swaps.state(sid) != SwapState::none || !ss.pressure || ss.conn == 0 ||
        ss.pid == 0) {
      continue;
    }
    if (!tenants_.at(ss.tenant.value()).overcommit || now.steady < rooms_.swaps.get(sid).skip_until) continue;
    // A process waiting for a grant of its own may be moved too: it uses nothing on the GPU
    // while it waits (and when everyone waits for memory, somebody has to make room).
    SwapCandidate c;
    c.session = sid;
    // What moving it out frees: its counted grants as far as NVML's last reading showed them.
    c.bytes = std::min(counted_on(ss, dev.ordinal), rooms_.counted.realized(sid, dev.ordinal).value_or(Bytes{~0ULL}));
    c.priority = priority_of(ss.tenant);
    c.last_active = ss.last_active;
    candidates.push_back(c);
    of.push_back(&ss);
  }
  Bytes started{0};
  for (std::size_t i : plan_swap(candidates, priority_of(requester.tenant), need, now.steady, settings_.swap_idle)) {
    Session& ss = *of[i];
    SwapRecord& sw = rooms_.swaps.of(ss.id);
    sw.state = SwapState::notified;
    sw.id = rooms_.swaps.next_id();
    sw.device = dev.ordinal;
    sw.bytes = candidates[i].bytes;
    // Its context and the driver's own memory, as NVML saw it last (about 520 MiB on an H100):
    // the checkpoint frees it too, and the restore needs it back.
    sw.context = acct_.usage(ss.tenant, dev.ordinal).nonpool;
    sw.since = now.steady;
    sw.for_session = requester.id;
    sw.moved_for = requester.id;
    sw.restore_asap = false;
    changes_.sessions.insert(requester.slot);  // what it waits for changed
    notify(ss, proto::SwapPhase::out);
    started += sw.bytes;
    changes_.sessions.insert(ss.slot);
    limited_.write(LogLevel::info, "swap out",
                   "GPU " + std::to_string(dev.ordinal.value()) + ": swapping out session " + std::to_string(ss.id) +
                       " (pid " + std::to_string(ss.pid) + ", " + std::to_string(sw.bytes.value() >> 20) +
                       " MiB, idle " + std::to_string(ms_between(ss.last_active, now.steady)) + " ms) for session " +
                       std::to_string(requester.id),
                   now.steady);
  }
  return started;
}

// Overcommit (node_swap.cpp): a counted grant of an overcommit tenant that the GPU has no room
// for now. Parks it while caches are reclaimed and, from the first retry on, idle processes
// are swapped out; nullopt: go on and grant (room, or nothing more to do: the process's own
// driver decides).
std::optional<GrantOut> Node::make_room(ConnId conn, const Session& s, Device& dev, const proto::GrantRequest& m,
                                        Bytes bytes, Now now, const ParkedGrant* retry) {
  const Bytes want = bytes + settings_.swap_margin;
  const Bytes free = room(dev);
  if (free >= want) return std::nullopt;
  // It holds counted grants NVML does not show, or had one revoked lately: it does not need
  // room, and nobody is moved out for it (docs/swap.md, "Counted grants are measured").
  if (!rooms_.counted.may_displace(s.id, dev.ordinal, now.steady)) {
    limited_.write(LogLevel::info, "room " + std::to_string(s.id),
                   "GPU " + std::to_string(dev.ordinal.value()) + ": " + std::to_string(bytes.value() >> 20) +
                       " MiB for session " + std::to_string(s.id) +
                       ": its counted grants are not in NVML's figure of its process (or one was revoked "
                       "lately): nobody is moved out for it; its driver decides",
                   now.steady);
    return std::nullopt;
  }
  const Bytes shortfall = want - free;
  const std::chrono::milliseconds wait = wait_of(s);
  if (retry != nullptr) {
    if (now.steady >= retry->deadline) return std::nullopt;  // the driver decides
    // Caches first (the Pressure of the first park); from the first retry on, processes.
    const Bytes coming = rooms_.swaps.swapping_out(dev.ordinal);
    if (coming < shortfall && now.steady >= retry->received + settings_.reclaim_deadline) {
      (void)start_swaps(s, dev, shortfall - coming, now);
    }
    return GrantOut{Parked{}};
  }
  if (wait.count() <= 0) return std::nullopt;
  if (auto capped = over_parked_cap(s, tenants_.at(s.tenant.value()), dev, m, bytes, now)) return capped;
  std::vector<PressureNote> notes = pressure_for(s, dev, shortfall, {}, false);
  const Bytes coming = rooms_.swaps.swapping_out(dev.ordinal);
  rooms_.parking.park(conn, s.id, m, now.steady, wait, asked_of(notes), false, s.tenant, dev.ordinal, bytes);
  ++counters_.grants_parked;
  limited_.write(LogLevel::info, "room " + std::to_string(s.id),
                 "GPU " + std::to_string(dev.ordinal.value()) + ": " + std::to_string(bytes.value() >> 20) +
                     " MiB for session " + std::to_string(s.id) + " wait for room (" +
                     std::to_string(free.value() >> 20) + " MiB free, " + std::to_string(coming.value() >> 20) +
                     " MiB being swapped out)",
                 now.steady);
  return GrantOut{Parked{std::move(notes)}};
}

std::optional<Malformed> Node::swap_ready(std::uint64_t session, const proto::SwapReady& m) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return std::nullopt;
  Session& s = it->second;
  SwapRecord& sw = rooms_.swaps.of(s.id);
  if (sw.state != SwapState::notified || sw.id != m.swap_id) return std::nullopt;  // called off meanwhile
  sw.state = SwapState::checkpointing;
  sw.since = steady_now();
  fx_.swap_jobs.push_back(SwapJob{s.id, s.pid, sw.device, false});
  return std::nullopt;
}

std::optional<proto::SwapInReply> Node::swap_in(ConnId conn, std::uint64_t session, const proto::SwapIn& m, Now now) {
  proto::SwapInReply r = proto::make<proto::SwapInReply>(m.h.request_id);
  r.status = proto::Status::ok;
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return r;
  Session& s = it->second;
  SwapRecord& sw = rooms_.swaps.of(s.id);
  if (sw.state == SwapState::none && driver_.checkpoint_supported()) {
    // A previous vlaked may have checkpointed it: the driver knows.
    try {
      if (driver_.process_state(static_cast<int>(s.pid)) == Driver::ProcessState::checkpointed) {
        sw.state = SwapState::swapped;
        sw.since = now.steady;
        if (!s.grants.empty()) sw.device = grants_.at(s.grants.front()).device;
        sw.bytes = counted_on(s, sw.device);
        log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
                  ") was left on the host by an earlier vlaked: restoring it");
      }
    } catch (const DriverError&) {
      // Not a process the driver knows: it is on the GPU.
    }
  }
  switch (sw.state) {
    case SwapState::none: return r;  // not swapped (a stale gate): go on
    case SwapState::notified:
      // Called off before the checkpoint began: the process needs the GPU again.
      sw.state = SwapState::none;
      changes_.sessions.insert(s.slot);
      return r;
    case SwapState::lost: r.status = proto::Status::internal; return r;
    case SwapState::checkpointing:
    case SwapState::swapped:
    case SwapState::restoring: break;
  }
  if (sw.in_conn == 0) sw.in_at = now.steady;
  sw.in_conn = conn;
  changes_.sessions.insert(s.slot);
  sw.in_request = m.h.request_id;
  if (sw.state == SwapState::swapped) try_restore(s, now);
  return std::nullopt;
}

void Node::try_restore(Session& s, Now now) {
  SwapRecord& sw = rooms_.swaps.of(s.id);
  if (sw.state != SwapState::swapped || (sw.in_conn == 0 && !sw.restore_asap)) return;
  const Device* dev = device_by_ordinal(sw.device);
  if (dev == nullptr) return;
  // What it holds now (its counted grants there, those served while it was away included) plus
  // its context: what the checkpoint freed is no measure when others allocate or free meanwhile
  // (measured on the H100: a restore sized by it lost a process).
  const Bytes held = counted_on(s, sw.device);
  const Bytes want = held + sw.context + settings_.swap_margin;
  const Bytes free = room(*dev);
  if (free >= want) {
    sw.extra = held + sw.context;  // what room() counts as taken while it restores
    sw.state = SwapState::restoring;
    sw.since = now.steady;
    fx_.swap_jobs.push_back(SwapJob{s.id, s.pid, sw.device, true});
    if (sw.in_conn == 0) {
      log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) + ") goes back to GPU " +
                std::to_string(sw.device.value()) +
                ": what it was moved out for is gone (its grant was revoked, or its process ended)");
    }
    return;
  }
  // A restore vlaked started itself waits for room; it moves nobody out.
  if (sw.in_conn == 0) return;
  if (now.steady >= sw.in_at + wait_of(s)) {
    ++counters_.swap_timeouts;
    proto::SwapInReply r = proto::make<proto::SwapInReply>(sw.in_request);
    r.status = proto::Status::out_of_memory;
    r.waited_ms = ms_between(sw.in_at, now.steady);
    fx_.swap_replies.push_back(SwapInOut{sw.in_conn, r});
    sw.in_conn = 0;
    changes_.sessions.insert(s.slot);
    record_refusal(s.tenant, s.pid, dev, st::kRefusalRestoreTimeout, want, free.value(), 0,
                   std::chrono::milliseconds{r.waited_ms}, now);
    limited_.write(LogLevel::info, "swap in " + std::to_string(s.id),
                   "session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
                       ") stays on the host: " + std::to_string(want.value() >> 20) + " MiB needed, " +
                       std::to_string(free.value() >> 20) + " MiB free after " + std::to_string(r.waited_ms) + " ms",
                   now.steady);
    return;
  }
  const Bytes coming = rooms_.swaps.swapping_out(dev->ordinal);
  if (free + coming < want) (void)start_swaps(s, *dev, want - free - coming, now);
}

void Node::swap_done(const SwapJob& job, bool ok, Bytes bytes, std::chrono::nanoseconds took, const std::string& error,
                     Now now) {
  auto it = sessions_.find(job.session);
  if (it == sessions_.end()) return;  // it ended meanwhile
  Session& s = it->second;
  SwapRecord& sw = rooms_.swaps.of(s.id);
  changes_.sessions.insert(s.slot);
  changes_.devices = true;
  if (const Session* f = session(sw.for_session)) changes_.sessions.insert(f->slot);
  sw.for_session = 0;
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(took.count(), 0));
  if (!job.restore) {
    if (!ok) {
      ++counters_.swap_failures;
      sw.state = SwapState::none;
      sw.skip_until = now.steady + SwapBook::kSkipAfterFailure;
      limited_.warn("swap failed",
                    "session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
                        "): checkpoint failed: " + error + "; it stays on the GPU",
                    now.steady);
      notify(s, proto::SwapPhase::back);
      if (sw.in_conn != 0) {
        proto::SwapInReply r = proto::make<proto::SwapInReply>(sw.in_request);
        r.status = proto::Status::ok;
        fx_.swap_replies.push_back(SwapInOut{sw.in_conn, r});
        sw.in_conn = 0;
      }
      return;
    }
    ++counters_.swap_outs;
    ++sw.outs;
    counters_.swap_out_ns += ns;
    notify(s, proto::SwapPhase::host);
    if (bytes.value() > 0) sw.bytes = bytes;
    counters_.swap_out_bytes += sw.bytes.value();
    sw.state = SwapState::swapped;
    sw.since = now.steady;
    rooms_.parking.memory_returned();
    log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
              ") is on the host: " + std::to_string(sw.bytes.value() >> 20) + " MiB freed on GPU " +
              std::to_string(sw.device.value()) + " in " + std::to_string(ns / 1000000) + " ms");
    try_restore(s, now);  // it may have asked meanwhile
    return;
  }
  proto::SwapInReply r = proto::make<proto::SwapInReply>(sw.in_request);
  r.waited_ms = ms_between(sw.in_at, now.steady);
  if (!ok) {
    ++counters_.swap_failures;
    sw.state = SwapState::lost;
    r.status = proto::Status::internal;
    log_.error("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) + "): restore failed: " + error +
               "; the process cannot run on the GPU again");
  } else {
    ++counters_.swap_ins;
    ++sw.ins;
    counters_.swap_in_ns += ns;
    counters_.swap_in_bytes += sw.extra.value();
    sw.state = SwapState::none;
    sw.since = now.steady;
    sw.extra = Bytes{0};
    sw.moved_for = 0;
    sw.restore_asap = false;
    if (sw.in_conn == 0) notify(s, proto::SwapPhase::back);  // restored unasked: its gate opens
    else s.last_active = now.steady;
    r.status = proto::Status::ok;
    log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) + ") is back on GPU " +
              std::to_string(sw.device.value()) + " after " + std::to_string(r.waited_ms) + " ms (" +
              std::to_string(sw.bytes.value() >> 20) + " MiB, restore " + std::to_string(ns / 1000000) + " ms)");
  }
  if (sw.in_conn != 0) fx_.swap_replies.push_back(SwapInOut{sw.in_conn, r});
  sw.in_conn = 0;
}

void Node::swap_tick(Now now) {
  for (auto& [id, s] : sessions_) {
    SwapRecord& sw = rooms_.swaps.of(id);
    if (sw.state == SwapState::notified && now.steady >= sw.since + SwapBook::kReadyTimeout) {
      // Its hook did not answer (no worker thread, or an older hook): left alone, and told so in
      // case its answer was lost.
      sw.state = SwapState::none;
      sw.skip_until = now.steady + SwapBook::kSkipAfterFailure;
      changes_.sessions.insert(s.slot);
      if (const Session* f = session(sw.for_session)) changes_.sessions.insert(f->slot);
      sw.for_session = 0;
      notify(s, proto::SwapPhase::back);
      limited_.write(LogLevel::info, "swap ready",
                     "session " + std::to_string(id) + " did not get ready to be swapped out within " +
                         std::to_string(SwapBook::kReadyTimeout.count()) + " ms; left on the GPU",
                     now.steady);
    }
    if (sw.state == SwapState::swapped && (sw.in_conn != 0 || sw.restore_asap)) try_restore(s, now);
  }
}

void Node::bring_back_victims_of(std::uint64_t session, std::optional<DeviceOrdinal> d) {
  for (auto& [id, sw] : rooms_.swaps.records_mut()) {
    if (id == session || sw.moved_for != session || (d && sw.device != *d)) continue;
    sw.moved_for = 0;
    // Being checkpointed too: it comes back once the checkpoint is done (swap_done tries then).
    if (sw.state != SwapState::none && sw.state != SwapState::lost) sw.restore_asap = true;
  }
}

// Node-side granted time of a grant: its CLOCK_REALTIME stamp carried to the steady clock of `now`.
namespace {
std::chrono::steady_clock::time_point granted_steady(const GrantRecord& g, Now now) {
  if (g.created_unix_ns == 0 || now.unix_ns < g.created_unix_ns) return now.steady;
  return now.steady - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::nanoseconds(now.unix_ns - g.created_unix_ns));
}
}  // namespace

void Node::audit_counted(const std::vector<GpuSample>& sample, Now now) {
  if (settings_.counted_realize.count() <= 0) return;
  std::vector<CountedAudit::Holding> holdings;
  for (const auto& [sid, s] : sessions_) {
    for (const GpuSample& g : sample) {
      CountedAudit::Holding h;
      h.session = sid;
      h.device = g.device;
      Bytes orphaned{0};
      for (std::uint64_t gid : s.grants) {
        const Grant& gr = grants_.at(gid);
        if (gr.device != g.device) continue;
        if (gr.orphaned) orphaned += gr.bytes;  // NVML charges those to the process as well
        else if (gr.purpose == proto::GrantPurpose::counted)
          h.grants.push_back({gr.id, gr.bytes, granted_steady(gr, now)});
      }
      if (h.grants.empty()) continue;
      Bytes seen{0};
      for (const ProcessUsage& p : g.processes) {
        if (p.pid == s.pid) seen += p.used;
      }
      h.seen = seen > orphaned ? seen - orphaned : Bytes{0};
      // On the host or moving, NVML cannot show it.
      h.exempt = s.pid == 0 || rooms_.swaps.state(sid) != SwapState::none;
      holdings.push_back(std::move(h));
    }
  }
  for (const CountedAudit::Revocation& r : rooms_.counted.observe(holdings, now.steady)) {
    auto git = grants_.find(r.grant);
    if (git == grants_.end()) continue;
    Grant& g = git->second;
    const Session* s = session(r.session);
    const Tenant* t = tenant(g.tenant);
    const std::string name = t != nullptr ? t->name : std::to_string(g.tenant.value());
    limited_.write(
        LogLevel::warn, "counted revoked " + name,
        "GPU " + std::to_string(r.device.value()) + ": counted grant " + std::to_string(r.grant) + " of " +
            std::to_string(r.bytes.value() >> 20) + " MiB of session " + std::to_string(r.session) + " (pid " +
            std::to_string(s != nullptr ? s->pid : 0) + ", tenant " + name +
            ") revoked: NVML shows its process holding " + std::to_string(r.seen.value() >> 20) + " MiB of the " +
            std::to_string(r.counted.value() >> 20) + " MiB its counted grants charge, " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now.steady - r.granted_at).count()) +
            " ms after it was served (--counted-realize " + std::to_string(settings_.counted_realize.count()) +
            " ms); the tenant is no longer charged for it",
        now.steady);
    finish_grant(g, g.tenant, false);
    rooms_.counted.revoked(r.session, now.steady);
    bring_back_victims_of(r.session, r.device);
  }
}

}  // namespace vlake::pool
