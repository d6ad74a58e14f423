// vlake::pool::plan_pressure — which sessions a grant that cannot be served asks to give memory
// back, and in which order (docs/pool.md, "Pressure protocol").
//
// Contract: given the other sessions on the GPU (what each keeps in its local reserve, whether a
// framework in it gives back its cache when asked, what it holds there, its namespace's priority
// and when it last asked the daemon for anything), the requester's priority and the shortfall,
// returns the indices (into `sessions`) of the sessions to send Pressure to, in the order asked:
//   - a session is a candidate when it has something to give (reserve > 0, or a reclaim
//     callback and more held than its reserve) and its priority is at most the requester's: a
//     tenant never takes memory from a higher-priority one;
//   - candidates are ordered by priority (lowest first), then by idleness (the longest since
//     their last request first), then by session id;
//   - they are taken in that order until what they can give covers the shortfall: a session's
//     `credible` figure when it has one (what its past answers make believable, ReclaimTrust:
//     0 for a session whose word is not taken, which is then asked without being counted on),
//     else its claim (pressure_claim()): its reserve, plus, with a reclaim callback, the rest of
//     what it holds (an upper bound: only its framework knows how much of it is cached rather
//     than in use).
// Pure; thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

struct PressureCandidate {
  std::uint64_t session = 0;
  Bytes reserve{0};  // its last ReserveReport for this GPU
  Bytes held{0};     // what its grants hold on this GPU (the reserve included)
  bool reclaim = false;
  std::int32_t priority = 0;
  std::chrono::steady_clock::time_point last_active{};
  // What the plan counts on it giving (docs/pool.md, "Claims and measurements"); nullopt: its claim.
  std::optional<Bytes> credible;
};

// What a candidate claims it can give: its reserve, or with a reclaim callback the larger of
// that and what it holds.
Bytes pressure_claim(const PressureCandidate& c);

std::vector<std::size_t> plan_pressure(const std::vector<PressureCandidate>& sessions, std::int32_t requester_priority,
                                       Bytes shortfall);

// vlake::pool::plan_swap — which idle processes of overcommit namespaces are checkpointed to host
// memory to make `need` bytes of room on a GPU (docs/swap.md).
//
// Contract: a candidate is eligible when its priority is at most the requester's, it holds
// something on the GPU (`bytes` > 0) and it has been idle (no CUDA call reported, no request) for
// at least `min_idle` at `now`. Eligible ones are ordered by priority (lowest first), then by
// idleness (longest first), then session id, and taken until their bytes cover `need`. When all
// of them together cannot cover it, nobody is chosen (swapping some out would disturb them for
// nothing). Pure; thread-safe.
struct SwapCandidate {
  std::uint64_t session = 0;
  Bytes bytes{0};  // what it holds on the GPU (an estimate: its counted grants there)
  std::int32_t priority = 0;
  std::chrono::steady_clock::time_point last_active{};
};

std::vector<std::size_t> plan_swap(const std::vector<SwapCandidate>& sessions, std::int32_t requester_priority,
                                   Bytes need, std::chrono::steady_clock::time_point now,
                                   std::chrono::milliseconds min_idle);

}  // namespace vlake::pool
