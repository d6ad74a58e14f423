// The hook's process state and the C++ implementations behind every intercepted entry point.
//
// Contract
// - state() creates the process state on first use (configuration from the environment,
//   pthread_atfork handlers; no driver call, no connection) and returns it; it returns nullptr
//   while the state is being created on the calling thread (re-entrancy from inside
//   initialization): callers then pass the call through to the driver.
// - on_<symbol>(ptds, args...) implements hooked.def row <symbol>; `ptds` tells whether the
//   application obtained the per-thread-default-stream variant. The exported trampolines
//   (exports.cpp) call them and turn any exception into a CUresult; they may throw.
// - Thread-safety: all of it may run concurrently; tables and the daemon connection have their
//   own mutexes (lock order: daemon connection, then tables).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "alloc/policy.hpp"
#include "client.hpp"
#include "config.hpp"
#include "kept.hpp"
#include "log.hpp"
#include "pass.hpp"
#include "peer.hpp"
#include "pending.hpp"
#include "prefetch.hpp"
#include "real.hpp"
#include "reclaim.hpp"
#include "reserve.hpp"
#include "swap.hpp"
#include "tables.hpp"
#include "usage_cache.hpp"

namespace vlake::hook {

namespace alloc {
class ProcessSeams;
}

struct State {
  explicit State(Config c);

  const Config config;
  DaemonClient client;
  // Every call passes straight through: VLAKE_DISABLE=1 and the daemon allowed it or could not
  // be reached (decided once, before the state is published; docs/hook.md).
  bool passthrough = false;
  AllocTable allocs;
  CreateTable creates;
  ManagedTable managed;
  RateLimiter refusals{std::chrono::seconds(1)};
  RateLimiter unreachable{std::chrono::seconds(1)};
  std::atomic<bool> passthrough_warned{false};
  std::atomic<bool> fault_reported{false};  // a guard event was sent (once per process)

  // Context -> device ordinal of contexts seen by current_device(): after a kernel fault the
  // context's cuCtxGetDevice fails (sticky error), but the fault report still names the device.
  static constexpr std::size_t kContextSlots = 64;
  std::array<std::atomic<CUcontext>, kContextSlots> ctx_seen{};
  std::array<std::atomic<int>, kContextSlots> ctx_device{};

  std::mutex uuid_mu;
  std::array<std::optional<Uuid>, proto::kMaxDevices> uuids;

  // Local reserve (docs/hook.md): freed alloc-path memory kept mapped for reuse.
  LocalReserve reserve;
  // Kept mappings (docs/hook.md): released grants still mapped here, until the daemon says Drop.
  KeptMappings kept;
  // Prefetch (prefetch.hpp, docs/hook.md): blocks of sizes the reserve keeps missing, fetched by
  // the worker into the reserve.
  Prefetch prefetch;
  // Devices that enabled peer access to each device's served memory (peer.hpp).
  PeerSet peers;

  // The background worker (started with the first block put in the reserve): unmaps and
  // releases blocks that leave the reserve, expires idle blocks, answers Pressure and sends
  // ReserveReports. Lock order: busy_mu, work_mu, then the connection and the tables.
  std::mutex busy_mu;  // held by the worker while it calls the driver or the daemon
  std::mutex work_mu;
  std::condition_variable work_cv;
  std::vector<ReserveBlock> retire_queue;  // guarded by work_mu
  bool worker_started = false;             // guarded by work_mu
  bool stopping = false;                   // guarded by work_mu: the process is exiting

  // Stream-ordered frees (pending.hpp): cuMemFreeAsync'd allocations waiting for their stream,
  // completed by the worker; pushed under work_mu (which also guards kicked: the worker
  // queries at once after a push).
  PendingFrees frees;
  EventPool events;
  bool kicked = false;  // the worker looks at once: a free pushed, prefetches queued (prefetch.hpp)
  // Held by whoever completes frees (the worker, or an application thread settling them before
  // a refused allocation is retried): a thread that takes it knows that every free completed by
  // others so far is finished. Lock order: busy_mu, settle_mu, work_mu, then the rest.
  std::mutex settle_mu;
  // Frees handed to the worker and frees completed (memory in the reserve or released): a free
  // is outstanding from its cuMemFreeAsync until its completion has finished.
  std::atomic<std::uint64_t> frees_queued{0};
  std::atomic<std::uint64_t> frees_completed{0};

  // The daemon's usage answers, briefly (usage_cache.hpp, docs/hook.md "Memory queries").
  UsageCache usage_cache;

  // Reclaim (reclaim.hpp, docs/hook.md "Reclaim"): frameworks' callbacks, run on their own
  // thread when a Pressure is more than the reserve covers. What they freed into the reserve is
  // returned by the worker: after_reclaim (guarded by work_mu) holds device, bytes.
  Reclaimer reclaim;
  // The application's CPU use, sampled by the worker of an overcommit process (swap.hpp).
  CpuWatch cpu;
  bool on_host = false;  // the worker's: vlaked said SwapNotice{host} and the gate is still closed
  std::vector<std::pair<int, std::uint64_t>> after_reclaim;

  // The allocation policy (alloc/policy.hpp) over this state's seams (never destroyed). The
  // last grant's granularity and guard mode are read from it on the hot path.
  alloc::ProcessSeams* const seams;
  alloc::AllocPolicy policy;
};

[[nodiscard]] State* state() noexcept;

// Starts the background worker if it is not running (it reads Pressure, returns the reserve and
// sends ReserveReports). Never throws; without a thread nothing happens.
void start_worker(State& s);

// The UUID of CUDA device `dev` (cached). CUresult of cuDeviceGetUuid_v2 on failure.
CUresult device_uuid(State& s, int dev, Uuid& out);

// Waits for the work that may still use allocation `a`, as cuMemFree does: a synchronize of the
// context it was allocated in (pushed if another is current; the current one if unknown).
CUresult fence_allocation(const LogicalAlloc& a);

// Called by the synchronizing wrappers when the driver returned CUDA_ERROR_ILLEGAL_ADDRESS
// (cold path): the first time in this process, sends a GuardEvent to vlaked — a kernel fault:
// kind fault_maps_shared when the process maps shared read-only chunks on that GPU, else fault;
// the suspects — and prints one stderr line. Never throws.
void report_fault(const char* call, CUresult rc) noexcept;
// Called by the copy and memset wrappers only when the driver refused the call with
// CUDA_ERROR_INVALID_VALUE (cold path): if the destination [dst, dst + bytes) overlaps a shared
// read-only range of this process (share::readonly_hit), sends a ReadOnlyWrite to vlaked and
// logs one line. Never throws.
void report_refused_write(const char* call, std::uint64_t dst, std::uint64_t bytes, CUresult rc) noexcept;

// The tenant's usage of GPU `uuid` (UsageQuery), from the usage cache when it may answer;
// nullopt when the daemon cannot be reached.
std::optional<UsageResult> usage_of(State& s, const Uuid& uuid);

// Applies the daemon's usage answer to a (free, total) pair the driver reported.
void virtualize_memory_info(const UsageResult& u, std::size_t& free, std::size_t& total) noexcept;

// ---- For counted.cpp and the rooms (hook.cpp, alloc/) ----
// The state when calls are intercepted (not passthrough, not initializing), else nullptr.
[[nodiscard]] State* active_state() noexcept;
// The device of the calling thread's current context.
CUresult current_device_of(int& dev);
// A GrantRequest{counted} of `bytes` on `dev`, with the hook's refusal and unreachable policies
// (refusals are logged). granted: grant_id and the charged bytes (rounded by the daemon).
struct Charge {
  enum class Outcome { granted, refused, passthrough } outcome = Outcome::refused;
  CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
  std::uint64_t grant_id = 0;
  std::uint64_t bytes = 0;
};
Charge charge_counted(State& s, int dev, std::uint64_t bytes);
void uncharge(State& s, std::uint64_t grant_id);
bool stream_capturing(bool ptds, CUstream stream);

// ---- Counted paths (counted.cpp) ----
// cuMemCreate with properties the node pool cannot serve: charged, then created by the driver.
CUresult create_counted(State& s, bool ptds, CUmemGenericAllocationHandle* handle, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags);
// cuMemFree / cuMemFreeAsync (has_stream) of a pointer the pool did not serve: passed to the
// driver; a memory-pool pointer updates its pool's charge.
CUresult free_unserved(State& s, bool ptds, CUdeviceptr dptr, CUstream stream, bool has_stream);
// After a successful stream, event or context synchronization: pools that freed memory are
// re-read (one atomic load when none did).
void after_synchronize() noexcept;

CUresult on_cuMemAlloc_v2(bool ptds, CUdeviceptr* dptr, size_t bytesize);
CUresult on_cuMemAllocPitch_v2(bool ptds, CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                               unsigned int ElementSizeBytes);
CUresult on_cuMemFree_v2(bool ptds, CUdeviceptr dptr);
CUresult on_cuMemAllocAsync(bool ptds, CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult on_cuMemFreeAsync(bool ptds, CUdeviceptr dptr, CUstream hStream);
CUresult on_cuMemCreate(bool ptds, CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                        unsigned long long flags);
CUresult on_cuMemRelease(bool ptds, CUmemGenericAllocationHandle handle);
CUresult on_cuMemRetainAllocationHandle(bool ptds, CUmemGenericAllocationHandle* handle, void* addr);
CUresult on_cuMemMap(bool ptds, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                     unsigned long long flags);
CUresult on_cuMemUnmap(bool ptds, CUdeviceptr ptr, size_t size);
CUresult on_cuMemImportFromShareableHandle(bool ptds, CUmemGenericAllocationHandle* handle, void* osHandle,
                                           CUmemAllocationHandleType shHandleType);
CUresult on_cuMemExportToShareableHandle(bool ptds, void* shareableHandle, CUmemGenericAllocationHandle handle,
                                         CUmemAllocationHandleType handleType, unsigned long long flags);
CUresult on_cuMemGetAllocationPropertiesFromHandle(bool ptds, CUmemAllocationProp* prop,
                                                   CUmemGenericAllocationHandle handle);
CUresult on_cuMemAllocManaged(bool ptds, CUdeviceptr* dptr, size_t bytesize, unsigned int flags);
CUresult on_cuMemGetInfo_v2(bool ptds, size_t* free, size_t* total);
CUresult on_cuDeviceTotalMem_v2(bool ptds, size_t* bytes, CUdevice dev);
CUresult on_cuMemGetAddressRange_v2(bool ptds, CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr);
CUresult on_cuPointerGetAttribute(bool ptds, void* data, CUpointer_attribute attribute, CUdeviceptr ptr);
CUresult on_cuPointerGetAttributes(bool ptds, unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                   CUdeviceptr ptr);
// Synchronizing calls: passed through; see report_fault().
CUresult on_cuCtxSynchronize(bool ptds);
CUresult on_cuCtxSynchronize_v2(bool ptds, CUcontext ctx);
CUresult on_cuStreamSynchronize(bool ptds, CUstream hStream);
CUresult on_cuStreamQuery(bool ptds, CUstream hStream);
CUresult on_cuEventSynchronize(bool ptds, CUevent hEvent);
CUresult on_cuEventQuery(bool ptds, CUevent hEvent);
CUresult on_cuMemcpyDtoH_v2(bool ptds, void* dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult on_cuMemcpyDtoHAsync_v2(bool ptds, void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
// Uploads: passed through, then offered for transparent dedup (share.hpp).
CUresult on_cuMemcpyHtoD_v2(bool ptds, CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount);
CUresult on_cuMemcpyHtoDAsync_v2(bool ptds, CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                 CUstream hStream);
// Copies and memsets into device memory: passed through; see report_refused_write() and
// report_fault().
CUresult on_cuMemcpyDtoD_v2(bool ptds, CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult on_cuMemcpyDtoDAsync_v2(bool ptds, CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                 CUstream hStream);
CUresult on_cuMemcpy(bool ptds, CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult on_cuMemcpyAsync(bool ptds, CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult on_cuMemcpyPeer(bool ptds, CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                         CUcontext srcContext, size_t ByteCount);
CUresult on_cuMemcpyPeerAsync(bool ptds, CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                              CUcontext srcContext, size_t ByteCount, CUstream hStream);
CUresult on_cuMemcpy2D_v2(bool ptds, const CUDA_MEMCPY2D* pCopy);
CUresult on_cuMemcpy2DUnaligned_v2(bool ptds, const CUDA_MEMCPY2D* pCopy);
CUresult on_cuMemcpy2DAsync_v2(bool ptds, const CUDA_MEMCPY2D* pCopy, CUstream hStream);
CUresult on_cuMemcpy3D_v2(bool ptds, const CUDA_MEMCPY3D* pCopy);
CUresult on_cuMemcpy3DAsync_v2(bool ptds, const CUDA_MEMCPY3D* pCopy, CUstream hStream);
CUresult on_cuMemsetD8_v2(bool ptds, CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult on_cuMemsetD16_v2(bool ptds, CUdeviceptr dstDevice, unsigned short us, size_t N);
CUresult on_cuMemsetD32_v2(bool ptds, CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult on_cuMemsetD8Async(bool ptds, CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult on_cuMemsetD16Async(bool ptds, CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
CUresult on_cuMemsetD32Async(bool ptds, CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
CUresult on_cuMemsetD2D8_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
                            size_t Height);
CUresult on_cuMemsetD2D16_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                             size_t Height);
CUresult on_cuMemsetD2D32_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
                             size_t Height);
CUresult on_cuMemsetD2D8Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
                              size_t Height, CUstream hStream);
CUresult on_cuMemsetD2D16Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                               size_t Height, CUstream hStream);
CUresult on_cuMemsetD2D32Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
                               size_t Height, CUstream hStream);
// Peer access (peer.cpp): passed through; on success served memory follows (peer.hpp).
CUresult on_cuCtxEnablePeerAccess(bool ptds, CUcontext peerContext, unsigned int Flags);
CUresult on_cuDevicePrimaryCtxRetain(bool ptds, CUcontext* pctx, CUdevice dev);
CUresult on_cuDevicePrimaryCtxRelease_v2(bool ptds, CUdevice dev);
CUresult on_cuDevicePrimaryCtxReset_v2(bool ptds, CUdevice dev);
// Created and green contexts (contexts.cpp): admitted like a primary context, given back when
// destroyed.
CUresult on_cuCtxCreate_v2(bool ptds, CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult on_cuCtxCreate_v3(bool ptds, CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                           unsigned int flags, CUdevice dev);
CUresult on_cuCtxCreate_v4(bool ptds, CUcontext* pctx, CUctxCreateParams* ctxCreateParams, unsigned int flags,
                           CUdevice dev);
CUresult on_cuCtxDestroy_v2(bool ptds, CUcontext ctx);
CUresult on_cuGreenCtxCreate(bool ptds, CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags);
CUresult on_cuGreenCtxDestroy(bool ptds, CUgreenCtx hCtx);
CUresult on_cuCtxDisablePeerAccess(bool ptds, CUcontext peerContext);
// CUDA IPC of pool memory (ipc.cpp, docs/ipc.md).
CUresult on_cuIpcGetMemHandle(bool ptds, CUipcMemHandle* pHandle, CUdeviceptr dptr);
CUresult on_cuIpcOpenMemHandle_v2(bool ptds, CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult on_cuIpcCloseMemHandle(bool ptds, CUdeviceptr dptr);
// Stream-ordered pools and graph memory: counted (counted.cpp).
// The pre-3.2 cuMemAlloc/cuMemFree ABI (32-bit device pointer and size): counted.
CUresult on_cuMemAlloc(bool ptds, CUdeviceptr_v1* dptr, unsigned int bytesize);
CUresult on_cuMemFree(bool ptds, CUdeviceptr_v1 dptr);
CUresult on_cuDeviceGetDefaultMemPool(bool ptds, CUmemoryPool* pool_out, CUdevice dev);
CUresult on_cuDeviceGetMemPool(bool ptds, CUmemoryPool* pool, CUdevice dev);
CUresult on_cuDeviceSetMemPool(bool ptds, CUdevice dev, CUmemoryPool pool);
CUresult on_cuMemPoolCreate(bool ptds, CUmemoryPool* pool, const CUmemPoolProps* poolProps);
CUresult on_cuMemPoolDestroy(bool ptds, CUmemoryPool pool);
CUresult on_cuMemPoolTrimTo(bool ptds, CUmemoryPool pool, size_t minBytesToKeep);
CUresult on_cuMemAllocFromPoolAsync(bool ptds, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult on_cuGraphInstantiateWithFlags(bool ptds, CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags);
CUresult on_cuGraphInstantiateWithParams(bool ptds, CUgraphExec* phGraphExec, CUgraph hGraph,
                                         CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams);
CUresult on_cuGraphUpload(bool ptds, CUgraphExec hGraphExec, CUstream hStream);
CUresult on_cuGraphLaunch(bool ptds, CUgraphExec hGraphExec, CUstream hStream);
// Kernel launches: passed through (the swap gate is in pass()).
CUresult on_cuLaunchKernel(bool ptds, CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                           unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                           unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra);
CUresult on_cuLaunchCooperativeKernel(bool ptds, CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                      unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                      unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                      void** kernelParams);
CUresult on_cuLaunchHostFunc(bool ptds, CUstream hStream, CUhostFn fn, void* userData);
CUresult on_cuLaunchKernelEx(bool ptds, const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra);
CUresult on_cuGraphExecDestroy(bool ptds, CUgraphExec hGraphExec);
CUresult on_cuDeviceGraphMemTrim(bool ptds, CUdevice device);
// Defined in exports.cpp (they need the cuGetProcAddress table).
CUresult on_cuGetProcAddress(bool ptds, const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult on_cuGetProcAddress_v2(bool ptds, const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                CUdriverProcAddressQueryResult* symbolStatus);

}  // namespace vlake::hook
