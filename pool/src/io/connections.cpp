// vlaked's connections (Daemon::Impl, daemon_impl.hpp): accepting them on the node socket and
// on allocation sockets (the peer's SO_PEERCRED, the per-uid and awaiting-Hello caps of
// ConnLimits, conn_limits.hpp; at the awaiting-Hello total, the oldest silent connection of the
// peer holding the most is closed for a newcomer), running out of descriptors without a busy loop, the Hello
// deadline, and closing a connection (its queued grants undone, its session told).
//
// A refused connection is closed at once, nothing read from it nor sent; refusals are counted
// in the state segment and logged through the Node's rate limiter. Never throws but what
// Poller::add() throws (the loop logs it).
#include <fcntl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "daemon_impl.hpp"
#include "process_control.hpp"

namespace vlake::pool {

UniqueFd Daemon::Impl::open_reserve_fd() { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

void Daemon::Impl::on_accept(int listen_fd, const std::string& alloc_id, Source src, std::uint64_t src_serial) {
  // A bounded batch per event, so that a connection flood cannot starve the other sources.
  for (int batch = 0; batch < 256; ++batch) {
    UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && accept_without_descriptors(listen_fd, errno, src, src_serial))
        continue;
      node_->log_limiter().warn("accept", std::string("accept: ") + std::strerror(errno),
                                std::chrono::steady_clock::now());
      return;
    }
    const auto t = std::chrono::steady_clock::now();
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      node_->log_limiter().warn("accept", std::string("SO_PEERCRED: ") + std::strerror(errno), t);
      continue;
    }
    const ConnId serial = next_conn_++;
    const std::string peer = ConnLimits::peer_of(cred.uid, alloc_id);
    const ConnLimits::Admit admit = conn_limits_.admit(serial, peer, t);
    if (admit != ConnLimits::Admit::ok) {
      // Closed at once: nothing is read from it, nothing is sent.
      if (admit == ConnLimits::Admit::peer_cap) node_->count_connection_cap();
      else node_->count_unauthenticated();
      node_->log_limiter().warn(
          "connection refused " + peer,
          "connection from pid " + std::to_string(cred.pid) + " closed: " + conn_limits_.describe(admit, peer), t);
      continue;
    }
    // Silent connections of the peer holding the most of them made room for this one.
    for (const std::uint64_t old : conn_limits_.take_evicted()) {
      auto it = conns_.find(old);
      if (it == conns_.end()) continue;
      node_->count_unauthenticated();
      node_->log_limiter().warn("evicted uid " + std::to_string(it->second.uid),
                                "connection " + std::to_string(old) + " (pid " + std::to_string(it->second.pid) +
                                    ", uid " + std::to_string(it->second.uid) +
                                    ") closed before its Hello: the unauthenticated table is full (vlaked "
                                    "--max-unauthenticated) and its peer holds the most connections awaiting Hello",
                                t);
      close_connection(old);
    }
    poller_.add(fd.get(), Source::conn, serial);
    log_.debug("connection " + std::to_string(serial) + " from pid " + std::to_string(cred.pid) + " uid " +
               std::to_string(cred.uid) + (alloc_id.empty() ? std::string() : " on allocation " + alloc_id));
    conns_.emplace(serial,
                   Connection{std::move(fd), static_cast<std::uint32_t>(cred.pid), cred.uid, cred.gid, 0, alloc_id});
    if (conn_limits_.unauthenticated() == 1) arm_hello_timer();
  }
}

// Out of descriptors: the pending connection would make the listener readable forever. Closes
// the reserve descriptor to accept it and close it at once, then takes the reserve back; when
// even that fails, the listener is not polled until the next tick. Returns true if a connection
// was taken off the queue.
bool Daemon::Impl::accept_without_descriptors(int listen_fd, int err, Source src, std::uint64_t src_serial) {
  const auto t = std::chrono::steady_clock::now();
  node_->count_connection_cap();
  node_->log_limiter().warn("accept descriptors",
                            std::string("accept: ") + std::strerror(err) +
                                ": out of descriptors; closing new connections at once (see --max-connections-per-uid)",
                            t);
  reserve_fd_.reset();
  UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  const bool took = static_cast<bool>(fd);
  fd.reset();
  reserve_fd_ = open_reserve_fd();
  if (took && reserve_fd_) return true;
  // Stop polling this listener until the next tick (no busy loop).
  poller_.del(listen_fd);
  paused_.push_back(Paused{listen_fd, src, src_serial});
  return false;
}

void Daemon::Impl::resume_accepting() {
  if (!reserve_fd_) reserve_fd_ = open_reserve_fd();
  for (const Paused& p : paused_) {
    // An allocation's socket may have gone (and its number been reused) meanwhile.
    if (p.src == Source::alloc_listen && (!alloc_watch_ || alloc_watch_->listener(p.serial).first != p.fd)) continue;
    try {
      poller_.add(p.fd, p.src, p.serial);
    } catch (const std::exception&) {
      // already polled again, or gone
    }
  }
  paused_.clear();
}

void Daemon::Impl::arm_hello_timer() { hello_timer_.set(conn_limits_.next_deadline()); }

void Daemon::Impl::on_hello_timer() {
  drain(hello_timer_.fd.get());
  hello_timer_.fired();
  const auto t = std::chrono::steady_clock::now();
  const std::vector<std::uint64_t> late = conn_limits_.expired(t);
  for (std::uint64_t serial : late) {
    auto it = conns_.find(serial);
    if (it == conns_.end()) continue;
    node_->count_unauthenticated();
    node_->log_limiter().warn("hello timeout uid " + std::to_string(it->second.uid),
                              "connection " + std::to_string(serial) + " (pid " + std::to_string(it->second.pid) +
                                  ", uid " + std::to_string(it->second.uid) + ") closed: no Hello within " +
                                  std::to_string(opts_.hello_timeout.count()) + " ms (vlaked --hello-timeout-ms)",
                              t);
    close_connection(serial);
  }
  arm_hello_timer();
}

void Daemon::Impl::close_connection(ConnId serial) {
  auto it = conns_.find(serial);
  if (it == conns_.end()) return;
  Connection c = std::move(it->second);
  conns_.erase(it);
  conn_limits_.closed(serial);
  poller_.del(c.fd.get());
  c.fd.reset();
  // Grants whose replies were still queued never reached the client: undone.
  for (const std::uint64_t g : c.outbox.grants()) node_->undo_grant(g);
  if (c.session == 0) return;
  auto p = pidfds_.find(c.session);
  const bool exited = p == pidfds_.end() || pidfd_exited(p->second.get());
  if (exited && p != pidfds_.end()) {
    poller_.del(p->second.get());
    pidfds_.erase(p);
  }
  node_->connection_closed(serial, c.session, exited);
}

}  // namespace vlake::pool
