// vlake::pool::ParkingLot — grants that wait for memory (docs/pool.md, "Pressure protocol").
//
// What it does
//   A grant the GPU cannot serve now is parked here (oldest first) with its deadline and the
//   sessions asked to give memory back for it. The lot decides when the parked grants are worth
//   trying again, and which: those whose deadline or next ask is due (ask_again() after the last
//   asks; a new round of asks kNewRound after the previous one), and, when memory came back,
//   those the memory each GPU can serve now could serve — smallest first, while their sizes add
//   up to it (begin_retry(now, servable)). So the work of a release is proportional to what it
//   can serve, not to everything parked (indexes by GPU and size, by wakeup time, by session
//   and by tenant; docs/security.md "Parked grants"). What a retry does (serve, refuse, ask the
//   next sessions) is the Node's; so is the per-tenant cap, read through parked_of().
// Ownership: owns its ParkedGrant values. No clock of its own (every rule takes the time).
// Errors: none (plain containers). Thread-safety: none; the event loop's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <ranges>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/pool/core/outcomes.hpp"

namespace vlake::pool {

struct ParkedGrant {
  using Time = std::chrono::steady_clock::time_point;
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::GrantRequest req{};
  Time received{};
  Time deadline{};
  std::vector<std::uint64_t> asked;  // sessions sent Pressure for it
  Time next_ask{};                   // when the next sessions are asked
  bool same_namespace = false;       // refused by its namespace's limit: only its namespace is asked
  Time round_at{};                   // when the current round of asks began
  TenantId tenant{};                 // the session's tenant when it parked (the per-tenant cap)
  DeviceOrdinal device{};            // the GPU it waits on, and its size there (granularity
  Bytes want{0};                     // applied): what a release must be able to serve
  std::uint64_t seq = 0;             // its place in the queue (set by the lot; kept by park_again)
};

// The sessions a set of Pressure notes asks (a parked grant's `asked`).
std::vector<std::uint64_t> asked_of(const std::vector<PressureNote>& notes);

class ParkingLot {
 public:
  using Time = std::chrono::steady_clock::time_point;
  // A parked grant that memory has not served this long after its last Pressure asks the next
  // sessions (those asked may have had less cached than they held).
  static constexpr std::chrono::milliseconds kAskAgain{250};
  void set_ask_again(std::chrono::milliseconds d) noexcept { ask_again_ = d; }
  [[nodiscard]] std::chrono::milliseconds ask_again() const noexcept { return ask_again_; }
  // Once everyone was asked, a new round (what they cached since) starts this long after the last.
  static constexpr std::chrono::milliseconds kNewRound{1000};

  // Parks a grant received at `now` until now + wait, `asked` being the sessions just sent
  // Pressure for it; its next ask is ask_again() away. `want` 0: the request's bytes.
  void park(ConnId conn, std::uint64_t session, const proto::GrantRequest& req, Time now,
            std::chrono::milliseconds wait, std::vector<std::uint64_t> asked, bool same_namespace,
            TenantId tenant = TenantId{}, DeviceOrdinal device = DeviceOrdinal{}, Bytes want = Bytes{0});
  // Parks a grant again (a retry that still waits), in its place in the queue.
  void park_again(ParkedGrant p);

  [[nodiscard]] bool empty() const noexcept { return grants_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return grants_.size(); }
  // Oldest first.
  [[nodiscard]] auto grants() const noexcept { return std::views::values(grants_); }
  // The session's oldest parked grant (nullptr: none waits).
  [[nodiscard]] const ParkedGrant* of_session(std::uint64_t session) const;
  // Grants a tenant has parked.
  [[nodiscard]] std::size_t parked_of(TenantId tenant) const;

  // Memory came back (a release, a retirement): with grants parked, a retry is due.
  void memory_returned() noexcept {
    if (!grants_.empty()) returned_ = true;
  }
  // A grant about to park made room itself (it retired memory): the retry comes at once.
  void retry_soon() noexcept { returned_ = true; }
  // True when memory came back since the last retry, or some deadline or next ask is at or before `now`.
  [[nodiscard]] bool due(Time now) const;
  // The earliest deadline or next ask (nullopt: nothing parked).
  [[nodiscard]] std::optional<Time> next_wakeup() const;
  // A retry begins: the grants whose deadline or next ask is due at `now` and, if memory came
  // back, on each GPU d the smallest ones whose sizes add up to at most servable[d] (what the
  // GPU's free pool and driver could serve now) leave the lot, oldest first; those that still
  // wait come back through park_again().
  std::vector<ParkedGrant> begin_retry(Time now, const std::vector<Bytes>& servable);
  // Every parked grant leaves the lot, oldest first.
  std::vector<ParkedGrant> begin_retry();
  // Parked grants handed out by begin_retry() since the lot was made (the retry work).
  [[nodiscard]] std::uint64_t examined() const noexcept { return examined_; }
  [[nodiscard]] static bool ask_due(const ParkedGrant& p, Time now) noexcept { return now >= p.next_ask; }
  [[nodiscard]] static bool new_round_due(const ParkedGrant& p, Time now) noexcept {
    return !p.asked.empty() && now >= p.round_at + kNewRound;
  }

 private:
  static Time wakeup_of(const ParkedGrant& p) { return std::min(p.deadline, p.next_ask); }
  // Takes one grant out of the queue and its indexes.
  ParkedGrant take(std::uint64_t seq);

  std::map<std::uint64_t, ParkedGrant> grants_;                                   // by seq: oldest first
  std::multimap<Time, std::uint64_t> wakeups_;                                    // min(deadline, next ask) -> seq
  std::map<std::uint32_t, std::multimap<std::uint64_t, std::uint64_t>> by_size_;  // GPU -> want -> seq
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_session_;                  // (session, seq)
  std::unordered_map<std::uint32_t, std::size_t> per_tenant_;                     // tenant -> grants parked
  std::uint64_t next_seq_ = 1;
  std::uint64_t examined_ = 0;
  bool returned_ = false;  // memory came back since the last retry
  std::chrono::milliseconds ask_again_{kAskAgain};
};

}  // namespace vlake::pool
