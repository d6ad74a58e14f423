// Reading a simulated node without attaching to it (NodeObserver, node.hpp): the snapshot of
// devices, usage and per-process charges that the simulated NVML reports.
#include "node.hpp"

#include "node_state.hpp"
#include "rules.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vlake::sim {

using namespace node_internal;

NodeObserver::NodeObserver(std::string name) : shm_name_("/vlake-sim-" + std::move(name)), self_(current_process()) {}

NodeObserver::~NodeObserver() { unmap(); }

void NodeObserver::unmap() {
  if (state_ != nullptr) ::munmap(state_, sizeof(NodeState));
  state_ = nullptr;
}

bool NodeObserver::read(NodeSnapshot& out) {
  // The file may have been removed (and another created) since the last read: map the current
  // one. No flock: a node being created has magic 0 (skipped); one being removed is unused.
  const int fd = ::shm_open(shm_name_.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    unmap();
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(NodeState)) {
    ::close(fd);
    unmap();
    return false;
  }
  if (state_ == nullptr || st.st_dev != dev_ || st.st_ino != ino_) {
    unmap();
    void* mem = ::mmap(nullptr, sizeof(NodeState), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
      ::close(fd);
      return false;
    }
    state_ = static_cast<NodeState*>(mem);
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
  ::close(fd);
  NodeState* s = state_;
  if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != kMagic || s->layout_version != kLayoutVersion ||
      s->state_size != sizeof(NodeState)) {
    return false;
  }
  NodeSnapshot snap;
  {
    Lock lock(s);
    purge_dead(s, self_);
    snap.device_count = static_cast<int>(std::min<std::uint32_t>(s->device_count, rules::kMaxDevices));
    snap.capacity = s->capacity;
    snap.in_use = s->nattached > 0 || s->record_hwm > 0;
    for (int d = 0; d < rules::kMaxDevices; ++d) snap.used[d] = s->used[d];
    settle_creator_gone(s);
    std::vector<std::map<std::int32_t, std::uint64_t>> charges(static_cast<std::size_t>(snap.device_count));
    // NVML lists only processes with a primary context on the device (measured on the H100: a
    // process that creates memory without a context is not listed, its memory is in `used`).
    for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
      const Record& r = s->records[i];
      if (r.nholders == 0 || r.swapped != 0 || r.dev != kContextDev || r.device < 0 || r.device >= snap.device_count) {
        continue;
      }
      charges[static_cast<std::size_t>(r.device)].emplace(r.holders[0].pid, 0);
    }
    for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
      const Record& r = s->records[i];
      // A record held only through descriptors, whose creator let go while a descriptor is
      // open, or whose first live holder has no context on its device, is charged to the
      // device and to no process.
      if (r.nholders == 0 || r.swapped != 0 || r.creator_gone != 0 || r.device < 0 || r.device >= snap.device_count) {
        continue;
      }
      auto& dev = charges[static_cast<std::size_t>(r.device)];
      if (auto it = dev.find(r.holders[0].pid); it != dev.end()) it->second += r.size;
    }
    snap.processes.resize(charges.size());
    for (std::size_t d = 0; d < charges.size(); ++d) {
      for (const auto& [pid, bytes] : charges[d]) snap.processes[d].push_back({pid, bytes});
    }
    // Host-located memory: in no device's figures; every live holder of a record holds its bytes.
    snap.host_capacity = s->host_capacity;
    snap.host_used = s->used[kHostLocation];
    std::map<std::int32_t, std::uint64_t> host;
    for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
      const Record& r = s->records[i];
      if (r.device != kHostLocation) continue;
      for (std::uint32_t h = 0; h < r.nholders; ++h) host[r.holders[h].pid] += r.size;
    }
    for (const auto& [pid, bytes] : host) snap.host_holders.push_back({pid, bytes});
  }
  out = std::move(snap);
  return true;
}

}  // namespace vlake::sim
