// Node: swapping idle processes of overcommit namespaces to host memory (docs/swap.md).
//
// A counted grant of an overcommit tenant that the GPU has no room for (the driver's free memory
// less --swap-margin) is parked: caches are reclaimed first (Pressure, as for the pool), and
// from its first retry on, idle processes (plan_swap) are told SwapNotice{out}. Each answers
// SwapReady once its hooked calls wait; the loop's swap thread then locks and checkpoints it
// (SwapJob), and swap_done() retries the parked grants. A swapped process's next hooked call
// sends SwapIn; it is restored once the GPU has room for what its checkpoint freed (plus the
// margin), swapping out others if need be, within its wait.
#include <algorithm>
#include <cstring>

#include "vlake/contracts/codec.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/pressure_plan.hpp"

namespace vlake::pool {

namespace {

// A notified process that does not answer SwapReady within this is left alone, and neither it nor
// one whose checkpoint failed is chosen again for kSkipAfterFailure.
constexpr std::chrono::milliseconds kReadyTimeout{2000};
constexpr std::chrono::milliseconds kSkipAfterFailure{60000};
// A counted grant's driver allocation is expected within this after the grant (room()).
constexpr std::chrono::milliseconds kRecentGrant{2000};

std::uint64_t ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return b > a ? static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count()) : 0;
}

}  // namespace

void Node::notify(const Session& s, proto::SwapPhase phase) {
  if (s.conn == 0) return;  // detached: its process hears nothing until it reconnects
  SwapNoticeOut n;
  n.conn = s.conn;
  n.session = s.id;
  n.msg = proto::make<proto::SwapNotice>();
  n.msg.phase = phase;
  n.msg.swap_id = s.swap_id;
  swap_notices_.push_back(n);
}

const char* to_string(SwapState s) noexcept {
  switch (s) {
    case SwapState::none: return "on the GPU";
    case SwapState::notified: return "asked to get ready";
    case SwapState::checkpointing: return "being checkpointed";
    case SwapState::swapped: return "on the host";
    case SwapState::restoring: return "being restored";
    case SwapState::lost: return "lost (restore failed)";
  }
  return "?";
}

Bytes Node::device_free(const Device& dev) {
  try {
    return driver_.memory_info(dev.ordinal).free;
  } catch (const DriverError& e) {
    limited_.warn("swap free", std::string("cannot read the GPU's free memory: ") + e.what(), steady_now());
    return Bytes{0};
  }
}

Bytes Node::counted_on(const Session& s, DeviceOrdinal d) const {
  Bytes held{0};
  for (std::uint64_t gid : s.grants) {
    const Grant& g = grants_.at(gid);
    if (g.device == d && g.purpose == proto::GrantPurpose::counted) held += g.bytes;
  }
  return held;
}

bool Node::swaps_possible() const {
  if (settings_.swap_idle.count() <= 0 || !driver_.checkpoint_supported()) return false;
  return std::any_of(sessions_.begin(), sessions_.end(),
                     [&](const auto& kv) { return tenants_.at(kv.second.tenant.value()).overcommit; });
}

Bytes Node::restoring(const Device& dev) const {
  Bytes in{0};
  for (const auto& [id, s] : sessions_) {
    if (s.swap == SwapState::restoring && s.swap_device == dev.ordinal) in += s.swap_extra;
  }
  return in;
}

Bytes Node::room(const Device& dev) {
  const Bytes free = device_free(dev);
  // Restores under way take memory back, and so do the drivers of processes just granted some.
  Bytes taken = restoring(dev);
  auto& recent = recent_counted_[static_cast<std::size_t>(dev.ordinal.value())];
  const auto now = steady_now();
  std::erase_if(recent, [&](const auto& r) { return now - r.first > kRecentGrant; });
  for (const auto& r : recent) taken += r.second;
  return free > taken ? free - taken : Bytes{0};
}

void Node::note_counted(const Device& dev, Bytes bytes) {
  recent_counted_[static_cast<std::size_t>(dev.ordinal.value())].emplace_back(steady_now(), bytes);
}

Bytes Node::swapped_bytes(DeviceOrdinal d) const {
  Bytes host{0};
  for (const auto& [id, s] : sessions_) {
    const bool out = s.swap == SwapState::swapped || s.swap == SwapState::restoring || s.swap == SwapState::lost;
    if (out && s.swap_device == d) host += s.swap_bytes;
  }
  return host;
}

Node::Wait Node::wait_of_session(const Session& s) const {
  Wait w;
  const bool restoring_wait =
      s.swap_in_conn != 0 &&
      (s.swap == SwapState::swapped || s.swap == SwapState::checkpointing || s.swap == SwapState::restoring);
  const bool parked =
      std::any_of(parked_.begin(), parked_.end(), [&](const ParkedGrant& p) { return p.session == s.id; });
  if (!parked && !restoring_wait) return w;  // most sessions: no walk over the others
  // Sessions being swapped out for it.
  std::vector<std::uint64_t> swapping;
  for (const auto& [id, o] : sessions_) {
    if (o.swap_for == s.id && (o.swap == SwapState::notified || o.swap == SwapState::checkpointing)) {
      swapping.push_back(id);
    }
  }
  std::sort(swapping.begin(), swapping.end());
  for (const ParkedGrant& p : parked_) {
    if (p.session != s.id) continue;
    const Device* dev = device_by_uuid(p.req.device_uuid);
    w.kind = st::kWaitMemory;
    w.device = dev != nullptr ? dev->ordinal : DeviceOrdinal{0};
    w.bytes = Bytes{p.req.bytes};
    w.since = p.received;
    w.deadline = p.deadline;
    w.waits_for = p.asked;
    break;  // the oldest
  }
  if (w.kind == st::kWaitNone && restoring_wait) {
    w.kind = st::kWaitRestore;
    w.device = s.swap_device;
    w.bytes = counted_on(s, s.swap_device) + s.swap_context;
    w.since = s.swap_in_at;
    w.deadline = s.swap_in_at + wait_of(s);
  }
  if (w.kind != st::kWaitNone) {
    for (std::uint64_t id : swapping) {
      if (std::find(w.waits_for.begin(), w.waits_for.end(), id) == w.waits_for.end()) w.waits_for.push_back(id);
    }
  }
  return w;
}

Bytes Node::swapping_out(const Device& dev) const {
  Bytes out{0};
  for (const auto& [id, s] : sessions_) {
    if ((s.swap == SwapState::notified || s.swap == SwapState::checkpointing) && s.swap_device == dev.ordinal) {
      out += s.swap_bytes;
    }
  }
  return out;
}

Bytes Node::start_swaps(const Session& requester, const Device& dev, Bytes need, Now now) {
  if (!swaps_possible()) return Bytes{0};
  std::vector<SwapCandidate> candidates;
  std::vector<Session*> of;
  for (auto& [sid, ss] : sessions_) {
    if (sid == requester.id || ss.swap != SwapState::none || !ss.pressure || ss.conn == 0 || ss.pid == 0) continue;
    if (!tenants_.at(ss.tenant.value()).overcommit || now.steady < ss.swap_skip_until) continue;
    // A process waiting for a grant of its own may be moved too: it uses nothing on the GPU
    // while it waits (and when everyone waits for memory, somebody has to make room).
    SwapCandidate c;
    c.session = sid;
    c.bytes = counted_on(ss, dev.ordinal);
    c.priority = priority_of(ss.tenant);
    c.last_active = ss.last_active;
    candidates.push_back(c);
    of.push_back(&ss);
  }
  Bytes started{0};
  for (std::size_t i : plan_swap(candidates, priority_of(requester.tenant), need, now.steady, settings_.swap_idle)) {
    Session& ss = *of[i];
    ss.swap = SwapState::notified;
    ss.swap_id = next_swap_id_++;
    ss.swap_device = dev.ordinal;
    ss.swap_bytes = candidates[i].bytes;
    // Its context and the driver's own memory, as NVML saw it last (about 520 MiB on an H100):
    // the checkpoint frees it too, and the restore needs it back.
    ss.swap_context = acct_.usage(ss.tenant, dev.ordinal).nonpool;
    ss.swap_since = now.steady;
    ss.swap_for = requester.id;
    changes_.sessions.insert(requester.slot);  // what it waits for changed
    notify(ss, proto::SwapPhase::out);
    started += ss.swap_bytes;
    changes_.sessions.insert(ss.slot);
    limited_.write(LogLevel::info, "swap out",
                   "GPU " + std::to_string(dev.ordinal.value()) + ": swapping out session " + std::to_string(ss.id) +
                       " (pid " + std::to_string(ss.pid) + ", " + std::to_string(ss.swap_bytes.value() >> 20) +
                       " MiB, idle " + std::to_string(ms_between(ss.last_active, now.steady)) + " ms) for session " +
                       std::to_string(requester.id),
                   now.steady);
  }
  return started;
}

std::optional<GrantOut> Node::make_room(ConnId conn, const Session& s, Device& dev, const proto::GrantRequest& m,
                                        Bytes bytes, Now now, const ParkedGrant* retry) {
  const Bytes want = bytes + settings_.swap_margin;
  const Bytes free = room(dev);
  if (free >= want) return std::nullopt;
  const Bytes shortfall = want - free;
  const std::chrono::milliseconds wait = wait_of(s);
  if (retry != nullptr) {
    if (now.steady >= retry->deadline) return std::nullopt;  // the driver decides
    // Caches first (the Pressure of the first park); from the first retry on, processes.
    const Bytes coming = swapping_out(dev);
    if (coming < shortfall && now.steady >= retry->received + kAskAgain) {
      (void)start_swaps(s, dev, shortfall - coming, now);
    }
    return GrantOut{Parked{}};
  }
  if (wait.count() <= 0) return std::nullopt;
  std::vector<PressureNote> notes = pressure_for(s, dev, shortfall, {}, false);
  const Bytes coming = swapping_out(dev);
  ParkedGrant parked{conn, s.id, m, now.steady, now.steady + wait, {}, now.steady + kAskAgain, false, now.steady};
  for (const PressureNote& n : notes) parked.asked.push_back(n.session);
  parked_.push_back(std::move(parked));
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
  if (s.swap != SwapState::notified || s.swap_id != m.swap_id) return std::nullopt;  // called off meanwhile
  s.swap = SwapState::checkpointing;
  s.swap_since = steady_now();
  swap_jobs_.push_back(SwapJob{s.id, s.pid, s.swap_device, false});
  return std::nullopt;
}

std::optional<proto::SwapInReply> Node::swap_in(ConnId conn, std::uint64_t session, const proto::SwapIn& m, Now now) {
  proto::SwapInReply r = proto::make<proto::SwapInReply>(m.h.request_id);
  r.status = proto::Status::ok;
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return r;
  Session& s = it->second;
  if (s.swap == SwapState::none && driver_.checkpoint_supported()) {
    // A previous vlaked may have checkpointed it: the driver knows.
    try {
      if (driver_.process_state(static_cast<int>(s.pid)) == Driver::ProcessState::checkpointed) {
        s.swap = SwapState::swapped;
        s.swap_since = now.steady;
        if (!s.grants.empty()) s.swap_device = grants_.at(s.grants.front()).device;
        s.swap_bytes = counted_on(s, s.swap_device);
        log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
                  ") was left on the host by an earlier vlaked: restoring it");
      }
    } catch (const DriverError&) {
      // Not a process the driver knows: it is on the GPU.
    }
  }
  switch (s.swap) {
    case SwapState::none: return r;  // not swapped (a stale gate): go on
    case SwapState::notified:
      // Called off before the checkpoint began: the process needs the GPU again.
      s.swap = SwapState::none;
      changes_.sessions.insert(s.slot);
      return r;
    case SwapState::lost: r.status = proto::Status::internal; return r;
    case SwapState::checkpointing:
    case SwapState::swapped:
    case SwapState::restoring: break;
  }
  if (s.swap_in_conn == 0) s.swap_in_at = now.steady;
  s.swap_in_conn = conn;
  changes_.sessions.insert(s.slot);
  s.swap_in_request = m.h.request_id;
  if (s.swap == SwapState::swapped) try_restore(s, now);
  return std::nullopt;
}

void Node::try_restore(Session& s, Now now) {
  if (s.swap != SwapState::swapped || s.swap_in_conn == 0) return;
  const Device* dev = device_by_ordinal(s.swap_device);
  if (dev == nullptr) return;
  // What it holds now (its counted grants there, those served while it was away included) plus
  // its context: what the checkpoint freed is no measure when others allocate or free meanwhile
  // (measured on the H100: a restore sized by it lost a process).
  const Bytes held = counted_on(s, s.swap_device);
  const Bytes want = held + s.swap_context + settings_.swap_margin;
  const Bytes free = room(*dev);
  if (free >= want) {
    s.swap_extra = held + s.swap_context;  // what room() counts as taken while it restores
    s.swap = SwapState::restoring;
    s.swap_since = now.steady;
    swap_jobs_.push_back(SwapJob{s.id, s.pid, s.swap_device, true});
    return;
  }
  if (now.steady >= s.swap_in_at + wait_of(s)) {
    ++counters_.swap_timeouts;
    proto::SwapInReply r = proto::make<proto::SwapInReply>(s.swap_in_request);
    r.status = proto::Status::out_of_memory;
    r.waited_ms = ms_between(s.swap_in_at, now.steady);
    swap_replies_.push_back(SwapInOut{s.swap_in_conn, r});
    s.swap_in_conn = 0;
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
  const Bytes coming = swapping_out(*dev);
  if (free + coming < want) (void)start_swaps(s, *dev, want - free - coming, now);
}

void Node::swap_done(const SwapJob& job, bool ok, Bytes bytes, std::chrono::nanoseconds took, const std::string& error,
                     Now now) {
  auto it = sessions_.find(job.session);
  if (it == sessions_.end()) return;  // it ended meanwhile
  Session& s = it->second;
  changes_.sessions.insert(s.slot);
  changes_.devices = true;
  if (const Session* f = session(s.swap_for)) changes_.sessions.insert(f->slot);
  s.swap_for = 0;
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(took.count(), 0));
  if (!job.restore) {
    if (!ok) {
      ++counters_.swap_failures;
      s.swap = SwapState::none;
      s.swap_skip_until = now.steady + kSkipAfterFailure;
      limited_.warn("swap failed",
                    "session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
                        "): checkpoint failed: " + error + "; it stays on the GPU",
                    now.steady);
      notify(s, proto::SwapPhase::back);
      if (s.swap_in_conn != 0) {
        proto::SwapInReply r = proto::make<proto::SwapInReply>(s.swap_in_request);
        r.status = proto::Status::ok;
        swap_replies_.push_back(SwapInOut{s.swap_in_conn, r});
        s.swap_in_conn = 0;
      }
      return;
    }
    ++counters_.swap_outs;
    ++s.swap_outs;
    counters_.swap_out_ns += ns;
    notify(s, proto::SwapPhase::host);
    if (bytes.value() > 0) s.swap_bytes = bytes;
    counters_.swap_out_bytes += s.swap_bytes.value();
    s.swap = SwapState::swapped;
    s.swap_since = now.steady;
    if (!parked_.empty()) memory_returned_ = true;
    log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
              ") is on the host: " + std::to_string(s.swap_bytes.value() >> 20) + " MiB freed on GPU " +
              std::to_string(s.swap_device.value()) + " in " + std::to_string(ns / 1000000) + " ms");
    try_restore(s, now);  // it may have asked meanwhile
    return;
  }
  proto::SwapInReply r = proto::make<proto::SwapInReply>(s.swap_in_request);
  r.waited_ms = ms_between(s.swap_in_at, now.steady);
  if (!ok) {
    ++counters_.swap_failures;
    s.swap = SwapState::lost;
    r.status = proto::Status::internal;
    log_.error("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) + "): restore failed: " + error +
               "; the process cannot run on the GPU again");
  } else {
    ++counters_.swap_ins;
    ++s.swap_ins;
    counters_.swap_in_ns += ns;
    counters_.swap_in_bytes += s.swap_extra.value();
    s.swap = SwapState::none;
    s.swap_since = now.steady;
    s.swap_extra = Bytes{0};
    s.last_active = now.steady;
    r.status = proto::Status::ok;
    log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) + ") is back on GPU " +
              std::to_string(s.swap_device.value()) + " after " + std::to_string(r.waited_ms) + " ms (" +
              std::to_string(s.swap_bytes.value() >> 20) + " MiB, restore " + std::to_string(ns / 1000000) + " ms)");
  }
  if (s.swap_in_conn != 0) swap_replies_.push_back(SwapInOut{s.swap_in_conn, r});
  s.swap_in_conn = 0;
}

void Node::swap_tick(Now now) {
  for (auto& [id, s] : sessions_) {
    if (s.swap == SwapState::notified && now.steady >= s.swap_since + kReadyTimeout) {
      // Its hook did not answer (no worker thread, or an older hook): left alone, and told so in
      // case its answer was lost.
      s.swap = SwapState::none;
      s.swap_skip_until = now.steady + kSkipAfterFailure;
      changes_.sessions.insert(s.slot);
      if (const Session* f = session(s.swap_for)) changes_.sessions.insert(f->slot);
      s.swap_for = 0;
      notify(s, proto::SwapPhase::back);
      limited_.write(LogLevel::info, "swap ready",
                     "session " + std::to_string(id) + " did not get ready to be swapped out within " +
                         std::to_string(kReadyTimeout.count()) + " ms; left on the GPU",
                     now.steady);
    }
    if (s.swap == SwapState::swapped && s.swap_in_conn != 0) try_restore(s, now);
  }
}

}  // namespace vlake::pool
