// The simulated driver's pointer queries and legacy CUDA IPC: cuMemGetAddressRange_v2,
// cuPointerGetAttribute, cuPointerGetAttributes, cuIpcGetMemHandle, cuIpcOpenMemHandle_v2,
// cuIpcCloseMemHandle. Read-only over the mapping table (shared lock).
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <cstring>
#include <shared_mutex>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

// ---- Pointer attributes ---------------------------------------------------------------------

template <class T>
void put(void* data, T value) {
  std::memcpy(data, &value, sizeof value);
}

// Writes attribute `a` of `ptr` (m: its mapping, or nullptr when unknown) to data.
// `strict`: cuPointerGetAttribute (unknown pointer / host pointer are errors) vs
// cuPointerGetAttributes (zeros and defaults).
CUresult pointer_attribute(void* data, CUpointer_attribute a, std::uintptr_t ptr, std::uintptr_t base, const Mapping* m,
                           bool strict) {
  if (m == nullptr && strict) return rules::kPointerUnknown;
  CUctx_st* cur = current_ctx();
  // Host-located VMM memory has no device: the current context's stands in (a guess; a one-GPU
  // H200 answers 0).
  int device = m != nullptr ? m->phys->device : 0;
  if (device == vlake::sim::kHostLocation) device = cur != nullptr ? cur->device : 0;
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      put<CUcontext>(data, m != nullptr && m->classic ? m->ctx : nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: {  // host-located VMM memory: HOST (measured on an H200)
      const bool host = m != nullptr && m->phys != nullptr && m->phys->device == vlake::sim::kHostLocation;
      put<unsigned>(data, m == nullptr ? 0u : static_cast<unsigned>(host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE));
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      put<CUdeviceptr>(data, m != nullptr ? static_cast<CUdeviceptr>(ptr) : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (m != nullptr && m->managed) {  // managed memory: the same address (measured)
        put<void*>(data, as_ptr(ptr));
        return CUDA_SUCCESS;
      }
      if (strict) return CUDA_ERROR_INVALID_VALUE;  // device memory has no host pointer
      put<void*>(data, nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: put<int>(data, 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      put<unsigned long long>(data, m != nullptr ? m->buffer_id : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: put<int>(data, m != nullptr && m->managed ? 1 : 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: put<int>(data, m != nullptr ? device : -2); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      // cuMemAlloc memory only: not VMM, managed (measured) or pool memory (measured).
      put<int>(data, m != nullptr && m->classic && !m->managed && !m->async ? 1 : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      put<CUdeviceptr>(data, m != nullptr ? static_cast<CUdeviceptr>(base) : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: put<std::size_t>(data, m != nullptr ? m->visible : 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED: put<int>(data, m != nullptr ? 1 : 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      put<unsigned long long>(data, m != nullptr && !m->classic ? m->phys->prop.requestedHandleTypes : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: put<int>(data, 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: {
      unsigned flags = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
      if (m != nullptr) flags = m->access[cur != nullptr ? cur->device : device];
      put<unsigned>(data, flags);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:  // non-null for cuMemAllocAsync memory (measured)
      put<CUmemoryPool>(data, m != nullptr && m->async ? &g_proc->pools[device] : nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: put<std::size_t>(data, m != nullptr ? m->size : 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      put<void*>(data, m != nullptr ? as_ptr(base) : nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      put<unsigned long long>(data, m != nullptr ? m->phys->block_id : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: put<int>(data, 0); return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

VLAKE_SIM_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  VLAKE_SIM_COUNT(cuMemGetAddressRange_v2);
  return in_context([&](CUctx_st*) -> CUresult {
    std::shared_lock lock(g_proc->mu);
    auto it = mapping_at(as_addr(dptr));
    if (it == g_proc->mappings.end()) return rules::kAddressRangeUnknown;
    if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(it->first);
    if (psize != nullptr) *psize = it->second.visible;
    return CUDA_SUCCESS;
  });
}

// Legacy CUDA IPC (docs/simulator.md): VMM memory is refused as the driver does; cuMemAlloc
// memory is not carried across processes (a simulator limit), so no handle is ever issued.
VLAKE_SIM_API CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  VLAKE_SIM_COUNT(cuIpcGetMemHandle);
  return in_context([&](CUctx_st*) -> CUresult {
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_proc->mu);
    auto it = mapping_at(as_addr(dptr));
    if (it == g_proc->mappings.end()) return rules::kIpcUnknownPointer;
    if (!it->second.classic || it->second.managed || it->second.async) return rules::kIpcNotCapable;
    return rules::kIpcClassicUnsupported;
  });
}

VLAKE_SIM_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuIpcOpenMemHandle_v2);
  (void)handle;
  return in_context([&](CUctx_st*) -> CUresult {
    if (pdptr == nullptr || (Flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return rules::kIpcBadHandle;
  });
}

VLAKE_SIM_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  VLAKE_SIM_COUNT(cuIpcCloseMemHandle);
  (void)dptr;
  return in_context([&](CUctx_st*) -> CUresult { return rules::kIpcBadHandle; });
}

VLAKE_SIM_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  VLAKE_SIM_COUNT(cuPointerGetAttribute);
  return initialized([&]() -> CUresult {
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (attribute == CU_POINTER_ATTRIBUTE_P2P_TOKENS) return CUDA_ERROR_NOT_SUPPORTED;
    std::shared_lock lock(g_proc->mu);
    auto it = mapping_at(as_addr(ptr));
    const bool found = it != g_proc->mappings.end();
    return pointer_attribute(data, attribute, as_addr(ptr), found ? it->first : 0, found ? &it->second : nullptr, true);
  });
}

VLAKE_SIM_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                              CUdeviceptr ptr) {
  VLAKE_SIM_COUNT(cuPointerGetAttributes);
  return initialized([&]() -> CUresult {
    if (numAttributes == 0 || attributes == nullptr || data == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::shared_lock lock(g_proc->mu);
    auto it = mapping_at(as_addr(ptr));
    const bool found = it != g_proc->mappings.end();
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (attributes[i] == CU_POINTER_ATTRIBUTE_P2P_TOKENS) return CUDA_ERROR_NOT_SUPPORTED;
      if (CUresult rc = pointer_attribute(data[i], attributes[i], as_addr(ptr), found ? it->first : 0,
                                          found ? &it->second : nullptr, false);
          rc != CUDA_SUCCESS) {
        return rc;
      }
    }
    return CUDA_SUCCESS;
  });
}
