// The simulated machine ("node"): device count, per-device capacity and the table of live
// physical allocations, shared by every process that uses the same VLAKE_SIM_NODE name.
//
// Contract
// - State lives in POSIX shared memory /dev/shm/vlake-sim-<node> (shm name "/vlake-sim-<node>"),
//   a fixed-layout struct (NodeState, magic + layout version) guarded by a robust,
//   process-shared pthread mutex. The first process creates it (under flock) with the
//   capacity of its environment.
// - A physical allocation is one record keyed by its memfd's (st_dev, st_ino) with the list of
//   processes (pid + start time) holding it, in the order they took it (creator first). It is
//   charged to its device while it has a live holder, and (for NVML's per-process figures) to
//   its first live holder when that process has a primary context on the device (otherwise to
//   no process, as on the real driver). Dead processes (exited, SIGKILLed, zombies, or a reused pid with
//   another start time) are purged on every capacity check and usage query.
// - A primary context is a record too (VLAKE_SIM_CONTEXT_MEMORY bytes, possibly 0) held by its
//   process only, so it counts against capacity, in usage and puts the process in NVML's list.
// - A host-located allocation (CU_MEM_LOCATION_TYPE_HOST_NUMA) is a record of device
//   kHostLocation: charged to the node's host memory (bounded by VLAKE_SIM_HOST_MEMORY), never to
//   a device's capacity, usage or NVML's per-process figures; otherwise held, purged and kept by
//   descriptors like any allocation. Checkpoints leave it alone (it is host memory already).
// - An attached process keeps the node file open (O_CLOEXEC) until it detaches, so a scan of
//   /proc/<pid>/fd finds the simulated GPU's users as it finds the real driver's
//   (/dev/nvidia*): device_file() names it.
// - A node with no live attached process and no record is reset to the capacity of the next
//   process that attaches; otherwise a process with different parameters is refused. The
//   last process to detach (normal exit) removes the file; a file left by killed processes
//   is harmless and reused.
// - The process that creates the file gives it exactly the mode and group of its FileAccess
//   (VLAKE_SIM_NODE_MODE, default 0660, whatever the umask; VLAKE_SIM_NODE_GROUP, default its
//   own group): processes of other uids attach when that mode lets them read and write it. A
//   file that exists keeps its mode and group.
// - Thread-safety: all member functions may be called concurrently (the robust mutex
//   serializes them, across processes too).
#pragma once

#include "rules.hpp"

#include <cuda.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vlake::sim {

// A process identity that survives pid reuse: pid plus start time (/proc/<pid>/stat field 22).
struct ProcessId {
  std::int32_t pid = 0;
  std::uint32_t reserved = 0;
  std::uint64_t start_time = 0;
};

// The identity of the calling process (reads /proc/self/stat).
ProcessId current_process();
// True when that process still runs (not exited, not a zombie, same start time).
bool process_alive(const ProcessId& p);

struct NodeState;  // the shared layout, defined in node_state.hpp

// The `device` of a host-located allocation (pinned host memory of NUMA node 0) in Node's calls.
inline constexpr int kHostLocation = rules::kMaxDevices;

// Who may open a node file this process creates (docs/simulator.md, "Who may use a node").
struct FileAccess {
  unsigned mode = 0660;  // permission bits, a subset of 0666 with owner read-write
  long gid = -1;         // group of the file; -1: the creating process's own
};

class Node {
 public:
  // Opens (creating if needed, with `access`) the node `name`, checks or sets its parameters,
  // and attaches `self`. `host_capacity` bounds the node's host-located bytes when this process
  // creates or resets the node (a node in use keeps its own bound, unchecked). On failure prints
  // one line to stderr and returns the CUresult for cuInit: CUDA_ERROR_OPERATING_SYSTEM when the
  // file cannot be opened (another user's file whose mode keeps this process out) or given its
  // mode and group.
  static CUresult attach(const std::string& name, int device_count, std::uint64_t capacity, std::uint64_t host_capacity,
                         const FileAccess& access, const ProcessId& self, std::unique_ptr<Node>& out);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // A new allocation made by this process on `device` (a device ordinal or kHostLocation):
  // CUDA_ERROR_OUT_OF_MEMORY if it does not fit (the device's capacity, or the node's host memory).
  CUresult charge_new(std::uint64_t dev, std::uint64_t ino, std::uint64_t size, int device);
  // This process holds an existing allocation (import): adds it as holder, re-creating the
  // record when every earlier holder is gone (without a capacity check: the memory exists).
  CUresult hold(std::uint64_t dev, std::uint64_t ino, std::uint64_t size, int device);
  // This process no longer holds the allocation.
  void release(std::uint64_t dev, std::uint64_t ino);
  // This process's primary context on `device` (serial 0), or a context it created there
  // (cuCtxCreate*, cuGreenCtxCreate: serial > 0), exists / is gone: a record of `bytes` held by
  // this process alone. CUDA_ERROR_OUT_OF_MEMORY if it does not fit.
  CUresult charge_context(int device, std::uint64_t bytes, std::uint32_t serial = 0);
  void release_context(int device, std::uint32_t serial = 0);
  // Process checkpoints (cuCheckpointProcess*), done by this process to the attached process
  // `pid`, with driver 580's semantics as measured (docs/simulator.md "Checkpoints"): lock blocks
  // the target's entry points (wait_while_locked); checkpoint moves the memory it alone holds to
  // host memory (uncharged) and releases its references to shared memory, which makes restore
  // CUDA_ERROR_NOT_SUPPORTED; restore charges the memory back (CUDA_ERROR_OUT_OF_MEMORY when it
  // does not fit: still checkpointed, and every later restore fails with
  // CUDA_ERROR_OPERATING_SYSTEM); unlock lets it run. A call in the wrong state is
  // CUDA_ERROR_ILLEGAL_STATE; a pid not attached to the node CUDA_ERROR_INVALID_VALUE; this
  // process itself CUDA_ERROR_NOT_SUPPORTED.
  CUresult lock_process(std::int32_t pid);
  CUresult checkpoint_process(std::int32_t pid);
  CUresult restore_process(std::int32_t pid);
  CUresult unlock_process(std::int32_t pid);
  CUresult process_state(std::int32_t pid, CUprocessState& out);
  // Returns once this process is neither locked nor checkpointed (at once, one atomic load, while
  // no process on the node is).
  void wait_while_locked();
  // Bytes charged to `device` by live holders, and its capacity.
  void usage(int device, std::uint64_t& used, std::uint64_t& capacity);
  // This process stops using the node (at exit): drops its holds and its attachment, and
  // removes the shared-memory file when no live process and no allocation remain.
  void detach();

  int device_count() const { return device_count_; }
  std::uint64_t capacity() const { return capacity_; }

 private:
  Node(NodeState* state, int device_count, std::uint64_t capacity, ProcessId self, std::string shm_name,
       std::uint64_t dev, std::uint64_t ino, int fd);
  NodeState* state_;
  int device_count_;
  std::uint64_t capacity_;
  ProcessId self_;
  std::string shm_name_;
  std::uint64_t dev_;  // identity of the shm file, to unlink only the file we use
  std::uint64_t ino_;
  int fd_;  // the node file, open (O_CLOEXEC) while attached: /proc/<pid>/fd shows a GPU user
};

// The simulated machine as this process's environment describes it.
struct Config {
  std::string node = "default";                            // VLAKE_SIM_NODE
  int device_count = 1;                                    // VLAKE_SIM_DEVICE_COUNT
  std::uint64_t capacity = std::uint64_t{16} << 30;        // VLAKE_SIM_DEVICE_MEMORY
  std::uint64_t context_memory = 0;                        // VLAKE_SIM_CONTEXT_MEMORY
  bool peer_access = true;                                 // VLAKE_SIM_PEER_ACCESS (1 or 0)
  std::uint64_t host_capacity = std::uint64_t{64} << 30;   // VLAKE_SIM_HOST_MEMORY
  bool host_vmm = true;                                    // VLAKE_SIM_HOST_VMM (1 or 0)
  std::uint64_t link_bandwidth = std::uint64_t{25} << 30;  // VLAKE_SIM_LINK_BANDWIDTH, bytes/s; 0: unmodeled
  FileAccess access;                                       // VLAKE_SIM_NODE_MODE, VLAKE_SIM_NODE_GROUP
};
// Reads the VLAKE_SIM_* variables. On a bad value returns false and sets `error` to one line
// naming the variable (the callers print it with their own prefix).
bool read_config(Config& out, std::string& error);

// The file every attached process of node `node` keeps open: "/dev/shm/vlake-sim-<node>".
std::string device_file(const std::string& node);

// The thread id holding node `node`'s lock now, 0 when nobody does (or the node does not exist
// or has another layout). The real driver holds no lock of its own across a SIGSTOP; a test that
// stops a process uses this to stop it outside the simulator's lock, as a stop on a GPU would be.
std::int32_t node_lock_owner(const std::string& node);

// The UUID of device `ordinal` of node `node`: stable, derived from both (cuDeviceGetUuid_v2 and
// nvmlDeviceGetUUID report the same bytes).
std::array<unsigned char, 16> device_uuid(const std::string& node, int ordinal);

// What NVML reports: a node's devices, their usage and the bytes charged to each process.
struct ProcessCharge {
  std::int32_t pid = 0;
  std::uint64_t bytes = 0;
};
struct NodeSnapshot {
  int device_count = 0;
  std::uint64_t capacity = 0;
  bool in_use = false;  // a live process is attached or an allocation is live
  std::uint64_t used[rules::kMaxDevices] = {};
  // Per device: every process that has a primary context there (a context record), with the
  // bytes of the records it is first live holder of (its context included); sorted by pid.
  // Records whose first live holder has no context there count in used[] under no process.
  // Host-located records are in neither used[] nor processes.
  std::vector<std::vector<ProcessCharge>> processes;
  // Host-located memory: the node's bound (VLAKE_SIM_HOST_MEMORY), the bytes of its live records
  // (held, or kept by a descriptor), and per live process holding any, the bytes of the host
  // records it holds (every holder counts each record it holds; sorted by pid).
  std::uint64_t host_capacity = 0;
  std::uint64_t host_used = 0;
  std::vector<ProcessCharge> host_holders;
};

// Read access to a node without attaching to it (nothing is created, held or charged).
// Thread-safety: one NodeObserver per thread, or external locking.
class NodeObserver {
 public:
  explicit NodeObserver(std::string name);
  ~NodeObserver();
  NodeObserver(const NodeObserver&) = delete;
  NodeObserver& operator=(const NodeObserver&) = delete;
  // The node as it is now. False when it does not exist (no process has used it yet, or its
  // last user detached) or has another layout; then `out` is untouched.
  bool read(NodeSnapshot& out);

 private:
  void unmap();
  std::string shm_name_;
  ProcessId self_;
  NodeState* state_ = nullptr;
  std::uint64_t dev_ = 0;
  std::uint64_t ino_ = 0;
};

}  // namespace vlake::sim
