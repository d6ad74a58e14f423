// vlake::pool::ReclaimTrust — what the sessions asked to give memory back actually gave
// (docs/pool.md, "Pressure protocol": "Claims and measurements").
//
// What it does
//   A session's reserve and reclaim figures (ReserveReport) are claims; the Releases that follow
//   a Pressure are measurements. For every session sent Pressure, the book opens an ask (its
//   GPU and time) and adds up the bytes the session releases on that GPU. An ask closes at its
//   deadline (`deadline` after it was opened; a second Pressure while it is open keeps the first
//   time):
//   - the session gave something: what it gave is its record ("gave lately"); the planner
//     counts at most that much from it next time, whatever it claims;
//   - it gave nothing: it loses its turn: it is not askable for `skip`, and its record is 0.
//   A session that gives back memory after its ask closed empty (a slow framework) is askable
//   again at once with what it gave as its record. A session never asked has no record: what
//   it claims is believed for the first asks of a grant (credible()).
// Ownership: plain values keyed by session id. No clock of its own (every rule takes the time).
// Errors: none. Thread-safety: none; the event loop's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

class ReclaimTrust {
 public:
  using Time = std::chrono::steady_clock::time_point;
  // deadline: how long an asked session has to give something back; skip: how long one that
  // gave nothing is not asked again. Both > 0 (the daemon's options check them).
  ReclaimTrust(std::chrono::milliseconds deadline, std::chrono::milliseconds skip) : deadline_(deadline), skip_(skip) {}

  // The outcome of an ask that closed.
  struct Verdict {
    std::uint64_t session = 0;
    DeviceOrdinal device{0};
    Bytes gave{0};
    bool skipped = false;  // it gave nothing: not asked again for `skip`
  };

  // The session was sent Pressure for GPU `d` at `now`. An ask still open (any GPU) keeps its
  // time and GPU.
  void asked(std::uint64_t session, DeviceOrdinal d, Time now);
  // The session released `bytes` on GPU `d` at `now`: counted toward its open ask on that GPU;
  // with none, a session skipped for an empty ask is trusted again with `bytes` as its record.
  void gave(std::uint64_t session, DeviceOrdinal d, Bytes bytes, Time now);
  // Closes every ask whose deadline is at or before `now`; their verdicts, by session id.
  std::vector<Verdict> expire(Time now);
  // Whether the session may be sent Pressure at `now` (not skipped).
  [[nodiscard]] bool askable(std::uint64_t session, Time now) const;
  // What a planner may count on from a session that claims `claim` bytes: the claim, at most its
  // record (what it gave at its last closed ask) when it has one; without a record, the claim
  // when `trust_claims`, else 0 (it is still asked, but nobody waits on its word).
  [[nodiscard]] Bytes credible(std::uint64_t session, Bytes claim, bool trust_claims) const;
  // Whether an ask of the session is open.
  [[nodiscard]] bool open(std::uint64_t session) const;
  // The session ended.
  void forget(std::uint64_t session) { records_.erase(session); }
  // The earliest deadline of an open ask (nullopt: none).
  [[nodiscard]] std::optional<Time> next_deadline() const;
  [[nodiscard]] std::chrono::milliseconds deadline() const noexcept { return deadline_; }
  [[nodiscard]] std::chrono::milliseconds skip() const noexcept { return skip_; }

 private:
  struct Record {
    bool open = false;  // an ask waits for its deadline
    DeviceOrdinal device{0};
    Time asked_at{};
    Bytes given{0};               // released on `device` since asked_at
    std::optional<Bytes> lately;  // what it gave at its last closed ask (none: never asked)
    Time skipped_until{};         // not askable before this
    bool skipped = false;         // its last closed ask was empty
  };

  std::chrono::milliseconds deadline_;
  std::chrono::milliseconds skip_;
  std::unordered_map<std::uint64_t, Record> records_;
};

}  // namespace vlake::pool
