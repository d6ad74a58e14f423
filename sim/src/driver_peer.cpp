// The simulated driver's peer access between devices: cuDeviceCanAccessPeer,
// cuCtxEnablePeerAccess, cuCtxDisablePeerAccess, cuMemcpyPeer, cuMemcpyPeerAsync and their
// per-thread variants (docs/simulator.md, "Several devices"). Peer access is a bit per (context, peer device) in
// CUctx_st::peers; like the real driver it only concerns cuMemAlloc memory (kernels of a context touching another
// device's cuMemAlloc memory need it); VMM memory is reached through cuMemSetAccess alone.
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "rules.hpp"

#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <shared_mutex>

#define VLAKE_SIM_API extern "C" __attribute__((visibility("default")))

namespace internal = vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

using vlake::sim::internal::guarded;
using vlake::sim::internal::in_context;

std::uint32_t bit(int device) { return std::uint32_t{1} << device; }

// The live (retained) primary context behind a CUcontext, or nullptr.
CUctx_st* live_context(CUcontext c) {
  CUctx_st* ctx = internal::context_of(c);
  return ctx != nullptr && ctx->retains.load() > 0 ? ctx : nullptr;
}

}  // namespace

VLAKE_SIM_API CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  VLAKE_SIM_COUNT(cuDeviceCanAccessPeer);
  return internal::initialized([&]() -> CUresult {
    if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!internal::device_valid(dev) || !internal::device_valid(peerDev)) return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = dev != peerDev && internal::process()->peer_access ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuCtxEnablePeerAccess);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    if (Flags != 0) return rules::kPeerBadFlags;
    std::unique_lock lock(internal::process()->mu);
    CUctx_st* peer = live_context(peerContext);
    if (peer == nullptr) return rules::kPeerBadContext;
    if (peer->device == ctx->device) return rules::kPeerSelf;
    if (!internal::process()->peer_access) return rules::kPeerUnsupported;
    if ((ctx->peers.load() & bit(peer->device)) != 0) return rules::kPeerAlreadyEnabled;
    ctx->peers.fetch_or(bit(peer->device));
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  VLAKE_SIM_COUNT(cuCtxDisablePeerAccess);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    std::unique_lock lock(internal::process()->mu);
    CUctx_st* peer = live_context(peerContext);
    if (peer == nullptr) return rules::kPeerBadContext;
    if ((ctx->peers.load() & bit(peer->device)) == 0) return rules::kPeerNotEnabled;
    ctx->peers.fetch_and(~bit(peer->device));
    return CUDA_SUCCESS;
  });
}

namespace {

// A copy between two contexts' memory: needs no peer access (the driver stages it), but the
// destination must be writable by its context's device and the source readable by its own.
CUresult copy_peer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                   size_t ByteCount) {
  CUctx_st* cur = nullptr;
  if (CUresult rc = internal::context(cur); rc != CUDA_SUCCESS) return rc;
  std::shared_lock lock(internal::process()->mu);
  CUctx_st* dst = live_context(dstContext);
  CUctx_st* src = live_context(srcContext);
  if (dst == nullptr || src == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (ByteCount == 0) return CUDA_SUCCESS;
  const auto d = static_cast<std::uintptr_t>(dstDevice);
  const auto s = static_cast<std::uintptr_t>(srcDevice);
  if (!internal::reachable(d, ByteCount, dst->device, true) || !internal::reachable(s, ByteCount, src->device, false)) {
    return internal::copy_refused(cur);
  }
  const auto start = std::chrono::steady_clock::now();
  const bool link = internal::touches_host(d, ByteCount) || internal::touches_host(s, ByteCount);
  std::memmove(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(s), ByteCount);
  lock.unlock();
  if (link) internal::pace_link(start, ByteCount);
  return CUDA_SUCCESS;
}

}  // namespace

VLAKE_SIM_API CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                    CUcontext srcContext, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyPeer);
  return guarded([&] { return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount); });
}

VLAKE_SIM_API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                         CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyPeerAsync);
  return internal::on_stream(hStream,
                             [&] { return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount); });
}

VLAKE_SIM_API CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                         CUcontext srcContext, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyPeer_ptds);
  return cuMemcpyPeer(dstDevice, dstContext, srcDevice, srcContext, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                              CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyPeerAsync_ptsz);
  return cuMemcpyPeerAsync(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream);
}
