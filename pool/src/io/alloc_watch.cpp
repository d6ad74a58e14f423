#include "alloc_watch.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "vlake/common/proc.hpp"

namespace vlake::pool {

namespace {
[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}
}  // namespace

// The worker's side: what it found, handed to the loop through `event`. A worker still
// running when the AllocWatch goes keeps this alive until it finishes.
struct AllocWatch::Shared {
  std::mutex mutex;
  std::optional<Scan> result;  // guarded by mutex
  UniqueFd event;              // eventfd: written once per finished scan
};

void AllocWatch::start(Poller& poller, Node& node, std::chrono::milliseconds interval) {
  mkdir_p(root_);
  inotify_.reset(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!inotify_) throw std::runtime_error(std::string("inotify_init1: ") + std::strerror(errno));
  const int wd = ::inotify_add_watch(inotify_.get(), root_.c_str(),
                                     IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF);
  if (wd < 0) throw std::runtime_error("inotify on " + root_ + ": " + std::strerror(errno));
  // The plugin's records (owner changes, sealed older allocations) come and go here.
  const std::string records = alloc::records_dir(root_);
  mkdir_p(records);
  if (::inotify_add_watch(inotify_.get(), records.c_str(),
                          IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM | IN_DELETE_SELF) < 0) {
    log_.warn("inotify on " + records + ": " + std::strerror(errno) + " (rescanned every interval)");
  }
  poller.add(inotify_.get(), Source::alloc_watch, 0);
  timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_) throw std::runtime_error(std::string("timerfd_create: ") + std::strerror(errno));
  itimerspec its{};
  const auto ms = interval.count();
  its.it_interval.tv_sec = ms / 1000;
  its.it_interval.tv_nsec = (ms % 1000) * 1'000'000;
  its.it_value = its.it_interval;
  ::timerfd_settime(timer_.get(), 0, &its, nullptr);
  poller.add(timer_.get(), Source::alloc_timer, 0);
  shared_->event.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!shared_->event) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  poller.add(shared_->event.get(), Source::alloc_scan, 0);
  log_.info("serving Kubernetes allocations under " + root_);
  rescan(poller, node);
}

void AllocWatch::on_watch() {
  alignas(inotify_event) char buf[8192];
  while (::read(inotify_.get(), buf, sizeof buf) > 0) {
  }
  request();
}

void AllocWatch::on_timer() {
  std::uint64_t expirations = 0;
  (void)!::read(timer_.get(), &expirations, sizeof expirations);
  request();
}

std::pair<int, std::string> AllocWatch::listener(std::uint64_t serial) const {
  auto it = serials_.find(serial);
  if (it == serials_.end()) return {-1, std::string()};
  return {entries_.at(it->second).fd.get(), it->second};
}

void AllocWatch::close(Poller& poller, Entry& e) {
  if (e.fd) {
    poller.del(e.fd.get());
    e.fd.reset();
  }
  serials_.erase(e.serial);
  owners_.erase(e.id);
}

void AllocWatch::warn(const std::string& id, const std::string& msg) {
  limited_.warn("allocation " + id, "allocation " + id + ": " + msg, std::chrono::steady_clock::now());
}

AllocWatch::AllocWatch(std::string root, const Logger& log)
    : root_(std::move(root)), log_(log), shared_(std::make_shared<Shared>()) {}

AllocWatch::~AllocWatch() = default;

AllocWatch::Scan AllocWatch::scan(const std::string& root) {
  Scan out;
  std::vector<std::string> ids;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) {
    out.root_error = std::strerror(errno);
    return out;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string id = e->d_name;
    if (alloc::valid_id(id)) ids.push_back(id);
  }
  ::closedir(d);
  // Only the plugin's records are read (never a file inside the directory, which is mounted
  // into the container); each read is bounded (alloc::read_bounded).
  for (const std::string& id : ids) {
    Found& f = out.found[id];
    try {
      f.allocation = alloc::read_allocation_record(root, id);
      if (f.allocation) f.owner = alloc::read_owner_record(root, id);
    } catch (const std::exception& e) {
      f.error = e.what();
    }
  }
  return out;
}

void AllocWatch::rescan(Poller& poller, Node& node) { apply(poller, node, scan(root_)); }

void AllocWatch::request() {
  if (busy_) {
    queued_ = true;
    return;
  }
  busy_ = true;
  std::thread([shared = shared_, root = root_] {
    Scan s;
    try {
      s = scan(root);
    } catch (const std::exception& e) {  // std::bad_alloc
      s.root_error = e.what();
    }
    {
      std::lock_guard lock(shared->mutex);
      shared->result = std::move(s);
    }
    const std::uint64_t one = 1;
    (void)!::write(shared->event.get(), &one, sizeof one);
  }).detach();
}

void AllocWatch::on_scanned(Poller& poller, Node& node) {
  std::uint64_t count = 0;
  (void)!::read(shared_->event.get(), &count, sizeof count);
  std::optional<Scan> s;
  {
    std::lock_guard lock(shared_->mutex);
    s.swap(shared_->result);
  }
  if (!s) return;
  busy_ = false;
  apply(poller, node, *s);
  if (queued_) {
    queued_ = false;
    request();
  }
}

void AllocWatch::apply(Poller& poller, Node& node, const Scan& s) {
  if (!s.root_error.empty()) {
    if (!root_warned_) log_.warn("cannot read " + root_ + ": " + s.root_error);
    root_warned_ = true;
  } else {
    root_warned_ = false;
  }
  // Gone: close the socket. Sessions opened through it keep their tenant until they end.
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (s.found.count(it->first) == 0) {
      log_.info("allocation " + it->first + " removed: its socket is closed");
      close(poller, it->second);
      node.allocation_removed(it->first);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [id, f] : s.found) {
    if (!f.error.empty()) {
      warn(id, f.error);
      continue;
    }
    if (!f.allocation) continue;  // being written, or an older layout not sealed yet: a later event brings it
    try {
      if (entries_.count(id) != 0) {
        if (f.owner && f.owner != owners_[id]) {
          owners_[id] = f.owner;
          node.allocation_owner(id, *f.owner);
        }
        continue;
      }
      add(poller, node, *f.allocation, f.owner, root_ + "/" + id);
    } catch (const std::exception& e) {
      warn(id, e.what());
    }
  }
}

void AllocWatch::add(Poller& poller, Node& node, const alloc::Allocation& info,
                     const std::optional<alloc::Owner>& owner, const std::string& dir) {
  const std::string& id = info.id;
  const auto uuid = Uuid::parse(info.gpu_uuid);
  const Node::Device* dev = uuid ? node.device_by_uuid(uuid->data()) : nullptr;
  if (dev == nullptr) {
    warn(id, "GPU " + info.gpu_uuid + " is not on this node");
    return;
  }
  AllocationInfo a;
  a.id = id;
  a.device = dev->ordinal;
  a.bytes = info.bytes;
  a.owner = owner;
  Entry e;
  e.id = id;
  const std::string path = dir + "/" + alloc::kSocketFile;
  e.fd.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!e.fd) throw_errno("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) throw std::runtime_error("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());  // left by an earlier vlaked
  if (::bind(e.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw_errno("bind " + path);
  // The directory mount is the access control. An older layout's directory is writable by its
  // pod: never follow a link put in the socket's place.
  ::fchmodat(AT_FDCWD, path.c_str(), 0666, AT_SYMLINK_NOFOLLOW);
  if (::listen(e.fd.get(), 128) != 0) throw_errno("listen " + path);
  e.serial = next_serial_++;
  poller.add(e.fd.get(), Source::alloc_listen, e.serial);
  serials_[e.serial] = id;
  owners_[id] = a.owner;
  log_.info("allocation " + id + ": " + alloc::tenant_name(id, a.owner) + ", " + std::to_string(a.bytes.value()) +
            " bytes on GPU " + std::to_string(a.device.value()) + ", socket " + path);
  entries_.emplace(id, std::move(e));
  node.allocation_added(a);
}

}  // namespace vlake::pool
