// The alloc, free and create entry points (hook.hpp) and the pointer queries they answer.
#include "hook.hpp"

#include "alloc/internal.hpp"
#include "ipc.hpp"
#include "profile.hpp"
#include "share.hpp"
#include "write_span.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace vlake::hook {

using proto::GrantPurpose;
using proto::Status;

// The alloc path shared by cuMemAlloc, cuMemAllocPitch and cuMemAllocAsync (AllocPolicy):
// `direct` performs the call on the driver (passthrough and counted paths).
template <class Direct>
CUresult serve_alloc(State& s, CUdeviceptr* dptr, std::uint64_t bytes, Direct direct) {
  int dev = 0;
  CUcontext ctx = nullptr;
  if (CUresult rc = current_device(dev, &ctx); rc != CUDA_SUCCESS) return rc;
  return s.policy.serve_alloc(DeviceOrdinal{dev}, ctx, Bytes{bytes}, dptr, direct);
}

// cuMemCreate properties vlake serves from the pool: pinned device memory, no or POSIX-fd
// handle types, no compression, RDMA or special usage.
bool served_prop(const CUmemAllocationProp* prop, unsigned long long flags) {
  if (prop == nullptr || flags != 0) return false;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return false;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return false;
  const auto types = static_cast<unsigned>(prop->requestedHandleTypes);
  if (types != CU_MEM_HANDLE_TYPE_NONE && types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return false;
  }
  if (prop->allocFlags.compressionType != 0 || prop->allocFlags.gpuDirectRDMACapable != 0 ||
      prop->allocFlags.usage != 0) {
    return false;
  }
  return true;
}

// ---- Alloc path ---------------------------------------------------------------------------------

CUresult on_cuMemAlloc_v2(bool ptds, CUdeviceptr* dptr, size_t bytesize) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemAlloc_v2>(ptds, dptr, bytesize);
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return serve_alloc(*s, dptr, bytesize, [&] { return pass<Row::cuMemAlloc_v2>(ptds, dptr, bytesize); });
}

CUresult on_cuMemAllocPitch_v2(bool ptds, CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                               unsigned int ElementSizeBytes) {
  State* s = active();
  if (s == nullptr) {
    return pass<Row::cuMemAllocPitch_v2>(ptds, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  }
  if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int dev = 0;
  if (CUresult rc = current_device(dev); rc != CUDA_SUCCESS) return rc;
  std::uint64_t align = 512;
  const UsedApi& api = used();
  int attr = 0;
  if (api.cuDeviceGetAttribute != nullptr &&
      api.cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, dev) == CUDA_SUCCESS && attr > 0 &&
      static_cast<std::uint64_t>(attr) > align) {
    align = static_cast<std::uint64_t>(attr);
  }
  if (WidthInBytes > std::numeric_limits<std::uint64_t>::max() - align) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const std::uint64_t pitch = (WidthInBytes + align - 1) / align * align;
  if (pitch > std::numeric_limits<std::uint64_t>::max() / Height) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult rc = serve_alloc(*s, dptr, pitch * Height, [&] {
    return pass<Row::cuMemAllocPitch_v2>(ptds, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  });
  if (rc == CUDA_SUCCESS && s->allocs.find(addr(*dptr))) *pPitch = pitch;
  return rc;
}

CUresult on_cuMemFree_v2(bool ptds, CUdeviceptr dptr) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemFree_v2>(ptds, dptr);
  if (auto a = s->allocs.take(addr(dptr))) return free_logical(*s, std::move(*a));
  if (s->allocs.find(addr(dptr))) return CUDA_ERROR_INVALID_VALUE;  // inside, not the pointer
  if (auto grant = s->managed.take(addr(dptr))) {
    const CUresult rc = pass<Row::cuMemFree_v2>(ptds, dptr);
    if (rc == CUDA_SUCCESS) {
      give_back(*s, *grant, 0);
    } else {
      s->managed.insert(addr(dptr), *grant);
    }
    return rc;
  }
  return free_unserved(*s, ptds, dptr, nullptr, false);
}

CUresult on_cuMemAllocAsync(bool ptds, CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  State* s = active();
  if (s == nullptr || capturing(effective_stream(ptds, hStream))) {
    // Stream capture records an allocation node in the graph: left to the driver.
    return pass<Row::cuMemAllocAsync>(ptds, dptr, bytesize, hStream);
  }
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (s->client.overcommit()) {
    // Overcommit (docs/swap.md): the device's current stream-ordered pool, counted like any
    // cuMemAllocFromPoolAsync.
    int dev = 0;
    if (CUresult rc = current_device(dev); rc != CUDA_SUCCESS) return rc;
    CUmemoryPool pool = nullptr;
    if (CUresult rc = on_cuDeviceGetMemPool(false, &pool, dev); rc != CUDA_SUCCESS) return rc;
    return on_cuMemAllocFromPoolAsync(ptds, dptr, bytesize, pool, hStream);
  }
  // The memory is mapped before this call returns, so it is valid for any later work on the
  // stream (stream-ordered semantics hold trivially).
  return serve_alloc(*s, dptr, bytesize, [&] { return pass<Row::cuMemAllocAsync>(ptds, dptr, bytesize, hStream); });
}

CUresult on_cuMemFreeAsync(bool ptds, CUdeviceptr dptr, CUstream hStream) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemFreeAsync>(ptds, dptr, hStream);
  if (!s->allocs.find(addr(dptr))) return free_unserved(*s, ptds, dptr, hStream, true);
  const CUstream stream = effective_stream(ptds, hStream);
  if (capturing(stream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  // Work queued on the stream may still use the memory: an event behind it, and the worker
  // frees the memory once the stream has reached it (pending.hpp). The pointer is gone at once.
  CUcontext ctx = nullptr;
  CUevent ev = nullptr;
  if (record_free_event(*s, stream, ctx, ev) == CUDA_SUCCESS) {
    auto a = s->allocs.take(addr(dptr));
    if (!a) {  // not the pointer, or freed meanwhile
      if (!s->events.release(ctx, ev)) used().cuEventDestroy_v2(ev);
      return CUDA_ERROR_INVALID_VALUE;
    }
    PendingFree f;
    f.alloc = std::move(*a);
    f.event = ev;
    f.ctx = ctx;
    return free_after_event(*s, std::move(f));
  }
  // No event on that stream (e.g. it belongs to another context): wait here, then free.
  const UsedApi& api = used();
  if (api.cuStreamSynchronize == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (CUresult rc = api.cuStreamSynchronize(stream); rc != CUDA_SUCCESS) return rc;
  auto a = s->allocs.take(addr(dptr));
  if (!a) return CUDA_ERROR_INVALID_VALUE;  // not the pointer, or freed meanwhile
  return free_logical(*s, std::move(*a), /*fenced=*/true);
}

// ---- Create path --------------------------------------------------------------------------------

CUresult on_cuMemCreate(bool ptds, CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                        unsigned long long flags) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemCreate>(ptds, handle, size, prop, flags);
  // Overcommit (docs/swap.md): every handle is the driver's, counted.
  if (!served_prop(prop, flags) || s->client.overcommit()) return create_counted(*s, ptds, handle, size, prop, flags);
  if (handle == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const UsedApi& api = used();
  if (api.cuMemGetAllocationGranularity == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  std::size_t gran = 0;
  if (CUresult rc = api.cuMemGetAllocationGranularity(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (gran == 0 || size % gran != 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = prop->location.id;
  Obtained o = obtain(*s, dev, size, GrantPurpose::create);
  if (o.decision == Decision::passthrough) {
    return pass<Row::cuMemCreate>(ptds, handle, size, prop, flags);
  }
  if (o.decision == Decision::refused) return o.rc;
  GrantResult& g = o.grant;
  if (g.handles.size() != 1 || g.fds.size() != 1 || g.handles[0].size != size || g.handles[0].offset != 0) {
    log(LogLevel::error,
        "vlaked answered a create grant of %zu bytes with %zu handles; expected one handle of "
        "that size",
        size, g.handles.size());
    give_back(*s, g.grant_id, 0);
    return CUDA_ERROR_UNKNOWN;
  }
  CUmemGenericAllocationHandle h = 0;
  if (CUresult rc = import_fd(g.fds[0].get(), h); rc != CUDA_SUCCESS) {
    give_back(*s, g.grant_id, 0);
    return rc;
  }
  s->creates.add(h, g.grant_id, size, *prop, std::move(g.fds[0]));
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult on_cuMemRelease(bool ptds, CUmemGenericAllocationHandle handle) {
  State* s = active();
  if (s == nullptr || !s->creates.owns(handle)) return pass<Row::cuMemRelease>(ptds, handle);
  const CUresult rc = pass<Row::cuMemRelease>(ptds, handle);
  if (rc != CUDA_SUCCESS) return rc;
  bool ours = false;
  if (auto done = s->creates.released(handle, ours)) {
    give_back(*s, done->grant_id, done->exported ? proto::kReleaseExported : 0u);
  }
  return rc;
}

CUresult on_cuMemRetainAllocationHandle(bool ptds, CUmemGenericAllocationHandle* handle, void* address) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemRetainAllocationHandle>(ptds, handle, address);
  // Memory of the alloc path is cuMemAlloc memory to the application: it has no handle.
  if (s->allocs.find(reinterpret_cast<std::uintptr_t>(address))) return CUDA_ERROR_INVALID_VALUE;
  const CUresult rc = pass<Row::cuMemRetainAllocationHandle>(ptds, handle, address);
  if (rc == CUDA_SUCCESS && handle != nullptr) {
    s->creates.retained(reinterpret_cast<std::uintptr_t>(address), *handle);
  }
  return rc;
}

CUresult on_cuMemMap(bool ptds, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                     unsigned long long flags) {
  const CUresult rc = pass<Row::cuMemMap>(ptds, ptr, size, offset, handle, flags);
  State* s = active();
  if (rc == CUDA_SUCCESS && s != nullptr) s->creates.mapped(addr(ptr), size, handle);
  return rc;
}

CUresult on_cuMemUnmap(bool ptds, CUdeviceptr ptr, size_t size) {
  const CUresult rc = pass<Row::cuMemUnmap>(ptds, ptr, size);
  State* s = active();
  if (rc == CUDA_SUCCESS && s != nullptr) {
    for (const FinishedGrant& f : s->creates.unmapped(addr(ptr), size)) {
      give_back(*s, f.grant_id, f.exported ? proto::kReleaseExported : 0u);
    }
  }
  return rc;
}

CUresult on_cuMemImportFromShareableHandle(bool ptds, CUmemGenericAllocationHandle* handle, void* osHandle,
                                           CUmemAllocationHandleType shHandleType) {
  const CUresult rc = pass<Row::cuMemImportFromShareableHandle>(ptds, handle, osHandle, shHandleType);
  State* s = active();
  // A driver may answer an import of memory this process already holds with the same handle
  // value and one more reference (the simulator does): count it like a retain.
  if (rc == CUDA_SUCCESS && s != nullptr && handle != nullptr) s->creates.add_reference(*handle);
  return rc;
}

CUresult on_cuMemExportToShareableHandle(bool ptds, void* shareableHandle, CUmemGenericAllocationHandle handle,
                                         CUmemAllocationHandleType handleType, unsigned long long flags) {
  State* s = active();
  if (s == nullptr || !s->creates.serves(handle)) {
    return pass<Row::cuMemExportToShareableHandle>(ptds, shareableHandle, handle, handleType, flags);
  }
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  auto prop = s->creates.props(handle);
  if (!prop || (static_cast<unsigned>(prop->requestedHandleTypes) & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;  // created without the POSIX-fd type, as the driver says
  }
  // An imported handle cannot be exported (measured): hand out a copy of the descriptor the
  // daemon sent with the grant.
  auto fd = s->creates.export_fd(handle);
  if (!fd) return CUDA_ERROR_INVALID_VALUE;
  if (*fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = *fd;
  return CUDA_SUCCESS;
}

CUresult on_cuMemGetAllocationPropertiesFromHandle(bool ptds, CUmemAllocationProp* prop,
                                                   CUmemGenericAllocationHandle handle) {
  State* s = active();
  if (s != nullptr && prop != nullptr) {
    if (auto p = s->creates.props(handle)) {
      *prop = *p;
      return CUDA_SUCCESS;
    }
  }
  return pass<Row::cuMemGetAllocationPropertiesFromHandle>(ptds, prop, handle);
}

// ---- Counted ------------------------------------------------------------------------------------

CUresult on_cuMemAllocManaged(bool ptds, CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemAllocManaged>(ptds, dptr, bytesize, flags);
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  int dev = 0;
  if (CUresult rc = current_device(dev); rc != CUDA_SUCCESS) return rc;
  return s->policy.serve_counted(DeviceOrdinal{dev}, Bytes{bytesize}, dptr,
                                 [&] { return pass<Row::cuMemAllocManaged>(ptds, dptr, bytesize, flags); });
}

CUresult on_cuMemGetAddressRange_v2(bool ptds, CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  State* s = active();
  if (s != nullptr) {
    if (auto r = ipc::imported(addr(dptr))) {  // an IPC import answers its whole range
      if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(r->base);
      if (psize != nullptr) *psize = static_cast<size_t>(r->bytes);
      return CUDA_SUCCESS;
    }
    if (auto a = s->allocs.find(addr(dptr)); a && in_mapping(*a, addr(dptr))) {
      if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(a->ptr);
      if (psize != nullptr) *psize = static_cast<size_t>(a->requested);
      return CUDA_SUCCESS;
    }
  }
  return pass<Row::cuMemGetAddressRange_v2>(ptds, pbase, psize, dptr);
}

namespace {

// The range attributes of cuPointerGetAttribute(s) answered with [base, base + bytes).
void write_range(unsigned n, const CUpointer_attribute* attributes, void** data, std::uint64_t base,
                 std::uint64_t bytes) {
  for (unsigned i = 0; i < n; ++i) {
    if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
      const auto v = static_cast<CUdeviceptr>(base);
      std::memcpy(data[i], &v, sizeof v);
    } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
      const auto v = static_cast<size_t>(bytes);
      std::memcpy(data[i], &v, sizeof v);
    }
  }
}

}  // namespace

CUresult on_cuPointerGetAttribute(bool ptds, void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  State* s = active();
  if (s != nullptr && data != nullptr &&
      (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE)) {
    if (auto r = ipc::imported(addr(ptr))) {
      write_range(1, &attribute, &data, r->base, r->bytes);
      return CUDA_SUCCESS;
    }
    if (auto a = s->allocs.find(addr(ptr)); a && in_mapping(*a, addr(ptr))) {
      write_range(1, &attribute, &data, a->ptr, a->requested);
      return CUDA_SUCCESS;
    }
  }
  return pass<Row::cuPointerGetAttribute>(ptds, data, attribute, ptr);
}

CUresult on_cuPointerGetAttributes(bool ptds, unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                   CUdeviceptr ptr) {
  const CUresult rc = pass<Row::cuPointerGetAttributes>(ptds, numAttributes, attributes, data, ptr);
  State* s = active();
  if (rc != CUDA_SUCCESS || s == nullptr) return rc;
  if (auto r = ipc::imported(addr(ptr))) {
    write_range(numAttributes, attributes, data, r->base, r->bytes);
    return rc;
  }
  auto a = s->allocs.find(addr(ptr));
  if (a && in_mapping(*a, addr(ptr))) write_range(numAttributes, attributes, data, a->ptr, a->requested);
  return rc;
}

}  // namespace vlake::hook
