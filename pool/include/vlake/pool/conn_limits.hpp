// vlake::pool::ConnLimits — vlaked's bounds on connections (docs/daemon.md, "Limits"): how many
// one peer may hold, how many may await their Hello, and for how long.
//
// Contract
// - A peer is a uid on the host socket, or a Kubernetes allocation (its socket) — containers
//   often all run as root, so an allocation is its own peer.
// - admit(conn, peer, now) decides at accept: over the peer's connection cap, or over the
//   per-peer cap of connections awaiting Hello -> refused (the loop closes it at once and
//   counts it). At the total cap of connections awaiting Hello, the oldest awaiting connection
//   of the peer holding the most of them is evicted instead (take_evicted() returns it for the
//   loop to close), provided it holds more than the newcomer's peer; otherwise the newcomer is
//   refused. So peers flooding the table with silent connections only displace their own, and
//   a peer awaiting few Hellos always gets in (docs/daemon.md, "Limits").
//   Admitted connections await Hello until authenticated(conn), or until
//   expired(now) returns them (deadline now + hello_timeout) for the loop to close.
// - closed(conn) forgets a connection (admitted or not; unknown ids are ignored).
// - Pure bookkeeping: no clock (time comes as `now`), no descriptors. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vlake::pool {

struct ConnLimitSettings {
  std::uint32_t per_peer = 256;                   // --max-connections-per-uid
  std::uint32_t unauthenticated = 512;            // --max-unauthenticated
  std::uint32_t unauthenticated_per_peer = 64;    // --max-unauthenticated-per-uid
  std::chrono::milliseconds hello_timeout{5000};  // --hello-timeout-ms
};

class ConnLimits {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Admit { ok, peer_cap, unauthenticated_cap, unauthenticated_peer_cap };

  explicit ConnLimits(ConnLimitSettings s) : s_(s) {}

  // "uid <n>" or "allocation <id>".
  static std::string peer_of(std::uint32_t uid, const std::string& alloc_id);
  // Text for a refusal: "<which cap>: <n> of <max> …".
  [[nodiscard]] std::string describe(Admit a, const std::string& peer) const;

  Admit admit(std::uint64_t conn, const std::string& peer, Clock::time_point now);
  // Connections evicted by admit() since the last call (forgotten here: the loop closes them).
  std::vector<std::uint64_t> take_evicted() { return std::exchange(evicted_, {}); }
  void authenticated(std::uint64_t conn);
  void closed(std::uint64_t conn);
  // Connections past their Hello deadline (forgotten here: the loop closes them).
  std::vector<std::uint64_t> expired(Clock::time_point now);
  [[nodiscard]] std::optional<Clock::time_point> next_deadline() const;

  [[nodiscard]] std::size_t connections(const std::string& peer) const;
  [[nodiscard]] std::size_t unauthenticated() const noexcept { return waiting_.size(); }
  [[nodiscard]] const ConnLimitSettings& settings() const noexcept { return s_; }

 private:
  struct Conn {
    std::string peer;
    bool waiting = true;
    Clock::time_point deadline{};
  };
  void unwait(std::uint64_t conn, Conn& c);
  // Evicts the oldest awaiting connection of the peer holding the most, if it holds more than
  // `held` (what the newcomer's peer holds). Returns whether one was evicted.
  bool evict_for(const std::string& peer, std::uint32_t held);

  ConnLimitSettings s_;
  std::unordered_map<std::uint64_t, Conn> conns_;
  std::unordered_map<std::string, std::uint32_t> per_peer_;
  std::unordered_map<std::string, std::uint32_t> waiting_per_peer_;
  std::multimap<Clock::time_point, std::uint64_t> waiting_;  // by deadline
  std::vector<std::uint64_t> evicted_;                       // for take_evicted()
};

}  // namespace vlake::pool
