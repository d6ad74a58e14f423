#include "vlake/pool/conn_limits.hpp"

#include <iterator>

namespace vlake::pool {

std::string ConnLimits::peer_of(std::uint32_t uid, const std::string& alloc_id) {
  return alloc_id.empty() ? "uid " + std::to_string(uid) : "allocation " + alloc_id;
}

std::string ConnLimits::describe(Admit a, const std::string& peer) const {
  auto count = [](const std::unordered_map<std::string, std::uint32_t>& m, const std::string& k) {
    auto it = m.find(k);
    return std::to_string(it == m.end() ? 0 : it->second);
  };
  switch (a) {
    case Admit::ok: return "admitted";
    case Admit::peer_cap:
      return "connection cap: " + peer + " holds " + count(per_peer_, peer) + " of " + std::to_string(s_.per_peer) +
             " connections (vlaked --max-connections-per-uid)";
    case Admit::unauthenticated_cap:
      return "unauthenticated cap: " + std::to_string(waiting_.size()) + " of " + std::to_string(s_.unauthenticated) +
             " connections await Hello (vlaked --max-unauthenticated), no peer holds more of them than " + peer;
    case Admit::unauthenticated_peer_cap:
      return "unauthenticated cap: " + peer + " has " + count(waiting_per_peer_, peer) + " of " +
             std::to_string(s_.unauthenticated_per_peer) +
             " connections awaiting Hello (vlaked --max-unauthenticated-per-uid)";
  }
  return "?";
}

ConnLimits::Admit ConnLimits::admit(std::uint64_t conn, const std::string& peer, Clock::time_point now) {
  auto count = [&](const std::unordered_map<std::string, std::uint32_t>& m) {
    auto it = m.find(peer);
    return it == m.end() ? 0u : it->second;
  };
  if (count(per_peer_) >= s_.per_peer) return Admit::peer_cap;
  if (count(waiting_per_peer_) >= s_.unauthenticated_per_peer) return Admit::unauthenticated_peer_cap;
  if (waiting_.size() >= s_.unauthenticated && !evict_for(peer, count(waiting_per_peer_)))
    return Admit::unauthenticated_cap;
  ++per_peer_[peer];
  ++waiting_per_peer_[peer];
  const Clock::time_point deadline = now + s_.hello_timeout;
  conns_[conn] = Conn{peer, true, deadline};
  waiting_.emplace(deadline, conn);
  return Admit::ok;
}

void ConnLimits::unwait(std::uint64_t conn, Conn& c) {
  if (!c.waiting) return;
  c.waiting = false;
  auto [lo, hi] = waiting_.equal_range(c.deadline);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == conn) {
      waiting_.erase(it);
      break;
    }
  }
  auto w = waiting_per_peer_.find(c.peer);
  if (w != waiting_per_peer_.end() && --w->second == 0) waiting_per_peer_.erase(w);
}

bool ConnLimits::evict_for(const std::string& peer, std::uint32_t held) {
  const std::string* most = nullptr;
  std::uint32_t n = 0;
  for (const auto& [p, k] : waiting_per_peer_) {
    if (k > n) {
      n = k;
      most = &p;
    }
  }
  if (most == nullptr || n <= held || *most == peer) return false;
  // Its oldest: the earliest deadline (every connection waits the same timeout).
  const std::string victim = *most;
  for (const auto& [deadline, conn] : waiting_) {
    if (conns_.at(conn).peer != victim) continue;
    const std::uint64_t id = conn;
    closed(id);
    evicted_.push_back(id);
    return true;
  }
  return false;
}

void ConnLimits::authenticated(std::uint64_t conn) {
  auto it = conns_.find(conn);
  if (it != conns_.end()) unwait(conn, it->second);
}

void ConnLimits::closed(std::uint64_t conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  unwait(conn, it->second);
  auto p = per_peer_.find(it->second.peer);
  if (p != per_peer_.end() && --p->second == 0) per_peer_.erase(p);
  conns_.erase(it);
}

std::vector<std::uint64_t> ConnLimits::expired(Clock::time_point now) {
  std::vector<std::uint64_t> out;
  while (!waiting_.empty() && waiting_.begin()->first <= now) {
    out.push_back(waiting_.begin()->second);
    closed(out.back());
  }
  return out;
}

std::optional<ConnLimits::Clock::time_point> ConnLimits::next_deadline() const {
  if (waiting_.empty()) return std::nullopt;
  return waiting_.begin()->first;
}

std::size_t ConnLimits::connections(const std::string& peer) const {
  auto it = per_peer_.find(peer);
  return it == per_peer_.end() ? 0 : it->second;
}

}  // namespace vlake::pool
