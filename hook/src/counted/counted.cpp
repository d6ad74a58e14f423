// The counted paths: device memory the driver allocates itself, charged to the tenant with
// counted grants (docs/hook.md, "What is covered"):
// - cuMemCreate with properties the node pool cannot serve (charged before the driver creates
//   it; released with the handle's last reference or mapping, as pool handles are);
// - stream-ordered memory pools: after an allocation the pool's reserved memory
//   (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) is compared with what is charged; growth is charged,
//   a refused growth gives the allocation back; frees, trims, destroys and synchronizations
//   re-read it and release what the pool gave back;
// - graph memory: instantiation refuses an exec whose allocation nodes cannot fit the tenant's
//   limit; launch and upload charge the device's graph memory growth before the launch and
//   settle on the exact reserved figure after it; cuDeviceGraphMemTrim releases.
#include "counted.hpp"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "hook.hpp"

namespace vlake::hook {
namespace {

constexpr std::size_t kDevices = proto::kMaxDevices;
constexpr int kMaxGraphDepth = 16;  // child-graph nesting walked at instantiation

struct PoolEntry {
  int device = 0;
  bool counted = true;     // a device pool (host pools hold no device memory)
  bool destroyed = false;  // destroyed with allocations outstanding
  std::size_t outstanding = 0;
  Ledger ledger;
};

using DeviceBytes = std::array<std::uint64_t, kDevices>;

struct Book {
  // charge_mu serializes the slow path (daemon round trips); mu guards the maps and ledgers and
  // is never held across a driver or daemon call. Lock order: charge_mu, mu, then the hook's.
  std::mutex charge_mu;
  std::mutex mu;
  std::unordered_map<CUmemoryPool, PoolEntry> pools;
  std::unordered_map<CUdeviceptr, CUmemoryPool> ptrs;  // live pool allocations
  struct Exec {
    DeviceBytes bytes{};     // its allocation nodes, per device
    bool auto_free = false;  // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
  };
  std::unordered_map<CUgraphExec, Exec> execs;  // execs with allocation nodes
  std::array<Ledger, kDevices> graph;           // per device: its graph memory
  std::atomic<bool> dirty{false};               // a pool allocation was freed
};

std::atomic<Book*> g_book{nullptr};

void fork_prepare() {
  Book* b = g_book.load(std::memory_order_acquire);
  if (b == nullptr) return;
  b->charge_mu.lock();
  b->mu.lock();
}

void fork_parent() {
  Book* b = g_book.load(std::memory_order_acquire);
  if (b == nullptr) return;
  b->mu.unlock();
  b->charge_mu.unlock();
}

// The child holds none of the parent's grants.
void fork_child() {
  Book* b = g_book.load(std::memory_order_acquire);
  if (b == nullptr) return;
  b->pools.clear();
  b->ptrs.clear();
  b->execs.clear();
  for (Ledger& l : b->graph) l.take_all();
  b->dirty.store(false);
  b->mu.unlock();
  b->charge_mu.unlock();
}

Book& book() {
  static Book* b = [] {
    auto* p = new Book;  // never destroyed: wrappers may run during exit
    g_book.store(p, std::memory_order_release);
    ::pthread_atfork(fork_prepare, fork_parent, fork_child);
    return p;
  }();
  return *b;
}

bool valid_device(int dev) { return dev >= 0 && static_cast<std::size_t>(dev) < kDevices; }

bool pool_reserved(CUmemoryPool pool, std::uint64_t& out) {
  const UsedApi& api = used();
  cuuint64_t v = 0;
  if (api.cuMemPoolGetAttribute == nullptr ||
      api.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) != CUDA_SUCCESS) {
    return false;
  }
  out = v;
  return true;
}

bool graph_attr(int dev, CUgraphMem_attribute attr, std::uint64_t& out) {
  const UsedApi& api = used();
  cuuint64_t v = 0;
  if (api.cuDeviceGetGraphMemAttribute == nullptr || api.cuDeviceGetGraphMemAttribute(dev, attr, &v) != CUDA_SUCCESS) {
    return false;
  }
  out = v;
  return true;
}

std::uint64_t slack(State& s) { return std::max<std::uint64_t>(1, s.policy.granularity()); }

// Brings `ledger` (of memory on `dev`) to `reserved` bytes. Caller holds charge_mu. False when
// a growth was refused (nothing was charged for it).
bool settle(State& s, Book& b, Ledger& ledger, int dev, std::uint64_t reserved) {
  Ledger::Plan plan;
  std::vector<std::uint64_t> release;
  {
    std::lock_guard lock(b.mu);
    plan = ledger.plan(reserved, slack(s));
    if (plan.consolidate) release = ledger.take_all();
  }
  for (std::uint64_t id : release) uncharge(s, id);
  if (plan.charge == 0) return true;
  const Charge c = charge_counted(s, dev, plan.charge);
  if (c.outcome == Charge::Outcome::refused) return false;
  if (c.outcome == Charge::Outcome::granted) {
    std::lock_guard lock(b.mu);
    ledger.add(c.grant_id, c.bytes);
  }
  return true;
}

// Re-reads `pool` and settles its charge.
void reconcile_pool(State& s, Book& b, CUmemoryPool pool) {
  std::uint64_t reserved = 0;
  if (!pool_reserved(pool, reserved)) return;
  std::lock_guard charge(b.charge_mu);
  PoolEntry* e = nullptr;
  {
    std::lock_guard lock(b.mu);
    auto it = b.pools.find(pool);
    if (it == b.pools.end() || !it->second.counted || it->second.destroyed) return;
    e = &it->second;  // stable: entries are erased only under charge_mu
  }
  if (!settle(s, b, e->ledger, e->device, reserved)) {
    log(LogLevel::warn, "memory pool on GPU %d grew to %s beyond what the tenant may hold (not charged)", e->device,
        format_bytes(reserved).c_str());
  }
}

// A pool the application reached (created, default, current): remembered with its device.
void remember_pool(CUmemoryPool pool, int dev, bool counted) {
  Book& b = book();
  std::lock_guard lock(b.mu);
  auto [it, fresh] = b.pools.try_emplace(pool);
  if (fresh || it->second.destroyed) {
    it->second = PoolEntry{};
    it->second.device = dev;
    it->second.counted = counted;
  }
}

// Adds the bytes of the graph's allocation nodes per device (child graphs included).
CUresult alloc_node_bytes(CUgraph graph, DeviceBytes& out, int depth) {
  const UsedApi& api = used();
  if (api.cuGraphGetNodes == nullptr || api.cuGraphNodeGetType == nullptr ||
      api.cuGraphMemAllocNodeGetParams == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (depth > kMaxGraphDepth) return CUDA_ERROR_NOT_SUPPORTED;
  std::size_t n = 0;
  if (CUresult rc = api.cuGraphGetNodes(graph, nullptr, &n); rc != CUDA_SUCCESS) return rc;
  std::vector<CUgraphNode> nodes(n);
  if (n != 0) {
    if (CUresult rc = api.cuGraphGetNodes(graph, nodes.data(), &n); rc != CUDA_SUCCESS) return rc;
    nodes.resize(n);
  }
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type{};
    if (CUresult rc = api.cuGraphNodeGetType(node, &type); rc != CUDA_SUCCESS) return rc;
    if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      CUDA_MEM_ALLOC_NODE_PARAMS p{};
      if (CUresult rc = api.cuGraphMemAllocNodeGetParams(node, &p); rc != CUDA_SUCCESS) return rc;
      if (p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(p.poolProps.location.id)) {
        out[static_cast<std::size_t>(p.poolProps.location.id)] += p.bytesize;
      }
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph child = nullptr;
      if (api.cuGraphChildGraphNodeGetGraph == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      if (CUresult rc = api.cuGraphChildGraphNodeGetGraph(node, &child); rc != CUDA_SUCCESS) return rc;
      if (CUresult rc = alloc_node_bytes(child, out, depth + 1); rc != CUDA_SUCCESS) return rc;
    }
  }
  return CUDA_SUCCESS;
}

bool any(const DeviceBytes& d) {
  return std::any_of(d.begin(), d.end(), [](std::uint64_t v) { return v != 0; });
}

// What launching allocations of `bytes` on `dev` would add to its graph memory; `freed`: bytes
// the launch frees first (an auto-free exec's previous allocations, if still live).
std::uint64_t graph_growth(Book& b, int dev, std::uint64_t bytes, std::uint64_t freed = 0) {
  std::uint64_t reserved = 0;
  std::uint64_t in_use = 0;
  graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, reserved);
  graph_attr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, in_use);
  in_use -= std::min(in_use, freed);
  const std::uint64_t expect = std::max(reserved, in_use + bytes);
  std::lock_guard lock(b.mu);
  const std::uint64_t charged = b.graph[static_cast<std::size_t>(dev)].charged();
  return expect > charged ? expect - charged : 0;
}

// Instantiation: refuses an exec whose allocation nodes cannot fit the tenant's limit.
CUresult check_fits(State& s, Book& b, const DeviceBytes& per_dev) {
  for (std::size_t d = 0; d < kDevices; ++d) {
    if (per_dev[d] == 0) continue;
    const int dev = static_cast<int>(d);
    const std::uint64_t need = graph_growth(b, dev, per_dev[d]);
    if (need == 0) continue;
    Uuid uuid{};
    if (device_uuid(s, dev, uuid) != CUDA_SUCCESS) continue;
    auto u = s.client.usage(uuid);
    if (!u || u->status != proto::Status::ok) continue;  // the launch's charge still decides
    if (u->used + need > u->limit) {
      log(LogLevel::error,
          "out of memory on GPU %d: a graph with %s of allocation nodes needs %s more; the tenant holds %s of its %s "
          "limit: instantiation refused",
          dev, format_bytes(per_dev[d]).c_str(), format_bytes(need).c_str(), format_bytes(u->used).c_str(),
          format_bytes(u->limit).c_str());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  return CUDA_SUCCESS;
}

// Settles every device's graph memory charge on what the driver reserves now. Caller holds
// charge_mu.
void settle_graphs(State& s, Book& b, const DeviceBytes& per_dev) {
  for (std::size_t d = 0; d < kDevices; ++d) {
    if (per_dev[d] == 0) continue;
    std::uint64_t reserved = 0;
    if (!graph_attr(static_cast<int>(d), CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, reserved)) continue;
    if (!settle(s, b, b.graph[d], static_cast<int>(d), reserved)) {
      log(LogLevel::warn, "graph memory on GPU %zu grew to %s, beyond the tenant's limit (not charged)", d,
          format_bytes(reserved).c_str());
    }
  }
}

template <class Instantiate>
CUresult instantiate(CUgraph graph, CUgraphExec* exec, unsigned long long flags, Instantiate call) {
  State* s = active_state();
  if (s == nullptr) return call();
  Book& b = book();
  DeviceBytes per_dev{};
  const bool walked = alloc_node_bytes(graph, per_dev, 0) == CUDA_SUCCESS;
  if (walked && any(per_dev)) {
    if (CUresult rc = check_fits(*s, b, per_dev); rc != CUDA_SUCCESS) return rc;
  }
  const CUresult rc = call();
  // Every exec whose allocation nodes are known is remembered (those without any too: their
  // launches then cost one lookup); an exec the hook could not walk is settled after each launch.
  if (rc == CUDA_SUCCESS && walked && exec != nullptr) {
    std::lock_guard lock(b.mu);
    b.execs[*exec] = Book::Exec{per_dev, (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0};
  }
  return rc;
}

// Launch or upload: the growth is charged first (refused: nothing runs), the exact reserved
// figure settled after.
template <class Run>
CUresult run_exec(CUgraphExec exec, bool launch, Run call) {
  State* s = active_state();
  if (s == nullptr) return call();
  Book& b = book();
  DeviceBytes per_dev{};
  bool auto_free = false;
  {
    std::lock_guard lock(b.mu);
    auto it = b.execs.find(exec);
    if (it != b.execs.end() && !any(it->second.bytes)) return call();  // no allocation node
    if (it != b.execs.end()) {
      per_dev = it->second.bytes;
      auto_free = launch && it->second.auto_free;
    }
  }
  if (!any(per_dev)) {
    // An exec the hook did not instantiate (a legacy cuGraphInstantiate ABI) or could not walk:
    // no refusal is possible before it runs; its graph memory is charged after it, on the
    // current device.
    const CUresult rc = call();
    int dev = -1;
    if (rc == CUDA_SUCCESS && current_device_of(dev) == CUDA_SUCCESS && valid_device(dev)) {
      std::lock_guard charge(b.charge_mu);
      per_dev[static_cast<std::size_t>(dev)] = 1;
      settle_graphs(*s, b, per_dev);
    }
    return rc;
  }
  std::lock_guard charge(b.charge_mu);
  for (std::size_t d = 0; d < kDevices; ++d) {
    if (per_dev[d] == 0) continue;
    const int dev = static_cast<int>(d);
    const std::uint64_t growth = graph_growth(b, dev, per_dev[d], auto_free ? per_dev[d] : 0);
    if (growth == 0) continue;
    const Charge c = charge_counted(*s, dev, growth);
    if (c.outcome == Charge::Outcome::refused) {
      settle_graphs(*s, b, per_dev);  // back to what the driver holds
      return c.rc;
    }
    if (c.outcome == Charge::Outcome::granted) {
      std::lock_guard lock(b.mu);
      b.graph[d].add(c.grant_id, c.bytes);
    }
  }
  const CUresult rc = call();
  settle_graphs(*s, b, per_dev);
  return rc;
}

}  // namespace

// ---- cuMemCreate with properties the pool cannot serve ------------------------------------------

CUresult create_counted(State& s, bool ptds, CUmemGenericAllocationHandle* handle, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags) {
  // Host locations (pinned host, NUMA) are not device memory; invalid arguments are the
  // driver's to report.
  if (prop == nullptr || handle == nullptr || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return pass<Row::cuMemCreate>(ptds, handle, size, prop, flags);
  }
  const Charge c = charge_counted(s, prop->location.id, size);
  if (c.outcome == Charge::Outcome::refused) return c.rc;
  const CUresult rc = pass<Row::cuMemCreate>(ptds, handle, size, prop, flags);
  if (c.outcome == Charge::Outcome::passthrough) return rc;
  if (rc != CUDA_SUCCESS) {
    uncharge(s, c.grant_id);
    return rc;
  }
  s.creates.add_counted(*handle, c.grant_id, size);
  return rc;
}

// ---- The pre-3.2 cuMemAlloc ABI ----------------------------------------------------------------
// Charged like cuMemAllocManaged: the driver allocates, the hook counts (whatever the 64-bit
// driver does with a 32-bit pointer: its failure uncharges).

CUresult on_cuMemAlloc(bool ptds, CUdeviceptr_v1* dptr, unsigned int bytesize) {
  State* s = active_state();
  if (s == nullptr || dptr == nullptr || bytesize == 0) return pass<Row::cuMemAlloc>(ptds, dptr, bytesize);
  int dev = 0;
  if (CUresult rc = current_device_of(dev); rc != CUDA_SUCCESS) return rc;
  const Charge c = charge_counted(*s, dev, bytesize);
  if (c.outcome == Charge::Outcome::refused) return c.rc;
  const CUresult rc = pass<Row::cuMemAlloc>(ptds, dptr, bytesize);
  if (c.outcome == Charge::Outcome::passthrough) return rc;
  if (rc != CUDA_SUCCESS) {
    uncharge(*s, c.grant_id);
    return rc;
  }
  s->managed.insert(*dptr, c.grant_id);  // cuMemFree_v2 of the zero-extended pointer uncharges too
  return rc;
}

CUresult on_cuMemFree(bool ptds, CUdeviceptr_v1 dptr) {
  State* s = active_state();
  if (s == nullptr) return pass<Row::cuMemFree>(ptds, dptr);
  auto grant = s->managed.take(dptr);
  const CUresult rc = pass<Row::cuMemFree>(ptds, dptr);
  if (grant) {
    if (rc == CUDA_SUCCESS) {
      uncharge(*s, *grant);
    } else {
      s->managed.insert(dptr, *grant);
    }
  }
  return rc;
}

// ---- Stream-ordered memory pools -----------------------------------------------------------------

CUresult free_unserved(State& s, bool ptds, CUdeviceptr dptr, CUstream stream, bool has_stream) {
  const CUresult rc = has_stream ? pass<Row::cuMemFreeAsync>(ptds, dptr, stream) : pass<Row::cuMemFree_v2>(ptds, dptr);
  Book* b = g_book.load(std::memory_order_acquire);
  if (rc != CUDA_SUCCESS || dptr == 0 || b == nullptr) return rc;
  if (has_stream && stream_capturing(ptds, stream)) return rc;  // a free node of the graph
  CUmemoryPool pool = nullptr;
  bool last_of_destroyed = false;
  {
    std::lock_guard lock(b->mu);
    auto it = b->ptrs.find(dptr);
    if (it == b->ptrs.end()) return rc;
    pool = it->second;
    b->ptrs.erase(it);
    auto p = b->pools.find(pool);
    if (p != b->pools.end()) {
      if (p->second.outstanding > 0) --p->second.outstanding;
      last_of_destroyed = p->second.destroyed && p->second.outstanding == 0;
    }
  }
  b->dirty.store(true, std::memory_order_release);
  if (last_of_destroyed) {
    // The driver releases a destroyed pool's memory with its last allocation.
    std::vector<std::uint64_t> ids;
    {
      std::lock_guard charge(b->charge_mu);
      std::lock_guard lock(b->mu);
      auto p = b->pools.find(pool);
      if (p != b->pools.end() && p->second.destroyed && p->second.outstanding == 0) {
        ids = p->second.ledger.take_all();
        b->pools.erase(p);
      }
    }
    for (std::uint64_t id : ids) uncharge(s, id);
    return rc;
  }
  reconcile_pool(s, *b, pool);
  return rc;
}

void after_synchronize() noexcept {
  try {
    Book* b = g_book.load(std::memory_order_acquire);
    if (b == nullptr || !b->dirty.load(std::memory_order_acquire)) return;
    State* s = active_state();
    if (s == nullptr || !b->dirty.exchange(false)) return;
    std::vector<CUmemoryPool> pools;
    {
      std::lock_guard lock(b->mu);
      for (const auto& [pool, e] : b->pools) {
        if (e.counted && !e.destroyed && !e.ledger.empty()) pools.push_back(pool);
      }
    }
    for (CUmemoryPool pool : pools) reconcile_pool(*s, *b, pool);
  } catch (...) {
  }
}

CUresult on_cuDeviceGetDefaultMemPool(bool ptds, CUmemoryPool* pool_out, CUdevice dev) {
  const CUresult rc = pass<Row::cuDeviceGetDefaultMemPool>(ptds, pool_out, dev);
  if (rc == CUDA_SUCCESS && pool_out != nullptr && active_state() != nullptr) remember_pool(*pool_out, dev, true);
  return rc;
}

CUresult on_cuDeviceGetMemPool(bool ptds, CUmemoryPool* pool, CUdevice dev) {
  const CUresult rc = pass<Row::cuDeviceGetMemPool>(ptds, pool, dev);
  if (rc == CUDA_SUCCESS && pool != nullptr && active_state() != nullptr) remember_pool(*pool, dev, true);
  return rc;
}

CUresult on_cuDeviceSetMemPool(bool ptds, CUdevice dev, CUmemoryPool pool) {
  const CUresult rc = pass<Row::cuDeviceSetMemPool>(ptds, dev, pool);
  if (rc == CUDA_SUCCESS && active_state() != nullptr) remember_pool(pool, dev, true);
  return rc;
}

CUresult on_cuMemPoolCreate(bool ptds, CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  const CUresult rc = pass<Row::cuMemPoolCreate>(ptds, pool, poolProps);
  if (rc != CUDA_SUCCESS || pool == nullptr || poolProps == nullptr || active_state() == nullptr) return rc;
  const bool device = poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  remember_pool(*pool, device ? poolProps->location.id : 0, device);
  return rc;
}

CUresult on_cuMemPoolDestroy(bool ptds, CUmemoryPool pool) {
  const CUresult rc = pass<Row::cuMemPoolDestroy>(ptds, pool);
  State* s = active_state();
  Book* b = g_book.load(std::memory_order_acquire);
  if (rc != CUDA_SUCCESS || s == nullptr || b == nullptr) return rc;
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard charge(b->charge_mu);
    std::lock_guard lock(b->mu);
    auto it = b->pools.find(pool);
    if (it == b->pools.end()) return rc;
    if (it->second.outstanding == 0) {
      ids = it->second.ledger.take_all();
      b->pools.erase(it);
    } else {
      // Outstanding allocations keep the pool's memory until they are freed (cuda.h).
      it->second.destroyed = true;
    }
  }
  for (std::uint64_t id : ids) uncharge(*s, id);
  return rc;
}

CUresult on_cuMemPoolTrimTo(bool ptds, CUmemoryPool pool, size_t minBytesToKeep) {
  const CUresult rc = pass<Row::cuMemPoolTrimTo>(ptds, pool, minBytesToKeep);
  State* s = active_state();
  Book* b = g_book.load(std::memory_order_acquire);
  if (rc == CUDA_SUCCESS && s != nullptr && b != nullptr) reconcile_pool(*s, *b, pool);
  return rc;
}

CUresult on_cuMemAllocFromPoolAsync(bool ptds, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                    CUstream hStream) {
  const CUresult rc = pass<Row::cuMemAllocFromPoolAsync>(ptds, dptr, bytesize, pool, hStream);
  State* s = active_state();
  if (rc != CUDA_SUCCESS || s == nullptr || dptr == nullptr || *dptr == 0) return rc;
  // On a capturing stream this is an allocation node: graph memory, counted at launch.
  if (stream_capturing(ptds, hStream)) return rc;
  Book& b = book();
  int dev = -1;
  {
    std::lock_guard lock(b.mu);
    if (auto it = b.pools.find(pool); it != b.pools.end() && !it->second.destroyed) {
      if (!it->second.counted) return rc;
      dev = it->second.device;
    }
  }
  if (dev < 0) {
    // A pool the hook has not seen handed out (e.g. obtained before the hook was loaded): the
    // pool of the current device.
    if (current_device_of(dev) != CUDA_SUCCESS) dev = 0;
    remember_pool(pool, dev, true);
  }
  const CUdeviceptr p = *dptr;
  std::uint64_t charged = 0;
  {
    std::lock_guard lock(b.mu);
    PoolEntry& e = b.pools[pool];
    ++e.outstanding;
    b.ptrs[p] = pool;
    charged = e.ledger.charged();
  }
  std::uint64_t reserved = 0;
  if (!pool_reserved(pool, reserved) || reserved <= charged) return rc;  // fast path: no growth
  bool fits = true;
  {
    std::lock_guard charge(b.charge_mu);
    PoolEntry* e = nullptr;
    {
      std::lock_guard lock(b.mu);
      e = &b.pools[pool];
    }
    fits = settle(*s, b, e->ledger, dev, reserved);
    std::lock_guard lock(b.mu);
    charged = e->ledger.charged();
  }
  if (fits) return rc;
  // Refused: give the allocation back and the pool's growth to the driver.
  pass<Row::cuMemFreeAsync>(ptds, p, hStream);
  pass<Row::cuStreamSynchronize>(ptds, hStream);
  {
    std::lock_guard lock(b.mu);
    b.ptrs.erase(p);
    if (auto it = b.pools.find(pool); it != b.pools.end() && it->second.outstanding > 0) --it->second.outstanding;
  }
  pass<Row::cuMemPoolTrimTo>(false, pool, static_cast<size_t>(charged));
  *dptr = 0;
  return CUDA_ERROR_OUT_OF_MEMORY;
}

// ---- Graph memory -------------------------------------------------------------------------------

CUresult on_cuGraphInstantiateWithFlags(bool ptds, CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  return instantiate(hGraph, phGraphExec, flags,
                     [&] { return pass<Row::cuGraphInstantiateWithFlags>(ptds, phGraphExec, hGraph, flags); });
}

CUresult on_cuGraphInstantiateWithParams(bool ptds, CUgraphExec* phGraphExec, CUgraph hGraph,
                                         CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  const bool upload =
      instantiateParams != nullptr && (instantiateParams->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0;
  const unsigned long long flags = instantiateParams != nullptr ? instantiateParams->flags : 0;
  if (!upload) {
    return instantiate(hGraph, phGraphExec, flags, [&] {
      return pass<Row::cuGraphInstantiateWithParams>(ptds, phGraphExec, hGraph, instantiateParams);
    });
  }
  // Instantiate-and-upload: instantiated without the upload flag, then uploaded through the
  // counted upload path (so the graph memory it reserves is charged first).
  CUDA_GRAPH_INSTANTIATE_PARAMS plain = *instantiateParams;
  plain.flags &= ~static_cast<cuuint64_t>(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
  CUresult rc = instantiate(hGraph, phGraphExec, flags,
                            [&] { return pass<Row::cuGraphInstantiateWithParams>(ptds, phGraphExec, hGraph, &plain); });
  instantiateParams->result_out = plain.result_out;
  instantiateParams->hErrNode_out = plain.hErrNode_out;
  if (rc != CUDA_SUCCESS || phGraphExec == nullptr) return rc;
  const CUstream stream = instantiateParams->hUploadStream;
  rc = run_exec(*phGraphExec, false, [&] { return pass<Row::cuGraphUpload>(ptds, *phGraphExec, stream); });
  if (rc != CUDA_SUCCESS) {
    on_cuGraphExecDestroy(false, *phGraphExec);
    *phGraphExec = nullptr;
  }
  return rc;
}

CUresult on_cuGraphUpload(bool ptds, CUgraphExec hGraphExec, CUstream hStream) {
  return run_exec(hGraphExec, false, [&] { return pass<Row::cuGraphUpload>(ptds, hGraphExec, hStream); });
}

CUresult on_cuGraphLaunch(bool ptds, CUgraphExec hGraphExec, CUstream hStream) {
  return run_exec(hGraphExec, true, [&] { return pass<Row::cuGraphLaunch>(ptds, hGraphExec, hStream); });
}

CUresult on_cuGraphExecDestroy(bool ptds, CUgraphExec hGraphExec) {
  const CUresult rc = pass<Row::cuGraphExecDestroy>(ptds, hGraphExec);
  if (Book* b = g_book.load(std::memory_order_acquire); rc == CUDA_SUCCESS && b != nullptr) {
    std::lock_guard lock(b->mu);
    b->execs.erase(hGraphExec);  // its graph memory stays reserved until cuDeviceGraphMemTrim
  }
  return rc;
}

CUresult on_cuDeviceGraphMemTrim(bool ptds, CUdevice device) {
  const CUresult rc = pass<Row::cuDeviceGraphMemTrim>(ptds, device);
  State* s = active_state();
  Book* b = g_book.load(std::memory_order_acquire);
  if (rc != CUDA_SUCCESS || s == nullptr || b == nullptr || !valid_device(device)) return rc;
  std::lock_guard charge(b->charge_mu);
  DeviceBytes one{};
  one[static_cast<std::size_t>(device)] = 1;
  settle_graphs(*s, *b, one);
  return rc;
}

}  // namespace vlake::hook
