// vlake::pool::Poller — the daemon's epoll set and the tokens of its events (internal).
//
// A token is the event's source kind in the top byte and a never-reused serial below.
// add() throws std::system_error; del() never throws. Thread-safety: none (the event loop).
#pragma once

#include <sys/epoll.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

#include "vlake/common/unique_fd.hpp"

namespace vlake::pool {

enum class Source : std::uint64_t {
  listen = 1,         // the node socket: a connection to accept
  signal = 2,         // the signalfd (SIGTERM, SIGINT, SIGHUP)
  timer = 3,          // the periodic tick (NVML sample, safety nets)
  conn = 4,           // a client connection (serial: its ConnId)
  pidfd = 5,          // a session's process exited (serial: the session)
  config_watch = 6,   // inotify on the quota file's directory (ConfigWatch)
  config_settle = 7,  // the quota file held still long enough to be read
  park = 8,           // the earliest deadline of the Node's parked grants
  config_result = 9,  // the quota file reader finished (ConfigWatch)
  hello = 10,         // the Hello deadline of connections that have not said Hello
  builds = 11,        // the HandleBuilder finished a warm reserve or stock handle (eventfd)
  swaps = 12,         // the Swapper finished a checkpoint or restore (eventfd)
  host_builds = 19,   // the HostBuilder made a host tier piece (eventfd)
  alloc_listen = 20,  // Kubernetes allocations (--alloc-root): their sockets,
  alloc_watch = 21,   // the directory watch,
  alloc_timer = 22,   // the periodic rescan,
  alloc_scan = 23,    // a scan finished off the loop (eventfd)
};

class Poller {
 public:
  Poller() : fd_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (!fd_) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  }
  static std::uint64_t token(Source k, std::uint64_t serial) { return (static_cast<std::uint64_t>(k) << 56) | serial; }
  static Source source_of(std::uint64_t t) { return static_cast<Source>(t >> 56); }
  static std::uint64_t serial_of(std::uint64_t t) { return t & ((1ULL << 56) - 1); }

  void add(int fd, Source k, std::uint64_t serial) { ctl(EPOLL_CTL_ADD, fd, EPOLLIN, token(k, serial)); }
  void del(int fd) noexcept { ::epoll_ctl(fd_.get(), EPOLL_CTL_DEL, fd, nullptr); }
  // Also reports `fd` writable (EPOLLOUT) while `on`: a connection with replies waiting.
  void watch_writable(int fd, Source k, std::uint64_t serial, bool on) {
    ctl(EPOLL_CTL_MOD, fd, EPOLLIN | (on ? EPOLLOUT : 0u), token(k, serial));
  }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

 private:
  void ctl(int op, int fd, std::uint32_t events, std::uint64_t data) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    if (::epoll_ctl(fd_.get(), op, fd, &ev) != 0) throw std::system_error(errno, std::generic_category(), "epoll_ctl");
  }

  UniqueFd fd_;
};

}  // namespace vlake::pool
