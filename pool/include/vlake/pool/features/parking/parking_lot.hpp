// vlake::pool::ParkingLot — grants that wait for memory (docs/pool.md, "Pressure protocol").
//
// What it does
//   A grant the GPU cannot serve now is parked here (FIFO) with its deadline and the sessions
//   asked to give memory back for it. The lot decides when the parked grants are worth trying
//   again: memory came back since the last retry, a deadline passed, or a grant's next ask is
//   due (ask_again() after the last asks; a new round of asks kNewRound after the previous one).
//   What a retry does (serve, refuse, ask the next sessions) is the Node's.
// Ownership: owns its ParkedGrant values. No clock of its own (every rule takes the time).
// Errors: none (plain containers). Thread-safety: none; the event loop's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

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
};

// The sessions a set of Pressure notes asks (a parked grant's `asked`).
std::vector<std::uint64_t> asked_of(const std::vector<PressureNote>& notes);

class ParkingLot {
 public:
  using Time = std::chrono::steady_clock::time_point;
  // A parked grant that memory has not served this long after its last Pressure asks the next
  // sessions (those asked may have had less cached than they held): kAskAgain unless
  // set_ask_again() (vlaked's --reclaim-deadline) says otherwise.
  static constexpr std::chrono::milliseconds kAskAgain{250};
  void set_ask_again(std::chrono::milliseconds d) noexcept { ask_again_ = d; }
  [[nodiscard]] std::chrono::milliseconds ask_again() const noexcept { return ask_again_; }
  // Once everyone was asked, a new round (what they cached since) starts this long after the last.
  static constexpr std::chrono::milliseconds kNewRound{1000};

  // Parks a grant received at `now` until now + wait, `asked` being the sessions just sent
  // Pressure for it; its next ask is ask_again() away.
  void park(ConnId conn, std::uint64_t session, const proto::GrantRequest& req, Time now,
            std::chrono::milliseconds wait, std::vector<std::uint64_t> asked, bool same_namespace);
  // Parks a grant again (a retry that still waits), at the end of the queue.
  void park_again(ParkedGrant p) { grants_.push_back(std::move(p)); }

  [[nodiscard]] bool empty() const noexcept { return grants_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return grants_.size(); }
  // Oldest first.
  [[nodiscard]] const std::vector<ParkedGrant>& grants() const noexcept { return grants_; }
  // The session's oldest parked grant (nullptr: none waits).
  [[nodiscard]] const ParkedGrant* of_session(std::uint64_t session) const;

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
  // A retry begins: every parked grant leaves the lot, oldest first (those that still wait come
  // back through park_again()).
  std::vector<ParkedGrant> begin_retry();
  // Whether a grant that still waits at `now` asks the next sessions, and whether, with nobody
  // left to ask, a new round of asks begins.
  [[nodiscard]] static bool ask_due(const ParkedGrant& p, Time now) noexcept { return now >= p.next_ask; }
  [[nodiscard]] static bool new_round_due(const ParkedGrant& p, Time now) noexcept {
    return !p.asked.empty() && now >= p.round_at + kNewRound;
  }

 private:
  std::vector<ParkedGrant> grants_;  // FIFO
  bool returned_ = false;            // memory came back since the last retry
  std::chrono::milliseconds ask_again_{kAskAgain};
};

}  // namespace vlake::pool
