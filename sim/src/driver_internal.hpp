// The private interface between the translation units of the simulated driver (libcuda.so.1):
// the process state every entry point works on and the checks, address-space and allocation
// helpers they share. Not part of the library's interface (nothing here is exported).
//
// Files (each one concern; the entry points it implements are listed at its top):
//   driver_state.cpp       initialization state, context/stream checks, host VA, physical
//                          allocations, mappings and the access check of the copy engines
//   driver_init.cpp        cuInit, versions, error strings, the cuGetProcAddress table, the
//                          simulator's own exports (call counters, device file, node lock owner)
//   driver_devices.cpp     devices, primary contexts, the context stack
//   driver_streams.cpp     streams, events, context synchronization
//   driver_classic.cpp     cuMemAlloc-like allocation and free (plain, pitched, managed, async)
//   driver_pointers.cpp    pointer queries (address range, attributes) and legacy CUDA IPC
//   driver_copy.cpp        linear copies and memsets
//   driver_copy2d.cpp      2D/3D copies and 2D memsets
//   driver_vmm.cpp         virtual memory management (cuMem{Create,Map,SetAccess,...})
//   driver_kernels.cpp     modules, kernels and launches
//   driver_checkpoint.cpp  process checkpoints
//   driver_pools.cpp       memory pools, stream capture, graph memory (namespace pools below)
//   driver_peer.cpp        peer access between devices
//
// Contract
// - Process state: g_proc is the process state after a successful cuInit (nullptr before; never
//   destroyed). Its `mu` guards mappings, reservations, handles, physical allocations, streams,
//   events and modules: helpers marked "caller holds mu" expect it held (shared or exclusive as
//   stated); all others take it themselves (callers hold no simulator lock).
// - Errors: helpers return CUresult codes (rules.hpp names the simulator's choices); none throws
//   except std::bad_alloc. guarded(f) is how every entry point runs its body: std::bad_alloc
//   becomes CUDA_ERROR_OUT_OF_MEMORY, any other exception CUDA_ERROR_UNKNOWN.
// - The lent names (process(), context(), reachable(), ...) are what driver_pools.cpp and
//   driver_peer.cpp use; the other translation units use the helpers directly.
// - Peer state: CUctx_st::peers bit d means the context enabled peer access to device d's
//   primary context. peer_reaches / forget_peers read and clear it (caller holds mu
//   exclusively for forget_peers).
// - The hooks driver_classic.cpp and driver_streams.cpp call (namespace pools) are implemented in
//   driver_pools.cpp.
#pragma once

#include "process.hpp"
#include "rules.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <type_traits>
#include <vector>

#define VLAKE_SIM_API extern "C" __attribute__((visibility("default")))

// Per-thread-default-stream variants of entry points older than CUDA 7.0. They are not rows of
// cuda_api.def (cudaTypedefs.h types them PFN_<base>_v7000_ptds/_ptsz, a name the .def's
// PFN_<base>_v<version> check cannot form), but the real driver exports them and its
// cuGetProcAddress returns exactly them for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM at
// version >= 7000 (measured), so the simulator does the same. Each forwards to its legacy
// function (streams are synchronous).
//   X(base, per-thread symbol, version, cudaTypedefs.h type)
#define VLAKE_SIM_PER_THREAD_ROWS(X)                                                                           \
  X(cuMemcpyHtoD, cuMemcpyHtoD_v2_ptds, 7000, PFN_cuMemcpyHtoD_v7000_ptds)                                     \
  X(cuMemcpyDtoH, cuMemcpyDtoH_v2_ptds, 7000, PFN_cuMemcpyDtoH_v7000_ptds)                                     \
  X(cuMemcpyDtoD, cuMemcpyDtoD_v2_ptds, 7000, PFN_cuMemcpyDtoD_v7000_ptds)                                     \
  X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2_ptsz, 7000, PFN_cuMemcpyHtoDAsync_v7000_ptsz)                      \
  X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2_ptsz, 7000, PFN_cuMemcpyDtoHAsync_v7000_ptsz)                      \
  X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2_ptsz, 7000, PFN_cuMemcpyDtoDAsync_v7000_ptsz)                      \
  X(cuMemsetD8, cuMemsetD8_v2_ptds, 7000, PFN_cuMemsetD8_v7000_ptds)                                           \
  X(cuMemsetD32, cuMemsetD32_v2_ptds, 7000, PFN_cuMemsetD32_v7000_ptds)                                        \
  X(cuMemsetD8Async, cuMemsetD8Async_ptsz, 7000, PFN_cuMemsetD8Async_v7000_ptsz)                               \
  X(cuMemsetD32Async, cuMemsetD32Async_ptsz, 7000, PFN_cuMemsetD32Async_v7000_ptsz)                            \
  X(cuStreamSynchronize, cuStreamSynchronize_ptsz, 7000, PFN_cuStreamSynchronize_v7000_ptsz)                   \
  X(cuStreamQuery, cuStreamQuery_ptsz, 7000, PFN_cuStreamQuery_v7000_ptsz)                                     \
  X(cuStreamWaitEvent, cuStreamWaitEvent_ptsz, 7000, PFN_cuStreamWaitEvent_v7000_ptsz)                         \
  X(cuEventRecord, cuEventRecord_ptsz, 7000, PFN_cuEventRecord_v7000_ptsz)                                     \
  X(cuLaunchKernel, cuLaunchKernel_ptsz, 7000, PFN_cuLaunchKernel_v7000_ptsz)                                  \
  X(cuMemcpy, cuMemcpy_ptds, 7000, PFN_cuMemcpy_v7000_ptds)                                                    \
  X(cuMemcpyAsync, cuMemcpyAsync_ptsz, 7000, PFN_cuMemcpyAsync_v7000_ptsz)                                     \
  X(cuMemcpyPeer, cuMemcpyPeer_ptds, 7000, PFN_cuMemcpyPeer_v7000_ptds)                                        \
  X(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, 7000, PFN_cuMemcpyPeerAsync_v7000_ptsz)                         \
  X(cuMemcpy2D, cuMemcpy2D_v2_ptds, 7000, PFN_cuMemcpy2D_v7000_ptds)                                           \
  X(cuMemcpy2DUnaligned, cuMemcpy2DUnaligned_v2_ptds, 7000, PFN_cuMemcpy2DUnaligned_v7000_ptds)                \
  X(cuMemcpy2DAsync, cuMemcpy2DAsync_v2_ptsz, 7000, PFN_cuMemcpy2DAsync_v7000_ptsz)                            \
  X(cuMemcpy3D, cuMemcpy3D_v2_ptds, 7000, PFN_cuMemcpy3D_v7000_ptds)                                           \
  X(cuMemcpy3DAsync, cuMemcpy3DAsync_v2_ptsz, 7000, PFN_cuMemcpy3DAsync_v7000_ptsz)                            \
  X(cuMemsetD16, cuMemsetD16_v2_ptds, 7000, PFN_cuMemsetD16_v7000_ptds)                                        \
  X(cuMemsetD16Async, cuMemsetD16Async_ptsz, 7000, PFN_cuMemsetD16Async_v7000_ptsz)                            \
  X(cuMemsetD2D8, cuMemsetD2D8_v2_ptds, 7000, PFN_cuMemsetD2D8_v7000_ptds)                                     \
  X(cuMemsetD2D16, cuMemsetD2D16_v2_ptds, 7000, PFN_cuMemsetD2D16_v7000_ptds)                                  \
  X(cuMemsetD2D32, cuMemsetD2D32_v2_ptds, 7000, PFN_cuMemsetD2D32_v7000_ptds)                                  \
  X(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, 7000, PFN_cuMemsetD2D8Async_v7000_ptsz)                         \
  X(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz, 7000, PFN_cuMemsetD2D16Async_v7000_ptsz)                      \
  X(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, 7000, PFN_cuMemsetD2D32Async_v7000_ptsz)                      \
  X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, 9000, PFN_cuLaunchCooperativeKernel_v9000_ptsz) \
  X(cuLaunchHostFunc, cuLaunchHostFunc_ptsz, 10000, PFN_cuLaunchHostFunc_v10000_ptsz)                          \
  X(cuLaunchKernelEx, cuLaunchKernelEx_ptsz, 11060, PFN_cuLaunchKernelEx_v11060_ptsz)

// The simulator's rows beyond cuda_api.def that are not per-thread variants: entry points the
// hook intercepts (hook/src/interposer/hooked.def) that common's table does not list.
//   X(base, symbol, version): symbol has type PFN_<base>_v<version> of cudaTypedefs.h.
#define VLAKE_SIM_EXTRA_ROWS(X)                                 \
  X(cuCtxSynchronize, cuCtxSynchronize_v2, 13000)               \
  X(cuMemcpy, cuMemcpy, 4000)                                   \
  X(cuMemcpyAsync, cuMemcpyAsync, 4000)                         \
  X(cuMemcpyPeerAsync, cuMemcpyPeerAsync, 4000)                 \
  X(cuMemcpy2D, cuMemcpy2D_v2, 3020)                            \
  X(cuMemcpy2DUnaligned, cuMemcpy2DUnaligned_v2, 3020)          \
  X(cuMemcpy2DAsync, cuMemcpy2DAsync_v2, 3020)                  \
  X(cuMemcpy3D, cuMemcpy3D_v2, 3020)                            \
  X(cuMemcpy3DAsync, cuMemcpy3DAsync_v2, 3020)                  \
  X(cuMemsetD16, cuMemsetD16_v2, 3020)                          \
  X(cuMemsetD16Async, cuMemsetD16Async, 3020)                   \
  X(cuMemsetD2D8, cuMemsetD2D8_v2, 3020)                        \
  X(cuMemsetD2D16, cuMemsetD2D16_v2, 3020)                      \
  X(cuMemsetD2D32, cuMemsetD2D32_v2, 3020)                      \
  X(cuMemsetD2D8Async, cuMemsetD2D8Async, 3020)                 \
  X(cuMemsetD2D16Async, cuMemsetD2D16Async, 3020)               \
  X(cuMemsetD2D32Async, cuMemsetD2D32Async, 3020)               \
  X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000) \
  X(cuLaunchHostFunc, cuLaunchHostFunc, 10000)                  \
  X(cuLaunchKernelEx, cuLaunchKernelEx, 11060)

// Declarations with the exact cudaTypedefs.h types: a definition with other parameters does
// not compile.
#define VLAKE_SIM_DECLARE_PT(base, sym, version, pfn) extern "C" std::remove_pointer_t<pfn> sym;
VLAKE_SIM_PER_THREAD_ROWS(VLAKE_SIM_DECLARE_PT)
#undef VLAKE_SIM_DECLARE_PT
#define VLAKE_SIM_CHECK_EXTRA(base, sym, version) \
  static_assert(std::is_same_v<decltype(&::sym), PFN_##base##_v##version>, #sym " does not match its PFN");
VLAKE_SIM_EXTRA_ROWS(VLAKE_SIM_CHECK_EXTRA)
#undef VLAKE_SIM_CHECK_EXTRA

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

// ---- Shared by the translation units of driver_*.cpp ------------------------------------------

inline constexpr std::size_t kGran = rules::kGranularity;

// Initialization: 0 cuInit not called; 1 initialized; 2 cuInit failed (the failure is cached,
// like the real driver's). g_init_pid: the process that initialized (not a fork()ed child).
extern std::atomic<int> g_init;
extern std::atomic<CUresult> g_init_error;
extern std::atomic<pid_t> g_init_pid;
extern std::mutex g_init_mu;
extern Process* g_proc;

// The calling thread's current context (top of its context stack), or nullptr.
CUctx_st* current_ctx();

// Initialized and not in a fork()ed child of the process that initialized. Blocks while
// another process has this one locked or checkpointed (cuCheckpointProcessLock): every entry
// point that needs an initialized driver passes here.
CUresult check_init();
// A context-requiring call: initialized, a live current context, no sticky error.
CUresult check_ctx(CUctx_st*& ctx);
bool valid_device(CUdevice dev);
// The primary context behind a handle, or nullptr.
CUctx_st* ctx_of_handle(CUcontext c);

inline std::uintptr_t as_addr(CUdeviceptr p) { return static_cast<std::uintptr_t>(p); }
inline void* as_ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
inline bool add_overflows(std::uintptr_t a, std::size_t n) { return a + n < a; }

// Host VA. reserve_va: `size` bytes of PROT_NONE VA aligned to `align` (a power of two), 0 on
// failure. unmap_to_reservation: puts back PROT_NONE over [base, base + size). prot_of: the
// host protection a mapping needs (the most any device has).
std::uintptr_t reserve_va(std::size_t size, std::size_t align);
void unmap_to_reservation(std::uintptr_t base, std::size_t size);
int prot_of(const Mapping& m, int device_count);

// Physical allocations are memfds named "vlake-sim:d<device>:t<requestedHandleTypes>" (host-located
// ones "vlake-sim:host:t<types>", device kHostLocation), so an importer can check that an fd is a
// simulator allocation and recover its location and types.
int create_memfd(std::size_t size, int device, unsigned handle_types);
bool parse_memfd(int fd, int& device, unsigned& handle_types);
// A Phys for the memfd `fd` (owned from now on; `st` its fstat) of `size` bytes on `device`, added
// to the process's table with a fresh block id; the caller charged or held it on the node.
// Caller holds mu exclusively.
Phys* add_phys(int fd, const struct stat& st, std::size_t size, int device);
// Creates the Phys of a new allocation (charged to the node). Caller holds mu exclusively.
CUresult new_phys(std::size_t size, int device, unsigned handle_types, bool classic, Phys*& out);
// Drops `p` once nothing in this process refers to it. Caller holds mu exclusively.
void maybe_destroy(Phys* p);
// A new reference to the handle of `p` (import of a known allocation, retain). Caller holds mu
// exclusively.
CUmemGenericAllocationHandle add_handle_ref(Phys* p);
Phys* find_handle(CUmemGenericAllocationHandle h);

using MappingIt = std::map<std::uintptr_t, Mapping>::iterator;
// The mapping containing addr (within its visible bytes), or end(). Caller holds mu.
MappingIt mapping_at(std::uintptr_t addr);
// True when [addr, addr + n) is covered by mappings giving `device` the access needed. For a
// kernel (`kernel` = its context) cuMemAlloc memory of another device (not managed memory)
// also needs peer access. Caller holds mu.
bool accessible(std::uintptr_t addr, std::size_t n, int device, bool write, const CUctx_st* kernel = nullptr);
// The whole VMM mappings that exactly tile [addr, addr + size): CUDA_SUCCESS, `not_mapped` when
// addr is not inside any mapping, `partial` otherwise. Caller holds mu.
CUresult whole_mappings(std::uintptr_t addr, std::size_t size, CUresult not_mapped, CUresult partial,
                        std::vector<MappingIt>& out);
// The VMM mappings wholly inside [addr, addr + size) for cuMemUnmap. Caller holds mu.
CUresult mappings_inside(std::uintptr_t addr, std::size_t size, std::vector<MappingIt>& out);
// What a copy engine refusing a bad access returns (and does to the context).
CUresult refused(CUctx_st* ctx);
// The copy engines' link to host-located memory (VLAKE_SIM_LINK_BANDWIDTH, docs/simulator.md):
// a copy or memset whose device side touches_host() (some mapping of [addr, addr + n) is of
// host-located memory; caller holds mu) notes the time before it moves a byte and, once done
// and mu released, calls pace_link(), which returns once `bytes` / bandwidth has passed since
// `start` (at once when the bandwidth is 0: unmodeled).
bool touches_host(std::uintptr_t addr, std::size_t n);
void pace_link(std::chrono::steady_clock::time_point start, std::size_t bytes);
// A known stream (the legacy/per-thread handles included). Caller holds mu.
bool valid_stream(CUstream s);
// Frees what a primary context owns and clears its sticky error. Caller holds mu exclusively.
void destroy_ctx_resources(CUctx_st* ctx);
// The stream check of an asynchronous copy or memset: initialized and a known stream.
CUresult check_async_stream(CUstream s);

// One side of a copy: where its rows are. Row y of slice z starts at base + y*pitch + z*slice.
struct CopySide {
  CUmemorytype type;  // CU_MEMORYTYPE_HOST, _DEVICE or _UNIFIED (device when inside a mapping)
  std::uintptr_t base;
  std::size_t pitch = 0;
  std::size_t slice = 0;
  std::uintptr_t row(std::size_t y, std::size_t z) const { return base + y * pitch + z * slice; }
};
// Copies `depth` slices of `height` rows of `width` bytes (driver_copy.cpp): needs a current
// context; nothing is copied unless the context's device may write every destination row and
// read every source row that is device memory (else refused()); a null host side is
// CUDA_ERROR_INVALID_VALUE; an empty copy succeeds.
CUresult copy_rows(const CopySide& dst, const CopySide& src, std::size_t width, std::size_t height, std::size_t depth);
// Sets `height` rows (`pitch` bytes apart; ignored for one row) of `width` elements of `elem`
// bytes (1, 2 or 4) to `value` (driver_copy.cpp): dst and pitch aligned to elem, the row within
// the pitch, every row writable by the current context's device (else refused()).
CUresult memset_rows(std::uintptr_t dst, std::size_t pitch, std::size_t elem, unsigned value, std::size_t width,
                     std::size_t height);

// ---- Lent to driver_pools.cpp and driver_peer.cpp -----------------------------------------------

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

// An entry point's body that needs an initialized driver: guarded, after check_init().
template <class F>
CUresult initialized(F&& f) noexcept {
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    return f();
  });
}

// An entry point's body that needs a current context: guarded, f(ctx) after check_ctx(ctx).
template <class F>
CUresult in_context(F&& f) noexcept {
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    return f(ctx);
  });
}

// An asynchronous call's body (streams are synchronous): guarded, after check_async_stream(s).
template <class F>
CUresult on_stream(CUstream s, F&& f) noexcept {
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(s); rc != CUDA_SUCCESS) return rc;
    return f();
  });
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
