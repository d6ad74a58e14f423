// The simulated driver's virtual memory management: cuMemGetAllocationGranularity, cuMemCreate,
// cuMemRelease, cuMemAddressReserve, cuMemAddressFree, cuMemMap, cuMemUnmap, cuMemSetAccess,
// cuMemGetAccess, cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
// cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle. Handles are memfds
// (POSIX fd export/import across processes); access flags become host page protections.
// Host-located handles (CU_MEM_LOCATION_TYPE_HOST_NUMA, node 0) are memfds too, of device
// kHostLocation: charged to the node's host memory, mapped and given device access like the others.
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "node.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

// ---- VMM property checks --------------------------------------------------------------------

// Pinned memory of a valid device, or (VLAKE_SIM_HOST_VMM) of host NUMA node 0; `any_numa`: any
// host NUMA node id (the granularity query, measured).
CUresult check_prop(const CUmemAllocationProp* prop, bool any_numa = false) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return rules::kUnsupportedLocation;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
    if (!g_proc->host_vmm) return rules::kHostVmmUnsupported;
    if (prop->location.id != 0 && !any_numa) return rules::kInvalidHostLocation;
  } else if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return rules::kUnsupportedLocation;
  } else if (!valid_device(prop->location.id)) {
    return rules::kInvalidLocation;
  }
  const unsigned types = static_cast<unsigned>(prop->requestedHandleTypes);
  if (types != CU_MEM_HANDLE_TYPE_NONE && types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return rules::kUnsupportedHandleType;
  }
  return CUDA_SUCCESS;
}

}  // namespace

// =================================================================================================
// Virtual memory management (no current context needed)
// =================================================================================================

VLAKE_SIM_API CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                     CUmemAllocationGranularity_flags option) {
  VLAKE_SIM_COUNT(cuMemGetAllocationGranularity);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult rc = check_prop(prop, /*any_numa=*/true); rc != CUDA_SUCCESS) return rc;
  *granularity = kGran;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                   unsigned long long flags) {
  VLAKE_SIM_COUNT(cuMemCreate);
  return initialized([&]() -> CUresult {
    if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return rc;
    if (size == 0 || size % kGran != 0) return CUDA_ERROR_INVALID_VALUE;
    const int device =
        prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? vlake::sim::kHostLocation : prop->location.id;
    std::unique_lock lock(g_proc->mu);
    Phys* p = nullptr;
    if (CUresult rc = new_phys(size, device, static_cast<unsigned>(prop->requestedHandleTypes), false, p);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    p->prop = *prop;
    *handle = add_handle_ref(p);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  VLAKE_SIM_COUNT(cuMemRelease);
  return initialized([&]() -> CUresult {
    std::unique_lock lock(g_proc->mu);
    Phys* p = find_handle(handle);
    if (p == nullptr) return rules::kUnknownHandle;
    if (--p->handle_refs == 0) g_proc->handles.erase(handle);
    maybe_destroy(p);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                           unsigned long long flags) {
  VLAKE_SIM_COUNT(cuMemAddressReserve);
  return guarded([&]() -> CUresult {
    (void)addr;  // the hint is ignored, as the driver may
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (ptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (size == 0 || size % kGran != 0) return CUDA_ERROR_INVALID_VALUE;
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t align = std::max(alignment, kGran);
    if (size > SIZE_MAX - align) return CUDA_ERROR_OUT_OF_MEMORY;
    const std::uintptr_t base = reserve_va(size, align);
    if (base == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::unique_lock lock(g_proc->mu);
    g_proc->reservations.emplace(base, size);
    *ptr = static_cast<CUdeviceptr>(base);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  VLAKE_SIM_COUNT(cuMemAddressFree);
  return initialized([&]() -> CUresult {
    std::unique_lock lock(g_proc->mu);
    auto it = g_proc->reservations.find(as_addr(ptr));
    if (it == g_proc->reservations.end() || it->second != size) return rules::kAddressFreeUnknown;
    auto m = g_proc->mappings.lower_bound(it->first);
    if (m != g_proc->mappings.end() && m->first < it->first + it->second) {
      return rules::kAddressFreeWithMappings;
    }
    ::munmap(as_ptr(it->first), it->second);
    g_proc->reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                unsigned long long flags) {
  VLAKE_SIM_COUNT(cuMemMap);
  return initialized([&]() -> CUresult {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_proc->mu);
    Phys* p = find_handle(handle);
    if (p == nullptr) return rules::kUnknownHandle;
    if (offset != 0) return rules::kMapNonZeroOffset;
    if (size != p->size) return rules::kPartialMap;
    const std::uintptr_t base = as_addr(ptr);
    if (base % kGran != 0 || add_overflows(base, size)) return rules::kMapOutsideReservation;
    auto r = g_proc->reservations.upper_bound(base);
    if (r == g_proc->reservations.begin()) return rules::kMapOutsideReservation;
    --r;
    if (base - r->first >= r->second || size > r->second - (base - r->first)) {
      return rules::kMapOutsideReservation;
    }
    auto next = g_proc->mappings.lower_bound(base);
    if (next != g_proc->mappings.end() && next->first < base + size) return rules::kMapOverExisting;
    if (next != g_proc->mappings.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size > base) return rules::kMapOverExisting;
    }
    if (::mmap(as_ptr(base), size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, 0) == MAP_FAILED) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ++p->mappings;
    Mapping m;
    m.size = size;
    m.visible = size;
    m.phys = p;
    m.buffer_id = g_proc->next_id++;
    g_proc->mappings.emplace(base, m);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  VLAKE_SIM_COUNT(cuMemUnmap);
  return initialized([&]() -> CUresult {
    std::unique_lock lock(g_proc->mu);
    std::vector<MappingIt> whole;
    if (CUresult rc = mappings_inside(as_addr(ptr), size, whole); rc != CUDA_SUCCESS) return rc;
    for (auto it : whole) {
      Phys* p = it->second.phys;
      unmap_to_reservation(it->first, it->second.size);
      g_proc->mappings.erase(it);
      --p->mappings;
      maybe_destroy(p);
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  VLAKE_SIM_COUNT(cuMemSetAccess);
  return initialized([&]() -> CUresult {
    if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (!valid_device(desc[i].location.id)) return rules::kInvalidLocation;
      if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    std::unique_lock lock(g_proc->mu);
    std::vector<MappingIt> whole;
    if (CUresult rc = whole_mappings(as_addr(ptr), size, rules::kSetAccessNotMapped, rules::kPartialSetAccess, whole);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    for (auto it : whole) {
      Mapping& m = it->second;
      for (size_t i = 0; i < count; ++i) {
        m.access[desc[i].location.id] = static_cast<unsigned char>(desc[i].flags);
      }
      ::mprotect(as_ptr(it->first), m.size, prot_of(m, g_proc->device_count));
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  VLAKE_SIM_COUNT(cuMemGetAccess);
  return initialized([&]() -> CUresult {
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(location->id)) return rules::kInvalidLocation;
    std::shared_lock lock(g_proc->mu);
    auto it = mapping_at(as_addr(ptr));
    if (it == g_proc->mappings.end() || it->second.classic) return CUDA_ERROR_INVALID_VALUE;
    *flags = it->second.access[location->id];
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                                    CUmemAllocationHandleType handleType, unsigned long long flags) {
  VLAKE_SIM_COUNT(cuMemExportToShareableHandle);
  return initialized([&]() -> CUresult {
    if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_proc->mu);
    Phys* p = find_handle(handle);
    if (p == nullptr) return rules::kUnknownHandle;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return rules::kUnsupportedHandleType;
    if ((static_cast<unsigned>(p->prop.requestedHandleTypes) & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      return rules::kExportWithoutPosixFd;
    }
    int fd = ::dup(p->fd);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareableHandle) = fd;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                      CUmemAllocationHandleType shHandleType) {
  VLAKE_SIM_COUNT(cuMemImportFromShareableHandle);
  return initialized([&]() -> CUresult {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      return rules::kUnsupportedHandleType;
    }
    const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) return rules::kImportNotAnAllocation;
    int device = 0;
    unsigned types = 0;
    if (!parse_memfd(fd, device, types) || !(valid_device(device) || device == vlake::sim::kHostLocation) ||
        st.st_size <= 0 || static_cast<std::size_t>(st.st_size) % kGran != 0) {
      return rules::kImportNotAnAllocation;
    }
    const bool host = device == vlake::sim::kHostLocation;
    if (host && !g_proc->host_vmm) return rules::kHostVmmUnsupported;
    std::unique_lock lock(g_proc->mu);
    auto known = g_proc->phys.find(std::make_pair(std::uint64_t{st.st_dev}, std::uint64_t{st.st_ino}));
    if (known != g_proc->phys.end()) {
      if (known->second->classic) return rules::kImportNotAnAllocation;
      *handle = add_handle_ref(known->second.get());
      return CUDA_SUCCESS;
    }
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    const auto size = static_cast<std::size_t>(st.st_size);
    if (CUresult rc = g_proc->node->hold(st.st_dev, st.st_ino, size, device); rc != CUDA_SUCCESS) {
      ::close(own);
      return rc;
    }
    Phys* raw = add_phys(own, st, size, device);
    raw->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    raw->prop.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    raw->prop.location.id = host ? 0 : device;
    raw->prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(types);
    *handle = add_handle_ref(raw);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  VLAKE_SIM_COUNT(cuMemRetainAllocationHandle);
  return initialized([&]() -> CUresult {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_proc->mu);
    auto it = mapping_at(reinterpret_cast<std::uintptr_t>(addr));
    if (it == g_proc->mappings.end() || it->second.classic) return rules::kRetainNotMapped;
    *handle = add_handle_ref(it->second.phys);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                              CUmemGenericAllocationHandle handle) {
  VLAKE_SIM_COUNT(cuMemGetAllocationPropertiesFromHandle);
  return initialized([&]() -> CUresult {
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_proc->mu);
    Phys* p = find_handle(handle);
    if (p == nullptr) return rules::kUnknownHandle;
    *prop = p->prop;
    return CUDA_SUCCESS;
  });
}
