// Node: the host tier (docs/swap.md, "Host tier"; state in features/tier/host_tier.hpp).
//
// Demote: a grant parked for want of room on a GPU (its retries, as for swapping) makes idle
// sessions of overcommit namespaces (plan_swap's rules) move whole alloc grants to pinned host
// memory made ahead: vlaked sends TierNotice{to_host}; the process's hook stops its threads at
// the entry gate and asks TierStep; each TierPlan names one grant and the host pieces to move
// it to; once the hook says moved, the grant's device handles go back to the pool (the parked
// grant is retried) and its pieces are on record as the grant's. The process keeps running on
// the same pointers. Promote: when a GPU has room again and no grant waits on it, the host
// grants of the most recently active session come back the same way (TierNotice{to_device},
// new pool handles). A grant on the host stays charged to its tenant: limits count memory
// wherever it is.
#include <algorithm>
#include <cstring>

#include "vlake/contracts/codec.hpp"
#include "vlake/pool/features/dedup/dedup.hpp"
#include "vlake/pool/host_builder.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/pressure_plan.hpp"

namespace vlake::pool {

namespace {

std::string mib(Bytes b) { return std::to_string(b.value() >> 20) + " MiB"; }

std::uint64_t ns_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return b > a ? static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count()) : 0;
}

// The TierPlan naming the current grant's pieces from `first`.
TierOut plan_of(const TierMove& m, std::uint64_t request_id, std::uint32_t first) {
  TierOut out;
  out.reply = proto::make<proto::TierPlan>(request_id);
  out.reply.status = proto::Status::ok;
  out.reply.move_id = m.id;
  out.reply.direction = m.direction;
  if (m.current == 0) return out;
  out.reply.grant_id = m.current;
  std::vector<std::pair<Bytes, int>> pieces;
  if (m.direction == proto::TierDirection::to_host) {
    for (const HostPiece& p : m.host) pieces.emplace_back(p.size, p.fd.get());
  } else {
    for (const auto& h : m.device_handles) pieces.emplace_back(h->size, h->fd.get());
  }
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (i >= first && out.reply.piece_count < proto::kMaxHandlesPerGrant) {
      out.reply.pieces[out.reply.piece_count++] = proto::TierPiece{pieces[i].first.value(), offset};
      out.fds.push_back(pieces[i].second);
    }
    offset += pieces[i].first.value();
  }
  out.reply.bytes = offset;
  out.reply.first_piece = first;
  out.reply.total_pieces = static_cast<std::uint32_t>(pieces.size());
  return out;
}

}  // namespace

// A grant the host tier may move: an alloc grant with pool handles (none of a counted, created,
// orphaned or canary grant), not shared by dedup, never exported through CUDA IPC, not already
// on the host or in a move.
bool Node::demotable(const Grant& g) const {
  if (g.purpose != proto::GrantPurpose::alloc || g.orphaned || g.canary || g.handles.empty()) return false;
  if (dedup_ && dedup_->is_shared(g.id)) return false;
  if (rooms_.ipc.exported(g.id) || rooms_.ipc.ever_imported(g.id)) return false;
  return rooms_.tier.find(g.id) == nullptr && !rooms_.tier.moving(g.id);
}

// Moves out what a grant of `want` bytes lacks on `dev` (its pool shortfall with --swap-margin),
// less what demotes under way there bring already; returns the bytes of the moves started.
Bytes Node::start_demotes(const Session& requester, const Device& dev, Bytes want, Now now) {
  HostTier& tier = rooms_.tier;
  if (!tier.enabled() || settings_.swap_idle.count() <= 0) return Bytes{0};
  const Bytes shortfall = dev.pool->shortfall(want + settings_.swap_margin);
  const Bytes coming = tier.demoting(dev.ordinal);
  if (shortfall <= coming) return Bytes{0};
  const Bytes need = shortfall - coming;
  // From the sessions picked, at least a piece of the tier where they have it: each move stops a
  // process for a moment, and a grant that parks is mostly one of a burst (8 notebooks waiting
  // for 32 MiB each at once, on an H200, made hundreds of 64 MiB moves).
  const Bytes target = std::max(need, tier.piece());
  std::vector<SwapCandidate> candidates;
  std::vector<std::vector<std::pair<Bytes, std::uint64_t>>> grants;  // per candidate: (bytes, grant id)
  for (auto& [sid, ss] : sessions_) {
    if (sid == requester.id || !ss.pressure || ss.conn == 0 || ss.pid == 0 || tier.move_of(sid) != nullptr) continue;
    // A session whose grant is parked is a candidate too: its waiting thread is outside its
    // hook's gate until the answer comes (protocol version 6). When every process waits for
    // memory at once, moving some of them is what lets the others go on.
    if (!tenants_.at(ss.tenant.value()).overcommit || rooms_.swaps.state(sid) != SwapState::none) continue;
    if (now.steady < rooms_.swaps.get(sid).skip_until) continue;
    std::vector<std::pair<Bytes, std::uint64_t>> mine;
    Bytes bytes{0};
    for (std::uint64_t gid : ss.grants) {
      const Grant& g = grants_.at(gid);
      if (g.device != dev.ordinal || !demotable(g)) continue;
      mine.emplace_back(g.bytes, gid);
      bytes += g.bytes;
    }
    if (mine.empty()) continue;
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    candidates.push_back(SwapCandidate{sid, bytes, priority_of(ss.tenant), ss.last_active});
    grants.push_back(std::move(mine));
  }
  Bytes started{0};
  for (std::size_t i : plan_swap(candidates, priority_of(requester.tenant), need, now.steady, settings_.swap_idle)) {
    Session& ss = sessions_.at(candidates[i].session);
    TierMove& m = tier.start(ss.id, proto::TierDirection::to_host, dev.ordinal, now.steady);
    m.for_session = requester.id;
    // Whole grants, largest first, until what is left to find is covered.
    for (const auto& [bytes, gid] : grants[i]) {
      if (started >= target) break;
      m.grants.push_back(gid);
      m.bytes += bytes;
      started += bytes;
    }
    TierNoticeOut n;
    n.conn = ss.conn;
    n.session = ss.id;
    n.msg = proto::make<proto::TierNotice>();
    n.msg.direction = proto::TierDirection::to_host;
    n.msg.move_id = m.id;
    fx_.tier_notices.push_back(n);
    changes_.sessions.insert(ss.slot);
    changes_.sessions.insert(requester.slot);
    limited_.write(LogLevel::info, "demote",
                   "GPU " + std::to_string(dev.ordinal.value()) + ": moving " + std::to_string(m.grants.size()) +
                       " grant(s) of session " + std::to_string(ss.id) + " (pid " + std::to_string(ss.pid) + ", " +
                       mib(m.bytes) + ") to host memory for session " + std::to_string(requester.id),
                   now.steady);
    if (started >= need) break;
  }
  return started;
}

// Promotes (room came back, nobody waits), moves nobody answers, the stock to make and the
// pieces to release. After every event (settle()).
void Node::tier_tick(Now now) {
  HostTier& tier = rooms_.tier;
  if (!tier.enabled()) return;
  std::vector<std::uint64_t> stale;
  for (const auto& [sid, m] : tier.moves()) {
    const auto limit = m.state == MoveState::notified ? std::chrono::milliseconds(HostTier::kReadyTimeout)
                                                      : std::chrono::milliseconds(HostTier::kStepTimeout);
    if (now.steady >= m.step_at + limit) stale.push_back(sid);
  }
  for (std::uint64_t sid : stale) {
    log_.warn("session " + std::to_string(sid) + ": its host tier move got no answer in time; it is over");
    rooms_.swaps.of(sid).skip_until = now.steady + SwapBook::kSkipAfterFailure;
    end_move(sid, now);
  }
  for (Bytes b : tier.to_build(now.steady)) fx_.host_builds.push_back(b);
  // Promotes: one move per GPU at a time, only when no grant waits for memory there.
  for (Device& dev : devices_) {
    if (tier.host_bytes(dev.ordinal).value() == 0) continue;
    const bool busy = std::any_of(tier.moves().begin(), tier.moves().end(),
                                  [&](const auto& kv) { return kv.second.device == dev.ordinal; });
    if (busy) continue;
    const bool waiting = std::any_of(rooms_.parking.grants().begin(), rooms_.parking.grants().end(),
                                     [&](const ParkedGrant& p) { return p.device == dev.ordinal; });
    if (waiting) continue;
    // The most recently active session first; its grants largest first, as many as fit.
    const Session* best = nullptr;
    for (const auto& [sid, ss] : sessions_) {
      if (ss.conn == 0 || tier.session_bytes(sid).value() == 0) continue;
      if (now.steady < rooms_.swaps.get(sid).skip_until) continue;
      if (best == nullptr || ss.last_active > best->last_active) best = &ss;
    }
    if (best == nullptr) continue;
    std::vector<std::pair<Bytes, std::uint64_t>> mine;
    for (const auto& [gid, g] : tier.grants()) {
      if (g.session == best->id && g.device == dev.ordinal) mine.emplace_back(g.bytes, gid);
    }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    Bytes room_left = dev.pool->free_bytes() + device_free(dev);
    room_left = room_left > settings_.swap_margin ? room_left - settings_.swap_margin : Bytes{0};
    std::vector<std::uint64_t> chosen;
    Bytes bytes{0};
    for (const auto& [b, gid] : mine) {
      if (bytes + b > room_left) continue;
      chosen.push_back(gid);
      bytes += b;
    }
    if (chosen.empty()) continue;
    TierMove& m = tier.start(best->id, proto::TierDirection::to_device, dev.ordinal, now.steady);
    m.grants.assign(chosen.begin(), chosen.end());
    m.bytes = bytes;
    TierNoticeOut n;
    n.conn = best->conn;
    n.session = best->id;
    n.msg = proto::make<proto::TierNotice>();
    n.msg.direction = proto::TierDirection::to_device;
    n.msg.move_id = m.id;
    fx_.tier_notices.push_back(n);
    changes_.sessions.insert(best->slot);
    limited_.write(LogLevel::info, "promote",
                   "GPU " + std::to_string(dev.ordinal.value()) + ": moving " + std::to_string(chosen.size()) +
                       " grant(s) of session " + std::to_string(best->id) + " (" + mib(bytes) +
                       ") back from host memory",
                   now.steady);
  }
  for (HostPiece& p : tier.take_released()) fx_.host_releases.push_back(std::move(p));
}

// The new memory of a move's current grant goes back: pool handles to the pool (the process may
// have written them: scrubbed before anyone else's grant), host pieces released.
void Node::drop_pending(TierMove& m) {
  if (auto it = grants_.find(m.current); it != grants_.end()) changes_.grants.insert(it->second.slot);
  if (!m.device_handles.empty()) {
    const Grant* g = nullptr;
    if (auto it = grants_.find(m.current); it != grants_.end()) g = &it->second;
    Device& dev = devices_.at(static_cast<std::size_t>(m.device.value()));
    const TenantId t = g != nullptr ? g->tenant : TenantId{};
    for (auto& h : m.device_handles) dev.pool->retire(std::move(h), t);
    m.device_handles.clear();
    (void)settle_device(dev);
    rooms_.parking.memory_returned();
  }
  if (!m.host.empty()) rooms_.tier.release(std::exchange(m.host, {}));
  m.current = 0;
}

void Node::end_move(std::uint64_t sid, Now now) {
  std::optional<TierMove> m = rooms_.tier.finish(sid);
  if (!m) return;
  drop_pending(*m);
  const std::uint64_t took = ns_between(m->since, now.steady);
  if (m->direction == proto::TierDirection::to_host) counters_.tier_demote_ns += took;
  else counters_.tier_promote_ns += took;
  if (const Session* s = session(sid)) changes_.sessions.insert(s->slot);
  if (const Session* f = session(m->for_session)) changes_.sessions.insert(f->slot);
  changes_.devices = true;
  if (m->grants_moved > 0) {
    log_.info("session " + std::to_string(sid) + ": " + std::to_string(m->grants_moved) + " grant(s) (" +
              mib(m->moved) + ") moved to " + (m->direction == proto::TierDirection::to_host ? "host" : "GPU") +
              " memory on GPU " + std::to_string(m->device.value()) + " in " + std::to_string(took / 1000000) + " ms");
  }
}

// The move's current grant is in its new memory.
void Node::commit_move(TierMove& m, Now now) {
  auto git = grants_.find(m.current);
  if (git == grants_.end()) {
    drop_pending(m);
    return;
  }
  Grant& g = git->second;
  Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  if (m.direction == proto::TierDirection::to_host) {
    HostGrant hg;
    hg.session = g.session;
    hg.tenant = g.tenant;
    hg.device = g.device;
    hg.bytes = g.bytes;
    hg.pieces = std::exchange(m.host, {});
    hg.since = now.steady;
    // The process released its imports of the device handles: their memory serves others now.
    // With handle binding (docs/pool.md) they are retired, as a bound handle another tenant needs
    // is: its descriptor stays charged to the tenant until no other process holds it.
    for (auto& h : g.handles) {
      if (dev.pool->binding()) dev.pool->retire(std::move(h), g.tenant);
      else dev.pool->put_back(std::move(h), g.tenant);
    }
    g.handles.clear();
    dev.granted -= g.bytes;
    rooms_.tier.put(g.id, std::move(hg));
    ++counters_.tier_demotes;
    counters_.tier_demoted_bytes += g.bytes.value();
    (void)settle_device(dev);
    rooms_.parking.memory_returned();
  } else {
    std::optional<HostGrant> hg = rooms_.tier.take_grant(g.id);
    if (hg) rooms_.tier.release(std::move(hg->pieces));
    g.handles = std::exchange(m.device_handles, {});
    g.handle_count = static_cast<std::uint32_t>(g.handles.size());
    dev.granted += g.bytes;
    ++counters_.tier_promotes;
    counters_.tier_promoted_bytes += g.bytes.value();
  }
  changes_.grants.insert(g.slot);
  touch_tenant(g.tenant);
  ++m.grants_moved;
  m.moved += g.bytes;
  m.current = 0;
}

// The next grant of the move with its new memory ready, or false when none is left.
bool Node::next_of_move(TierMove& m, const Session& s) {
  HostTier& tier = rooms_.tier;
  Device& dev = devices_.at(static_cast<std::size_t>(m.device.value()));
  while (!m.grants.empty()) {
    const std::uint64_t gid = m.grants.front();
    m.grants.pop_front();
    auto git = grants_.find(gid);
    if (git == grants_.end() || !s.holds(gid)) continue;  // released meanwhile
    Grant& g = git->second;
    if (m.direction == proto::TierDirection::to_host) {
      if (!demotable(g)) continue;
      std::vector<HostPiece> pieces;
      bool ok = true;
      for (Bytes size : tier.pieces_for(g.bytes)) {
        if (std::optional<HostPiece> p = tier.take(size)) {
          pieces.push_back(std::move(*p));
          continue;
        }
        if (!tier.fits(size) && !tier.make_room(size)) {
          ok = false;
          break;
        }
        try {  // the stock lacks it: made on the spot (slow: pinned host memory, zeroed)
          HostPiece p = make_host_piece(driver_, size, dev.granularity);
          tier.note_made(size);
          ++counters_.tier_made_on_demand;
          pieces.push_back(std::move(p));
        } catch (const DriverError& e) {
          limited_.warn("host piece", std::string("cannot make host memory for the host tier: ") + e.what(),
                        steady_now());
          ok = false;
          break;
        }
      }
      if (!ok) {
        tier.release(std::move(pieces));
        m.grants.clear();  // the tier is full: the rest stays on the GPU
        limited_.write(LogLevel::info, "tier full",
                       "GPU " + std::to_string(dev.ordinal.value()) + ": the host tier is full (" +
                           mib(tier.used_bytes()) + " held by grants of its " + mib(tier.bound()) + "): grant " +
                           std::to_string(gid) + " and the rest of the move stay on the GPU",
                       steady_now());
        return false;
      }
      m.host = std::move(pieces);
    } else {
      if (tier.find(gid) == nullptr) continue;
      try {
        DevicePool::Served sv = dev.pool->serve(g.bytes, g.tenant, proto::kMaxHandlesPerGrant, s.id);
        m.device_handles = std::move(sv.handles);
      } catch (const std::exception& e) {
        limited_.write(LogLevel::info, "promote",
                       "GPU " + std::to_string(dev.ordinal.value()) + ": no room to bring grant " +
                           std::to_string(gid) + " back (" + e.what() + "); it stays on the host",
                       steady_now());
        m.grants.clear();
        return false;
      }
    }
    m.current = gid;
    changes_.grants.insert(g.slot);  // its location (moving) is published
    return true;
  }
  return false;
}

std::variant<TierOut, Malformed> Node::tier_step(std::uint64_t session, const proto::TierStep& m, Now now) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  Session& s = sit->second;
  TierMove* mv = rooms_.tier.move_of(session);
  if (mv == nullptr || mv->id != m.move_id) {
    TierOut out;
    out.reply = proto::make<proto::TierPlan>(m.h.request_id);
    out.reply.status = proto::Status::unknown_grant;
    out.reply.move_id = m.move_id;
    return out;
  }
  mv->step_at = now.steady;
  if (m.result == proto::TierResult::busy) {
    ++counters_.tier_busy;
    rooms_.swaps.of(session).skip_until = now.steady + SwapBook::kSkipAfterFailure;
    limited_.write(LogLevel::info, "demote busy",
                   "session " + std::to_string(session) + " (pid " + std::to_string(s.pid) +
                       ") is busy: its memory stays where it is",
                   now.steady);
    TierOut out = plan_of(TierMove{}, m.h.request_id, 0);
    out.reply.move_id = m.move_id;
    end_move(session, now);
    return out;
  }
  if (m.grant_id != 0 && m.grant_id != mv->current) {
    return Malformed{"TierStep names grant " + std::to_string(m.grant_id) + ", not the one being moved"};
  }
  if (m.grant_id != 0 && m.result == proto::TierResult::none) {
    if (m.first_piece >= plan_of(*mv, 0, 0).reply.total_pieces) return Malformed{"TierStep first_piece out of range"};
    return plan_of(*mv, m.h.request_id, m.first_piece);
  }
  if (m.grant_id != 0) {
    if (m.result == proto::TierResult::moved) {
      commit_move(*mv, now);
    } else if (m.result == proto::TierResult::released) {
      // Nobody used it (the hook's local reserve): its memory comes back at once, as a Release.
      drop_pending(*mv);
      proto::Release r = proto::make<proto::Release>(m.h.request_id);
      r.grant_id = m.grant_id;
      (void)release(session, r);
      changes_.devices = true;
      rooms_.parking.memory_returned();
    } else {
      ++counters_.tier_declined;
      // A process that failed to move it is not asked again for a while.
      if (m.result == proto::TierResult::failed) {
        rooms_.swaps.of(session).skip_until = now.steady + SwapBook::kSkipAfterFailure;
      }
      limited_.write(LogLevel::info, "tier declined",
                     "session " + std::to_string(session) + ": grant " + std::to_string(m.grant_id) +
                         " was not moved (" + (m.result == proto::TierResult::declined ? "declined" : "failed") + ")",
                     now.steady);
      drop_pending(*mv);
    }
  }
  mv->state = MoveState::running;
  if (next_of_move(*mv, s)) return plan_of(*mv, m.h.request_id, 0);
  const std::uint64_t id = mv->id;
  end_move(session, now);
  TierOut out = plan_of(TierMove{}, m.h.request_id, 0);
  out.reply.move_id = id;
  return out;
}

void Node::host_built(HostPiece p) {
  rooms_.tier.built(std::move(p));
  changes_.devices = true;
}

void Node::host_build_failed(Bytes size, const std::string& error) {
  rooms_.tier.build_failed(size, steady_now());
  limited_.warn("host build", "making " + mib(size) + " of host memory for the host tier failed: " + error,
                steady_now());
}

}  // namespace vlake::pool
