// The hook's bookkeeping of pool memory in this process. Plain data structures (no driver or
// daemon calls), each guarded by its own mutex; every method is thread-safe.
//
// AllocTable: logical allocations of the alloc path (cuMemAlloc/Pitch/Async): one entry per
//   pointer handed to the application: its VA reservation (base, reserved size, mapped size),
//   the returned pointer and requested size, grant id, device, creation time and the imported
//   handles mapped inside it. Indexed by reservation base; the application's pointer may lie
//   inside the reservation (guard fault mode right-aligns it), so removal is by that pointer.
// CreateTable: grants handed to the application as handles (cuMemCreate), and counted grants of
//   handles the driver created (cuMemCreate with properties the pool cannot serve). Tracks the
//   application's references to each handle (creation + cuMemRetainAllocationHandle, minus
//   cuMemRelease) and its mappings of it (cuMemMap/cuMemUnmap, a VA range -> grant). A grant is
//   finished — to be released to the daemon — when it has no reference and no mapping left.
//   Keeps the descriptor received with the grant, because an imported handle cannot be exported
//   (export returns a dup of it).
// ManagedTable: cuMemAllocManaged pointers -> their counted grant.
//
// Fork: lock_all()/unlock_all() bracket fork() (prepare/parent), clear_after_fork() runs in the
// child (unlocks and forgets everything: the child owns none of the parent's grants).
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "fork_lock.hpp"
#include "vlake/common/unique_fd.hpp"

namespace vlake::hook {

struct LogicalAlloc {
  std::uint64_t base = 0;       // start of the VA reservation
  std::uint64_t reserved = 0;   // reserved VA bytes: the mapped grant plus any guard chunk
  std::uint64_t mapped = 0;     // bytes mapped from `base` (the grant)
  std::uint64_t ptr = 0;        // the pointer handed to the application (base, or right-aligned)
  std::uint64_t requested = 0;  // the application's size: it owns [ptr, ptr + requested)
  std::uint64_t grant_id = 0;
  int device = 0;
  CUcontext ctx = nullptr;  // the context current when it was allocated (free fences it)
  std::uint32_t peers = 0;  // devices (bit mask) given read-write access besides `device` (peer.hpp)
  std::chrono::steady_clock::time_point created{};
  std::vector<std::uint64_t> handles;
  std::uint64_t key = 0;  // one handle with a daemon key: may be kept mapped on release (kept.hpp)
  bool on_host = false;   // its handles are the host tier's (tier.hpp): freed, it goes straight back
};

class AllocTable : public ForkLock {
 public:
  void insert(LogicalAlloc a);
  // Removes and returns the allocation whose returned pointer is exactly `ptr`.
  std::optional<LogicalAlloc> take(std::uint64_t ptr);
  // The allocation whose reserved VA range (guard chunk included) contains `addr` (handles
  // omitted).
  [[nodiscard]] std::optional<LogicalAlloc> find(std::uint64_t addr) const;
  [[nodiscard]] std::size_t size() const;
  // Live allocations on `device`, and the `n` most recently created of them (newest first,
  // handles omitted).
  [[nodiscard]] std::size_t count(int device) const;
  [[nodiscard]] std::vector<LogicalAlloc> newest(int device, std::size_t n) const;
  // Peer access (peer.hpp): records that the allocation at reservation base `base` now gives
  // the devices `peers` access; returns the set it had (nullopt if it is no longer live).
  std::optional<std::uint32_t> set_peers(std::uint64_t base, std::uint32_t peers);
  // The same for every live allocation on `device` whose set differs: returns them (handles
  // omitted) with `peers` holding the set they had.
  std::vector<LogicalAlloc> retag(int device, std::uint32_t peers);
  // The host tier (tier/tier.hpp): the live allocation of grant `grant_id`, handles included;
  // its handles replaced after a move, with where they are now (false if it is no longer
  // live); the distinct contexts live allocations were made in.
  [[nodiscard]] std::optional<LogicalAlloc> find_grant(std::uint64_t grant_id) const;
  bool replace_handles(std::uint64_t base, std::uint64_t grant_id, std::vector<std::uint64_t> handles, bool on_host);
  [[nodiscard]] std::vector<CUcontext> contexts() const;

  void clear_after_fork() noexcept;

 private:
  std::map<std::uint64_t, LogicalAlloc> by_base_;  // reservation base -> allocation
};

struct FinishedGrant {
  std::uint64_t grant_id = 0;
  bool exported = false;
};

class CreateTable : public ForkLock {
 public:
  // A new pool handle given to the application (one reference, no mapping).
  void add(std::uint64_t handle, std::uint64_t grant_id, std::uint64_t size, const CUmemAllocationProp& prop,
           UniqueFd fd);
  // A handle the driver created with properties the pool cannot serve, charged by the counted
  // grant `grant_id` (one reference, no mapping; no descriptor, no properties kept).
  void add_counted(std::uint64_t handle, std::uint64_t grant_id, std::uint64_t size);
  [[nodiscard]] bool owns(std::uint64_t handle) const;
  // owns() and served from the pool (not a counted handle): the hook answers export and
  // properties queries for it.
  [[nodiscard]] bool serves(std::uint64_t handle) const;
  // After the driver accepted cuMemRelease(handle): drops one reference. `ours` tells whether the
  // handle was a pool handle; the result is the grant if it is now finished.
  std::optional<FinishedGrant> released(std::uint64_t handle, bool& ours);
  // After the driver accepted cuMemMap(va, size, ..., handle): records the mapping if the handle
  // is a pool handle.
  void mapped(std::uint64_t va, std::uint64_t size, std::uint64_t handle);
  // After the driver accepted cuMemUnmap(va, size): forgets every recorded mapping inside the
  // range; returns the grants that are now finished.
  std::vector<FinishedGrant> unmapped(std::uint64_t va, std::uint64_t size);
  // After the driver accepted cuMemRetainAllocationHandle(&handle, addr): one more reference if
  // `addr` lies in a recorded mapping of the pool handle `handle`.
  bool retained(std::uint64_t addr, std::uint64_t handle);
  // One more reference to `handle` if it is a pool handle the application holds (an import
  // that returned an existing handle value).
  bool add_reference(std::uint64_t handle);
  // A dup() of the grant's descriptor (marks the grant exported); -1 with errno on failure;
  // nullopt if `handle` is not a pool handle.
  std::optional<int> export_fd(std::uint64_t handle);
  [[nodiscard]] std::optional<CUmemAllocationProp> props(std::uint64_t handle) const;
  [[nodiscard]] std::size_t grants() const;

  void clear_after_fork() noexcept;

 private:
  struct Grant {
    std::uint64_t handle = 0;
    std::uint64_t size = 0;
    CUmemAllocationProp prop{};
    int refs = 0;
    int mappings = 0;
    bool exported = false;
    bool counted = false;  // created by the driver, only charged
    UniqueFd fd;
  };
  struct Mapping {
    std::uint64_t size = 0;
    std::uint64_t grant_id = 0;
  };
  std::optional<FinishedGrant> finish_if_done(std::uint64_t grant_id);

  std::map<std::uint64_t, Grant> grants_;                  // grant id -> grant
  std::unordered_map<std::uint64_t, std::uint64_t> live_;  // handle with references -> grant id
  std::map<std::uint64_t, Mapping> mappings_;              // mapped VA -> mapping
};

class ManagedTable : public ForkLock {
 public:
  void insert(std::uint64_t ptr, std::uint64_t grant_id);
  std::optional<std::uint64_t> take(std::uint64_t ptr);
  void clear_after_fork() noexcept;

 private:
  std::map<std::uint64_t, std::uint64_t> grants_;
};

}  // namespace vlake::hook
