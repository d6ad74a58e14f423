// KeptMappings: released alloc grants whose single handle this process keeps imported and
// mapped (docs/hook.md, "Kept mappings"). The daemon pools such a handle bound to this
// process's tenant (charged to it as retained); when it grants the same handle to this process
// again, the hook hands out the kept mapping: no import, no map, no set-access. The daemon
// sends Drop when it needs the handle elsewhere; the hook unmaps it and answers Dropped.
//
// Contract
// - Plain data structure: no driver or daemon call. Entries that leave (taken for reuse,
//   dropped) are returned to the caller, who unmaps them (unmap_logical) or reuses them.
// - Keys are the daemon's handle keys (HandleDesc::key, nonzero); an entry remembers the
//   connection generation it was kept under: a lookup under another generation (the hook
//   reconnected, maybe to another daemon) does not match, and the caller drops it.
// - Thread-safety: every method may be called from any thread (one internal mutex). Fork:
//   lock_all()/unlock_all() bracket fork() in the parent; clear_after_fork() in the child
//   forgets every entry (they are the parent's mappings) and unlocks.
#pragma once

#include "vlake/common/cuda_api.hpp"  // cuda.h as the hook sees it (legacy names visible)

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "fork_lock.hpp"
#include "tables.hpp"

namespace vlake::hook {

class KeptMappings : public ForkLock {
 public:
  struct Entry {
    LogicalAlloc alloc;  // base, reserved, mapped, handles, device, ctx; grant_id/ptr stale
    std::uint64_t generation = 0;
  };

  void put(std::uint64_t key, Entry e);
  // The entry for `key` if it was kept under `generation` and maps `bytes` on `device`; an
  // entry that does not match is removed and returned in `stale` (the caller unmaps it).
  [[nodiscard]] std::optional<Entry> take(std::uint64_t key, std::uint64_t generation, int device, std::uint64_t bytes,
                                          std::vector<Entry>& stale);
  // Removes and returns the entries with these keys (missing keys are skipped).
  [[nodiscard]] std::vector<Entry> take_keys(std::span<const std::uint64_t> keys);
  // Removes and returns the entries `match` accepts, with their keys.
  [[nodiscard]] std::vector<std::pair<std::uint64_t, Entry>> take_if(const std::function<bool(const Entry&)>& match);

  [[nodiscard]] std::uint64_t bytes(int device) const;
  [[nodiscard]] std::size_t size() const;

  void clear_after_fork() noexcept;

 private:
  std::map<std::uint64_t, Entry> entries_;
};

}  // namespace vlake::hook
