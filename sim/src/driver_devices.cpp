// The simulated driver's devices and contexts: cuDeviceGet, cuDeviceGetCount, cuDeviceGetName,
// cuDeviceGetUuid(_v2), cuDeviceTotalMem_v2, cuDeviceGetAttribute, cuDeviceGetPCIBusId, the
// primary context calls (cuDevicePrimaryCtx{Retain,Release_v2,GetState,Reset_v2}) and the
// per-thread context stack (cuCtx{Get,Set}Current, cuCtx{Push,Pop}Current_v2, cuCtxGetDevice).
// Only primary contexts exist; the stack is per thread (current_ctx()).
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "node.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

// Per-thread context stack (trivially destructible, so safe in a dlopen'ed library).
constexpr int kMaxStack = 64;
thread_local CUctx_st* t_stack[kMaxStack];
thread_local int t_depth = 0;

// ---- Device facts -------------------------------------------------------------------------------

CUuuid device_uuid(int dev) {
  const auto bytes = vlake::sim::device_uuid(g_proc->node_name, dev);
  CUuuid u{};
  std::memcpy(u.bytes, bytes.data(), sizeof u.bytes);
  return u;
}

// The attributes whose value is the same on every simulated device; any other attribute
// (outside device_attribute's per-device and per-process ones) is CUDA_ERROR_INVALID_VALUE.
struct FixedAttribute {
  CUdevice_attribute attribute;
  int value;
};
constexpr FixedAttribute kFixedAttributes[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0},
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
    {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
    {CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    // 32 on the H100 (measured); the pitch cuMemAllocPitch_v2 returns is a multiple of
    // TEXTURE_ALIGNMENT (512), see rules::kPitchAlignment.
    {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},  // cuMemAllocManaged (measured 1)
    {CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0},
    {CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2},
    {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, 0},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0},  // no cuMemHostRegister
    {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0},
    {CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST, 0},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0},  // not simulated
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, 32505856},
    {CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, 134213632},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},  // cuMemAllocAsync (measured 1)
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0},
    {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, 4},
    {CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS, 1},
    {CU_DEVICE_ATTRIBUTE_NUMA_CONFIG, 0},
    {CU_DEVICE_ATTRIBUTE_NUMA_ID, -1},
    {CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MPS_ENABLED, 0},
    {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0},  // the one host NUMA node of host-located memory
};

bool device_attribute(CUdevice_attribute a, int dev, int& v) {
  // The attributes that depend on the device ordinal.
  if (a == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
    v = dev + 1;
    return true;
  }
  if (a == CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID) {
    v = dev;
    return true;
  }
  if (a == CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
    v = g_proc->host_vmm ? 1 : 0;  // VLAKE_SIM_HOST_VMM
    return true;
  }
  for (const FixedAttribute& f : kFixedAttributes) {
    if (f.attribute == a) {
      v = f.value;
      return true;
    }
  }
  return false;
}

// A query about device `dev` that needs only an initialized driver: *out = value() (a null out
// is CUDA_ERROR_INVALID_VALUE, an invalid dev CUDA_ERROR_INVALID_DEVICE, checked in that order).
template <class T, class Value>
CUresult answer_for(CUdevice dev, T* out, Value&& value) {
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *out = value();
  return CUDA_SUCCESS;
}

// An entry point's body on device `dev`'s primary context: initialized, `dev` valid (else
// CUDA_ERROR_INVALID_DEVICE), then f(ctx) under g_proc->mu.
template <class F>
CUresult on_primary_ctx(CUdevice dev, F&& f) {
  return initialized([&]() -> CUresult {
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::unique_lock lock(g_proc->mu);
    return f(g_proc->ctxs[dev]);
  });
}

// A query that needs only an initialized driver: *out = value() (a null out is
// CUDA_ERROR_INVALID_VALUE; value() runs only once the driver is initialized).
template <class T, class Value>
CUresult answer(T* out, Value&& value) {
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = value();
  return CUDA_SUCCESS;
}

}  // namespace

CUctx_st* vlake::sim::internal::current_ctx() { return t_depth > 0 ? t_stack[t_depth - 1] : nullptr; }

// =================================================================================================
// Devices
// =================================================================================================

VLAKE_SIM_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  VLAKE_SIM_COUNT(cuDeviceGet);
  return answer_for(ordinal, device, [&] { return ordinal; });
}

VLAKE_SIM_API CUresult cuDeviceGetCount(int* count) {
  VLAKE_SIM_COUNT(cuDeviceGetCount);
  return answer(count, [] { return g_proc->device_count; });
}

VLAKE_SIM_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  VLAKE_SIM_COUNT(cuDeviceGetName);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<std::size_t>(len), "%s", rules::kDeviceName);
  return CUDA_SUCCESS;
}

namespace {
CUresult get_uuid(CUuuid* uuid, CUdevice dev) {
  return guarded([&] { return answer_for(dev, uuid, [&] { return device_uuid(dev); }); });
}
}  // namespace

VLAKE_SIM_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  VLAKE_SIM_COUNT(cuDeviceGetUuid);
  return get_uuid(uuid, dev);
}

VLAKE_SIM_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  VLAKE_SIM_COUNT(cuDeviceGetUuid_v2);
  return get_uuid(uuid, dev);
}

VLAKE_SIM_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  VLAKE_SIM_COUNT(cuDeviceTotalMem_v2);
  return answer_for(dev, bytes, [] { return static_cast<size_t>(g_proc->capacity); });
}

VLAKE_SIM_API CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  VLAKE_SIM_COUNT(cuDeviceGetAttribute);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int v = 0;
  if (!device_attribute(attrib, dev, v)) return CUDA_ERROR_INVALID_VALUE;
  *pi = v;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  VLAKE_SIM_COUNT(cuDeviceGetPCIBusId);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(pciBusId, static_cast<std::size_t>(len), "0000:%02x:00.0", static_cast<unsigned>(dev + 1));
  return CUDA_SUCCESS;
}

// =================================================================================================
// Contexts
// =================================================================================================

VLAKE_SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  VLAKE_SIM_COUNT(cuDevicePrimaryCtxRetain);
  return initialized([&]() -> CUresult {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    CUctx_st& ctx = g_proc->ctxs[dev];
    // Creating the context charges its VLAKE_SIM_CONTEXT_MEMORY on the node (a record this
    // process holds, listed by NVML); it must fit like any allocation.
    std::unique_lock lock(g_proc->mu);
    if (ctx.retains.load() == 0) {
      if (CUresult rc = g_proc->node->charge_context(dev, g_proc->context_memory); rc != CUDA_SUCCESS) {
        return rc;
      }
    }
    ctx.retains.fetch_add(1);
    *pctx = &ctx;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  VLAKE_SIM_COUNT(cuDevicePrimaryCtxRelease_v2);
  return on_primary_ctx(dev, [&](CUctx_st& ctx) -> CUresult {
    if (ctx.retains.load() <= 0) return rules::kReleaseUnretained;
    if (ctx.retains.fetch_sub(1) == 1) {
      destroy_ctx_resources(&ctx);
      g_proc->node->release_context(dev);
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  VLAKE_SIM_COUNT(cuDevicePrimaryCtxGetState);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = g_proc->ctxs[dev].retains.load() > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  VLAKE_SIM_COUNT(cuDevicePrimaryCtxReset_v2);
  return on_primary_ctx(dev, [](CUctx_st& ctx) -> CUresult {
    destroy_ctx_resources(&ctx);
    return CUDA_SUCCESS;
  });
}

// Contexts a process creates besides the primary ones (cuCtxCreate_v2/_v3/_v4, cuGreenCtxCreate):
// each charges VLAKE_SIM_CONTEXT_MEMORY like a primary context; nothing else of them is modeled
// (the handle is good for its destroy call only: not current, no work in it).
namespace {

// A new created context (T: CUctx_st or CUgreenCtx_st) on `dev` into *out: its record charged,
// its handle remembered.
template <class T>
CUresult create_ctx(T** out, CUdevice dev) {
  return initialized([&]() -> CUresult {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    auto ctx = std::make_unique<T>();
    ctx->device = dev;
    std::unique_lock lock(g_proc->mu);
    const std::uint32_t serial = g_proc->next_ctx_serial++;
    if (CUresult rc = g_proc->node->charge_context(dev, g_proc->context_memory, serial); rc != CUDA_SUCCESS) return rc;
    g_proc->created_ctxs.emplace(ctx.get(), serial);
    *out = ctx.release();
    return CUDA_SUCCESS;
  });
}

// Destroys a created context: CUDA_ERROR_INVALID_CONTEXT for any other handle.
template <class T>
CUresult destroy_ctx(T* handle) {
  return initialized([&]() -> CUresult {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_proc->mu);
    const auto it = g_proc->created_ctxs.find(handle);
    if (it == g_proc->created_ctxs.end()) return CUDA_ERROR_INVALID_CONTEXT;  // a primary context too
    g_proc->node->release_context(handle->device, it->second);
    g_proc->created_ctxs.erase(it);
    delete handle;
    return CUDA_SUCCESS;
  });
}

}  // namespace

VLAKE_SIM_API CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int /*flags*/, CUdevice dev) {
  VLAKE_SIM_COUNT(cuCtxCreate_v2);
  return create_ctx(pctx, dev);
}

VLAKE_SIM_API CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* /*paramsArray*/, int /*numParams*/,
                                      unsigned int /*flags*/, CUdevice dev) {
  VLAKE_SIM_COUNT(cuCtxCreate_v3);
  return create_ctx(pctx, dev);
}

VLAKE_SIM_API CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* /*ctxCreateParams*/, unsigned int /*flags*/,
                                      CUdevice dev) {
  VLAKE_SIM_COUNT(cuCtxCreate_v4);
  return create_ctx(pctx, dev);
}

VLAKE_SIM_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  VLAKE_SIM_COUNT(cuCtxDestroy_v2);
  return destroy_ctx(ctx);
}

VLAKE_SIM_API CUresult cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc /*desc*/, CUdevice dev,
                                        unsigned int /*flags*/) {
  VLAKE_SIM_COUNT(cuGreenCtxCreate);
  return create_ctx(phCtx, dev);
}

VLAKE_SIM_API CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
  VLAKE_SIM_COUNT(cuGreenCtxDestroy);
  return destroy_ctx(hCtx);
}

VLAKE_SIM_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  VLAKE_SIM_COUNT(cuCtxGetCurrent);
  return answer(pctx, [] { return current_ctx(); });
}

VLAKE_SIM_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  VLAKE_SIM_COUNT(cuCtxSetCurrent);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr) {
    if (t_depth > 0) --t_depth;
    return CUDA_SUCCESS;
  }
  if (ctx_of_handle(ctx) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_depth == 0) t_depth = 1;
  t_stack[t_depth - 1] = ctx;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  VLAKE_SIM_COUNT(cuCtxPushCurrent_v2);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr || ctx_of_handle(ctx) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_depth >= kMaxStack) return CUDA_ERROR_OUT_OF_MEMORY;
  t_stack[t_depth++] = ctx;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  VLAKE_SIM_COUNT(cuCtxPopCurrent_v2);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (t_depth == 0) return rules::kPopEmpty;
  CUctx_st* top = t_stack[--t_depth];
  if (pctx != nullptr) *pctx = top;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuCtxGetDevice(CUdevice* device) {
  VLAKE_SIM_COUNT(cuCtxGetDevice);
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}
