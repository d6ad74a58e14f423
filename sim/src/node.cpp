// The simulated machine (node.hpp): attaching to a node and detaching from it, the records of
// its allocations and contexts, process checkpoints, the VLAKE_SIM_* configuration and the
// devices' identities. The shared layout and its lock are node_state.hpp; reading a node
// without attaching (NodeObserver) is node_observer.cpp.
#include "node.hpp"

#include "node_state.hpp"
#include "rules.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "vlake/common/proc.hpp"
#include "vlake/common/size.hpp"

namespace vlake::sim {
using namespace node_internal;

namespace {

bool same(const ProcessId& a, const ProcessId& b) { return a.pid == b.pid && a.start_time == b.start_time; }

Swap* find_swap(NodeState* s, std::int32_t pid) {
  for (std::uint32_t i = 0; i < s->nswaps; ++i) {
    if (s->swaps[i].process.pid == pid) return &s->swaps[i];
  }
  return nullptr;
}

void erase_swap(NodeState* s, Swap* w) {
  *w = s->swaps[s->nswaps - 1];
  __atomic_store_n(&s->nswaps, s->nswaps - 1, __ATOMIC_RELEASE);
}

// A checkpoint step on process `pid`: under the node lock, step(w) on its checkpoint record w if
// that is in state `expected`, else CUDA_ERROR_ILLEGAL_STATE.
template <class Step>
CUresult checkpoint_step(NodeState* s, std::int32_t pid, CUprocessState expected, Step&& step) {
  Lock lock(s);
  Swap* w = find_swap(s, pid);
  if (w == nullptr || w->state != expected) return CUDA_ERROR_ILLEGAL_STATE;
  return step(w);
}

Record* find(NodeState* s, std::uint64_t dev, std::uint64_t ino) {
  for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
    Record& r = s->records[i];
    if (in_use(r) && r.dev == dev && r.ino == ino) return &r;
  }
  return nullptr;
}

Record* free_slot(NodeState* s) {
  for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
    if (!in_use(s->records[i])) return &s->records[i];
  }
  if (s->record_hwm < kMaxRecords) return &s->records[s->record_hwm++];
  return nullptr;
}

void shrink_hwm(NodeState* s) {
  while (s->record_hwm > 0 && !in_use(s->records[s->record_hwm - 1])) --s->record_hwm;
}

// Drops holder `idx` of `r`, keeping the others in order. When it was the last one, a context
// record is uncharged; an allocation stays charged as `fd_held` until a sweep finds no
// descriptor of it (an exported or received descriptor keeps the memory alive on the real
// driver: docs/driver.md).
void drop_holder(NodeState* s, Record& r, std::uint32_t idx) {
  if (r.swapped != 0) {  // its checkpointed holder is gone: account it as a held record again
    r.swapped = 0;
    s->used[r.device] += r.size;
  }
  if (idx == 0 && r.nholders > 1 && r.dev != kContextDev && r.creator_gone == 0) r.creator_gone = 1;
  for (std::uint32_t i = idx + 1; i < r.nholders; ++i) r.holders[i - 1] = r.holders[i];
  --r.nholders;
  if (r.nholders > 0) return;
  if (r.dev == kContextDev) {
    s->used[r.device] -= r.size;
  } else {
    r.fd_held = 1;
  }
}

using FileKey = std::pair<std::uint64_t, std::uint64_t>;  // (st_dev, st_ino)
struct OpenDescriptor {
  FileKey key;
  ProcessId process;
  bool operator<(const OpenDescriptor& o) const { return key < o.key; }
};

// The descriptors of `wanted` (sorted) that attached processes but `skip` have open, sorted by
// key: /proc/<pid>/fd of each attached process is read and each entry's target compared by
// (st_dev, st_ino). nullopt when a process's descriptors cannot be read (it may hold any of
// them). Only attached processes count: a descriptor passed to a process that never initialized
// the driver is not seen. Note that the simulator's own handles are descriptors of their memfd
// too: a holder's descriptors cannot be told from its handles.
std::optional<std::vector<OpenDescriptor>> open_descriptors(const NodeState* s, const std::vector<FileKey>& wanted,
                                                            const ProcessId* skip) {
  std::vector<OpenDescriptor> seen;
  for (std::uint32_t a = 0; a < s->nattached; ++a) {
    const ProcessId p = s->attached[a];
    if (skip != nullptr && same(p, *skip)) continue;
    const std::string dir = "/proc/" + std::to_string(p.pid) + "/fd";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno != ENOENT) return std::nullopt;
      continue;
    }
    const int dfd = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      struct stat st {};
      if (::fstatat(dfd, e->d_name, &st, 0) != 0) continue;
      const FileKey key{st.st_dev, st.st_ino};
      if (std::binary_search(wanted.begin(), wanted.end(), key)) seen.push_back({key, p});
    }
    ::closedir(d);
  }
  std::sort(seen.begin(), seen.end());
  return seen;
}

// open_descriptors() of the records `pick` selects; nullopt when it selects none too.
template <class Pick>
std::optional<std::vector<OpenDescriptor>> descriptors_of(const NodeState* s, Pick pick, const ProcessId* skip) {
  std::vector<FileKey> keys;
  for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
    const Record& r = s->records[i];
    if (pick(r)) keys.emplace_back(r.dev, r.ino);
  }
  if (keys.empty()) return std::nullopt;
  std::sort(keys.begin(), keys.end());
  return open_descriptors(s, keys, skip);
}

// Uncharges every fd_held record of which no attached process (but `skip`, a process about to
// close all of its descriptors) has a descriptor. While any process's descriptors cannot be
// read, every such record stays charged (it may hold one).
void sweep_fd_held(NodeState* s, const ProcessId* skip) {
  const auto seen = descriptors_of(
      s, [](const Record& r) { return r.nholders == 0 && r.fd_held != 0; }, skip);
  if (!seen) return;
  for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
    Record& r = s->records[i];
    if (r.nholders != 0 || r.fd_held == 0) continue;
    if (std::binary_search(seen->begin(), seen->end(), OpenDescriptor{{r.dev, r.ino}, {}})) continue;
    r.fd_held = 0;
    s->used[r.device] -= r.size;
  }
}

}  // namespace

// Clears `creator_gone` on every held record of which no attached process but its holders has a
// descriptor left: from then on NVML charges it to its first holder. A holder's descriptors are
// not counted (the simulator cannot tell them from its handles): a process that keeps both an
// imported handle and a descriptor is charged, where the real driver charges no one.
// Unreadable descriptors keep the mark.
void node_internal::settle_creator_gone(NodeState* s) {
  const auto seen = descriptors_of(
      s, [](const Record& r) { return r.nholders != 0 && r.creator_gone != 0; }, nullptr);
  if (!seen) return;
  for (std::uint32_t i = 0; i < s->record_hwm; ++i) {
    Record& r = s->records[i];
    if (r.nholders == 0 || r.creator_gone == 0) continue;
    const auto [first, last] = std::equal_range(seen->begin(), seen->end(), OpenDescriptor{{r.dev, r.ino}, {}});
    const bool other = std::any_of(first, last, [&](const OpenDescriptor& d) {
      return std::none_of(r.holders, r.holders + r.nholders, [&](const ProcessId& h) { return same(h, d.process); });
    });
    if (!other) r.creator_gone = 0;
  }
}

namespace {

// Which attached processes are alive, through a pidfd per process that this process opens once
// (and checks the start time of then): one poll() answers for all of them, where reading
// /proc/<pid>/stat of each would cost a file open per process and call. A pidfd is readable
// once its process has exited (a zombie included). Pidfds of processes no longer attached to the
// node asked about are closed. Thread-safe (a process may use several nodes).
class Liveness {
 public:
  std::vector<bool> alive(const NodeState* s, const ProcessId& self) {
    std::lock_guard lock(mu_);
    std::vector<bool> out(s->nattached, true);
    std::vector<pollfd> polls;
    std::vector<std::uint32_t> index;
    std::map<Key, int> keep;
    for (std::uint32_t a = 0; a < s->nattached; ++a) {
      const ProcessId p = s->attached[a];
      if (same(p, self)) continue;
      const Key k{p.pid, p.start_time};
      auto it = fds_.find(k);
      int fd = it != fds_.end() ? it->second : -1;
      if (it == fds_.end()) {
        fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(p.pid), 0));
        if (fd < 0 && errno != ESRCH) {
          out[a] = process_alive(p);  // no pidfd to be had (descriptor limit): read /proc
          continue;
        }
        if (fd >= 0 && !process_alive(p)) {  // the pid is another process now, or a zombie
          ::close(fd);
          fd = -1;
        }
        if (fd < 0) {
          out[a] = false;
          continue;
        }
      } else {
        fds_.erase(it);
      }
      keep.emplace(k, fd);
      polls.push_back(pollfd{fd, POLLIN, 0});
      index.push_back(a);
    }
    for (auto& [k, fd] : fds_) ::close(fd);  // not attached any more
    fds_ = std::move(keep);
    if (!polls.empty() && ::poll(polls.data(), polls.size(), 0) > 0) {
      for (std::size_t i = 0; i < polls.size(); ++i) {
        if ((polls[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) out[index[i]] = false;
      }
    }
    return out;
  }

 private:
  using Key = std::pair<std::int32_t, std::uint64_t>;
  std::mutex mu_;
  std::map<Key, int> fds_;
};
// Never destroyed: the library detaches (and purges) from exit handlers, after static destructors
// may have run.
Liveness& liveness() {
  static auto* l = new Liveness;
  return *l;
}

}  // namespace

// Removes dead attached processes and every hold they had.
void node_internal::purge_dead(NodeState* s, const ProcessId& self) {
  std::vector<ProcessId> dead;
  const std::vector<bool> alive = liveness().alive(s, self);
  std::uint32_t kept = 0;
  for (std::uint32_t a = 0; a < s->nattached; ++a) {
    if (alive[a]) {
      s->attached[kept++] = s->attached[a];
    } else {
      dead.push_back(s->attached[a]);
    }
  }
  s->nattached = kept;
  std::uint32_t live_swaps = 0;
  for (std::uint32_t i = 0; i < s->nswaps; ++i) {
    bool gone = false;
    for (const auto& d : dead) gone = gone || same(d, s->swaps[i].process);
    if (!gone) s->swaps[live_swaps++] = s->swaps[i];
  }
  __atomic_store_n(&s->nswaps, live_swaps, __ATOMIC_RELEASE);
  for (std::uint32_t i = 0; !dead.empty() && i < s->record_hwm; ++i) {
    Record& r = s->records[i];
    for (std::uint32_t h = 0; h < r.nholders;) {
      bool gone = false;
      for (const auto& d : dead) gone = gone || same(d, r.holders[h]);
      if (gone) {
        drop_holder(s, r, h);
      } else {
        ++h;
      }
    }
  }
  sweep_fd_held(s, nullptr);
  shrink_hwm(s);
}

namespace {

// A free record for a new allocation of `size` bytes on `device`, charged to the device, with
// no holder yet (the caller adds them); nullptr when the table is full even after the dead
// processes' records are purged.
Record* new_record(NodeState* s, const ProcessId& self, std::uint64_t dev, std::uint64_t ino, std::uint64_t size,
                   int device) {
  Record* r = free_slot(s);
  if (r == nullptr) {
    purge_dead(s, self);
    r = free_slot(s);
  }
  if (r == nullptr) return nullptr;
  r->dev = dev;
  r->ino = ino;
  r->size = size;
  r->device = device;
  r->nholders = 0;
  r->fd_held = 0;
  r->creator_gone = 0;
  r->swapped = 0;
  r->imported = 0;
  s->used[device] += size;
  return r;
}

void print_error(const std::string& msg) { std::fprintf(stderr, "vlake-sim: %s\n", msg.c_str()); }

std::string to_octal(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%03o", v);
  return buf;
}

}  // namespace

ProcessId current_process() {
  ProcessId p;
  p.pid = static_cast<std::int32_t>(::getpid());
  p.start_time = process_start_time(static_cast<std::uint32_t>(p.pid));
  return p;
}

bool process_alive(const ProcessId& p) {
  const std::optional<ProcStat> s = read_proc_stat(static_cast<std::uint32_t>(p.pid));
  if (!s || s->state == 'Z' || s->state == 'X' || s->state == 'x') return false;
  return s->start_time == p.start_time;
}

CUresult Node::attach(const std::string& name, int device_count, std::uint64_t capacity, std::uint64_t host_capacity,
                      const FileAccess& access, const ProcessId& self, std::unique_ptr<Node>& out) {
  const std::string shm_name = "/vlake-sim-" + name;
  const std::string path = "/dev/shm" + shm_name;
  // The whole attach runs under flock on the file, and so does the unlink of an unused node
  // (detach): a process never attaches to a file that is being removed, and never sees a
  // half-built state (a creator that died half-way left magic == 0: initialized again).
  int fd = -1;
  bool created = false;
  struct stat st {};
  for (int attempt = 0;; ++attempt) {
    // O_EXCL tells whether this process created the file (and so sets its mode and group).
    fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    created = fd >= 0;
    if (fd < 0 && errno == EEXIST) {
      fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0 && errno == ENOENT && attempt < 100) continue;  // removed meanwhile: create it
    }
    if (fd < 0) {
      const int err = errno;
      std::string msg = "cannot open the node state " + path + ": " + std::strerror(err);
      if (err == EACCES && ::stat(path.c_str(), &st) == 0) {
        msg += " (mode 0" + to_octal(st.st_mode & 0777) + ", owner uid " + std::to_string(st.st_uid) + ", group gid " +
               std::to_string(st.st_gid) +
               "; the process that created it sets VLAKE_SIM_NODE_MODE and VLAKE_SIM_NODE_GROUP, "
               "docs/simulator.md)";
      }
      print_error(msg);
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
    ::flock(fd, LOCK_EX);
    ::fstat(fd, &st);
    if (st.st_nlink > 0 || attempt >= 100) break;
    ::close(fd);  // unlinked by a detaching process meanwhile: open the new one
  }
  auto fail = [&](const std::string& msg, CUresult rc, void* mem) {
    if (!msg.empty()) print_error(msg);
    if (mem != nullptr) ::munmap(mem, sizeof(NodeState));
    if (created) ::shm_unlink(shm_name.c_str());  // under flock: a waiting opener sees it gone
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return rc;
  };
  // Exactly the configured mode (the umask does not narrow it) and group.
  int access_error = 0;
  if (created && ::fchmod(fd, static_cast<mode_t>(access.mode)) != 0) access_error = errno;
  if (created && access_error == 0 && access.gid >= 0 &&
      ::fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(access.gid)) != 0) {
    access_error = errno;
  }
  if (access_error != 0) {
    return fail("cannot give the node state " + path + " mode 0" + to_octal(access.mode) +
                    (access.gid >= 0 ? " and group " + std::to_string(access.gid) : std::string()) + ": " +
                    std::strerror(access_error) + " (VLAKE_SIM_NODE_MODE, VLAKE_SIM_NODE_GROUP)",
                CUDA_ERROR_OPERATING_SYSTEM, nullptr);
  }
  if (static_cast<std::size_t>(st.st_size) < sizeof(NodeState) &&
      ::ftruncate(fd, static_cast<off_t>(sizeof(NodeState))) != 0) {
    return fail("cannot size the node state " + path + ": " + std::strerror(errno), CUDA_ERROR_OPERATING_SYSTEM,
                nullptr);
  }
  void* mem = ::mmap(nullptr, sizeof(NodeState), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    return fail("cannot map the node state " + path + ": " + std::strerror(errno), CUDA_ERROR_OPERATING_SYSTEM,
                nullptr);
  }
  auto* s = static_cast<NodeState*>(mem);
  if (s->magic == 0) {
    std::memset(static_cast<void*>(s), 0, sizeof(NodeState));
    s->layout_version = kLayoutVersion;
    s->state_size = sizeof(NodeState);
    s->device_count = static_cast<std::uint32_t>(device_count);
    s->capacity = capacity;
    s->host_capacity = host_capacity;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    __atomic_store_n(&s->magic, kMagic, __ATOMIC_RELEASE);
  }
  if (s->magic != kMagic || s->layout_version != kLayoutVersion || s->state_size != sizeof(NodeState)) {
    return fail("node state " + path +
                    " has another layout (another vlake version?); remove the file when no "
                    "process uses node '" +
                    name + "'",
                CUDA_ERROR_INVALID_VALUE, mem);
  }
  std::string refusal;
  CUresult refusal_rc = CUDA_SUCCESS;
  {
    Lock lock(s);
    purge_dead(s, self);
    if (s->nattached == 0 && s->record_hwm == 0) {
      // Nobody uses the node: it takes the parameters of this process.
      s->device_count = static_cast<std::uint32_t>(device_count);
      s->capacity = capacity;
      s->host_capacity = host_capacity;
      for (auto& u : s->used) u = 0;
    }
    if (s->device_count != static_cast<std::uint32_t>(device_count) || s->capacity != capacity) {
      refusal = "node '" + name + "' is in use with VLAKE_SIM_DEVICE_COUNT=" + std::to_string(s->device_count) +
                " and VLAKE_SIM_DEVICE_MEMORY=" + std::to_string(s->capacity) + " bytes, but this process asks for " +
                std::to_string(device_count) + " device(s) of " + std::to_string(capacity) +
                " bytes; use the same values or another VLAKE_SIM_NODE";
      refusal_rc = CUDA_ERROR_INVALID_VALUE;
    } else if (s->nattached >= kMaxAttached) {
      refusal = "node '" + name + "' has too many attached processes (" + std::to_string(kMaxAttached) + ")";
      refusal_rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      s->attached[s->nattached++] = self;
    }
  }
  if (refusal_rc != CUDA_SUCCESS) return fail(refusal, refusal_rc, mem);
  ::flock(fd, LOCK_UN);
  // The descriptor stays open (O_CLOEXEC) while the process is attached: like an open of the
  // real driver's device files, it is how /proc/<pid>/fd shows a GPU user (docs/simulator.md).
  out.reset(new Node(s, device_count, capacity, self, shm_name, st.st_dev, st.st_ino, fd));
  return CUDA_SUCCESS;
}

Node::Node(NodeState* state, int device_count, std::uint64_t capacity, ProcessId self, std::string shm_name,
           std::uint64_t dev, std::uint64_t ino, int fd)
    : state_(state),
      device_count_(device_count),
      capacity_(capacity),
      self_(self),
      shm_name_(std::move(shm_name)),
      dev_(dev),
      ino_(ino),
      fd_(fd) {}

void Node::detach() {
  int fd = ::shm_open(shm_name_.c_str(), O_RDWR | O_CLOEXEC, 0);
  struct stat st {};
  const bool same_file = fd >= 0 && ::fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  if (same_file) ::flock(fd, LOCK_EX);
  bool unused = false;
  {
    Lock lock(state_);
    for (std::uint32_t i = 0; i < state_->record_hwm; ++i) {
      Record& r = state_->records[i];
      for (std::uint32_t h = 0; h < r.nholders; ++h) {
        if (same(r.holders[h], self_)) {
          drop_holder(state_, r, h);
          break;
        }
      }
    }
    shrink_hwm(state_);
    if (Swap* w = find_swap(state_, self_.pid); w != nullptr) erase_swap(state_, w);
    for (std::uint32_t i = 0; i < state_->nattached; ++i) {
      if (same(state_->attached[i], self_)) {
        state_->attached[i] = state_->attached[--state_->nattached];
        break;
      }
    }
    purge_dead(state_, self_);
    sweep_fd_held(state_, &self_);  // this process's descriptors close with it
    shrink_hwm(state_);
    unused = state_->nattached == 0 && state_->record_hwm == 0;
  }
  if (same_file && unused) ::shm_unlink(shm_name_.c_str());
  if (fd >= 0) {
    if (same_file) ::flock(fd, LOCK_UN);
    ::close(fd);
  }
  if (fd_ >= 0) ::close(fd_);  // no longer a user of the simulated GPUs
  fd_ = -1;
}

Node::~Node() {
  ::munmap(state_, sizeof(NodeState));
  if (fd_ >= 0) ::close(fd_);
}

CUresult Node::charge_new(std::uint64_t dev, std::uint64_t ino, std::uint64_t size, int device) {
  Lock lock(state_);
  const std::uint64_t limit = device == kHostLocation ? state_->host_capacity : state_->capacity;
  auto fits = [&] { return state_->used[device] <= limit && size <= limit - state_->used[device]; };
  // Purging reads /proc for every attached process (and their descriptors): only when the
  // answer depends on it, so that the lock every process shares is held for microseconds.
  if (!fits()) purge_dead(state_, self_);
  if (!fits()) return CUDA_ERROR_OUT_OF_MEMORY;
  Record* r = new_record(state_, self_, dev, ino, size, device);
  if (r == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  r->holders[0] = self_;
  r->nholders = 1;
  return CUDA_SUCCESS;
}

CUresult Node::hold(std::uint64_t dev, std::uint64_t ino, std::uint64_t size, int device) {
  Lock lock(state_);
  Record* r = find(state_, dev, ino);
  if (r != nullptr && r->nholders >= kMaxHolders) {
    purge_dead(state_, self_);  // dead holders may take the places
    r = find(state_, dev, ino);
  }
  if (r == nullptr) {
    r = new_record(state_, self_, dev, ino, size, device);
    if (r == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  } else if (r->swapped != 0) {
    // Imported from a checkpointed process's descriptor: the memory is needed on the device
    // again, and that process can no longer be restored (it shares it now).
    r->swapped = 0;
    state_->used[device] += size;
    if (Swap* w = find_swap(state_, r->holders[0].pid); w != nullptr) w->unsupported = 1;
  } else if (r->nholders == 0 && r->fd_held != 0) {
    r->creator_gone = 1;  // imported again from a kept descriptor: the creator is gone
  }
  r->fd_held = 0;  // held again (still charged once)
  r->imported = 1;
  for (std::uint32_t h = 0; h < r->nholders; ++h) {
    if (same(r->holders[h], self_)) return CUDA_SUCCESS;
  }
  if (r->nholders >= kMaxHolders) return CUDA_ERROR_OUT_OF_MEMORY;
  r->holders[r->nholders++] = self_;
  return CUDA_SUCCESS;
}

void Node::release(std::uint64_t dev, std::uint64_t ino) {
  Lock lock(state_);
  Record* r = find(state_, dev, ino);
  if (r == nullptr) return;
  for (std::uint32_t h = 0; h < r->nholders; ++h) {
    if (same(r->holders[h], self_)) {
      drop_holder(state_, *r, h);
      break;
    }
  }
  shrink_hwm(state_);
}

void Node::usage(int device, std::uint64_t& used, std::uint64_t& capacity) {
  Lock lock(state_);
  purge_dead(state_, self_);
  used = state_->used[device];
  capacity = state_->capacity;
}

CUresult Node::charge_context(int device, std::uint64_t bytes, std::uint32_t serial) {
  return charge_new(kContextDev, context_ino(self_.pid, device, serial), bytes, device);
}

void Node::release_context(int d, std::uint32_t serial) { release(kContextDev, context_ino(self_.pid, d, serial)); }

// ---- Process checkpoints --------------------------------------------------------------------

CUresult Node::lock_process(std::int32_t pid) {
  if (pid == self_.pid) return CUDA_ERROR_NOT_SUPPORTED;
  Lock lock(state_);
  purge_dead(state_, self_);
  const ProcessId* target = nullptr;
  for (std::uint32_t a = 0; a < state_->nattached; ++a) {
    if (state_->attached[a].pid == pid) target = &state_->attached[a];
  }
  if (target == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (find_swap(state_, pid) != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (state_->nswaps >= kMaxSwaps) return CUDA_ERROR_OUT_OF_MEMORY;
  state_->swaps[state_->nswaps] = Swap{*target, CU_PROCESS_STATE_LOCKED, 0};
  __atomic_store_n(&state_->nswaps, state_->nswaps + 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult Node::checkpoint_process(std::int32_t pid) {
  return checkpoint_step(state_, pid, CU_PROCESS_STATE_LOCKED, [&](Swap* w) -> CUresult {
    // Memory it alone holds goes to host memory (uncharged); its references to memory others hold
    // too are released, and then it cannot be restored (driver 580, docs/simulator.md).
    for (std::uint32_t i = 0; i < state_->record_hwm; ++i) {
      Record& r = state_->records[i];
      if (r.device == kHostLocation) continue;  // host memory already: it stays as it is
      for (std::uint32_t h = 0; h < r.nholders; ++h) {
        if (!same(r.holders[h], w->process)) continue;
        if (r.nholders == 1 && r.imported == 0 && r.swapped == 0) {
          r.swapped = 1;
          state_->used[r.device] -= r.size;
        } else if (r.swapped == 0) {
          w->unsupported = 1;
          drop_holder(state_, r, h);
        }
        break;
      }
    }
    shrink_hwm(state_);
    w->state = CU_PROCESS_STATE_CHECKPOINTED;
    return CUDA_SUCCESS;
  });
}

CUresult Node::restore_process(std::int32_t pid) {
  return checkpoint_step(state_, pid, CU_PROCESS_STATE_CHECKPOINTED, [&](Swap* w) -> CUresult {
    if (w->unsupported == 1) return CUDA_ERROR_NOT_SUPPORTED;
    if (w->unsupported == 2) return CUDA_ERROR_OPERATING_SYSTEM;
    auto swapped_out = [&](const Record& r) {
      return r.swapped != 0 && r.nholders > 0 && same(r.holders[0], w->process);
    };
    auto needed = [&] {
      std::array<std::uint64_t, rules::kMaxDevices> need{};
      for (std::uint32_t i = 0; i < state_->record_hwm; ++i) {
        if (swapped_out(state_->records[i])) need[state_->records[i].device] += state_->records[i].size;
      }
      return need;
    };
    auto fits = [&](const std::array<std::uint64_t, rules::kMaxDevices>& need) {
      for (int d = 0; d < rules::kMaxDevices; ++d) {
        if (state_->used[d] > state_->capacity || need[d] > state_->capacity - state_->used[d]) return false;
      }
      return true;
    };
    if (!fits(needed())) purge_dead(state_, self_);
    w = find_swap(state_, pid);
    if (w == nullptr) return CUDA_ERROR_ILLEGAL_STATE;  // it died meanwhile
    if (!fits(needed())) {
      w->unsupported = 2;  // stays checkpointed, and cannot be restored any more
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (std::uint32_t i = 0; i < state_->record_hwm; ++i) {
      Record& r = state_->records[i];
      if (!swapped_out(r)) continue;
      r.swapped = 0;
      state_->used[r.device] += r.size;
    }
    w->state = CU_PROCESS_STATE_LOCKED;
    return CUDA_SUCCESS;
  });
}

CUresult Node::unlock_process(std::int32_t pid) {
  return checkpoint_step(state_, pid, CU_PROCESS_STATE_LOCKED, [&](Swap* w) -> CUresult {
    erase_swap(state_, w);
    return CUDA_SUCCESS;
  });
}

CUresult Node::process_state(std::int32_t pid, CUprocessState& out) {
  Lock lock(state_);
  purge_dead(state_, self_);
  bool attached = false;
  for (std::uint32_t a = 0; a < state_->nattached; ++a) attached = attached || state_->attached[a].pid == pid;
  if (!attached) return CUDA_ERROR_INVALID_VALUE;
  const Swap* w = find_swap(state_, pid);
  out = w == nullptr ? CU_PROCESS_STATE_RUNNING : static_cast<CUprocessState>(w->state);
  return CUDA_SUCCESS;
}

void Node::wait_while_locked() {
  if (__atomic_load_n(&state_->nswaps, __ATOMIC_ACQUIRE) == 0) return;
  for (;;) {
    {
      Lock lock(state_);
      const Swap* w = find_swap(state_, self_.pid);
      if (w == nullptr || !same(w->process, self_)) return;
    }
    ::usleep(1000);
  }
}

bool read_config(Config& out, std::string& error) {
  Config c;
  if (const char* mem = std::getenv("VLAKE_SIM_DEVICE_MEMORY"); mem != nullptr) {
    try {
      c.capacity = parse_size(mem, Bytes{rules::kGranularity}, Bytes{~std::uint64_t{0}}).value();
    } catch (const SizeError& e) {
      error = std::string("VLAKE_SIM_DEVICE_MEMORY=") + e.what();
      return false;
    }
  }
  if (const char* n = std::getenv("VLAKE_SIM_DEVICE_COUNT"); n != nullptr) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(n, &end, 10);
    if (errno != 0 || end == n || *end != '\0' || v < 1 || v > rules::kMaxDevices) {
      error = std::string("VLAKE_SIM_DEVICE_COUNT='") + n + "' is not a device count (1.." +
              std::to_string(rules::kMaxDevices) + ")";
      return false;
    }
    c.device_count = static_cast<int>(v);
  }
  if (const char* n = std::getenv("VLAKE_SIM_NODE"); n != nullptr) c.node = n;
  const bool node_ok =
      !c.node.empty() && c.node.size() <= 100 && std::all_of(c.node.begin(), c.node.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
               ch == '_' || ch == '-';
      });
  if (!node_ok) {
    error = "VLAKE_SIM_NODE='" + c.node + "' is not a node name (1..100 of [A-Za-z0-9._-])";
    return false;
  }
  if (const char* m = std::getenv("VLAKE_SIM_CONTEXT_MEMORY"); m != nullptr) {
    try {
      c.context_memory = parse_size(m).value();
    } catch (const SizeError& e) {
      error = std::string("VLAKE_SIM_CONTEXT_MEMORY=") + e.what();
      return false;
    }
  }
  if (const char* v = std::getenv("VLAKE_SIM_PEER_ACCESS"); v != nullptr) {
    if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) {
      error = std::string("VLAKE_SIM_PEER_ACCESS='") + v + "' is not 0 or 1";
      return false;
    }
    c.peer_access = v[0] == '1';
  }
  if (const char* m = std::getenv("VLAKE_SIM_HOST_MEMORY"); m != nullptr) {
    try {
      c.host_capacity = parse_size(m).value();
    } catch (const SizeError& e) {
      error = std::string("VLAKE_SIM_HOST_MEMORY=") + e.what();
      return false;
    }
  }
  if (const char* v = std::getenv("VLAKE_SIM_HOST_VMM"); v != nullptr) {
    if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) {
      error = std::string("VLAKE_SIM_HOST_VMM='") + v + "' is not 0 or 1";
      return false;
    }
    c.host_vmm = v[0] == '1';
  }
  if (const char* b = std::getenv("VLAKE_SIM_LINK_BANDWIDTH"); b != nullptr) {
    try {
      c.link_bandwidth = parse_size(b).value();  // bytes per second
    } catch (const SizeError& e) {
      error = std::string("VLAKE_SIM_LINK_BANDWIDTH=") + e.what();
      return false;
    }
  }
  if (const char* v = std::getenv("VLAKE_SIM_NODE_MODE"); v != nullptr) {
    // 3 or 4 octal digits; read-write bits only, the owner's both.
    const std::size_t n = std::strlen(v);
    bool octal = n >= 3 && n <= 4;
    for (std::size_t i = 0; i < n; ++i) octal = octal && v[i] >= '0' && v[i] <= '7';
    const unsigned mode = octal ? static_cast<unsigned>(std::strtoul(v, nullptr, 8)) : 07777;
    if ((mode & ~0666u) != 0 || (mode & 0600u) != 0600u) {
      error = std::string("VLAKE_SIM_NODE_MODE='") + v +
              "' is not an octal mode of read-write bits with the owner's both (0600, 0660, 0666, ...)";
      return false;
    }
    c.access.mode = mode;
  }
  if (const char* v = std::getenv("VLAKE_SIM_NODE_GROUP"); v != nullptr) {
    char* end = nullptr;
    errno = 0;
    const long gid = std::strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || *v < '0' || *v > '9' || gid > 0xfffffffeL) {
      error = std::string("VLAKE_SIM_NODE_GROUP='") + v + "' is not a numeric gid";
      return false;
    }
    c.access.gid = gid;
  }
  out = c;
  return true;
}

namespace {
std::uint64_t fnv1a(std::uint64_t h, std::string_view s) {
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return h;
}
}  // namespace

std::string device_file(const std::string& node) { return "/dev/shm/vlake-sim-" + node; }

std::int32_t node_lock_owner(const std::string& node) {
  const int fd = ::shm_open(("/vlake-sim-" + node).c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct stat st {};
  void* mem = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= sizeof(NodeState)) {
    mem = ::mmap(nullptr, sizeof(NodeState), PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (mem == MAP_FAILED) return 0;
  const auto* s = static_cast<const NodeState*>(mem);
  std::int32_t owner = 0;
  if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) == kMagic && s->layout_version == kLayoutVersion) {
    // A robust mutex's futex word is its owner's thread id (plus the waiters and owner-died bits).
    const auto* word = reinterpret_cast<const std::int32_t*>(&s->mutex);
    owner = __atomic_load_n(word, __ATOMIC_ACQUIRE) & 0x3fffffff;  // FUTEX_TID_MASK
  }
  ::munmap(mem, sizeof(NodeState));
  return owner;
}

std::array<unsigned char, 16> device_uuid(const std::string& node, int ordinal) {
  const std::string key = node + "/" + std::to_string(ordinal);
  const std::uint64_t a = fnv1a(0xcbf29ce484222325ULL, key);
  const std::uint64_t b = fnv1a(a ^ 0x9e3779b97f4a7c15ULL, key);
  std::array<unsigned char, 16> u{};
  for (int i = 0; i < 8; ++i) {
    u[static_cast<std::size_t>(i)] = static_cast<unsigned char>((a >> (8 * i)) & 0xff);
    u[static_cast<std::size_t>(8 + i)] = static_cast<unsigned char>((b >> (8 * i)) & 0xff);
  }
  u[6] = static_cast<unsigned char>((u[6] & 0x0f) | 0x50);  // version 5 style
  u[8] = static_cast<unsigned char>((u[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return u;
}

}  // namespace vlake::sim
