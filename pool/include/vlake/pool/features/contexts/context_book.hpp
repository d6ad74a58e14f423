// vlake::pool::ContextBook — CUDA contexts admitted before the driver creates them (docs/quota.md,
// "Contexts"; docs/daemon.md, "Contexts").
//
// A CUDA context takes device memory (about 518 MiB on an H100) the moment it exists, before any
// allocation. The hook asks vlaked to admit that memory first (ContextRequest, protocol.hpp); the
// Node checks the tenant's and its namespace's limits with size() and records the admission here.
// What the tenant is then charged on a GPU is charge(): NVML's figure of its session processes
// (the non-pool figure, measured()) plus, per session, what its admitted contexts are charged
// beyond NVML's figure of that process: max(0, contexts × size − figure). So a context counts
// from its admission on, and once NVML lists the process its charge is the larger of the
// measurement and the admitted size (an admission racing a reading is never lost).
//
// The context size of a GPU:
//   - fixed (vlaked --context-memory SIZE): always that;
//   - otherwise vlaked's own context on that GPU (observe_daemon: NVML's figure of the daemon
//     less the pool's handles, the least reading), `fallback` before any reading. Tenants'
//     readings are never used for it: a tenant's first NVML figure races its own counted memory
//     (granted before the driver allocates it, or allocated by a stream-ordered pool before the
//     hook counts it), so it can read far below or above its context, and tenants are untrusted
//     (several processes could move any statistic of their readings). A tenant whose context is
//     larger than vlaked's is charged its larger NVML figure from the first reading that lists it.
// Ownership: plain values keyed by session id and device. No clock of its own. Errors: none.
// Thread-safety: none; the event loop's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

class ContextBook {
 public:
  // `fixed`: the size of every context; nullopt: vlaked's own context (observe_daemon),
  // `fallback` until that was measured.
  ContextBook(std::optional<Bytes> fixed, Bytes fallback) : fixed_(fixed), fallback_(fallback) {}

  // The size a context on `d` is charged now, and where it comes from ("fixed", "daemon" or
  // "default").
  [[nodiscard]] Bytes size(DeviceOrdinal d) const;
  [[nodiscard]] const char* source(DeviceOrdinal d) const;

  // ---- admissions (the Node has checked the limits)
  void admit(std::uint64_t session, TenantId t, DeviceOrdinal d);
  // One admitted context of the session on `d` is gone; false when it had none.
  bool release(std::uint64_t session, DeviceOrdinal d);
  // The session ended: its admissions go. Returns the tenant it was charged to (nullopt: none).
  std::optional<TenantId> forget(std::uint64_t session);
  // The session moved to tenant `to` (a reload): its admissions follow.
  void move(std::uint64_t session, TenantId to);
  [[nodiscard]] std::uint32_t contexts(std::uint64_t session, DeviceOrdinal d) const;
  // Admitted contexts of the tenant on `d`, all its sessions.
  [[nodiscard]] std::uint32_t contexts_of(TenantId t, DeviceOrdinal d) const;
  // The sessions with an admitted context on any GPU.
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }

  // ---- readings
  // NVML's figure of the session's process on `d` (its non-pool figure; `listed` false: NVML
  // does not list it there, figure 0).
  void observe(std::uint64_t session, DeviceOrdinal d, bool listed, Bytes figure);
  // vlaked's own context on `d` (NVML's figure of the daemon less the pool's handles); the
  // least of these readings counts.
  void observe_daemon(DeviceOrdinal d, Bytes context);
  // The tenant's non-pool figure on `d` from the latest reading (attribute_nonpool).
  void measured(TenantId t, DeviceOrdinal d, Bytes nonpool);

  // What the tenant's sessions' contexts add beyond NVML's figures on `d`.
  [[nodiscard]] Bytes extra(TenantId t, DeviceOrdinal d) const;
  // The tenant's non-pool charge on `d`: measured() + extra().
  [[nodiscard]] Bytes charge(TenantId t, DeviceOrdinal d) const;

 private:
  struct Entry {
    TenantId tenant{};
    std::uint32_t contexts = 0;
    Bytes figure{0};  // NVML's figure of the process at the latest reading
  };
  using Key = std::pair<std::uint64_t, std::int32_t>;  // (session, device)

  const std::optional<Bytes> fixed_;
  const Bytes fallback_;
  std::map<Key, Entry> entries_;
  std::map<std::int32_t, Bytes> daemon_;                             // by device
  std::map<std::pair<std::uint32_t, std::int32_t>, Bytes> nonpool_;  // (tenant, device)
};

}  // namespace vlake::pool
