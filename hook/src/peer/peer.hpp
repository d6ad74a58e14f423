// Peer access to served memory (docs/hook.md, "Several GPUs").
//
// Served alloc-path memory is VMM memory whose mapping gives access to its own device only
// (cuMemSetAccess), and cuCtxEnablePeerAccess concerns cuMemAlloc memory only, so the hook
// extends it: after the driver accepted cuCtxEnablePeerAccess(peer) in a context of device A,
// every served allocation of the peer's device B — live ones at once, later ones when they
// are mapped or taken from the local reserve — also gives A read-write access;
// cuCtxDisablePeerAccess takes it away again.
//
// Contract
// - PeerSet remembers, per device B, the devices that enabled peer access to B (a bit mask;
//   per device, not per context). of() is one atomic load: the alloc path reads it.
// - access_for(owner, peers, out) fills `out` with the descriptors of one cuMemSetAccess call
//   giving `owner` and every device of `peers` read-write access; returns how many (no heap).
// - settle(s, base, device, peers) runs after the allocation at reservation base `base`
//   (mapped with access for `peers`) was inserted in s.allocs: if the device's peer set changed
//   in between (or a reserve block carries an old set), it brings the mapping and its record to
//   the current set. Cheap when nothing changed (one atomic load); otherwise serialized with
//   enable/disable by PeerSet's mutex.
// - Allocations with shared read-only chunks (transparent dedup) are left alone: giving a peer
//   read-write access would let it write shared memory.
// - A revocation the driver refuses is logged (debug) and the access stays.
// - Thread-safety: everything may run concurrently. Lock order: PeerSet's mutex, then the
//   tables' (it is held across the driver calls of one change).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "vlake/common/cuda_api.hpp"
#include "vlake/contracts/protocol.hpp"

namespace vlake::hook {

struct LogicalAlloc;
struct State;

class PeerSet {
 public:
  [[nodiscard]] std::uint32_t of(int device) const noexcept {
    return device >= 0 && device < static_cast<int>(proto::kMaxDevices)
               ? peers_[static_cast<std::size_t>(device)].load(std::memory_order_seq_cst)
               : 0;
  }
  // Under mu(): adds / removes `accessor` to the peers of `owner`; returns the new set.
  std::uint32_t add(int owner, int accessor) noexcept;
  std::uint32_t remove(int owner, int accessor) noexcept;
  std::mutex& mu() noexcept { return mu_; }

 private:
  std::array<std::atomic<std::uint32_t>, proto::kMaxDevices> peers_{};
  std::mutex mu_;
};

using AccessDescs = std::array<CUmemAccessDesc, proto::kMaxDevices>;
[[nodiscard]] std::size_t access_for(int owner, std::uint32_t peers, AccessDescs& out) noexcept;

void settle(State& s, std::uint64_t base, int device, std::uint32_t peers);

}  // namespace vlake::hook
