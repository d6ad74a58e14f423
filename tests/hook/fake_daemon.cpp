#include "fake_daemon.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <span>
#include <stdexcept>
#include <system_error>

#include "vlake/common/unix_socket.hpp"
#include "vlake/contracts/codec.hpp"

namespace hooktest {

using namespace vlake::proto;

namespace {

template <class T>
void send_msg(int fd, const T& m, std::span<const int> fds = {}) {
  try {
    vlake::send_with_fds(fd, encode(m), fds);
  } catch (const std::exception&) {
    // the client went away; its EOF is handled by the poll loop
  }
}

}  // namespace

FakeDaemon::FakeDaemon(vlake::Driver& driver, FakeDaemonOptions options)
    : driver_(driver), options_(std::move(options)) {
  for (int d = 0; d < driver_.device_count(); ++d) {
    uuids_.push_back(driver_.device_uuid(vlake::DeviceOrdinal{d}));
    totals_.push_back(driver_.total_memory(vlake::DeviceOrdinal{d}).value());
  }
  used_.assign(uuids_.size(), 0);
  granularity_ = driver_.granularity(vlake::DeviceOrdinal{0}).value();

  ::unlink(options_.socket_path.c_str());
  listen_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listen_) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.socket_path.size() >= sizeof addr.sun_path) throw std::runtime_error("path");
  std::memcpy(addr.sun_path, options_.socket_path.c_str(), options_.socket_path.size() + 1);
  if (::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_.get(), 64) != 0) {
    throw std::system_error(errno, std::generic_category(), "bind/listen");
  }
  thread_ = std::thread([this] { serve(); });
}

FakeDaemon::~FakeDaemon() {
  stop_ = true;
  thread_.join();
  for (auto& [fd, session] : clients_) ::close(fd);
  std::lock_guard lock(mu_);
  while (!grants_.empty()) release_grant_locked(grants_.begin());
  ::unlink(options_.socket_path.c_str());
}

Counters FakeDaemon::counters() const {
  std::lock_guard lock(mu_);
  Counters c = counters_;
  c.used = used_.empty() ? 0 : used_[0];
  c.outstanding = grants_.size();
  return c;
}

bool FakeDaemon::wait_disconnected(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (connections_.load() != 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void FakeDaemon::set_limit(std::uint64_t limit) {
  std::lock_guard lock(mu_);
  options_.limit = limit;
}

void FakeDaemon::serve() {
  while (!stop_) {
    std::vector<pollfd> fds;
    fds.push_back(pollfd{listen_.get(), POLLIN, 0});  // -1 (ignored) once vanished
    for (auto& [fd, session] : clients_) fds.push_back(pollfd{fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
    if ((fds[0].revents & POLLIN) != 0) {
      const int c = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        clients_[c] = 0;
        ++connections_;
      }
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      alignas(8) std::byte buf[kMaxMessageBytes];
      vlake::Received got;
      try {
        got = vlake::recv_with_fds(fd, std::span<std::byte>(buf, sizeof buf));
      } catch (const std::exception&) {
        got.bytes = 0;
      }
      if (got.bytes == 0) {
        close_client(fd, true);
        continue;
      }
      handle(fd, std::span<const std::byte>(buf, got.bytes), got.fds.size());
    }
  }
}

void FakeDaemon::close_client(int fd, bool process_gone) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  const std::uint64_t session = it->second;
  clients_.erase(it);
  ::close(fd);
  --connections_;
  if (!process_gone || session == 0) return;
  // The tenant process is gone: everything its session held comes back.
  std::lock_guard lock(mu_);
  for (auto g = grants_.begin(); g != grants_.end();) {
    if (g->second.session == session) {
      auto next = std::next(g);
      release_grant_locked(g);
      g = next;
    } else {
      ++g;
    }
  }
  sessions_.erase(session);
}

void FakeDaemon::handle(int fd, std::span<const std::byte> datagram, std::size_t descriptors) {
  // The daemon's own decoder: whatever it refuses, vlaked would refuse too.
  const Decoded d = decode(datagram, descriptors);
  if (!d) {
    close_client(fd, true);
    return;
  }
  if (const auto* m = d.get<ReserveReport>()) {
    on_reserve_report(fd, *m);
    return;
  }
  // Not a request the tests count or drop (a context comes before any allocation).
  if (const auto* x = d.get<ContextRequest>()) {
    on_context(fd, *x);
    return;
  }
  if (d.get<Hello>() == nullptr) {
    bool drop = false;
    {
      std::lock_guard lock(mu_);
      ++requests_;
      drop = options_.drop_on_request != 0 && requests_ == options_.drop_on_request;
      if (drop) ++counters_.drops;
    }
    if (options_.stall) return;
    if (drop) {
      close_client(fd, false);  // a "restart": the session survives
      if (options_.vanish_on_drop) {
        listen_.reset();
        ::unlink(options_.socket_path.c_str());
      }
      return;
    }
  }
  if (const auto* m = d.get<Hello>()) {
    on_hello(fd, *m);
  } else if (const auto* g = d.get<GrantRequest>()) {
    on_grant(fd, *g);
  } else if (const auto* r = d.get<Release>()) {
    on_release(fd, *r);
  } else if (const auto* u = d.get<UsageQuery>()) {
    on_usage(fd, *u);

  } else if (const auto* e = d.get<GuardEvent>()) {
    on_guard_event(*e);
  } else {
    close_client(fd, true);
  }
}

void FakeDaemon::on_reserve_report(int fd, const ReserveReport& m) {
  bool pressure = false;
  {
    std::lock_guard lock(mu_);
    ++counters_.reserve_reports;
    counters_.last_reserve_bytes = m.bytes;
    counters_.last_reserve_blocks = m.blocks;
    if ((m.flags & kReportReclaim) != 0) ++counters_.reclaim_reports;
    pressure = options_.pressure_on_report && (m.bytes > 0 || (m.flags & kReportReclaim) != 0);
  }
  if (pressure) send_pressure(fd, m.device_uuid);
}

void FakeDaemon::send_pressure(int fd, const std::uint8_t* uuid) {
  Pressure p{};
  p.h = make_header<Pressure>(MsgType::pressure, 0);
  std::memcpy(p.device_uuid, uuid, sizeof p.device_uuid);
  p.bytes = 0;
  p.reason = PressureReason::pool_exhausted;
  send_msg(fd, p);
  std::lock_guard lock(mu_);
  ++counters_.pressure_sent;
}

void FakeDaemon::on_guard_event(const GuardEvent& m) {
  const int dev = device_of(m.device_uuid);
  std::lock_guard lock(mu_);
  counters_.guard_events.push_back(m);
  counters_.guard_event_devices.push_back(dev);
}

int FakeDaemon::device_of(const std::uint8_t* uuid) const {
  for (std::size_t i = 0; i < uuids_.size(); ++i) {
    if (std::memcmp(uuids_[i].data(), uuid, 16) == 0) return static_cast<int>(i);
  }
  return -1;
}

void FakeDaemon::on_hello(int fd, const Hello& m) {
  ucred cred{};
  socklen_t len = sizeof cred;
  ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
  HelloAck ack{};
  ack.h = make_header<HelloAck>(MsgType::hello_ack, m.h.request_id);
  std::lock_guard lock(mu_);
  ++counters_.hellos;
  counters_.hello_flags = m.flags;
  counters_.hello_pids.insert(cred.pid);
  if ((m.flags & vlake::proto::kHelloPassthrough) != 0 && options_.allow_disable) {
    ack.status = Status::passthrough;
    ack.tenant_id = 1;
    std::snprintf(ack.tenant_name, sizeof ack.tenant_name, "%s", options_.tenant.c_str());
    send_msg(fd, ack);
    return;
  }
  std::uint64_t session = 0;
  if (m.old_session != 0) {
    ++counters_.hellos_with_old_session;
    auto s = sessions_.find(m.old_session);
    if (s != sessions_.end() && s->second.pid == cred.pid) {
      session = m.old_session;
      ++counters_.rebinds;
    }
  }
  if (session == 0) {
    session = next_session_++;
    sessions_[session] = Session{cred.pid};
  }
  clients_[fd] = session;
  ack.status = Status::ok;
  ack.tenant_id = 1;
  ack.session_id = session;
  ack.granularity = granularity_;
  ack.guard_mode = options_.guard_mode;
  if (options_.overcommit) ack.flags |= kAckOvercommit;
  ack.device_count = static_cast<std::uint32_t>(uuids_.size());
  std::snprintf(ack.tenant_name, sizeof ack.tenant_name, "%s", options_.tenant.c_str());
  for (std::size_t i = 0; i < uuids_.size() && i < kMaxDevices; ++i) {
    std::memcpy(ack.devices[i].uuid, uuids_[i].data(), 16);
    ack.devices[i].total = totals_[i];
    ack.devices[i].limit = options_.limit;
    ack.devices[i].used = used_[i];
  }
  send_msg(fd, ack);
}

void FakeDaemon::on_grant(int fd, const GrantRequest& m) {
  GrantReply rep{};
  rep.h = make_header<GrantReply>(MsgType::grant_reply, m.h.request_id);
  const int dev = device_of(m.device_uuid);
  std::vector<vlake::UniqueFd> fds;
  {
    std::lock_guard lock(mu_);
    const std::uint64_t bytes = (m.bytes + granularity_ - 1) / granularity_ * granularity_;
    counters_.last_grant_bytes = bytes;
    rep.bytes = bytes;
    rep.limit = options_.limit;
    if (dev < 0) {
      rep.status = Status::unknown_device;
      send_msg(fd, rep);
      return;
    }
    rep.used = used_[static_cast<std::size_t>(dev)];
    if (options_.grant_status != Status::ok) {
      ++counters_.refusals;
      rep.status = options_.grant_status;
      send_msg(fd, rep);
      return;
    }
    if (used_[static_cast<std::size_t>(dev)] + bytes > options_.limit) {
      ++counters_.refusals;
      rep.status = Status::over_limit;
      send_msg(fd, rep);
      return;
    }
    Grant g;
    g.session = clients_[fd];
    g.device = dev;
    g.bytes = bytes;
    std::vector<std::uint64_t> sizes;
    if (m.purpose == GrantPurpose::alloc && bytes > options_.split_above) {
      const std::uint64_t first = bytes / granularity_ / 2 * granularity_;
      sizes = {first, bytes - first};
    } else if (m.purpose != GrantPurpose::counted) {
      sizes = {bytes};
    }
    std::uint64_t offset = 0;
    for (std::uint64_t size : sizes) {
      const auto h = driver_.create(vlake::DeviceOrdinal{dev}, vlake::Bytes{size});
      g.handles.push_back(h);
      fds.push_back(driver_.export_fd(h));
      rep.handles[rep.handle_count++] = HandleDesc{size, offset, 0};
      offset += size;
    }
    if (m.purpose == GrantPurpose::alloc) ++counters_.grants_alloc;
    if (m.purpose == GrantPurpose::create) ++counters_.grants_create;
    if (m.purpose == GrantPurpose::counted) ++counters_.grants_counted;
    used_[static_cast<std::size_t>(dev)] += bytes;
    rep.status = Status::ok;
    rep.grant_id = next_grant_++;
    rep.used = used_[static_cast<std::size_t>(dev)];
    grants_[rep.grant_id] = std::move(g);
  }
  bool pressure = false;
  {
    std::lock_guard lock(mu_);
    pressure = options_.pressure_before_grant != 0 && m.purpose == GrantPurpose::alloc &&
               counters_.grants_alloc + counters_.refusals == options_.pressure_before_grant;
  }
  if (pressure) send_pressure(fd, m.device_uuid);
  std::vector<int> raw;
  for (auto& f : fds) raw.push_back(f.get());
  send_msg(fd, rep, raw);
}

void FakeDaemon::release_grant_locked(std::map<std::uint64_t, Grant>::iterator it) {
  for (auto h : it->second.handles) {
    try {
      driver_.release(h);
    } catch (const std::exception&) {
    }
  }
  used_[static_cast<std::size_t>(it->second.device)] -= it->second.bytes;
  grants_.erase(it);
}

void FakeDaemon::on_release(int fd, const Release& m) {
  ReleaseAck ack{};
  ack.h = make_header<ReleaseAck>(MsgType::release_ack, m.h.request_id);
  std::lock_guard lock(mu_);
  auto it = grants_.find(m.grant_id);
  if (it == grants_.end() || it->second.session != clients_[fd]) {
    ++counters_.releases_unknown;
    ack.status = Status::unknown_grant;
  } else {
    ++counters_.releases;
    if ((m.flags & kReleaseExported) != 0) ++counters_.releases_exported;
    const int dev = it->second.device;
    release_grant_locked(it);
    ack.status = Status::ok;
    ack.used = used_[static_cast<std::size_t>(dev)];
  }
  send_msg(fd, ack);
}

void FakeDaemon::on_usage(int fd, const UsageQuery& m) {
  UsageReply rep{};
  rep.h = make_header<UsageReply>(MsgType::usage_reply, m.h.request_id);
  const int dev = device_of(m.device_uuid);
  std::lock_guard lock(mu_);
  ++counters_.usage_queries;
  if (dev < 0) {
    rep.status = Status::unknown_device;
  } else {
    rep.status = Status::ok;
    rep.total = totals_[static_cast<std::size_t>(dev)];
    rep.limit = options_.limit;
    rep.used = used_[static_cast<std::size_t>(dev)];
  }
  send_msg(fd, rep);
}

// Contexts cost nothing here: every admission is granted (vlaked's rule is tested in tests/e2e).
void FakeDaemon::on_context(int fd, const ContextRequest& m) {
  ContextReply rep{};
  rep.h = make_header<ContextReply>(MsgType::context_reply, m.h.request_id);
  std::lock_guard lock(mu_);
  if (m.op == ContextOp::admit) ++counters_.contexts;
  rep.status = device_of(m.device_uuid) < 0 ? Status::unknown_device : Status::ok;
  rep.limit = options_.limit;
  send_msg(fd, rep);
}

}  // namespace hooktest
