#include "alloc_watch.hpp"

#include <dirent.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <system_error>

#include "vlake/common/proc.hpp"

namespace vlake::pool {

namespace {
[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}
}  // namespace

void AllocWatch::start(Poller& poller, Node& node, std::chrono::milliseconds interval) {
  mkdir_p(root_);
  inotify_.reset(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!inotify_) throw std::runtime_error(std::string("inotify_init1: ") + std::strerror(errno));
  const int wd = ::inotify_add_watch(inotify_.get(), root_.c_str(),
                                     IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF);
  if (wd < 0) throw std::runtime_error("inotify on " + root_ + ": " + std::strerror(errno));
  watches_[wd] = std::string();
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
  log_.info("serving Kubernetes allocations under " + root_);
  rescan(poller, node);
}

void AllocWatch::on_watch(Poller& poller, Node& node) {
  alignas(inotify_event) char buf[8192];
  while (::read(inotify_.get(), buf, sizeof buf) > 0) {
  }
  rescan(poller, node);
}

void AllocWatch::on_timer(Poller& poller, Node& node) {
  std::uint64_t expirations = 0;
  (void)!::read(timer_.get(), &expirations, sizeof expirations);
  rescan(poller, node);
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
  for (auto it = watches_.begin(); it != watches_.end();) {
    if (it->second == e.id) {
      ::inotify_rm_watch(inotify_.get(), it->first);
      it = watches_.erase(it);
    } else {
      ++it;
    }
  }
}

void AllocWatch::rescan(Poller& poller, Node& node) {
  std::set<std::string> seen;
  DIR* d = ::opendir(root_.c_str());
  if (d == nullptr) {
    if (!root_warned_) log_.warn("cannot read " + root_ + ": " + std::strerror(errno));
    root_warned_ = true;
  } else {
    root_warned_ = false;
    while (const dirent* e = ::readdir(d)) {
      const std::string id = e->d_name;
      if (alloc::valid_id(id)) seen.insert(id);
    }
    ::closedir(d);
  }
  // Gone: close the socket. Sessions opened through it keep their tenant until they end.
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (seen.count(it->first) == 0) {
      log_.info("allocation " + it->first + " removed: its socket is closed");
      close(poller, it->second);
      node.allocation_removed(it->first);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& id : seen) {
    const std::string dir = root_ + "/" + id;
    try {
      if (entries_.count(id) != 0) {
        std::optional<alloc::Owner> owner = alloc::read_owner(dir);
        if (owner && owner != owners_[id]) {
          owners_[id] = owner;
          node.allocation_owner(id, *owner);
        }
        continue;
      }
      add(poller, node, id, dir);
    } catch (const std::exception& e) {
      log_.warn("allocation " + id + ": " + e.what());
    }
  }
}

void AllocWatch::add(Poller& poller, Node& node, const std::string& id, const std::string& dir) {
  const std::optional<alloc::Allocation> info = alloc::read_allocation(dir);
  if (!info) return;  // being written: the rename brings another event
  const auto uuid = Uuid::parse(info->gpu_uuid);
  const Node::Device* dev = uuid ? node.device_by_uuid(uuid->data()) : nullptr;
  if (dev == nullptr) {
    log_.warn("allocation " + id + ": GPU " + info->gpu_uuid + " is not on this node");
    return;
  }
  AllocationInfo a;
  a.id = id;
  a.device = dev->ordinal;
  a.bytes = info->bytes;
  a.owner = alloc::read_owner(dir);
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
  ::chmod(path.c_str(), 0666);  // the directory mount is the access control
  if (::listen(e.fd.get(), 128) != 0) throw_errno("listen " + path);
  e.serial = next_serial_++;
  poller.add(e.fd.get(), Source::alloc_listen, e.serial);
  const int wd = ::inotify_add_watch(inotify_.get(), dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE);
  if (wd >= 0) watches_[wd] = id;
  serials_[e.serial] = id;
  owners_[id] = a.owner;
  log_.info("allocation " + id + ": " + alloc::tenant_name(id, a.owner) + ", " + std::to_string(a.bytes.value()) +
            " bytes on GPU " + std::to_string(a.device.value()) + ", socket " + path);
  entries_.emplace(id, std::move(e));
  node.allocation_added(a);
}

}  // namespace vlake::pool
