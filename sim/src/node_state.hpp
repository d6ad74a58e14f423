// The shared layout of a simulated node (NodeState, node.hpp) and what node.cpp and
// node_observer.cpp both need to work on it: its records, the node lock and the purges. Internal
// to vlake_sim_node (nothing here is exported; node.hpp is the interface).
//
// Contract
// - NodeState is the fixed layout every process maps from /dev/shm/vlake-sim-<node>; bump
//   kLayoutVersion on any change to it, Record or Swap.
// - Thread-safety: the tables are read and changed only while holding a Lock (the robust,
//   process-shared mutex in the state; it serializes processes too); purge_dead and
//   settle_creator_gone expect it held. `magic` and `nswaps` are also read without it (atomic
//   loads).
#pragma once

#include "node.hpp"

#include <pthread.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>

namespace vlake::sim {
namespace node_internal {

constexpr std::uint64_t kMagic = 0x4d49532d454b4c56ULL;  // "VLKE-SIM"
// 2: holders are kept in the order they took the allocation (creator first); primary contexts
// are records keyed (kContextDev, context_ino(pid, device)).
// 3: a record without holders stays charged while an attached process keeps a descriptor of it
// (`fd_held`), as on the real driver.
// 4: `creator_gone`: the creator released a record others still hold; NVML charges it to no
// process while a descriptor of it is open.
// 5: process checkpoints (`swaps`, `nlocked`, Record::swapped).
// 6: host-located allocations (device kHostLocation, `used[kHostLocation]`, `host_capacity`).
constexpr std::uint32_t kLayoutVersion = 6;
constexpr std::uint32_t kMaxAttached = 512;   // processes attached to one node at once
constexpr std::uint32_t kMaxRecords = 32768;  // live physical allocations per node
constexpr std::uint32_t kMaxHolders = 16;     // processes holding one allocation at once
constexpr std::uint32_t kMaxSwaps = 64;       // processes locked or checkpointed at once
// A context record: st_dev kContextDev (no memfd has it), st_ino its pid, device and serial (0: primary).
constexpr std::uint64_t kContextDev = ~std::uint64_t{0};
inline std::uint64_t context_ino(std::int32_t pid, int device, std::uint32_t serial = 0) {
  return (std::uint64_t{serial} << 40) | (std::uint64_t{static_cast<std::uint32_t>(pid)} << 8) | unsigned(device);
}

struct Record {
  std::uint64_t dev;
  std::uint64_t ino;
  std::uint64_t size;
  std::int32_t device;
  std::uint32_t nholders;  // processes holding a handle, an imported handle or a mapping
  std::uint32_t fd_held;   // no holder, but maybe a descriptor somewhere: still charged (see sweep)
  // The creator (first holder) let go while others hold it, and a descriptor may be open: the
  // real driver then charges the memory to no process until no descriptor is left (measured,
  // docs/driver.md "What NVML reports"). Cleared by the first NVML read that finds none.
  std::uint32_t creator_gone;
  // Its only holder is checkpointed: the contents are in host memory, the record is not charged
  // to its device (nor to NVML's per-process figures) until that process is restored.
  std::uint32_t swapped;
  std::uint32_t imported;  // some process imported it (cuMemImportFromShareableHandle)
  ProcessId holders[kMaxHolders];
};

// A process another process locked (cuCheckpointProcessLock) or checkpointed. Running processes
// have no entry.
struct Swap {
  ProcessId process;
  std::uint32_t state;  // CUprocessState: LOCKED or CHECKPOINTED
  // 1: it held memory other processes held too: restore is CUDA_ERROR_NOT_SUPPORTED. 2: a restore
  // failed for lack of memory: every later one is CUDA_ERROR_OPERATING_SYSTEM (driver 580).
  std::uint32_t unsupported;
};

// A record is in use (charged to its device) while it has a holder or may be held through a
// descriptor.
inline bool in_use(const Record& r) { return r.nholders > 0 || r.fd_held != 0; }

}  // namespace node_internal

// The shared layout. Bump kLayoutVersion on any change.
struct NodeState {
  std::uint64_t magic;  // written last by the creator
  std::uint32_t layout_version;
  std::uint32_t state_size;
  std::uint32_t device_count;
  std::uint32_t reserved;
  std::uint64_t capacity;       // per device, bytes
  std::uint64_t host_capacity;  // host-located bytes of the whole node
  // Per device, then used[kHostLocation]: the node's host-located bytes.
  std::uint64_t used[kHostLocation + 1];
  pthread_mutex_t mutex;  // robust, process-shared
  std::uint32_t nattached;
  std::uint32_t record_hwm;  // records[record_hwm..] are all unused
  ProcessId attached[node_internal::kMaxAttached];
  node_internal::Record records[node_internal::kMaxRecords];
  // Read without the mutex by every entry point (Node::wait_while_locked): nonzero while any
  // process is locked or checkpointed.
  std::uint32_t nswaps;
  std::uint32_t reserved2;
  node_internal::Swap swaps[node_internal::kMaxSwaps];
};

namespace node_internal {

class Lock {
 public:
  explicit Lock(NodeState* s) : s_(s) {
    int rc = pthread_mutex_lock(&s_->mutex);
    if (rc == EOWNERDEAD) {
      // A process died holding the lock: the tables may be half-updated. Make them
      // consistent again from the records, which are the source of truth.
      pthread_mutex_consistent(&s_->mutex);
      repair();
    } else if (rc != 0) {
      throw std::runtime_error("vlake-sim: node mutex is unusable");
    }
  }
  ~Lock() { pthread_mutex_unlock(&s_->mutex); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  void repair() {
    if (s_->nattached > kMaxAttached) s_->nattached = kMaxAttached;
    if (s_->record_hwm > kMaxRecords) s_->record_hwm = kMaxRecords;
    for (auto& u : s_->used) u = 0;
    for (std::uint32_t i = 0; i < s_->record_hwm; ++i) {
      Record& r = s_->records[i];
      if (r.nholders > kMaxHolders) r.nholders = kMaxHolders;
      if (!in_use(r)) continue;
      if (r.device < 0 || r.device > kHostLocation) {
        r.nholders = 0;
        continue;
      }
      if (r.swapped == 0) s_->used[r.device] += r.size;
    }
  }
  NodeState* s_;
};

// Removes dead attached processes and every hold they had (node.cpp).
void purge_dead(NodeState* s, const ProcessId& self);

// Clears `creator_gone` on every held record of which no attached process but its holders has a
// descriptor left (node.cpp).
void settle_creator_gone(NodeState* s);

}  // namespace node_internal
}  // namespace vlake::sim
