// vlake::pool::SwapBook — swapping idle processes of overcommit namespaces to host memory
// (docs/swap.md): where each session stands, and what that means for each GPU's room.
//
// What it does
//   Keeps one SwapRecord per session that was ever chosen or asked (none: on the GPU): its state
//   (SwapState), the swap id its notices carry, the GPU and bytes involved, a SwapIn waiting for
//   its answer, when it may be chosen again, and its swap-out/in counts. From them it answers
//   per GPU what is being swapped out (coming back as room), what restores under way take back,
//   and what is on the host; and it remembers the counted grants served lately, which the GPU's
//   free memory does not show yet. The Node decides whom to swap (plan_swap) and when to
//   restore, sends the notices and runs the jobs (Effects).
// Ownership: plain values keyed by session id. No clock of its own. Errors: none.
// Thread-safety: none; the event loop's thread only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/pool/core/outcomes.hpp"

namespace vlake::pool {

enum class SwapState : std::uint8_t {
  none,           // on the GPU
  notified,       // SwapNotice{out} sent; waiting for its SwapReady
  checkpointing,  // a SwapJob{out} runs (lock + checkpoint)
  swapped,        // on the host
  restoring,      // a SwapJob{restore} runs (restore + unlock)
  lost,           // the driver could not restore it: it never runs again (docs/swap.md)
};
const char* to_string(SwapState s) noexcept;

// One session's swapping.
struct SwapRecord {
  using Time = std::chrono::steady_clock::time_point;
  SwapState state = SwapState::none;
  std::uint64_t id = 0;  // the swap its notices name
  DeviceOrdinal device{0};
  Bytes bytes{0};  // estimate while going out; what its checkpoint freed once out
  // While restoring: what the restore takes back (its counted grants and its context).
  Bytes extra{0};
  Bytes context{0};    // its tenant's non-pool bytes (NVML) when it was chosen
  Time since{};        // when the current state began
  ConnId in_conn = 0;  // a SwapIn waits for its answer (0: none)
  std::uint64_t in_request = 0;
  Time in_at{};
  // Not chosen again before this: it did not get ready in time, or its checkpoint failed.
  Time skip_until{};
  std::uint64_t for_session = 0;  // being swapped out to make room for this session (0: none)
  // On the host: the session it was moved out for (0: none or unknown). restore_asap: that
  // session's grant was revoked or it ended: it goes back as soon as the GPU has room, without
  // waiting for its next call (and moving nobody out for it).
  std::uint64_t moved_for = 0;
  bool restore_asap = false;
  std::uint32_t outs = 0;
  std::uint32_t ins = 0;

  [[nodiscard]] bool going_out() const noexcept {
    return state == SwapState::notified || state == SwapState::checkpointing;
  }
  // On the host (what its checkpoint freed is not on the GPU), restoring and lost ones included.
  [[nodiscard]] bool on_host() const noexcept {
    return state == SwapState::swapped || state == SwapState::restoring || state == SwapState::lost;
  }
};

class SwapBook {
 public:
  using Time = std::chrono::steady_clock::time_point;
  // A notified process that does not answer SwapReady within this is left alone, and neither it
  // nor one whose checkpoint failed is chosen again for kSkipAfterFailure.
  static constexpr std::chrono::milliseconds kReadyTimeout{2000};
  static constexpr std::chrono::milliseconds kSkipAfterFailure{60000};
  // A counted grant's driver allocation is expected within this after the grant.
  static constexpr std::chrono::milliseconds kRecentGrant{2000};

  // The session's record, created (on the GPU) on first use.
  SwapRecord& of(std::uint64_t session) { return records_[session]; }
  // A copy of the session's record (a default one, on the GPU, when it has none).
  [[nodiscard]] SwapRecord get(std::uint64_t session) const;
  [[nodiscard]] SwapState state(std::uint64_t session) const { return get(session).state; }
  // The session ended.
  void forget(std::uint64_t session) { records_.erase(session); }
  [[nodiscard]] const std::unordered_map<std::uint64_t, SwapRecord>& records() const noexcept { return records_; }
  [[nodiscard]] std::unordered_map<std::uint64_t, SwapRecord>& records_mut() noexcept { return records_; }

  // A new swap id (from 1).
  std::uint64_t next_id() noexcept { return next_id_++; }

  // Bytes of GPU `d`'s sessions being swapped out now (notified or checkpointing).
  [[nodiscard]] Bytes swapping_out(DeviceOrdinal d) const;
  // What restores under way on `d` take back.
  [[nodiscard]] Bytes restoring(DeviceOrdinal d) const;
  // Bytes of `d`'s processes on the host (what their checkpoints freed; restoring and lost included).
  [[nodiscard]] Bytes on_host(DeviceOrdinal d) const;
  // Sessions being swapped out to make room for `session`, ascending.
  [[nodiscard]] std::vector<std::uint64_t> swapping_for(std::uint64_t session) const;

  // A counted grant of an overcommit tenant served at `now` on `d`, and what such grants of the
  // last kRecentGrant before `now` hold there (older ones are forgotten).
  void note_counted(DeviceOrdinal d, Time now, Bytes bytes);
  Bytes recent_counted(DeviceOrdinal d, Time now);

 private:
  std::unordered_map<std::uint64_t, SwapRecord> records_;  // by session id
  std::uint64_t next_id_ = 1;
  std::array<std::vector<std::pair<Time, Bytes>>, state::kMaxDevices> recent_{};
};

}  // namespace vlake::pool
