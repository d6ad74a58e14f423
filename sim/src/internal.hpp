// The simulated driver's internals shared between its translation units (driver.cpp defines
// them; driver_peer.cpp uses them). Not part of the library's interface.
//
// Contract
// - process() is the process state after a successful cuInit (nullptr before).
// - init_checked / current_checked are the checks every entry point starts with: initialized
//   (and not a fork()ed child); plus a live current context without a sticky error.
// - reachable(addr, n, device, write) is the copy engines' access check (caller holds
//   process()->mu, shared or exclusive); copy_refused(ctx) is what a refused copy returns.
// - Peer state: CUctx_st::peers bit d means the context enabled peer access to device d's
//   primary context. peer_reaches / forget_peers read and clear it (caller holds mu
//   exclusively for forget_peers).
#pragma once

#include "process.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace vlake::sim {

// True when a kernel of context `from` may touch cuMemAlloc memory of `owner_device`.
inline bool peer_reaches(const CUctx_st& from, int owner_device) {
  return from.device == owner_device ||
         (from.peers.load(std::memory_order_acquire) & (std::uint32_t{1} << owner_device)) != 0;
}

// A destroyed context loses its peer access, and the others lose theirs to it.
inline void forget_peers(Process& p, CUctx_st& ctx) {
  ctx.peers.store(0, std::memory_order_release);
  for (int d = 0; d < p.device_count; ++d) {
    p.ctxs[d].peers.fetch_and(~(std::uint32_t{1} << ctx.device), std::memory_order_acq_rel);
  }
}

namespace internal {
Process* process();
CUresult init_checked();
CUresult current_checked(CUctx_st*& ctx);
CUctx_st* context_of(CUcontext c);
bool device_valid(CUdevice dev);
bool reachable(std::uintptr_t addr, std::size_t n, int device, bool write);
CUresult copy_refused(CUctx_st* ctx);
}  // namespace internal

}  // namespace vlake::sim
