// The simulated CUDA driver: every entry point of common/include/vlake/common/cuda_api.def.
// See docs/simulator.md for the rules it follows and sim/src/rules.hpp for its error codes.
#include "vlake/common/chunk_hash.hpp"
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
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

#define VLAKE_SIM_API extern "C" __attribute__((visibility("default")))

// Entry points beyond cuda_api.def (the kernel path of vlake::Driver::fill_u32_kernel): the
// same prototype check cuda_api.hpp does for the listed ones.
static_assert(std::is_same_v<decltype(&::cuModuleLoadData), PFN_cuModuleLoadData_v2000>);
static_assert(std::is_same_v<decltype(&::cuModuleUnload), PFN_cuModuleUnload_v2000>);
static_assert(std::is_same_v<decltype(&::cuModuleGetFunction), PFN_cuModuleGetFunction_v2000>);
static_assert(std::is_same_v<decltype(&::cuLaunchKernel), PFN_cuLaunchKernel_v4000>);

// Per-thread-default-stream variants of entry points older than CUDA 7.0. They are not rows of
// cuda_api.def (cudaTypedefs.h types them PFN_<base>_v7000_ptds/_ptsz, a name the .def's
// PFN_<base>_v<version> check cannot form), but the real driver exports them and its
// cuGetProcAddress returns exactly them for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM at
// version >= 7000 (measured), so the simulator does the same. Each forwards to its legacy
// function (streams are synchronous).
//   X(base, per-thread symbol, version, cudaTypedefs.h type)
#define VLAKE_SIM_PER_THREAD_ROWS(X)                                                         \
  X(cuMemcpyHtoD, cuMemcpyHtoD_v2_ptds, 7000, PFN_cuMemcpyHtoD_v7000_ptds)                   \
  X(cuMemcpyDtoH, cuMemcpyDtoH_v2_ptds, 7000, PFN_cuMemcpyDtoH_v7000_ptds)                   \
  X(cuMemcpyDtoD, cuMemcpyDtoD_v2_ptds, 7000, PFN_cuMemcpyDtoD_v7000_ptds)                   \
  X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2_ptsz, 7000, PFN_cuMemcpyHtoDAsync_v7000_ptsz)    \
  X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2_ptsz, 7000, PFN_cuMemcpyDtoHAsync_v7000_ptsz)    \
  X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2_ptsz, 7000, PFN_cuMemcpyDtoDAsync_v7000_ptsz)    \
  X(cuMemsetD8, cuMemsetD8_v2_ptds, 7000, PFN_cuMemsetD8_v7000_ptds)                         \
  X(cuMemsetD32, cuMemsetD32_v2_ptds, 7000, PFN_cuMemsetD32_v7000_ptds)                      \
  X(cuMemsetD8Async, cuMemsetD8Async_ptsz, 7000, PFN_cuMemsetD8Async_v7000_ptsz)             \
  X(cuMemsetD32Async, cuMemsetD32Async_ptsz, 7000, PFN_cuMemsetD32Async_v7000_ptsz)          \
  X(cuStreamSynchronize, cuStreamSynchronize_ptsz, 7000, PFN_cuStreamSynchronize_v7000_ptsz) \
  X(cuStreamQuery, cuStreamQuery_ptsz, 7000, PFN_cuStreamQuery_v7000_ptsz)                   \
  X(cuStreamWaitEvent, cuStreamWaitEvent_ptsz, 7000, PFN_cuStreamWaitEvent_v7000_ptsz)       \
  X(cuEventRecord, cuEventRecord_ptsz, 7000, PFN_cuEventRecord_v7000_ptsz)                   \
  X(cuLaunchKernel, cuLaunchKernel_ptsz, 7000, PFN_cuLaunchKernel_v7000_ptsz)

#define VLAKE_SIM_CHECK_PT(base, sym, version, pfn) \
  static_assert(std::is_same_v<decltype(&::sym), pfn>, #sym " does not match " #pfn);
VLAKE_SIM_PER_THREAD_ROWS(VLAKE_SIM_CHECK_PT)
#undef VLAKE_SIM_CHECK_PT
// The _ptsz rows of cuda_api.def are checked against the legacy PFN there; the exact per-thread
// type too:
static_assert(std::is_same_v<decltype(&::cuMemAllocAsync_ptsz), PFN_cuMemAllocAsync_v11020_ptsz>);
static_assert(std::is_same_v<decltype(&::cuMemFreeAsync_ptsz), PFN_cuMemFreeAsync_v11020_ptsz>);

using vlake::sim::Mapping;
using vlake::sim::Phys;
using vlake::sim::Process;
namespace rules = vlake::sim::rules;

namespace {

constexpr std::size_t kGran = rules::kGranularity;

// ---- Initialization state -------------------------------------------------------------------
// 0: cuInit not called; 1: initialized; 2: cuInit failed (the failure is cached, like the
// real driver's).
std::atomic<int> g_init{0};
std::atomic<CUresult> g_init_error{CUDA_SUCCESS};
std::atomic<pid_t> g_init_pid{0};
std::mutex g_init_mu;
// Never destroyed: entry points may run during process exit from other threads.
Process* g_proc = nullptr;

// Per-thread context stack (trivially destructible, so safe in a dlopen'ed library).
constexpr int kMaxStack = 64;
thread_local CUctx_st* t_stack[kMaxStack];
thread_local int t_depth = 0;

CUctx_st* current_ctx() { return t_depth > 0 ? t_stack[t_depth - 1] : nullptr; }

using vlake::sim::internal::guarded;

// Initialized and not in a fork()ed child of the process that initialized.
// Blocks while another process has this one locked or checkpointed (cuCheckpointProcessLock):
// every entry point that needs an initialized driver passes here.
CUresult check_init() {
  if (g_init.load(std::memory_order_acquire) != 1) return rules::kNotInitialized;
  if (::getpid() != g_init_pid.load(std::memory_order_relaxed)) return rules::kNotInitialized;
  g_proc->node->wait_while_locked();
  return CUDA_SUCCESS;
}

// A context-requiring call: initialized, a live current context, no sticky error.
CUresult check_ctx(CUctx_st*& ctx) {
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  ctx = current_ctx();
  if (ctx == nullptr || ctx->retains.load() <= 0) return rules::kNoContext;
  if (CUresult sticky = ctx->sticky.load(); sticky != CUDA_SUCCESS) return sticky;
  return CUDA_SUCCESS;
}

bool valid_device(CUdevice dev) { return dev >= 0 && dev < g_proc->device_count; }

CUctx_st* ctx_of_handle(CUcontext c) {
  for (int i = 0; i < g_proc->device_count; ++i) {
    if (c == &g_proc->ctxs[i]) return c;
  }
  return nullptr;
}

std::uintptr_t as_addr(CUdeviceptr p) { return static_cast<std::uintptr_t>(p); }
void* as_ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

bool add_overflows(std::uintptr_t a, std::size_t n) { return a + n < a; }

// ---- Host VA ----------------------------------------------------------------------------------

// Reserves `size` bytes of PROT_NONE host VA aligned to `align` (a power of two).
std::uintptr_t reserve_va(std::size_t size, std::size_t align) {
  const std::size_t span = size + align;
  void* p = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 0;
  const auto raw = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t base = (raw + align - 1) & ~(std::uintptr_t{align} - 1);
  if (base > raw) ::munmap(p, base - raw);
  const std::uintptr_t end = base + size;
  if (raw + span > end) ::munmap(as_ptr(end), raw + span - end);
  return base;
}

// Puts back an anonymous PROT_NONE reservation over [base, base + size).
void unmap_to_reservation(std::uintptr_t base, std::size_t size) {
  ::mmap(as_ptr(base), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

int prot_of(const Mapping& m, int device_count) {
  unsigned char most = 0;
  for (int d = 0; d < device_count; ++d) most = std::max(most, m.access[d]);
  if (most == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return PROT_READ | PROT_WRITE;
  if (most == CU_MEM_ACCESS_FLAGS_PROT_READ) return PROT_READ;
  return PROT_NONE;
}

// ---- Physical allocations -----------------------------------------------------------------------

// memfd name: "vlake-sim:d<device>:t<requestedHandleTypes>", so an importer can check that an
// fd is a simulator allocation and recover its device and handle types.
int create_memfd(std::size_t size, int device, unsigned handle_types) {
  char name[64];
  std::snprintf(name, sizeof name, "vlake-sim:d%d:t%u", device, handle_types);
  int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
  return fd;
}

bool parse_memfd(int fd, int& device, unsigned& handle_types) {
  char link[64];
  char target[256];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::sscanf(target, "/memfd:vlake-sim:d%d:t%u", &device, &handle_types) == 2;
}

// Creates the Phys of a new allocation (charged to the node). Caller holds mu exclusively.
CUresult new_phys(std::size_t size, int device, unsigned handle_types, bool classic, Phys*& out) {
  int fd = create_memfd(size, device, handle_types);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st {};
  ::fstat(fd, &st);
  auto p = std::make_unique<Phys>();
  p->fd = fd;
  p->dev = st.st_dev;
  p->ino = st.st_ino;
  p->size = size;
  p->device = device;
  p->classic = classic;
  if (CUresult rc = g_proc->node->charge_new(p->dev, p->ino, size, device); rc != CUDA_SUCCESS) {
    ::close(fd);
    return rc;
  }
  p->block_id = g_proc->next_id++;
  out = p.get();
  g_proc->phys.emplace(std::make_pair(p->dev, p->ino), std::move(p));
  return CUDA_SUCCESS;
}

// Drops `p` once nothing in this process refers to it. Caller holds mu exclusively.
void maybe_destroy(Phys* p) {
  if (p->handle_refs > 0 || p->mappings > 0) return;
  if (p->handle != 0) g_proc->handles.erase(p->handle);
  g_proc->node->release(p->dev, p->ino);
  ::close(p->fd);
  g_proc->phys.erase(std::make_pair(p->dev, p->ino));
}

// A new reference to the handle of `p` (import of a known allocation, retain).
CUmemGenericAllocationHandle add_handle_ref(Phys* p) {
  if (p->handle == 0) p->handle = g_proc->next_handle++;
  if (p->handle_refs++ == 0) g_proc->handles[p->handle] = p;
  return p->handle;
}

Phys* find_handle(CUmemGenericAllocationHandle h) {
  auto it = g_proc->handles.find(h);
  return it == g_proc->handles.end() ? nullptr : it->second;
}

// ---- Mappings -------------------------------------------------------------------------------

// The mapping containing addr (within its visible bytes), or end().
std::map<std::uintptr_t, Mapping>::iterator mapping_at(std::uintptr_t addr) {
  auto& maps = g_proc->mappings;
  auto it = maps.upper_bound(addr);
  if (it == maps.begin()) return maps.end();
  --it;
  if (addr - it->first < it->second.visible) return it;
  return maps.end();
}

// True when [addr, addr + n) is covered by mappings giving `device` the access needed. For a
// kernel (`kernel` = its context) cuMemAlloc memory of another device (not managed memory)
// also needs peer access.
bool accessible(std::uintptr_t addr, std::size_t n, int device, bool write, const CUctx_st* kernel = nullptr) {
  if (add_overflows(addr, n)) return false;
  const unsigned need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
  const std::uintptr_t end = addr + n;
  std::uintptr_t cur = addr;
  auto it = mapping_at(cur);
  while (cur < end) {
    if (it == g_proc->mappings.end() || it->first > cur) return false;
    const std::uintptr_t limit = it->first + it->second.visible;
    if (cur >= limit) return false;
    if ((it->second.access[device] & need) != need) return false;
    if (kernel != nullptr && it->second.classic && !it->second.managed &&
        !vlake::sim::peer_reaches(*kernel, it->second.phys->device)) {
      return false;
    }
    cur = limit;
    ++it;
  }
  return true;
}

// Collects the whole VMM mappings that exactly tile [addr, addr + size).
// Returns CUDA_SUCCESS, `not_mapped` when addr is not inside any mapping, `partial` otherwise.
CUresult whole_mappings(std::uintptr_t addr, std::size_t size, CUresult not_mapped, CUresult partial,
                        std::vector<std::map<std::uintptr_t, Mapping>::iterator>& out) {
  if (size == 0 || add_overflows(addr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto& maps = g_proc->mappings;
  auto it = maps.find(addr);
  if (it == maps.end()) {
    auto inside = mapping_at(addr);
    return (inside != maps.end() && !inside->second.classic) ? partial : not_mapped;
  }
  if (it->second.classic) return not_mapped;
  const std::uintptr_t end = addr + size;
  std::uintptr_t cur = addr;
  while (cur < end) {
    if (it == maps.end() || it->first != cur || it->second.classic) return partial;
    if (it->second.size > end - cur) return partial;
    out.push_back(it);
    cur += it->second.size;
    ++it;
  }
  return CUDA_SUCCESS;
}

// Collects the VMM mappings wholly inside [addr, addr + size) for cuMemUnmap: no mapping may
// straddle either end; unmapped VA inside is fine; the range must lie in one reservation.
CUresult mappings_inside(std::uintptr_t addr, std::size_t size,
                         std::vector<std::map<std::uintptr_t, Mapping>::iterator>& out) {
  if (size == 0 || add_overflows(addr, size)) return CUDA_ERROR_INVALID_VALUE;
  const std::uintptr_t end = addr + size;
  auto r = g_proc->reservations.upper_bound(addr);
  if (r == g_proc->reservations.begin()) return rules::kUnmapNotMapped;
  --r;
  if (addr - r->first >= r->second || size > r->second - (addr - r->first)) {
    return rules::kUnmapNotMapped;
  }
  auto& maps = g_proc->mappings;
  auto it = maps.lower_bound(addr);
  if (it != maps.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > addr) return rules::kPartialUnmap;
  }
  for (; it != maps.end() && it->first < end; ++it) {
    if (it->second.classic) return rules::kUnmapNotMapped;
    if (it->second.size > end - it->first) return rules::kPartialUnmap;
    out.push_back(it);
  }
  return CUDA_SUCCESS;
}

// A copy engine refusing a bad access.
CUresult refused(CUctx_st* ctx) {
  if (rules::kCopyBadAccessIsSticky) ctx->sticky.store(rules::kIllegalAccess);
  return rules::kCopyBadAccess;
}

bool valid_stream(CUstream s) {
  if (s == nullptr || s == reinterpret_cast<CUstream>(std::uintptr_t{1}) ||
      s == reinterpret_cast<CUstream>(std::uintptr_t{2})) {
    return true;
  }
  return g_proc->streams.count(s) != 0;
}

// Frees what a primary context owns (cuMemAlloc memory, streams, events) and clears its
// sticky error. Caller holds mu exclusively.
void destroy_ctx_resources(CUctx_st* ctx) {
  vlake::sim::forget_peers(*g_proc, *ctx);
  auto& maps = g_proc->mappings;
  for (auto it = maps.begin(); it != maps.end();) {
    // cuMemAllocAsync memory belongs to the device's pool and outlives the context (cuda.h).
    if (it->second.classic && !it->second.async && it->second.ctx == ctx) {
      Phys* p = it->second.phys;
      ::munmap(as_ptr(it->first), it->second.size);
      it = maps.erase(it);
      --p->mappings;
      maybe_destroy(p);
    } else {
      ++it;
    }
  }
  for (auto it = g_proc->streams.begin(); it != g_proc->streams.end();) {
    if ((*it)->ctx == ctx) {
      delete *it;
      it = g_proc->streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = g_proc->events.begin(); it != g_proc->events.end();) {
    if ((*it)->ctx == ctx) {
      delete *it;
      it = g_proc->events.erase(it);
    } else {
      ++it;
    }
  }
  ctx->sticky.store(CUDA_SUCCESS);
}

// ---- Copies ---------------------------------------------------------------------------------

CUresult copy_checked(std::uintptr_t dst, bool dst_device, std::uintptr_t src, bool src_device, std::size_t n) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if ((!dst_device && dst == 0) || (!src_device && src == 0)) return CUDA_ERROR_INVALID_VALUE;
  std::shared_lock lock(g_proc->mu);
  if (dst_device && !accessible(dst, n, ctx->device, true)) return refused(ctx);
  if (src_device && !accessible(src, n, ctx->device, false)) return refused(ctx);
  std::memmove(as_ptr(dst), as_ptr(src), n);
  return CUDA_SUCCESS;
}

// Zeroes [dst, dst + n) (accessible, checked by the caller) as a GPU would, fast: whole pages of
// the memfds behind the range are punched out (they read as zero in every process mapping them,
// and take no host memory until written again); only partial pages are written. A scrub of a
// 64 MiB handle then costs microseconds, as on the GPU, not a host memset faulting in 64 MiB.
void zero_fill(std::uintptr_t dst, std::size_t n) {
  constexpr std::uintptr_t kPage = 4096;
  const std::uintptr_t end = dst + n;
  std::uintptr_t cur = dst;
  for (auto it = mapping_at(cur); cur < end && it != g_proc->mappings.end(); ++it) {
    const std::uintptr_t limit = std::min<std::uintptr_t>(end, it->first + it->second.visible);
    const std::uintptr_t first_page = (cur + kPage - 1) & ~(kPage - 1);
    const std::uintptr_t last_page = limit & ~(kPage - 1);
    bool punched = false;
    if (first_page < last_page && it->second.phys != nullptr && it->second.phys->fd >= 0) {
      punched =
          ::fallocate(it->second.phys->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(first_page - it->first), static_cast<off_t>(last_page - first_page)) == 0;
    }
    if (punched) {
      std::memset(as_ptr(cur), 0, first_page - cur);
      std::memset(as_ptr(last_page), 0, limit - last_page);
    } else {
      std::memset(as_ptr(cur), 0, limit - cur);
    }
    cur = limit;
  }
}

CUresult memset_checked(std::uintptr_t dst, std::size_t elem, unsigned value, std::size_t count) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  if (elem == 4 && dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  if (count == 0) return CUDA_SUCCESS;
  if (count > SIZE_MAX / elem) return CUDA_ERROR_INVALID_VALUE;
  std::shared_lock lock(g_proc->mu);
  if (!accessible(dst, count * elem, ctx->device, true)) return refused(ctx);
  if ((value & (elem == 1 ? 0xffu : ~0u)) == 0) {
    zero_fill(dst, count * elem);
    return CUDA_SUCCESS;
  }
  if (elem == 1) {
    std::memset(as_ptr(dst), static_cast<int>(value & 0xffu), count);
  } else {
    auto* p = static_cast<std::uint32_t*>(as_ptr(dst));
    std::fill(p, p + count, static_cast<std::uint32_t>(value));
  }
  return CUDA_SUCCESS;
}

CUresult check_async_stream(CUstream s) {
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  std::shared_lock lock(g_proc->mu);
  return valid_stream(s) ? CUDA_SUCCESS : rules::kBadStreamOrEvent;
}

// ---- Environment --------------------------------------------------------------------------------

CUresult init_failure(const std::string& msg, CUresult rc) {
  std::fprintf(stderr, "vlake-sim: %s\n", msg.c_str());
  return rc;
}

CUresult do_init() {
  vlake::sim::Config config;
  std::string error;
  if (!vlake::sim::read_config(config, error)) return init_failure(error, CUDA_ERROR_INVALID_VALUE);
  auto proc = std::make_unique<Process>();
  proc->node_name = config.node;
  proc->device_count = config.device_count;
  proc->capacity = config.capacity;
  proc->context_memory = config.context_memory;
  proc->peer_access = config.peer_access;
  for (int i = 0; i < rules::kMaxDevices; ++i) {
    proc->ctxs[i].device = i;
    proc->pools[i].device = i;
  }
  if (CUresult rc = vlake::sim::Node::attach(config.node, config.device_count, config.capacity, config.access,
                                             vlake::sim::current_process(), proc->node);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  g_proc = proc.release();
  return CUDA_SUCCESS;
}

// ---- Device facts -------------------------------------------------------------------------------

CUuuid device_uuid(int dev) {
  const auto bytes = vlake::sim::device_uuid(g_proc->node_name, dev);
  CUuuid u{};
  std::memcpy(u.bytes, bytes.data(), sizeof u.bytes);
  return u;
}

bool device_attribute(CUdevice_attribute a, int dev, int& v) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; return true;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; return true;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; return true;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: v = 512; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = dev + 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; return true;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 52428800; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; return true;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; return true;
    // 32 on the H100 (measured); the pitch cuMemAllocPitch_v2 returns is a multiple of
    // TEXTURE_ALIGNMENT (512), see rules::kPitchAlignment.
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: v = 32; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; return true;  // cuMemAllocManaged (measured 1)
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: v = dev; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: v = 2; return true;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 0; return true;  // no cuMemHostRegister
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: v = 0; return true;  // not simulated
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; return true;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: v = 32505856; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: v = 134213632; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; return true;  // cuMemAllocAsync (measured 1)
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: v = 4; return true;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS: v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: v = -1; return true;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = -1; return true;
    default: return false;
  }
}

// ---- cuGetProcAddress table -----------------------------------------------------------------

struct ProcRow {
  const char* base;
  int version;
  void* fn;
  bool per_thread;  // a _ptsz/_ptds variant
};

constexpr bool per_thread_symbol(std::string_view sym) { return sym.ends_with("_ptsz") || sym.ends_with("_ptds"); }

// cuGetProcAddress (v1: `v2` false) and cuGetProcAddress_v2. Among the rows of `symbol`, the
// per-thread rows answer CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM when the base has any
// (measured: "cuMemcpyHtoD"@7000 -> cuMemcpyHtoD_v2_ptds, but @3020 -> version not sufficient),
// the legacy rows answer otherwise; the highest version <= cuda_version wins. Not found: v2
// succeeds with a null pointer and the reason in *status (measured), v1 fails.
CUresult resolve_proc(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status, bool v2) {
  static const ProcRow rows[] = {
#define VLAKE_CU_API(base, sym, version) {#base, version, reinterpret_cast<void*>(&::sym), per_thread_symbol(#sym)},
#include "vlake/common/cuda_api.def"
#undef VLAKE_CU_API
#define VLAKE_SIM_PT_ROW(base, sym, version, pfn) {#base, version, reinterpret_cast<void*>(&::sym), true},
      VLAKE_SIM_PER_THREAD_ROWS(VLAKE_SIM_PT_ROW)
#undef VLAKE_SIM_PT_ROW
  };
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pfn = nullptr;
  bool known = false;
  bool has_per_thread = false;
  for (const ProcRow& r : rows) {
    if (std::strcmp(r.base, symbol) != 0) continue;
    known = true;
    has_per_thread = has_per_thread || r.per_thread;
  }
  const bool want_per_thread = has_per_thread && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const ProcRow* best = nullptr;
  for (const ProcRow& r : rows) {
    if (r.per_thread != want_per_thread || std::strcmp(r.base, symbol) != 0) continue;
    if (r.version <= cuda_version && (best == nullptr || r.version > best->version)) best = &r;
  }
  if (best == nullptr) {
    if (status != nullptr) {
      *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return v2 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

// ---- Error strings ----------------------------------------------------------------------------

struct ErrorRow {
  CUresult code;
  const char* name;
  const char* text;
};

const ErrorRow* find_error(CUresult code) {
  static const ErrorRow rows[] = {
#define VLAKE_SIM_ERROR(name, text) {name, #name, text},
#include "error_table.inc"
#undef VLAKE_SIM_ERROR
  };
  for (const ErrorRow& r : rows) {
    if (r.code == code) return &r;
  }
  return nullptr;
}

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
  const int device = m != nullptr ? m->phys->device : 0;
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      put<CUcontext>(data, m != nullptr && m->classic ? m->ctx : nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put<unsigned>(data, m != nullptr ? static_cast<unsigned>(CU_MEMORYTYPE_DEVICE) : 0u);
      return CUDA_SUCCESS;
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

// ---- VMM property checks --------------------------------------------------------------------

CUresult check_prop(const CUmemAllocationProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return rules::kUnsupportedLocation;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return rules::kUnsupportedLocation;
  if (!valid_device(prop->location.id)) return rules::kInvalidLocation;
  const unsigned types = static_cast<unsigned>(prop->requestedHandleTypes);
  if (types != CU_MEM_HANDLE_TYPE_NONE && types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return rules::kUnsupportedHandleType;
  }
  return CUDA_SUCCESS;
}

// At normal process exit (or dlclose), the process stops holding memory on the node at once
// instead of waiting for another process to notice that it died. Not in a fork()ed child.
__attribute__((destructor)) void detach_at_exit() {
  if (g_init.load() != 1 || ::getpid() != g_init_pid.load()) return;
  try {
    g_proc->node->detach();
  } catch (...) {
  }
}

}  // namespace

// What driver_peer.cpp needs of this file (driver_internal.hpp).
namespace vlake::sim::internal {
Process* process() { return g_proc; }
CUctx_st* context_of(CUcontext c) { return ctx_of_handle(c); }
bool device_valid(CUdevice dev) { return valid_device(dev); }
bool reachable(std::uintptr_t addr, std::size_t n, int device, bool write) {
  return accessible(addr, n, device, write);
}
CUresult copy_refused(CUctx_st* ctx) { return refused(ctx); }
}  // namespace vlake::sim::internal

// =================================================================================================
// Initialization, versions, errors
// =================================================================================================

VLAKE_SIM_API CUresult cuInit(unsigned int Flags) {
  VLAKE_SIM_COUNT(cuInit);
  return guarded([&]() -> CUresult {
    if (g_init.load() == 1) return check_init();
    std::lock_guard lock(g_init_mu);
    const int state = g_init.load();
    if (state == 1) return check_init();
    if (state == 2) return g_init_error.load();
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const CUresult rc = do_init();
    if (rc != CUDA_SUCCESS) {
      g_init_error.store(rc);
      g_init.store(2, std::memory_order_release);
      return rc;
    }
    g_init_pid.store(::getpid());
    g_init.store(1, std::memory_order_release);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuDriverGetVersion(int* driverVersion) {
  VLAKE_SIM_COUNT(cuDriverGetVersion);
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = rules::kDriverVersion;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuGetErrorString(CUresult error, const char** pStr) {
  VLAKE_SIM_COUNT(cuGetErrorString);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorRow* r = find_error(error);
  *pStr = r != nullptr ? r->text : nullptr;
  return r != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VLAKE_SIM_API CUresult cuGetErrorName(CUresult error, const char** pStr) {
  VLAKE_SIM_COUNT(cuGetErrorName);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorRow* r = find_error(error);
  *pStr = r != nullptr ? r->name : nullptr;
  return r != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VLAKE_SIM_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  VLAKE_SIM_COUNT(cuGetProcAddress);
  return guarded([&] { return resolve_proc(symbol, pfn, cudaVersion, flags, nullptr, false); });
}

VLAKE_SIM_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                           CUdriverProcAddressQueryResult* symbolStatus) {
  VLAKE_SIM_COUNT(cuGetProcAddress_v2);
  return guarded([&] { return resolve_proc(symbol, pfn, cudaVersion, flags, symbolStatus, true); });
}

// =================================================================================================
// Devices
// =================================================================================================

VLAKE_SIM_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  VLAKE_SIM_COUNT(cuDeviceGet);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuDeviceGetCount(int* count) {
  VLAKE_SIM_COUNT(cuDeviceGetCount);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = g_proc->device_count;
  return CUDA_SUCCESS;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *uuid = device_uuid(dev);
    return CUDA_SUCCESS;
  });
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
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = static_cast<size_t>(g_proc->capacity);
  return CUDA_SUCCESS;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::unique_lock lock(g_proc->mu);
    CUctx_st& ctx = g_proc->ctxs[dev];
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::unique_lock lock(g_proc->mu);
    destroy_ctx_resources(&g_proc->ctxs[dev]);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  VLAKE_SIM_COUNT(cuCtxGetCurrent);
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = current_ctx();
  return CUDA_SUCCESS;
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

namespace {

// VLAKE_SIM_EVENT_LAG_MS (docs/simulator.md): a GPU still working through its streams, as seen
// through events. An event recorded at t completes at t + lag; stream and context
// synchronizations wait for every event recorded before them, stream queries answer
// CUDA_ERROR_NOT_READY until then. 0 (unset): events complete when recorded.
std::chrono::milliseconds event_lag() {
  static const std::chrono::milliseconds lag = [] {
    const char* v = std::getenv("VLAKE_SIM_EVENT_LAG_MS");
    if (v == nullptr || *v == '\0') return std::chrono::milliseconds(0);
    char* end = nullptr;
    const long ms = std::strtol(v, &end, 10);
    return *end == '\0' && ms > 0 ? std::chrono::milliseconds(ms) : std::chrono::milliseconds(0);
  }();
  return lag;
}

// The completion time of the latest event recorded in this process (steady clock, ns).
std::atomic<std::int64_t> g_events_done_ns{0};

std::int64_t ns_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Waits until every event recorded so far is complete (lag only).
void wait_recorded_events() {
  if (event_lag().count() == 0) return;
  const std::int64_t done = g_events_done_ns.load(std::memory_order_acquire);
  const std::int64_t now = ns_of(std::chrono::steady_clock::now());
  if (done > now) std::this_thread::sleep_for(std::chrono::nanoseconds(done - now));
}

bool recorded_events_pending() {
  return event_lag().count() != 0 &&
         g_events_done_ns.load(std::memory_order_acquire) > ns_of(std::chrono::steady_clock::now());
}

}  // namespace

VLAKE_SIM_API CUresult cuCtxSynchronize() {
  VLAKE_SIM_COUNT(cuCtxSynchronize);
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  wait_recorded_events();
  vlake::sim::pools::synchronized();
  return CUDA_SUCCESS;
}

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
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    {
      std::shared_lock lock(g_proc->mu);
      if (!valid_stream(hStream)) return rules::kBadStreamOrEvent;
    }
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
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    {
      std::shared_lock lock(g_proc->mu);
      if (!valid_stream(hStream)) return rules::kBadStreamOrEvent;
    }
    if (dptr == 0) return CUDA_SUCCESS;  // measured
    if (CUresult rc = CUDA_SUCCESS; vlake::sim::pools::free_async(dptr, hStream, true, rc)) return rc;
    return free_classic(as_addr(dptr), rules::kFreeAsyncUnknown);
  });
}

}  // namespace

VLAKE_SIM_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  VLAKE_SIM_COUNT(cuMemAlloc_v2);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_classic(ctx, bytesize, ClassicKind::plain, dptr);
  });
}

VLAKE_SIM_API CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                          unsigned int ElementSizeBytes) {
  VLAKE_SIM_COUNT(cuMemAllocPitch_v2);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (CUresult rc = CUDA_SUCCESS; vlake::sim::pools::free_async(dptr, nullptr, false, rc)) return rc;
    return free_classic(as_addr(dptr), rules::kFreeUnknown);
  });
}

VLAKE_SIM_API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  VLAKE_SIM_COUNT(cuMemGetInfo_v2);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t used = 0;
    std::uint64_t cap = 0;
    g_proc->node->usage(ctx->device, used, cap);
    *total = static_cast<size_t>(cap);
    *free = static_cast<size_t>(used >= cap ? 0 : cap - used);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  VLAKE_SIM_COUNT(cuMemGetAddressRange_v2);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (pdptr == nullptr || (Flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return rules::kIpcBadHandle;
  });
}

VLAKE_SIM_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  VLAKE_SIM_COUNT(cuIpcCloseMemHandle);
  (void)dptr;
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    return rules::kIpcBadHandle;
  });
}

VLAKE_SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyHtoD_v2);
  return guarded([&] {
    return copy_checked(as_addr(dstDevice), true, reinterpret_cast<std::uintptr_t>(srcHost), false, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoH_v2);
  return guarded([&] {
    return copy_checked(reinterpret_cast<std::uintptr_t>(dstHost), false, as_addr(srcDevice), true, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoD_v2);
  return guarded([&] { return copy_checked(as_addr(dstDevice), true, as_addr(srcDevice), true, ByteCount); });
}

VLAKE_SIM_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                            CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyHtoDAsync_v2);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return copy_checked(as_addr(dstDevice), true, reinterpret_cast<std::uintptr_t>(srcHost), false, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoHAsync_v2);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return copy_checked(reinterpret_cast<std::uintptr_t>(dstHost), false, as_addr(srcDevice), true, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                            CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoDAsync_v2);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return copy_checked(as_addr(dstDevice), true, as_addr(srcDevice), true, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD8_v2);
  return guarded([&] { return memset_checked(as_addr(dstDevice), 1, uc, N); });
}

VLAKE_SIM_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD32_v2);
  return guarded([&] { return memset_checked(as_addr(dstDevice), 4, ui, N); });
}

VLAKE_SIM_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD8Async);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return memset_checked(as_addr(dstDevice), 1, uc, N);
  });
}

VLAKE_SIM_API CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD32Async);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return memset_checked(as_addr(dstDevice), 4, ui, N);
  });
}

VLAKE_SIM_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  VLAKE_SIM_COUNT(cuPointerGetAttribute);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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

// =================================================================================================
// Streams and events (synchronous: every operation has completed when its call returns)
// =================================================================================================

VLAKE_SIM_API CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuStreamCreate);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (phStream == nullptr || (Flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto s = std::make_unique<CUstream_st>();
    s->ctx = ctx;
    s->flags = Flags;
    std::unique_lock lock(g_proc->mu);
    g_proc->streams.insert(s.get());
    *phStream = s.release();
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuStreamDestroy_v2(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamDestroy_v2);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    std::unique_lock lock(g_proc->mu);
    if (g_proc->streams.erase(hStream) == 0) return rules::kBadStreamOrEvent;
    delete hStream;
    return CUDA_SUCCESS;
  });
}

namespace {

CUresult stream_sync(CUstream hStream, bool query) {
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    {
      std::shared_lock lock(g_proc->mu);
      if (!valid_stream(hStream)) return rules::kBadStreamOrEvent;
    }
    if (vlake::sim::pools::capturing(hStream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (query && recorded_events_pending()) return CUDA_ERROR_NOT_READY;
    wait_recorded_events();
    vlake::sim::pools::synchronized();
    return CUDA_SUCCESS;
  });
}
}  // namespace

VLAKE_SIM_API CUresult cuStreamSynchronize(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamSynchronize);
  return stream_sync(hStream, false);
}

VLAKE_SIM_API CUresult cuStreamQuery(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamQuery);
  return stream_sync(hStream, true);
}

VLAKE_SIM_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuStreamWaitEvent);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if ((Flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::shared_lock lock(g_proc->mu);
    if (!valid_stream(hStream) || g_proc->events.count(hEvent) == 0) {
      return rules::kBadStreamOrEvent;
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuEventCreate);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    const unsigned allowed = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == nullptr || (Flags & ~allowed) != 0) return CUDA_ERROR_INVALID_VALUE;
    auto e = std::make_unique<CUevent_st>();
    e->ctx = ctx;
    e->flags = Flags;
    std::unique_lock lock(g_proc->mu);
    g_proc->events.insert(e.get());
    *phEvent = e.release();
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  VLAKE_SIM_COUNT(cuEventRecord);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    std::unique_lock lock(g_proc->mu);
    if (g_proc->events.count(hEvent) == 0 || !valid_stream(hStream)) {
      return rules::kBadStreamOrEvent;
    }
    hEvent->recorded = true;
    hEvent->when = std::chrono::steady_clock::now();
    hEvent->done = hEvent->when + event_lag();
    if (event_lag().count() != 0) {
      const std::int64_t done = ns_of(hEvent->done);
      std::int64_t prev = g_events_done_ns.load(std::memory_order_acquire);
      while (prev < done && !g_events_done_ns.compare_exchange_weak(prev, done, std::memory_order_acq_rel)) {
      }
    }
    return CUDA_SUCCESS;
  });
}

namespace {
// CUDA_SUCCESS, CUDA_ERROR_NOT_READY (VLAKE_SIM_EVENT_LAG_MS: recorded, not complete yet; `done`
// says when it will be) or an invalid handle.
CUresult event_query(CUevent hEvent, std::chrono::steady_clock::time_point* done = nullptr) {
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    std::shared_lock lock(g_proc->mu);
    if (g_proc->events.count(hEvent) == 0) return rules::kBadStreamOrEvent;
    if (hEvent->recorded && hEvent->done > std::chrono::steady_clock::now()) {
      if (done != nullptr) *done = hEvent->done;
      return CUDA_ERROR_NOT_READY;
    }
    return CUDA_SUCCESS;
  });
}
}  // namespace

VLAKE_SIM_API CUresult cuEventQuery(CUevent hEvent) {
  VLAKE_SIM_COUNT(cuEventQuery);
  return event_query(hEvent);
}

VLAKE_SIM_API CUresult cuEventSynchronize(CUevent hEvent) {
  VLAKE_SIM_COUNT(cuEventSynchronize);
  std::chrono::steady_clock::time_point done{};
  CUresult rc = event_query(hEvent, &done);
  if (rc == CUDA_ERROR_NOT_READY) {
    std::this_thread::sleep_until(done);
    rc = CUDA_SUCCESS;
  }
  if (rc == CUDA_SUCCESS) vlake::sim::pools::synchronized();
  return rc;
}

VLAKE_SIM_API CUresult cuEventDestroy_v2(CUevent hEvent) {
  VLAKE_SIM_COUNT(cuEventDestroy_v2);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    std::unique_lock lock(g_proc->mu);
    if (g_proc->events.erase(hEvent) == 0) return rules::kBadStreamOrEvent;
    delete hEvent;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  VLAKE_SIM_COUNT(cuEventElapsedTime_v2);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_proc->mu);
    if (g_proc->events.count(hStart) == 0 || g_proc->events.count(hEnd) == 0) {
      return rules::kBadStreamOrEvent;
    }
    if (!hStart->recorded || !hEnd->recorded || ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING) != 0) {
      return rules::kElapsedUnrecorded;
    }
    *pMilliseconds = std::chrono::duration<float, std::milli>(hEnd->when - hStart->when).count();
    return CUDA_SUCCESS;
  });
}

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
  if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return rc;
  *granularity = kGran;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                   unsigned long long flags) {
  VLAKE_SIM_COUNT(cuMemCreate);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return rc;
    if (size == 0 || size % kGran != 0) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_proc->mu);
    Phys* p = nullptr;
    if (CUresult rc = new_phys(size, prop->location.id, static_cast<unsigned>(prop->requestedHandleTypes), false, p);
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    std::unique_lock lock(g_proc->mu);
    std::vector<std::map<std::uintptr_t, Mapping>::iterator> whole;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
    std::vector<std::map<std::uintptr_t, Mapping>::iterator> whole;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      return rules::kUnsupportedHandleType;
    }
    const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) return rules::kImportNotAnAllocation;
    int device = 0;
    unsigned types = 0;
    if (!parse_memfd(fd, device, types) || !valid_device(device) || st.st_size <= 0 ||
        static_cast<std::size_t>(st.st_size) % kGran != 0) {
      return rules::kImportNotAnAllocation;
    }
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
    auto p = std::make_unique<Phys>();
    p->fd = own;
    p->dev = st.st_dev;
    p->ino = st.st_ino;
    p->size = size;
    p->device = device;
    p->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->prop.location.id = device;
    p->prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(types);
    p->block_id = g_proc->next_id++;
    Phys* raw = p.get();
    g_proc->phys.emplace(std::make_pair(raw->dev, raw->ino), std::move(p));
    *handle = add_handle_ref(raw);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  VLAKE_SIM_COUNT(cuMemRetainAllocationHandle);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_proc->mu);
    Phys* p = find_handle(handle);
    if (p == nullptr) return rules::kUnknownHandle;
    *prop = p->prop;
    return CUDA_SUCCESS;
  });
}

// =================================================================================================
// Modules and kernels: PTX is not compiled; the simulator runs the kernels it knows by entry
// name on the host, synchronously, with the access checks of a GPU (a fault is sticky).
// =================================================================================================

namespace {

constexpr const char* kKnownKernels[] = {
    // vlake_fill_u32(unsigned* p, unsigned long long n, unsigned v): p[0..n) = v
    "vlake_fill_u32",
    // vlake_hash_u64(const u64* p, u64 n, u64* partials): lane t of the grid's threads folds
    // p[t], p[t + threads], ... into partials[t] (vlake/common/chunk_hash.hpp)
    "vlake_hash_u64",
};

bool known_kernel(const std::string& name) {
  for (const char* k : kKnownKernels) {
    if (name == k) return true;
  }
  return false;
}

// Executes `f` with its parameters; a bad access poisons the context (reported by the next
// synchronizing call, as on a GPU) and leaves memory untouched.
void run_kernel(CUctx_st* ctx, const CUfunc_st* f, void** params, std::uint64_t threads) {
  if (f->name == "vlake_hash_u64") {
    CUdeviceptr p = 0;
    unsigned long long n = 0;
    CUdeviceptr out = 0;
    std::memcpy(&p, params[0], sizeof p);
    std::memcpy(&n, params[1], sizeof n);
    std::memcpy(&out, params[2], sizeof out);
    if (threads > SIZE_MAX / 8 || as_addr(out) % 8 != 0 ||
        !accessible(as_addr(out), static_cast<std::size_t>(threads) * 8, ctx->device, true, ctx) ||
        (n != 0 && (n > SIZE_MAX / 8 || as_addr(p) % 8 != 0 ||
                    !accessible(as_addr(p), static_cast<std::size_t>(n) * 8, ctx->device, false, ctx)))) {
      ctx->sticky.store(rules::kIllegalAccess);
      return;
    }
    const auto* words = static_cast<const std::uint64_t*>(as_ptr(as_addr(p)));
    std::vector<std::uint64_t> acc(static_cast<std::size_t>(threads));
    for (std::size_t t = 0; t < acc.size(); ++t) acc[t] = vlake::chunk_hash_seed(t);
    for (std::uint64_t i = 0; i < n; ++i) {
      auto& a = acc[static_cast<std::size_t>(i % threads)];
      a = vlake::chunk_hash_step(a, words[i]);
    }
    std::memcpy(as_ptr(as_addr(out)), acc.data(), acc.size() * 8);
    return;
  }
  if (f->name == "vlake_fill_u32") {
    CUdeviceptr p = 0;
    unsigned long long n = 0;
    unsigned v = 0;
    std::memcpy(&p, params[0], sizeof p);
    std::memcpy(&n, params[1], sizeof n);
    std::memcpy(&v, params[2], sizeof v);
    if (n == 0) return;
    if (n > SIZE_MAX / 4 || as_addr(p) % 4 != 0 ||
        !accessible(as_addr(p), static_cast<std::size_t>(n) * 4, ctx->device, true, ctx)) {
      ctx->sticky.store(rules::kIllegalAccess);
      return;
    }
    auto* words = static_cast<std::uint32_t*>(as_ptr(as_addr(p)));
    std::fill(words, words + n, v);
  }
}

}  // namespace

VLAKE_SIM_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  VLAKE_SIM_COUNT(cuModuleLoadData);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::string_view text(static_cast<const char*>(image));
    auto mod = std::make_unique<CUmod_st>();
    for (std::size_t pos = text.find(".entry"); pos != std::string_view::npos; pos = text.find(".entry", pos + 6)) {
      std::size_t b = pos + 6;
      while (b < text.size() && (text[b] == ' ' || text[b] == '\t')) ++b;
      std::size_t e = b;
      while (e < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[e])) != 0 || text[e] == '_' || text[e] == '$')) {
        ++e;
      }
      if (e > b) mod->entries.emplace_back(text.substr(b, e - b));
    }
    if (mod->entries.empty()) return rules::kBadImage;
    std::unique_lock lock(g_proc->mu);
    g_proc->modules.insert(mod.get());
    *module = mod.release();
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuModuleUnload(CUmodule hmod) {
  VLAKE_SIM_COUNT(cuModuleUnload);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    std::unique_lock lock(g_proc->mu);
    if (g_proc->modules.erase(hmod) == 0) return rules::kBadModuleOrFunction;
    delete hmod;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  VLAKE_SIM_COUNT(cuModuleGetFunction);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_proc->mu);
    if (g_proc->modules.count(hmod) == 0) return rules::kBadModuleOrFunction;
    const std::string wanted(name);
    if (std::find(hmod->entries.begin(), hmod->entries.end(), wanted) == hmod->entries.end() || !known_kernel(wanted)) {
      return rules::kNoSuchFunction;
    }
    for (const auto& f : hmod->functions) {
      if (f->name == wanted) {
        *hfunc = f.get();
        return CUDA_SUCCESS;
      }
    }
    auto f = std::make_unique<CUfunc_st>();
    f->module = hmod;
    f->name = wanted;
    *hfunc = f.get();
    hmod->functions.push_back(std::move(f));
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                      unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                      unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                                      void** extra) {
  VLAKE_SIM_COUNT(cuLaunchKernel);
  return guarded([&]() -> CUresult {
    CUctx_st* ctx = nullptr;
    if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
    (void)sharedMemBytes;
    if (gridDimX == 0 || gridDimY == 0 || gridDimZ == 0 || blockDimX == 0 || blockDimY == 0 || blockDimZ == 0 ||
        std::uint64_t{blockDimX} * blockDimY * blockDimZ > 1024) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (kernelParams == nullptr || extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_proc->mu);
    if (!valid_stream(hStream)) return rules::kBadStreamOrEvent;
    bool found = false;
    for (CUmod_st* m : g_proc->modules) {
      for (const auto& fn : m->functions) found = found || fn.get() == f;
    }
    if (!found) return rules::kBadModuleOrFunction;
    run_kernel(ctx, f, kernelParams, std::uint64_t{gridDimX} * gridDimY * gridDimZ * blockDimX * blockDimY * blockDimZ);
    return CUDA_SUCCESS;
  });
}

// =================================================================================================
// Per-thread-default-stream variants (VLAKE_SIM_PER_THREAD_ROWS): the legacy functions, since
// every simulated stream is synchronous; distinct symbols so cuGetProcAddress can answer with
// them like the real driver.
// =================================================================================================

VLAKE_SIM_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyHtoD_v2_ptds);
  return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoH_v2_ptds);
  return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoD_v2_ptds);
  return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                                 CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyHtoDAsync_v2_ptsz);
  return cuMemcpyHtoDAsync_v2(dstDevice, srcHost, ByteCount, hStream);
}

VLAKE_SIM_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                                 CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoHAsync_v2_ptsz);
  return cuMemcpyDtoHAsync_v2(dstHost, srcDevice, ByteCount, hStream);
}

VLAKE_SIM_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                                 CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoDAsync_v2_ptsz);
  return cuMemcpyDtoDAsync_v2(dstDevice, srcDevice, ByteCount, hStream);
}

VLAKE_SIM_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD8_v2_ptds);
  return cuMemsetD8_v2(dstDevice, uc, N);
}

VLAKE_SIM_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD32_v2_ptds);
  return cuMemsetD32_v2(dstDevice, ui, N);
}

VLAKE_SIM_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD8Async_ptsz);
  return cuMemsetD8Async(dstDevice, uc, N, hStream);
}

VLAKE_SIM_API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD32Async_ptsz);
  return cuMemsetD32Async(dstDevice, ui, N, hStream);
}

VLAKE_SIM_API CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamSynchronize_ptsz);
  return cuStreamSynchronize(hStream);
}

VLAKE_SIM_API CUresult cuStreamQuery_ptsz(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamQuery_ptsz);
  return cuStreamQuery(hStream);
}

VLAKE_SIM_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuStreamWaitEvent_ptsz);
  return cuStreamWaitEvent(hStream, hEvent, Flags);
}

VLAKE_SIM_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  VLAKE_SIM_COUNT(cuEventRecord_ptsz);
  return cuEventRecord(hEvent, hStream);
}

VLAKE_SIM_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                           unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                           void** kernelParams, void** extra) {
  VLAKE_SIM_COUNT(cuLaunchKernel_ptsz);
  return cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                        kernelParams, extra);
}

// =================================================================================================
// =================================================================================================
// Process checkpoints (node.hpp; docs/simulator.md "Checkpoints")
// =================================================================================================

VLAKE_SIM_API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  VLAKE_SIM_COUNT(cuCheckpointProcessGetRestoreThreadId);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (tid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUprocessState st{};
    if (CUresult rc = g_proc->node->process_state(pid, st); rc != CUDA_SUCCESS) return rc;
    *tid = pid;  // the simulator restores from the calling process: no thread of the target
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  VLAKE_SIM_COUNT(cuCheckpointProcessGetState);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return g_proc->node->process_state(pid, *state);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessLock);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    (void)args;  // no submitted work to wait for: a timeout never expires
    return g_proc->node->lock_process(pid);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessCheckpoint);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    (void)args;
    return g_proc->node->checkpoint_process(pid);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessRestore);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    if (args != nullptr && args->gpuPairs != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // no GPU remapping
    return g_proc->node->restore_process(pid);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessUnlock);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
    (void)args;
    return g_proc->node->unlock_process(pid);
  });
}

// Call counters (call_counts.hpp, docs/simulator.md "Call counters"): not part of the CUDA API.
// =================================================================================================

// ---- What driver_pools.cpp uses (driver_internal.hpp) ------------------------------------------

namespace vlake::sim::internal {

CUresult context(CUctx_st*& ctx) { return check_ctx(ctx); }
CUresult initialized() { return check_init(); }
int device_count() { return g_proc->device_count; }
CUctx_st* device_context(int device) { return &g_proc->ctxs[device]; }
CUmemoryPool default_pool(int device) { return &g_proc->pools[device]; }

bool stream_ok(CUstream s) {
  std::shared_lock lock(g_proc->mu);
  return valid_stream(s);
}

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

std::uintptr_t address_range(std::size_t bytes) { return reserve_va(bytes, kGran); }

}  // namespace vlake::sim::internal

extern "C" __attribute__((visibility("default"))) unsigned long long vlake_sim_call_count(const char* entry) noexcept {
  return vlake::sim::calls::count_of(entry);
}

extern "C" __attribute__((visibility("default"))) unsigned long long vlake_sim_vmm_call_count() noexcept {
  return vlake::sim::calls::vmm_total();
}

// The thread holding the lock of the node VLAKE_SIM_NODE names (default "default") now, 0 if
// none (node.hpp, node_lock_owner). Needs no cuInit. Not part of the CUDA API.
extern "C" __attribute__((visibility("default"))) int vlake_sim_node_lock_owner() noexcept {
  try {
    const char* n = std::getenv("VLAKE_SIM_NODE");
    return vlake::sim::node_lock_owner(n != nullptr ? n : "default");
  } catch (...) {
    return 0;
  }
}

// The file this process keeps open while it uses the simulated GPUs (node.hpp), named for
// vlake::Driver::device_files(); "" before cuInit succeeded. Not part of the CUDA API.
extern "C" __attribute__((visibility("default"))) const char* vlake_sim_device_file() noexcept {
  if (g_proc == nullptr) return "";
  static const std::string file = vlake::sim::device_file(g_proc->node_name);  // g_proc never changes
  return file.c_str();
}
