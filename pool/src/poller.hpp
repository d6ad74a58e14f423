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
  listen = 1,
  signal = 2,
  timer = 3,
  conn = 4,
  pidfd = 5,
  config_watch = 6,
  config_settle = 7,
  park = 8,
  config_result = 9,  // the quota file reader finished (ConfigWatch)
  hello = 10,         // the Hello deadline of connections that have not said Hello
  builds = 11,        // the HandleBuilder finished a warm reserve or stock handle (eventfd)
  swaps = 12,         // the Swapper finished a checkpoint or restore (eventfd)
  alloc_listen = 20,  // Kubernetes allocations (--alloc-root): their sockets,
  alloc_watch = 21,   // the directory watch,
  alloc_timer = 22,   // the periodic rescan
};

class Poller {
 public:
  Poller() : fd_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (!fd_) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  }
  static std::uint64_t token(Source k, std::uint64_t serial) { return (static_cast<std::uint64_t>(k) << 56) | serial; }
  static Source source_of(std::uint64_t t) { return static_cast<Source>(t >> 56); }
  static std::uint64_t serial_of(std::uint64_t t) { return t & ((1ULL << 56) - 1); }

  void add(int fd, Source k, std::uint64_t serial) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = token(k, serial);
    if (::epoll_ctl(fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw std::system_error(errno, std::generic_category(), "epoll_ctl");
    }
  }
  void del(int fd) noexcept { ::epoll_ctl(fd_.get(), EPOLL_CTL_DEL, fd, nullptr); }
  // Also reports `fd` writable (EPOLLOUT) while `on`: a connection with replies waiting.
  void watch_writable(int fd, Source k, std::uint64_t serial, bool on) {
    epoll_event ev{};
    ev.events = EPOLLIN | (on ? EPOLLOUT : 0u);
    ev.data.u64 = token(k, serial);
    if (::epoll_ctl(fd_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) {
      throw std::system_error(errno, std::generic_category(), "epoll_ctl");
    }
  }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

 private:
  UniqueFd fd_;
};

}  // namespace vlake::pool
