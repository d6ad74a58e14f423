// The simulated driver's process state and the helpers every entry point shares
// (driver_internal.hpp): initialization and context checks, host VA, physical allocations
// (memfds charged to the node), the mapping table and the access check of the copy engines.
// Implements no entry point.
#include "driver_internal.hpp"
#include "node.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <shared_mutex>
#include <thread>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using vlake::sim::Process;

namespace vlake::sim::internal {

// ---- Initialization state -------------------------------------------------------------------
std::atomic<int> g_init{0};
std::atomic<CUresult> g_init_error{CUDA_SUCCESS};
std::atomic<pid_t> g_init_pid{0};
std::mutex g_init_mu;
// Never destroyed: entry points may run during process exit from other threads.
Process* g_proc = nullptr;

CUresult check_init() {
  if (g_init.load(std::memory_order_acquire) != 1) return rules::kNotInitialized;
  if (::getpid() != g_init_pid.load(std::memory_order_relaxed)) return rules::kNotInitialized;
  g_proc->node->wait_while_locked();
  return CUDA_SUCCESS;
}

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

// memfd name: "vlake-sim:d<device>:t<requestedHandleTypes>" ("vlake-sim:host:t<types>" for
// host-located memory), so an importer can check that an fd is a simulator allocation and
// recover its location and handle types.
int create_memfd(std::size_t size, int device, unsigned handle_types) {
  char name[64];
  if (device == vlake::sim::kHostLocation) {
    std::snprintf(name, sizeof name, "vlake-sim:host:t%u", handle_types);
  } else {
    std::snprintf(name, sizeof name, "vlake-sim:d%d:t%u", device, handle_types);
  }
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
  if (std::sscanf(target, "/memfd:vlake-sim:host:t%u", &handle_types) == 1) {
    device = vlake::sim::kHostLocation;
    return true;
  }
  return std::sscanf(target, "/memfd:vlake-sim:d%d:t%u", &device, &handle_types) == 2;
}

Phys* add_phys(int fd, const struct stat& st, std::size_t size, int device) {
  auto p = std::make_unique<Phys>();
  p->fd = fd;
  p->dev = st.st_dev;
  p->ino = st.st_ino;
  p->size = size;
  p->device = device;
  p->block_id = g_proc->next_id++;
  Phys* raw = p.get();
  g_proc->phys.emplace(std::make_pair(raw->dev, raw->ino), std::move(p));
  return raw;
}

CUresult new_phys(std::size_t size, int device, unsigned handle_types, bool classic, Phys*& out) {
  int fd = create_memfd(size, device, handle_types);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st {};
  ::fstat(fd, &st);
  if (CUresult rc = g_proc->node->charge_new(st.st_dev, st.st_ino, size, device); rc != CUDA_SUCCESS) {
    ::close(fd);
    return rc;
  }
  out = add_phys(fd, st, size, device);
  out->classic = classic;
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
MappingIt mapping_at(std::uintptr_t addr) {
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
bool accessible(std::uintptr_t addr, std::size_t n, int device, bool write, const CUctx_st* kernel) {
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
                        std::vector<MappingIt>& out) {
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
CUresult mappings_inside(std::uintptr_t addr, std::size_t size, std::vector<MappingIt>& out) {
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

bool touches_host(std::uintptr_t addr, std::size_t n) {
  if (n == 0) return false;
  const std::uintptr_t end = add_overflows(addr, n) ? UINTPTR_MAX : addr + n;
  auto& maps = g_proc->mappings;
  auto it = maps.upper_bound(addr);
  if (it != maps.begin()) --it;
  for (; it != maps.end() && it->first < end; ++it) {
    if (it->first + it->second.size <= addr) continue;
    if (it->second.phys != nullptr && it->second.phys->device == vlake::sim::kHostLocation) return true;
  }
  return false;
}

void pace_link(std::chrono::steady_clock::time_point start, std::size_t bytes) {
  const std::uint64_t bandwidth = g_proc->link_bandwidth;
  if (bandwidth == 0 || bytes == 0) return;
  const double seconds = static_cast<double>(bytes) / static_cast<double>(bandwidth);
  std::this_thread::sleep_until(
      start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds)));
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

CUresult check_async_stream(CUstream s) {
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  std::shared_lock lock(g_proc->mu);
  return valid_stream(s) ? CUDA_SUCCESS : rules::kBadStreamOrEvent;
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
  // The context's streams and events go with it.
  auto destroy_owned = [ctx](auto& live) {
    for (auto it = live.begin(); it != live.end();) {
      if ((*it)->ctx == ctx) {
        delete *it;
        it = live.erase(it);
      } else {
        ++it;
      }
    }
  };
  destroy_owned(g_proc->streams);
  destroy_owned(g_proc->events);
  ctx->sticky.store(CUDA_SUCCESS);
}

}  // namespace vlake::sim::internal

namespace {

using namespace vlake::sim::internal;

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

// ---- Lent to driver_pools.cpp and driver_peer.cpp (driver_internal.hpp) -------------------------

namespace vlake::sim::internal {

Process* process() { return g_proc; }
CUctx_st* context_of(CUcontext c) { return ctx_of_handle(c); }
bool device_valid(CUdevice dev) { return valid_device(dev); }
bool reachable(std::uintptr_t addr, std::size_t n, int device, bool write) {
  return accessible(addr, n, device, write);
}
CUresult copy_refused(CUctx_st* ctx) { return refused(ctx); }
CUresult context(CUctx_st*& ctx) { return check_ctx(ctx); }
CUresult initialized() { return check_init(); }
int device_count() { return g_proc->device_count; }
CUctx_st* device_context(int device) { return &g_proc->ctxs[device]; }
CUmemoryPool default_pool(int device) { return &g_proc->pools[device]; }

bool stream_ok(CUstream s) {
  std::shared_lock lock(g_proc->mu);
  return valid_stream(s);
}

std::uintptr_t address_range(std::size_t bytes) { return reserve_va(bytes, kGran); }

}  // namespace vlake::sim::internal
