// The simulated driver's stream-ordered memory pools, stream capture and graph memory
// (docs/simulator.md, "Pools and graphs").
//
// Model
// - A pool (cuMemPoolCreate, or a device's default pool) holds chunks: one per allocation, its
//   size rounded up to 2 MiB, charged to the node (cuMemAllocAsync-like memory). A freed chunk
//   stays reserved (reused by a later allocation of the same rounded size) until a stream, event
//   or context synchronization finds the pool holding more than its release threshold, or
//   cuMemPoolTrimTo, or cuMemPoolDestroy. Frees are immediate (the simulator runs no work).
// - Stream capture records graph nodes: cuMemAllocAsync / cuMemAllocFromPoolAsync on a
//   capturing stream add an allocation node (its address fixed at once, as the driver's),
//   cuMemFreeAsync a free node.
// - Graph memory: one pool per device. Launch or upload of an exec reserves the peak of its
//   allocations (plus graph allocations still live) as physical memory charged to the node;
//   the reservation stays until cuDeviceGraphMemTrim (down to what live allocations need).
//   Graph allocation addresses are PROT_NONE VA: the simulator does not back them with pages.
#include "vlake/common/cuda_api.hpp"  // first: the legacy (pre-3.2) declarations too

#include "driver_internal.hpp"
#include "process.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <vector>

#define VLAKE_SIM_API extern "C" __attribute__((visibility("default")))

namespace internal = vlake::sim::internal;

struct CUgraphNode_st {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};  // allocation nodes (dptr set at creation)
  CUdeviceptr freed = 0;               // free nodes
};

struct CUgraph_st {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;
};

struct CUgraphExec_st {
  int device = 0;
  bool auto_free = false;        // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
  CUgraph_st* source = nullptr;  // its graph, while it has memory nodes
  std::vector<std::pair<CUdeviceptr, std::size_t>> allocs;
  std::vector<CUdeviceptr> frees;
};

namespace {

constexpr std::size_t kGran = vlake::sim::rules::kGranularity;

std::size_t round_up(std::size_t v) { return (v + kGran - 1) / kGran * kGran; }

using vlake::sim::internal::guarded;
using vlake::sim::internal::in_context;

struct Pool {
  int device = 0;
  bool is_default = false;
  bool destroyed = false;  // destroyed with allocations outstanding: freed as they come back
  std::uint64_t threshold = 0;
  std::map<CUdeviceptr, std::size_t> used;              // live allocations -> chunk size
  std::multimap<std::size_t, CUdeviceptr> free_chunks;  // chunk size -> address
  std::uint64_t reserved_high = 0;
  std::uint64_t used_high = 0;

  [[nodiscard]] std::uint64_t used_bytes() const {
    std::uint64_t n = 0;
    for (const auto& [p, size] : used) n += size;
    return n;
  }
  [[nodiscard]] std::uint64_t reserved() const {
    std::uint64_t n = used_bytes();
    for (const auto& [size, p] : free_chunks) n += size;
    return n;
  }
};

struct GraphPool {
  std::vector<std::pair<std::uint64_t, std::size_t>> chunks;  // physical id, bytes
  std::map<CUdeviceptr, std::size_t> live;                    // graph allocations not freed
  std::uint64_t reserved_high = 0;
  std::uint64_t used_high = 0;
  [[nodiscard]] std::uint64_t reserved() const {
    std::uint64_t n = 0;
    for (const auto& c : chunks) n += c.second;
    return n;
  }
  [[nodiscard]] std::uint64_t used() const {
    std::uint64_t n = 0;
    for (const auto& [p, size] : live) n += size;
    return n;
  }
};

struct State {
  std::mutex mu;  // taken before the process's mu (driver_internal calls take that one)
  std::map<CUmemoryPool, std::unique_ptr<Pool>> pools;
  std::map<CUdeviceptr, CUmemoryPool> owner;  // pool allocation -> its pool
  CUmemoryPool current[vlake::sim::rules::kMaxDevices] = {};
  std::map<CUstream, CUgraph_st*> captures;
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
  std::map<CUdeviceptr, std::pair<int, std::size_t>> graph_addrs;  // alloc node address -> device, size
  GraphPool graph[vlake::sim::rules::kMaxDevices];
};

State& st() {
  static State* s = new State;  // never destroyed: entry points may run during exit
  return *s;
}

bool valid_device(int dev) { return dev >= 0 && dev < internal::device_count(); }

// The pool for `h` (default pools are created on first use). Caller holds st().mu.
Pool* find_pool(CUmemoryPool h) {
  State& s = st();
  if (auto it = s.pools.find(h); it != s.pools.end()) return it->second->destroyed ? nullptr : it->second.get();
  for (int d = 0; d < internal::device_count(); ++d) {
    if (h == internal::default_pool(d)) {
      auto p = std::make_unique<Pool>();
      p->device = d;
      p->is_default = true;
      Pool* raw = p.get();
      s.pools.emplace(h, std::move(p));
      return raw;
    }
  }
  return nullptr;
}

// The body of a call on a known pool: initialized, under the pools' lock, f(pool); an unknown
// pool is CUDA_ERROR_INVALID_VALUE.
template <class F>
CUresult on_pool(CUmemoryPool h, F&& f) {
  return internal::initialized([&]() -> CUresult {
    std::lock_guard lock(st().mu);
    Pool* p = find_pool(h);
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return f(*p);
  });
}

CUmemoryPool default_pool(int dev) { return internal::default_pool(dev); }

void note_highs(Pool& p) {
  p.reserved_high = std::max(p.reserved_high, p.reserved());
  p.used_high = std::max(p.used_high, p.used_bytes());
}

// Releases free chunks (largest first) while the pool holds more than `keep`.
void release_above(Pool& p, std::uint64_t keep) {
  std::uint64_t reserved = p.reserved();
  for (auto it = p.free_chunks.rbegin(); it != p.free_chunks.rend() && reserved > keep;) {
    reserved -= it->first;
    internal::device_free(it->second);
    it = decltype(it)(p.free_chunks.erase(std::next(it).base()));
  }
}

CUresult pool_alloc(CUdeviceptr* dptr, std::size_t bytes, CUmemoryPool h, CUstream stream) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = internal::context(ctx); rc != CUDA_SUCCESS) return rc;
  if (dptr == nullptr || h == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!internal::stream_ok(stream)) return CUDA_ERROR_INVALID_HANDLE;
  State& s = st();
  std::unique_lock lock(s.mu);
  Pool* p = find_pool(h);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0) {
    *dptr = 0;
    return CUDA_SUCCESS;
  }
  if (bytes > SIZE_MAX - kGran) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t size = round_up(bytes);
  if (s.captures.count(stream) != 0) {
    lock.unlock();
    CUresult rc = CUDA_SUCCESS;
    vlake::sim::pools::alloc_captured(dptr, bytes, stream, p->device, rc);
    return rc;
  }
  CUdeviceptr out = 0;
  if (auto it = p->free_chunks.find(size); it != p->free_chunks.end()) {
    out = it->second;
    p->free_chunks.erase(it);
  } else if (CUresult rc = internal::device_alloc(internal::device_context(p->device), size, &out);
             rc != CUDA_SUCCESS) {
    return rc;
  }
  p->used[out] = size;
  s.owner[out] = h;
  note_highs(*p);
  *dptr = out;
  return CUDA_SUCCESS;
}

// Reserves graph memory on `dev` for `peak` bytes of simultaneous graph allocations.
CUresult graph_reserve(int dev, std::uint64_t peak) {
  GraphPool& g = st().graph[dev];
  const std::uint64_t have = g.reserved();
  if (peak <= have) return CUDA_SUCCESS;
  const std::size_t add = round_up(static_cast<std::size_t>(peak - have));
  std::uint64_t id = 0;
  if (CUresult rc = internal::physical_alloc(add, dev, id); rc != CUDA_SUCCESS) return rc;
  g.chunks.emplace_back(id, add);
  g.reserved_high = std::max(g.reserved_high, g.reserved());
  return CUDA_SUCCESS;
}

// The peak of graph allocations on the exec's device while it runs.
std::uint64_t exec_peak(const CUgraphExec_st& e) {
  const GraphPool& g = st().graph[e.device];
  std::uint64_t live = g.used();
  for (const auto& a : e.allocs) live += g.live.count(a.first) != 0 ? 0 : a.second;
  return live;
}

// Destroys a graph or an executable graph registered in `live` (st().graphs or st().execs); a
// null or unknown one is CUDA_ERROR_INVALID_VALUE.
template <class Set>
CUresult destroy_registered(Set& live, typename Set::key_type h) {
  return internal::initialized([&]() -> CUresult {
    std::lock_guard lock(st().mu);
    if (h == nullptr || live.erase(h) == 0) return CUDA_ERROR_INVALID_VALUE;
    delete h;
    return CUDA_SUCCESS;
  });
}

CUresult launch_or_upload(CUgraphExec e, CUstream stream, bool launch) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = internal::context(ctx); rc != CUDA_SUCCESS) return rc;
  if (!internal::stream_ok(stream)) return CUDA_ERROR_INVALID_HANDLE;
  State& s = st();
  std::lock_guard lock(s.mu);
  if (e == nullptr || s.execs.count(e) == 0) return CUDA_ERROR_INVALID_VALUE;
  GraphPool& g = s.graph[e->device];
  if (launch && e->auto_free) {
    for (const auto& a : e->allocs) g.live.erase(a.first);  // its previous allocations
  }
  if (launch) {
    for (const auto& a : e->allocs) {
      if (g.live.count(a.first) != 0) return CUDA_ERROR_INVALID_VALUE;  // its allocation is still live
    }
  }
  if (CUresult rc = graph_reserve(e->device, exec_peak(*e)); rc != CUDA_SUCCESS) return rc;
  if (!launch) return CUDA_SUCCESS;
  for (const auto& a : e->allocs) g.live[a.first] = a.second;
  g.used_high = std::max(g.used_high, g.used());
  for (CUdeviceptr f : e->frees) g.live.erase(f);
  return CUDA_SUCCESS;
}

CUresult instantiate(CUgraphExec* out, CUgraph graph, unsigned long long flags) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  CUctx_st* ctx = nullptr;
  if (CUresult rc = internal::context(ctx); rc != CUDA_SUCCESS) return rc;
  State& s = st();
  std::lock_guard lock(s.mu);
  if (out == nullptr || graph == nullptr || s.graphs.count(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<CUgraphExec_st>();
  e->device = ctx->device;
  const bool memory_nodes = std::any_of(graph->nodes.begin(), graph->nodes.end(), [](const auto& n) {
    return n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->type == CU_GRAPH_NODE_TYPE_MEM_FREE;
  });
  if (memory_nodes) {
    // cuda.h: at most one executable graph at a time for a graph with memory nodes (the
    // error code is not documented: guessed).
    for (CUgraphExec_st* other : s.execs) {
      if (other->source == graph) return CUDA_ERROR_INVALID_VALUE;
    }
    e->source = graph;
  }
  e->auto_free = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
  for (const auto& n : graph->nodes) {
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      e->device = n->alloc.poolProps.location.id;
      e->allocs.emplace_back(n->alloc.dptr, round_up(n->alloc.bytesize));
    } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
      e->frees.push_back(n->freed);
    }
  }
  s.execs.insert(e.get());
  *out = e.release();
  return CUDA_SUCCESS;
}

// A new allocation node of `graph`. Caller holds st().mu.
CUresult add_alloc_node(CUgraph graph, CUDA_MEM_ALLOC_NODE_PARAMS& params, CUgraphNode* out) {
  const CUmemPoolProps& pp = params.poolProps;
  if (params.bytesize == 0 || pp.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      pp.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(pp.location.id)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::size_t size = round_up(params.bytesize);
  const std::uintptr_t va = internal::address_range(size);
  if (va == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  params.dptr = static_cast<CUdeviceptr>(va);
  auto n = std::make_unique<CUgraphNode_st>();
  n->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  n->alloc = params;
  n->alloc.accessDescs = nullptr;
  n->alloc.accessDescCount = 0;
  st().graph_addrs[params.dptr] = {pp.location.id, size};
  if (out != nullptr) *out = n.get();
  graph->nodes.push_back(std::move(n));
  return CUDA_SUCCESS;
}

CUresult add_free_node(CUgraph graph, CUdeviceptr p, CUgraphNode* out) {
  if (st().graph_addrs.count(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  auto n = std::make_unique<CUgraphNode_st>();
  n->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  n->freed = p;
  if (out != nullptr) *out = n.get();
  graph->nodes.push_back(std::move(n));
  return CUDA_SUCCESS;
}

bool legacy(CUstream s) {
  return s == nullptr || s == reinterpret_cast<CUstream>(std::uintptr_t{1}) ||
         s == reinterpret_cast<CUstream>(std::uintptr_t{2});
}

}  // namespace

// ---- Hooks called by driver_classic.cpp and driver_streams.cpp --------------------------------

namespace vlake::sim::pools {

bool free_async(CUdeviceptr p, CUstream stream, bool has_stream, CUresult& rc) {
  State& s = st();
  std::lock_guard lock(s.mu);
  if (has_stream) {
    if (auto c = s.captures.find(stream); c != s.captures.end()) {
      rc = add_free_node(c->second, p, nullptr);
      return true;
    }
  }
  if (auto it = s.owner.find(p); it != s.owner.end()) {
    Pool& pool = *s.pools.at(it->second);
    const std::size_t size = pool.used.at(p);
    pool.used.erase(p);
    s.owner.erase(it);
    if (pool.destroyed) {
      internal::device_free(p);
    } else {
      pool.free_chunks.emplace(size, p);
    }
    rc = CUDA_SUCCESS;
    return true;
  }
  if (auto g = s.graph_addrs.find(p); g != s.graph_addrs.end()) {
    rc = s.graph[g->second.first].live.erase(p) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  return false;
}

bool alloc_captured(CUdeviceptr* dptr, std::size_t bytes, CUstream stream, int device, CUresult& rc) {
  State& s = st();
  std::lock_guard lock(s.mu);
  auto c = s.captures.find(stream);
  if (c == s.captures.end()) return false;
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = device;
  params.bytesize = bytes;
  rc = add_alloc_node(c->second, params, nullptr);
  if (rc == CUDA_SUCCESS) *dptr = params.dptr;
  return true;
}

void synchronized() {
  State& s = st();
  std::lock_guard lock(s.mu);
  for (auto& [h, p] : s.pools) {
    if (!p->destroyed) release_above(*p, p->threshold);
  }
}

bool capturing(CUstream stream) {
  State& s = st();
  std::lock_guard lock(s.mu);
  return s.captures.count(stream) != 0;
}

}  // namespace vlake::sim::pools

// ---- The pre-3.2 cuMemAlloc ABI ---------------------------------------------------------------------
// The 64-bit driver refuses it with CUDA_ERROR_INVALID_CONTEXT even in a current context (measured
// on the H100, driver 580: tests/gpu/driver_facts.py); so does the simulator, after the usual checks.

VLAKE_SIM_API CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = internal::context(ctx); rc != CUDA_SUCCESS) return rc;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_INVALID_CONTEXT;
}

VLAKE_SIM_API CUresult cuMemFree(CUdeviceptr_v1 dptr) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = internal::context(ctx); rc != CUDA_SUCCESS) return rc;
  (void)dptr;
  return CUDA_ERROR_INVALID_VALUE;  // nothing was ever allocated through it
}

// ---- Memory pools -----------------------------------------------------------------------------------

VLAKE_SIM_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pool_out = default_pool(dev);
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(st().mu);
  *pool = st().current[dev] != nullptr ? st().current[dev] : default_pool(dev);
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  return guarded([&]() -> CUresult {
    std::lock_guard lock(st().mu);
    Pool* p = find_pool(pool);
    if (p == nullptr || p->device != dev) return CUDA_ERROR_INVALID_VALUE;
    st().current[dev] = pool;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  return internal::initialized([&]() -> CUresult {
    if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!valid_device(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    const auto types = static_cast<unsigned>(props->handleTypes);
    if (types != CU_MEM_HANDLE_TYPE_NONE && types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    auto p = std::make_unique<Pool>();
    p->device = props->location.id;
    auto h = reinterpret_cast<CUmemoryPool>(new CUmemPoolHandle_st{props->location.id});
    std::lock_guard lock(st().mu);
    st().pools.emplace(h, std::move(p));
    *pool = h;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  return on_pool(pool, [&](Pool& p) -> CUresult {
    if (p.is_default) return CUDA_ERROR_INVALID_VALUE;
    release_above(p, 0);
    // Outstanding allocations keep their memory until freed (cuda.h: released automatically).
    p.destroyed = true;
    for (auto& c : st().current) {
      if (c == pool) c = nullptr;
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  return on_pool(pool, [&](Pool& p) -> CUresult {
    release_above(p, minBytesToKeep);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return on_pool(pool, [&](Pool& p) -> CUresult {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto put64 = [value](std::uint64_t v) { *static_cast<cuuint64_t*>(value) = v; };
    switch (attr) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *static_cast<int*>(value) = 1; break;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: put64(p.threshold); break;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: put64(p.reserved()); break;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: put64(p.reserved_high); break;
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: put64(p.used_bytes()); break;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH: put64(p.used_high); break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return on_pool(pool, [&](Pool& p) -> CUresult {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const cuuint64_t v = *static_cast<cuuint64_t*>(value);
    switch (attr) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: break;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p.threshold = v; break;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:  // may only be reset to zero
        if (v != 0) return CUDA_ERROR_INVALID_VALUE;
        p.reserved_high = p.reserved();
        break;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (v != 0) return CUDA_ERROR_INVALID_VALUE;
        p.used_high = p.used_bytes();
        break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                               CUstream hStream) {
  return guarded([&] { return pool_alloc(dptr, bytesize, pool, hStream); });
}

VLAKE_SIM_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                    CUstream hStream) {
  return guarded([&] { return pool_alloc(dptr, bytesize, pool, hStream == nullptr ? CU_STREAM_PER_THREAD : hStream); });
}

// ---- Stream capture ---------------------------------------------------------------------------------

VLAKE_SIM_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return in_context([&](CUctx_st*) -> CUresult {
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!internal::stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
    if (legacy(hStream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    std::lock_guard lock(st().mu);
    if (st().captures.count(hStream) != 0) return CUDA_ERROR_ILLEGAL_STATE;
    auto g = std::make_unique<CUgraph_st>();
    st().graphs.insert(g.get());
    st().captures[hStream] = g.release();
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return in_context([&](CUctx_st*) -> CUresult {
    if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(st().mu);
    auto it = st().captures.find(hStream);
    if (it == st().captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = it->second;
    st().captures.erase(it);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return in_context([&](CUctx_st*) -> CUresult {
    if (captureStatus == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!internal::stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
    *captureStatus =
        vlake::sim::pools::capturing(hStream) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  });
}

// ---- Graphs -----------------------------------------------------------------------------------------

VLAKE_SIM_API CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  return internal::initialized([&]() -> CUresult {
    if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto g = std::make_unique<CUgraph_st>();
    std::lock_guard lock(st().mu);
    st().graphs.insert(g.get());
    *phGraph = g.release();
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuGraphDestroy(CUgraph hGraph) { return destroy_registered(st().graphs, hGraph); }

VLAKE_SIM_API CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*,
                                              size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  (void)numDependencies;  // the simulator runs no work: dependencies do not matter
  return internal::initialized([&]() -> CUresult {
    if (phGraphNode == nullptr || nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(st().mu);
    if (hGraph == nullptr || st().graphs.count(hGraph) == 0) return CUDA_ERROR_INVALID_VALUE;
    return add_alloc_node(hGraph, *nodeParams, phGraphNode);
  });
}

VLAKE_SIM_API CUresult cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode*,
                                             size_t numDependencies, CUdeviceptr dptr) {
  (void)numDependencies;
  return internal::initialized([&]() -> CUresult {
    if (phGraphNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(st().mu);
    if (hGraph == nullptr || st().graphs.count(hGraph) == 0) return CUDA_ERROR_INVALID_VALUE;
    return add_free_node(hGraph, dptr, phGraphNode);
  });
}

VLAKE_SIM_API CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  return internal::initialized([&]() -> CUresult {
    if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(st().mu);
    if (hGraph == nullptr || st().graphs.count(hGraph) == 0) return CUDA_ERROR_INVALID_VALUE;
    if (nodes == nullptr) {
      *numNodes = hGraph->nodes.size();
      return CUDA_SUCCESS;
    }
    const std::size_t n = std::min(*numNodes, hGraph->nodes.size());
    for (std::size_t i = 0; i < n; ++i) nodes[i] = hGraph->nodes[i].get();
    *numNodes = n;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  if (hNode == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = hNode->type;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS* params_out) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  if (hNode == nullptr || params_out == nullptr || hNode->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *params_out = hNode->alloc;
  return CUDA_SUCCESS;
}

// The CUDA 11 ABI (error node and log buffer): what CUDA 11 runtimes call.
VLAKE_SIM_API CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode,
                                             char* logBuffer, size_t bufferSize) {
  return guarded([&]() -> CUresult {
    if (phErrorNode != nullptr) *phErrorNode = nullptr;
    if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph, 0);
  });
}

VLAKE_SIM_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  return guarded([&]() -> CUresult {
    if (flags & ~static_cast<unsigned long long>(
                    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return instantiate(phGraphExec, hGraph, flags);
  });
}

namespace {
CUresult instantiate_with_params(CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return guarded([&]() -> CUresult {
    if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const cuuint64_t known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                             CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if ((params->flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
    params->hErrNode_out = nullptr;
    CUresult rc = instantiate(phGraphExec, hGraph, params->flags);
    if (rc == CUDA_SUCCESS && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0) {
      rc = launch_or_upload(*phGraphExec, params->hUploadStream, false);
      if (rc != CUDA_SUCCESS) {
        std::lock_guard lock(st().mu);
        st().execs.erase(*phGraphExec);
        delete *phGraphExec;
        *phGraphExec = nullptr;
      }
    }
    params->result_out = rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return rc;
  });
}
}  // namespace

VLAKE_SIM_API CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                    CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  return instantiate_with_params(phGraphExec, hGraph, instantiateParams);
}

VLAKE_SIM_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                         CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  return instantiate_with_params(phGraphExec, hGraph, instantiateParams);
}

VLAKE_SIM_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return guarded([&] { return launch_or_upload(hGraphExec, hStream, true); });
}

VLAKE_SIM_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return guarded([&] { return launch_or_upload(hGraphExec, hStream, true); });
}

VLAKE_SIM_API CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  return guarded([&] { return launch_or_upload(hGraphExec, hStream, false); });
}

VLAKE_SIM_API CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return guarded([&] { return launch_or_upload(hGraphExec, hStream, false); });
}

VLAKE_SIM_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { return destroy_registered(st().execs, hGraphExec); }

VLAKE_SIM_API CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(st().mu);
  const GraphPool& g = st().graph[device];
  cuuint64_t v = 0;
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: v = g.used(); break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: v = g.used_high; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: v = g.reserved(); break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: v = g.reserved_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  *static_cast<cuuint64_t*>(value) = v;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuDeviceGraphMemTrim(CUdevice device) {
  if (CUresult rc = internal::initialized(); rc != CUDA_SUCCESS) return rc;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  return guarded([&]() -> CUresult {
    std::lock_guard lock(st().mu);
    GraphPool& g = st().graph[device];
    const std::uint64_t need = g.used();
    std::uint64_t reserved = g.reserved();
    while (!g.chunks.empty() && reserved - g.chunks.back().second >= need) {
      reserved -= g.chunks.back().second;
      internal::physical_free(g.chunks.back().first);
      g.chunks.pop_back();
    }
    if (reserved > need && !g.chunks.empty()) {  // shrink the last chunk to what is live
      const std::uint64_t keep = reserved - g.chunks.back().second;
      internal::physical_free(g.chunks.back().first);
      g.chunks.pop_back();
      if (need > keep) {
        std::uint64_t id = 0;
        const std::size_t size = round_up(static_cast<std::size_t>(need - keep));
        if (internal::physical_alloc(size, device, id) == CUDA_SUCCESS) g.chunks.emplace_back(id, size);
      }
    }
    return CUDA_SUCCESS;
  });
}
