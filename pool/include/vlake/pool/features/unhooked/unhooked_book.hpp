// vlake::pool::UnhookedBook — memory outside vlake (docs/daemon.md, "Memory outside vlake";
// docs/quota.md, `enforce`): what each tenant's processes without a session hold on the GPUs,
// and the `enforce: kill` grace.
//
// What it does
//   Node::observe_gpus() attributes one NVML reading of every process: pids holding a session
//   keep the non-pool rule; every other pid but the daemon's is attributed to a tenant (its
//   Kubernetes allocation, else its uid/gid through the quota file's rules) as unhooked memory,
//   charged per its namespace's `enforce`. Memory NVML charges to no listed process (unlisted:
//   NVML's used − what it lists − retired handles alive through a descriptor − what vlake knows
//   no listed process is charged for, clamped at 0) above kUnlistedTolerance is split equally
//   among the device-file users NVML lists on no GPU (a session pid's share goes to its
//   session's tenant and is never killed). This book keeps the result per tenant:
//   - record(): a tenant's figures of the latest reading (per GPU, and its processes), with
//     newcomers() naming the processes the previous reading did not have;
//   - over_limit(): the kill rule: a tenant over a limit with unhooked processes for its grace
//     has them killed (Verdict::kill, once; the grace starts again);
//   - a cache of the tenant of each process (pid, start time), so that a reading does not
//     resolve every process again; cleared when the quota file or the allocations change, pruned
//     to the processes of the latest reading.
// Ownership: plain values keyed by tenant id. No clock of its own. Errors: none.
// Thread-safety: none; the event loop's thread only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/state.hpp"

namespace vlake::pool {

struct UnhookedProcess {
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  Bytes bytes{0};  // NVML's figure, all GPUs
};

// One tenant's memory outside vlake at the latest reading.
struct UnhookedUse {
  std::array<std::uint64_t, state::kMaxDevices> bytes{};  // per GPU
  std::vector<UnhookedProcess> procs;
  // Under `enforce: kill`: since when it has been over a limit with unhooked processes.
  std::optional<std::chrono::steady_clock::time_point> over_since;
  [[nodiscard]] bool empty() const noexcept;
};

class UnhookedBook {
 public:
  using Time = std::chrono::steady_clock::time_point;
  using Bytes = std::array<std::uint64_t, state::kMaxDevices>;

  // The tenant's figures (an empty use when it has none).
  [[nodiscard]] const UnhookedUse& of(TenantId t) const;
  // The processes of `procs` the tenant's previous reading did not have.
  [[nodiscard]] std::vector<UnhookedProcess> newcomers(TenantId t, const std::vector<UnhookedProcess>& procs) const;
  // Records the tenant's latest reading; true when its bytes or its number of processes changed.
  bool record(TenantId t, const Bytes& bytes, std::vector<UnhookedProcess> procs);

  enum class Verdict {
    none,   // not over a limit with unhooked processes (the grace is reset), or within its grace
    grace,  // it just went over: the grace starts now
    kill,   // over for its whole grace: its unhooked processes are to be killed
  };
  // `over`: the tenant is over a limit under `enforce: kill` with unhooked processes.
  Verdict over_limit(TenantId t, bool over, Time now, std::chrono::milliseconds grace);

  // The tenant record was freed.
  void forget(TenantId t) { use_.erase(t.value()); }

  // ---- the tenant of a process without a session, by (pid, start time)
  [[nodiscard]] std::optional<TenantId> cached(std::uint32_t pid, std::uint64_t start_time) const;
  void remember(std::uint32_t pid, std::uint64_t start_time, TenantId t) { cache_[{pid, start_time}] = t; }
  // Keeps the processes `live` answers true for.
  void prune(const std::function<bool(std::uint32_t pid, std::uint64_t start_time)>& live);
  void clear_cache() noexcept { cache_.clear(); }

 private:
  std::map<std::uint32_t, UnhookedUse> use_;  // by TenantId value
  std::map<std::pair<std::uint32_t, std::uint64_t>, TenantId> cache_;
};

}  // namespace vlake::pool
