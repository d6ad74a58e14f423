// vlake::pool::CountedAudit — counted grants measured against NVML (docs/swap.md, "Counted grants
// are measured").
//
// What it does
//   A counted grant charges memory that the tenant's own process allocates through its driver
//   (overcommit namespaces, stream-ordered pools, graph memory): vlaked hands out no memory for
//   it, so a process could ask and never allocate, and the charge would still make room for it
//   (others swapped out to host memory). The audit compares, at every NVML reading, a process's
//   counted grants on a GPU with what NVML charges to that process there (`seen`, its context
//   included):
//   - realized = min(counted, seen); the unrealized rest U is blamed on its newest grants first
//     (the oldest are the likeliest to be allocated);
//   - a grant wholly unrealized at two readings in a row, at least `window` after it was served,
//     while U is above kSlack, is revoked (newest first, until what is left unrealized is at
//     most kSlack). The Node releases it, logs it and records the refusal;
//   - a session whose grants on a GPU were unrealized above kSlack at the last reading, at least
//     kSettle after they were served, or that had a grant revoked within `skip`, may not make
//     others move out for its grants there (may_displace): its own driver decides.
//   Holdings marked exempt (the process is on the host or moving: NVML cannot show it) are not
//   judged and their marks are dropped. Without readings nothing is judged. A reading replaces
//   every figure of the previous one (a session without holdings in it has none).
// Ownership: plain values keyed by session id and grant id. No clock of its own (every rule
// takes the time). Errors: none. Thread-safety: none; the event loop's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

class CountedAudit {
 public:
  using Time = std::chrono::steady_clock::time_point;
  // Unrealized bytes per process and GPU that are never revoked: rounding to the granularity,
  // and small allocations the driver packs into fewer pages than they were charged for.
  static constexpr Bytes kSlack{64ull << 20};
  // A grant served this long before a reading that does not show it counts against may_displace.
  static constexpr std::chrono::milliseconds kSettle{1000};

  // window: how long a counted grant may stay unrealized (> 0); skip: how long a session that
  // had a grant revoked may not make others move out.
  CountedAudit(std::chrono::milliseconds window, std::chrono::milliseconds skip) : window_(window), skip_(skip) {}

  struct Grant {
    std::uint64_t id = 0;
    Bytes bytes{0};
    Time granted_at{};
  };
  // One session's counted grants on one GPU at a reading.
  struct Holding {
    std::uint64_t session = 0;
    DeviceOrdinal device{0};
    Bytes seen{0};  // what NVML charges to its process on that GPU (0: not listed)
    std::vector<Grant> grants;
    bool exempt = false;  // on the host or moving (swap): not judged
  };
  struct Revocation {
    std::uint64_t grant = 0;
    std::uint64_t session = 0;
    DeviceOrdinal device{0};
    Bytes bytes{0};
    Bytes counted{0};  // the session's counted grants on that GPU at the reading
    Bytes seen{0};
    Time granted_at{};
  };

  // One NVML reading taken at `now` (every holding of a counted grant, each session and GPU
  // once); returns the grants to revoke now. The caller revokes them and calls revoked().
  std::vector<Revocation> observe(const std::vector<Holding>& holdings, Time now);
  // A grant of `session` was revoked at `now`.
  void revoked(std::uint64_t session, Time now);
  // min(counted, seen) of the session on `d` at the last reading that judged it (nullopt: none).
  [[nodiscard]] std::optional<Bytes> realized(std::uint64_t session, DeviceOrdinal d) const;
  // Whether the session's counted grants on `d` may make others move out at `now`.
  [[nodiscard]] bool may_displace(std::uint64_t session, DeviceOrdinal d, Time now) const;
  // The session ended (its grants are gone).
  void forget(std::uint64_t session);
  [[nodiscard]] std::chrono::milliseconds window() const noexcept { return window_; }
  [[nodiscard]] std::chrono::milliseconds skip() const noexcept { return skip_; }

 private:
  struct Reading {
    Bytes realized{0};
    bool overdue = false;  // unrealized above kSlack, kSettle after the grants it blames
  };
  std::chrono::milliseconds window_;
  std::chrono::milliseconds skip_;
  std::map<std::pair<std::uint64_t, std::int32_t>, Reading> last_;  // (session, device)
  std::unordered_map<std::uint64_t, Time> unrealized_since_;        // by grant id
  std::unordered_map<std::uint64_t, std::uint64_t> grant_session_;  // grants with a mark
  std::unordered_map<std::uint64_t, Time> revoked_at_;              // by session
};

}  // namespace vlake::pool
