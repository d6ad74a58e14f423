// What driver.cpp lends the other translation units of the simulated driver (driver_pools.cpp,
// driver_peer.cpp). Not part of the library's interface.
//
// Contract
// - Every function takes the process's `mu` itself (callers hold no simulator lock), except
//   where noted; none throws except std::bad_alloc.
// - guarded(f) is how every entry point runs its body: std::bad_alloc becomes
//   CUDA_ERROR_OUT_OF_MEMORY, any other exception CUDA_ERROR_UNKNOWN.
// - process() is the process state after a successful cuInit (nullptr before).
// - reachable(addr, n, device, write) is the copy engines' access check (caller holds
//   process()->mu, shared or exclusive); copy_refused(ctx) is what a refused copy returns.
// - Peer state: CUctx_st::peers bit d means the context enabled peer access to device d's
//   primary context. peer_reaches / forget_peers read and clear it (caller holds mu
//   exclusively for forget_peers).
// - The hooks driver.cpp calls (namespace pools) are implemented in driver_pools.cpp.
#pragma once

#include "process.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <new>

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

}  // namespace vlake::sim

namespace vlake::sim::internal {

template <class F>
CUresult guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

Process* process();
CUctx_st* context_of(CUcontext c);
bool device_valid(CUdevice dev);
bool reachable(std::uintptr_t addr, std::size_t n, int device, bool write);
CUresult copy_refused(CUctx_st* ctx);

// check_ctx: initialized, a live current context without sticky error.
CUresult context(CUctx_st*& ctx);
CUresult initialized();
int device_count();
// The primary context of `device` (for allocations on a pool's device).
CUctx_st* device_context(int device);
// The device's default memory pool (also CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE of its memory).
CUmemoryPool default_pool(int device);
// A known stream (the legacy/per-thread handles included).
bool stream_ok(CUstream s);
// cuMemAllocAsync-like memory on `ctx`'s device: charged to the node rounded to 2 MiB.
CUresult device_alloc(CUctx_st* ctx, std::size_t bytes, CUdeviceptr* dptr);
// Frees memory from device_alloc (CUDA_ERROR_INVALID_VALUE if unknown).
CUresult device_free(CUdeviceptr p);
// `bytes` (a multiple of 2 MiB) charged to the node on `device` without a mapping; the id for
// physical_free. CUDA_ERROR_OUT_OF_MEMORY when the device is full.
CUresult physical_alloc(std::size_t bytes, int device, std::uint64_t& id);
void physical_free(std::uint64_t id);
// PROT_NONE host VA of `bytes` (an address nothing else hands out); 0 on failure.
std::uintptr_t address_range(std::size_t bytes);

}  // namespace vlake::sim::internal

namespace vlake::sim::pools {

// cuMemFreeAsync/cuMemFree of `p`: true when `p` belongs to a memory pool or graph (then `rc`
// is the result); on a capturing stream (`stream` non-null) a free node is recorded instead.
bool free_async(CUdeviceptr p, CUstream stream, bool has_stream, CUresult& rc);
// cuMemAllocAsync on a capturing stream: true when `stream` captures (then `rc` is the result
// and *dptr the allocation node's address).
bool alloc_captured(CUdeviceptr* dptr, std::size_t bytes, CUstream stream, int device, CUresult& rc);
// Stream, event or context synchronization: pools release free memory above their threshold.
void synchronized();
// A stream being captured cannot be synchronized (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
bool capturing(CUstream stream);

}  // namespace vlake::sim::pools
