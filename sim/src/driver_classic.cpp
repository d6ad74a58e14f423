// The simulated driver's cuMemAlloc-like memory: cuMemAlloc_v2, cuMemAllocPitch_v2,
// cuMemAllocManaged, cuMemAllocAsync(_ptsz), cuMemFreeAsync(_ptsz), cuMemFree_v2 and
// cuMemGetInfo_v2. Each allocation is a fresh memfd charged to the node rounded up to 2 MiB,
// mapped read-write at fresh VA (readable and writable by every device); pool and graph memory
// is driver_pools.cpp's. Also the memory driver_pools.cpp borrows (device_alloc, physical_alloc).
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "node.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

// =================================================================================================
// Classic allocation and copies
// =================================================================================================

namespace {

enum class ClassicKind { plain, managed, async };

// cuMemAlloc-like memory: a fresh memfd, charged rounded up to 2 MiB, mapped read-write at fresh
// VA; callers may touch exactly `bytesize` bytes. Caller checked the context.
CUresult alloc_classic(CUctx_st* ctx, std::size_t bytesize, ClassicKind kind, CUdeviceptr* dptr) {
  if (bytesize > SIZE_MAX - kGran) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t size = (bytesize + kGran - 1) / kGran * kGran;
  std::unique_lock lock(g_proc->mu);
  Phys* p = nullptr;
  if (CUresult rc = new_phys(size, ctx->device, 0, true, p); rc != CUDA_SUCCESS) return rc;
  const std::uintptr_t va = reserve_va(size, kGran);
  if (va == 0 || ::mmap(as_ptr(va), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, 0) == MAP_FAILED) {
    if (va != 0) ::munmap(as_ptr(va), size);
    maybe_destroy(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  p->mappings = 1;
  Mapping m;
  m.size = size;
  m.visible = bytesize;
  m.phys = p;
  m.classic = true;
  m.managed = kind == ClassicKind::managed;
  m.async = kind == ClassicKind::async;
  m.ctx = ctx;
  m.buffer_id = g_proc->next_id++;
  for (auto& a : m.access) a = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  g_proc->mappings.emplace(va, m);
  *dptr = static_cast<CUdeviceptr>(va);
  return CUDA_SUCCESS;
}

// Frees the cuMemAlloc-like allocation starting at `addr` (any kind), or returns `unknown`.
CUresult free_classic(std::uintptr_t addr, CUresult unknown) {
  std::unique_lock lock(g_proc->mu);
  auto it = g_proc->mappings.find(addr);
  if (it == g_proc->mappings.end() || !it->second.classic) return unknown;
  Phys* p = it->second.phys;
  ::munmap(as_ptr(it->first), it->second.size);
  g_proc->mappings.erase(it);
  --p->mappings;
  maybe_destroy(p);
  return CUDA_SUCCESS;
}

CUresult alloc_async(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return in_context([&](CUctx_st* ctx) -> CUresult {
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!stream_ok(hStream)) return rules::kBadStreamOrEvent;
    if (bytesize == 0) {  // succeeds with a null pointer (measured)
      *dptr = 0;
      return CUDA_SUCCESS;
    }
    if (CUresult rc = CUDA_SUCCESS; vlake::sim::pools::alloc_captured(dptr, bytesize, hStream, ctx->device, rc)) {
      return rc;
    }
    return alloc_classic(ctx, bytesize, ClassicKind::async, dptr);
  });
}

CUresult free_async(CUdeviceptr dptr, CUstream hStream) {
  return in_context([&](CUctx_st*) -> CUresult {
    if (!stream_ok(hStream)) return rules::kBadStreamOrEvent;
    if (dptr == 0) return CUDA_SUCCESS;  // measured
    if (CUresult rc = CUDA_SUCCESS; vlake::sim::pools::free_async(dptr, hStream, true, rc)) return rc;
    return free_classic(as_addr(dptr), rules::kFreeAsyncUnknown);
  });
}

}  // namespace

VLAKE_SIM_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  VLAKE_SIM_COUNT(cuMemAlloc_v2);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_classic(ctx, bytesize, ClassicKind::plain, dptr);
  });
}

VLAKE_SIM_API CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                          unsigned int ElementSizeBytes) {
  VLAKE_SIM_COUNT(cuMemAllocPitch_v2);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
      return rules::kBadPitchRequest;
    }
    if (WidthInBytes > rules::kMaxPitch) return rules::kPitchTooWide;
    const std::size_t pitch =
        (WidthInBytes + rules::kPitchAlignment - 1) / rules::kPitchAlignment * rules::kPitchAlignment;
    if (pitch > rules::kMaxPitch) return rules::kPitchTooWide;
    if (Height > SIZE_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = alloc_classic(ctx, pitch * Height, ClassicKind::plain, dptr);
    if (rc == CUDA_SUCCESS) *pPitch = pitch;
    return rc;
  });
}

VLAKE_SIM_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  VLAKE_SIM_COUNT(cuMemAllocManaged);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
      return rules::kBadManagedRequest;
    }
    return alloc_classic(ctx, bytesize, ClassicKind::managed, dptr);
  });
}

VLAKE_SIM_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemAllocAsync);
  return alloc_async(dptr, bytesize, hStream);
}

VLAKE_SIM_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemAllocAsync_ptsz);
  return alloc_async(dptr, bytesize, hStream);
}

VLAKE_SIM_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemFreeAsync);
  return free_async(dptr, hStream);
}

VLAKE_SIM_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemFreeAsync_ptsz);
  return free_async(dptr, hStream);
}

VLAKE_SIM_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  VLAKE_SIM_COUNT(cuMemFree_v2);
  return in_context([&](CUctx_st*) -> CUresult {
    if (CUresult rc = CUDA_SUCCESS; vlake::sim::pools::free_async(dptr, nullptr, false, rc)) return rc;
    return free_classic(as_addr(dptr), rules::kFreeUnknown);
  });
}

VLAKE_SIM_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  VLAKE_SIM_COUNT(cuMemGetInfo_v2);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t used = 0;
    std::uint64_t cap = 0;
    g_proc->node->usage(ctx->device, used, cap);
    *total = static_cast<size_t>(cap);
    *free = static_cast<size_t>(used >= cap ? 0 : cap - used);
    return CUDA_SUCCESS;
  });
}

// ---- Lent to driver_pools.cpp (driver_internal.hpp) ----------------------------------------------

namespace vlake::sim::internal {

CUresult device_alloc(CUctx_st* ctx, std::size_t bytes, CUdeviceptr* dptr) {
  return alloc_classic(ctx, bytes, ClassicKind::async, dptr);
}

CUresult device_free(CUdeviceptr p) { return free_classic(as_addr(p), CUDA_ERROR_INVALID_VALUE); }

CUresult physical_alloc(std::size_t bytes, int device, std::uint64_t& id) {
  std::unique_lock lock(g_proc->mu);
  Phys* p = nullptr;
  if (CUresult rc = new_phys(bytes, device, 0, true, p); rc != CUDA_SUCCESS) return rc;
  p->handle_refs = 1;  // held by the pool, not a handle of the application
  id = p->block_id;
  return CUDA_SUCCESS;
}

void physical_free(std::uint64_t id) {
  std::unique_lock lock(g_proc->mu);
  for (auto& [key, p] : g_proc->phys) {
    if (p->block_id != id) continue;
    Phys* raw = p.get();
    raw->handle_refs = 0;
    maybe_destroy(raw);
    return;
  }
}

}  // namespace vlake::sim::internal
