// Process-local state of the simulated driver: contexts, physical allocations known to this
// process, address reservations, mappings, streams and events.
//
// Contract
// - A CUdeviceptr is a host virtual address. Reservations are PROT_NONE anonymous host VA;
//   a mapping places the allocation's memfd there (MAP_SHARED|MAP_FIXED) and cuMemSetAccess
//   mprotects it. cuMemAlloc memory is a memfd mapped read-write at fresh VA.
// - Every access made by the simulator (copies, memsets) is checked against the mapping table
//   first, so a bad access returns an error instead of faulting the process.
// - Thread-safety: `mu` guards every table (exclusive for changes, shared for copies and
//   queries); the node has its own cross-process lock, always taken after `mu`.
#pragma once

#include "node.hpp"
#include "rules.hpp"

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

// The driver's opaque handle types, defined by the simulator (cuda.h only declares them).
struct CUctx_st {
  int device = 0;
  std::atomic<int> retains{0};                 // primary-context retain count
  std::atomic<CUresult> sticky{CUDA_SUCCESS};  // sticky error (illegal access)
  // Bit d: cuCtxEnablePeerAccess(primary context of device d) succeeded in this context, so its
  // kernels may touch device d's cuMemAlloc memory (driver_peer.cpp). Cleared when either
  // context is destroyed.
  std::atomic<std::uint32_t> peers{0};
};

// A green context (cuGreenCtxCreate): like a created context, only its memory is modeled.
struct CUgreenCtx_st {
  int device = 0;
};

struct CUstream_st {
  CUctx_st* ctx = nullptr;
  unsigned flags = 0;
};

struct CUevent_st {
  CUctx_st* ctx = nullptr;
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point when{};
  std::chrono::steady_clock::time_point done{};  // when + VLAKE_SIM_EVENT_LAG_MS (driver_streams.cpp)
};

// A loaded module: the .entry names found in its PTX.
struct CUfunc_st;
struct CUmod_st {
  std::vector<std::string> entries;
  std::vector<std::unique_ptr<CUfunc_st>> functions;  // handed out by cuModuleGetFunction
};

// The device's default memory pool: only an identity for CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
// of cuMemAllocAsync memory (no cuMemPool* call is simulated).
struct CUmemPoolHandle_st {
  int device = 0;
};

// A kernel the simulator executes on the host (see driver_kernels.cpp, run_kernel).
struct CUfunc_st {
  CUmod_st* module = nullptr;
  std::string name;
};

namespace vlake::sim {

// A physical allocation this process holds (one per memfd per process).
struct Phys {
  int fd = -1;
  std::uint64_t dev = 0;
  std::uint64_t ino = 0;
  std::size_t size = 0;
  int device = 0;                           // a device ordinal, or kHostLocation (host-located)
  bool classic = false;                     // cuMemAlloc memory (no handle)
  CUmemAllocationProp prop{};               // as created / as reconstructed on import
  CUmemGenericAllocationHandle handle = 0;  // the handle value this process uses for it
  std::uint32_t handle_refs = 0;            // cuMemCreate/import/retain minus cuMemRelease
  std::uint32_t mappings = 0;               // live mappings of it
  std::uint64_t block_id = 0;               // CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID
};

struct Mapping {
  std::size_t size = 0;     // mapped bytes (the handle size; rounded size for cuMemAlloc)
  std::size_t visible = 0;  // bytes a caller may touch (== size, or cuMemAlloc's request)
  Phys* phys = nullptr;
  bool classic = false;                           // cuMemAlloc-like memory: cuMemAlloc, pitch, managed, async
  bool managed = false;                           // cuMemAllocManaged
  bool async = false;                             // cuMemAllocAsync: owned by the device's pool, not the context
  CUctx_st* ctx = nullptr;                        // owning (for async: allocating) context of classic memory
  std::uint64_t buffer_id = 0;                    // CU_POINTER_ATTRIBUTE_BUFFER_ID
  unsigned char access[rules::kMaxDevices] = {};  // CUmemAccess_flags per device
};

struct Process {
  std::shared_mutex mu;
  std::unique_ptr<Node> node;
  std::string node_name;
  int device_count = 1;
  std::uint64_t capacity = 0;
  std::uint64_t context_memory = 0;  // VLAKE_SIM_CONTEXT_MEMORY, charged per primary context
  bool peer_access = true;           // VLAKE_SIM_PEER_ACCESS: devices can access each other
  bool host_vmm = true;              // VLAKE_SIM_HOST_VMM: host-located VMM memory exists
  std::uint64_t link_bandwidth = 0;  // VLAKE_SIM_LINK_BANDWIDTH, bytes/s (0: copies unpaced)
  CUctx_st ctxs[rules::kMaxDevices];
  CUmemPoolHandle_st pools[rules::kMaxDevices];

  std::map<std::pair<std::uint64_t, std::uint64_t>, std::unique_ptr<Phys>> phys;  // (dev, ino)
  std::unordered_map<CUmemGenericAllocationHandle, Phys*> handles;                // handle_refs > 0 only
  std::map<std::uintptr_t, std::size_t> reservations;                             // base -> size
  std::map<std::uintptr_t, Mapping> mappings;                                     // base -> mapping
  std::unordered_set<CUstream_st*> streams;
  std::unordered_set<CUevent_st*> events;
  std::unordered_set<CUmod_st*> modules;
  // Contexts made by cuCtxCreate_v2/_v3/_v4 and cuGreenCtxCreate: only their memory is modeled
  // (a context record each, keyed by its serial; docs/simulator.md "Contexts"). The handles are
  // good for their destroy call only.
  std::map<const void*, std::uint32_t> created_ctxs;  // handle -> serial (> 0)
  std::uint32_t next_ctx_serial = 1;
  CUmemGenericAllocationHandle next_handle = 0x5100000001ULL;
  std::uint64_t next_id = 1;
};

}  // namespace vlake::sim
