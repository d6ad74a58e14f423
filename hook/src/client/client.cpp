#include "client.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <system_error>
#include <thread>
#include <type_traits>

#include "log.hpp"
#include "vlake/common/unix_socket.hpp"
#include "vlake/contracts/codec.hpp"

namespace vlake::hook {

namespace {

constexpr auto kConnectHoldOff = std::chrono::seconds(1);
constexpr auto kReconnectPause = std::chrono::milliseconds(50);

timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

bool is_broken_errno(int e) {
  return e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ECONNABORTED || e == EBADF;
}

}  // namespace

DaemonClient::DaemonClient(const Config& config, bool pressure)
    : path_(config.socket_path),
      timeout_(config.timeout),
      reconnect_timeout_(config.reconnect_timeout),
      pressure_(pressure),
      wait_(config.wait) {}

bool DaemonClient::connected() const {
  std::lock_guard lock(mu_);
  return fd_.valid();
}

bool DaemonClient::send_reserve_report(const Uuid& device, std::uint64_t bytes, std::uint64_t blocks, bool reclaim,
                                       bool active) {
  // Never waits for a request in flight (a SwapIn may take minutes): the report goes next tick.
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || !fd_) return false;
  auto r = proto::make<proto::ReserveReport>(next_request_++);
  device.copy_to(r.device_uuid);
  r.bytes = bytes;
  r.blocks = blocks;
  r.flags = (reclaim ? proto::kReportReclaim : 0u) | (active ? proto::kReportActive : 0u);
  try {
    send_with_fds(fd_.get(), proto::encode(r), {});
    return true;
  } catch (const std::system_error& e) {
    last_error_ = std::string("send: ") + std::strerror(e.code().value());
    fd_.reset();
    return false;
  }
}

void DaemonClient::keep_pressure_locked(const proto::Pressure& p) {
  PressureNote n;
  n.device = Uuid::from_bytes(p.device_uuid);
  n.bytes = p.bytes;
  std::lock_guard lock(pressure_mu_);
  pressure_notes_.push_back(n);
}

void DaemonClient::poll_pressure() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  while (read_one_locked(std::chrono::milliseconds(0))) {
  }
}

bool DaemonClient::read_one_locked(std::chrono::milliseconds wait) {
  if (!fd_) return false;
  pollfd p{fd_.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
    return false;
  }
  alignas(8) std::byte buf[proto::kMaxMessageBytes];
  Received got;
  try {
    got = recv_with_fds(fd_.get(), std::span<std::byte>(buf, sizeof buf));
  } catch (const std::exception& e) {
    last_error_ = e.what();
    fd_.reset();
    return false;
  }
  if (got.bytes == 0) {  // the daemon went away: the next request reconnects
    last_error_ = "the daemon closed the connection";
    fd_.reset();
    return false;
  }
  const proto::Decoded d = proto::decode(std::span<const std::byte>(buf, got.bytes), got.fds.size());
  if (!keep_unsolicited_locked(d, got.fds)) {
    last_error_ = "unexpected message from the daemon on an idle connection";
    if (!d) last_error_ += " (" + d.error().reason + ")";
    log(LogLevel::warn, "%s; reconnecting", last_error_.c_str());
    fd_.reset();
    return false;
  }
  return true;
}

bool DaemonClient::keep_unsolicited_locked(const proto::Decoded& d, std::vector<UniqueFd>& fds) {
  if (const proto::Header* h = d.header(); h != nullptr && (h->request_id & kSideRequest) != 0) {
    // The answer to a request sent beside another: a TierPlan is kept for tier_step(), a
    // Release's ack is dropped.
    if (const proto::TierPlan* plan = d.get<proto::TierPlan>()) keep_plan(*plan, std::move(fds));
  } else if (const proto::Drop* drop = d.get<proto::Drop>()) {
    keep_drop_locked(*drop);
  } else if (const proto::SwapNotice* n = d.get<proto::SwapNotice>()) {
    keep_swap_locked(*n);
  } else if (const proto::TierNotice* t = d.get<proto::TierNotice>()) {
    keep_tier_locked(*t);
  } else if (const proto::Pressure* p = d.get<proto::Pressure>()) {
    keep_pressure_locked(*p);
  } else {
    return false;
  }
  return true;
}

std::uint64_t DaemonClient::next_side_id() noexcept {
  return kSideRequest | (side_requests_.fetch_add(1, std::memory_order_relaxed) + 1);
}

void DaemonClient::keep_plan(const proto::TierPlan& p, std::vector<UniqueFd> fds) {
  {
    std::lock_guard lock(pressure_mu_);
    tier_plans_.push_back(KeptPlan{p, std::move(fds)});
  }
  plan_cv_.notify_all();
}

std::optional<proto::TierPlan> DaemonClient::take_plan(std::uint64_t request_id, std::vector<UniqueFd>& fds) {
  std::lock_guard lock(pressure_mu_);
  for (auto it = tier_plans_.begin(); it != tier_plans_.end(); ++it) {
    if (it->plan.h.request_id != request_id) continue;
    proto::TierPlan p = it->plan;
    fds = std::move(it->fds);
    tier_plans_.erase(it);
    return p;
  }
  // Answers nobody waits for any more (their step timed out) are dropped with their descriptors.
  std::erase_if(tier_plans_, [&](const KeptPlan& k) { return k.plan.h.request_id < request_id; });
  return std::nullopt;
}

void DaemonClient::keep_swap_locked(const proto::SwapNotice& n) {
  std::lock_guard lock(pressure_mu_);
  swap_notices_.push_back(n);
}

std::vector<proto::SwapNotice> DaemonClient::take_swap_notices() {
  std::lock_guard lock(pressure_mu_);
  return std::exchange(swap_notices_, {});
}

bool DaemonClient::send_beside(std::span<const std::byte> bytes) {
  std::lock_guard side(side_mu_);
  if (!side_fd_) return false;
  try {
    send_with_fds(side_fd_.get(), bytes, {});
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool DaemonClient::send_swap_ready(std::uint64_t swap_id) {
  auto m = proto::make<proto::SwapReady>();
  m.swap_id = swap_id;
  // Not through mu_: the thread that holds it may wait for vlaked's answer for minutes, and that
  // answer may depend on this message.
  return send_beside(proto::encode(m));
}

std::optional<proto::SwapInReply> DaemonClient::swap_in() {
  auto req = proto::make<proto::SwapIn>();
  std::lock_guard lock(mu_);
  return exchange_locked<proto::SwapIn, proto::SwapInReply>(req, nullptr);
}

void DaemonClient::keep_tier_locked(const proto::TierNotice& n) {
  std::lock_guard lock(pressure_mu_);
  tier_notices_.push_back(n);
}

std::vector<proto::TierNotice> DaemonClient::take_tier_notices() {
  std::lock_guard lock(pressure_mu_);
  return std::exchange(tier_notices_, {});
}

std::optional<proto::TierPlan> DaemonClient::tier_step(const proto::TierStep& step, std::vector<UniqueFd>& fds,
                                                       std::chrono::milliseconds wait) {
  proto::TierStep req = step;
  {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      if (!fd_) return std::nullopt;  // a move belongs to the connection it began on
      req.h = proto::make_header<proto::TierStep>(proto::MsgType::tier_step, 0);
      return exchange_locked<proto::TierStep, proto::TierPlan>(req, &fds);
    }
  }
  // Another thread holds the connection (a parked grant may keep it for minutes): the step goes
  // out beside its request, and the answer comes to whoever reads the connection.
  const std::uint64_t id = next_side_id();
  req.h = proto::make_header<proto::TierStep>(proto::MsgType::tier_step, id);
  if (!send_beside(proto::encode(req))) return std::nullopt;
  changes_.fetch_add(1, std::memory_order_acq_rel);
  const auto deadline = std::chrono::steady_clock::now() + std::max(wait, timeout_);
  for (;;) {
    if (std::optional<proto::TierPlan> p = take_plan(id, fds)) return p;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return std::nullopt;
    {
      std::unique_lock lock(mu_, std::try_to_lock);
      if (lock.owns_lock()) {
        // Nobody else reads: read here (what comes meanwhile is kept as any reader keeps it).
        if (!fd_) return std::nullopt;
        (void)read_one_locked(std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                                       std::chrono::milliseconds(20)));
        continue;
      }
    }
    std::unique_lock lock(pressure_mu_);
    plan_cv_.wait_for(lock, std::chrono::milliseconds(2), [&] {
      return std::any_of(tier_plans_.begin(), tier_plans_.end(),
                         [&](const KeptPlan& k) { return k.plan.h.request_id == id; });
    });
  }
}

void DaemonClient::keep_drop_locked(const proto::Drop& d) {
  std::lock_guard lock(pressure_mu_);
  drop_keys_.insert(drop_keys_.end(), d.keys, d.keys + d.count);
}

std::vector<std::uint64_t> DaemonClient::take_drops() {
  std::lock_guard lock(pressure_mu_);
  std::vector<std::uint64_t> out;
  out.swap(drop_keys_);
  return out;
}

bool DaemonClient::send_dropped(std::span<const std::uint64_t> keys) {
  std::lock_guard lock(mu_);
  if (!fd_) return false;
  for (std::size_t i = 0; i < keys.size(); i += proto::kMaxDropKeys) {
    auto m = proto::make<proto::Dropped>();
    m.count = static_cast<std::uint32_t>(std::min<std::size_t>(proto::kMaxDropKeys, keys.size() - i));
    std::copy_n(keys.begin() + static_cast<std::ptrdiff_t>(i), m.count, m.keys);
    try {
      send_with_fds(fd_.get(), proto::encode(m), {});
    } catch (const std::exception& e) {
      last_error_ = e.what();
      fd_.reset();
      return false;
    }
  }
  return true;
}

std::vector<PressureNote> DaemonClient::take_pressure() {
  std::lock_guard lock(pressure_mu_);
  std::vector<PressureNote> out;
  out.swap(pressure_notes_);
  return out;
}

std::string DaemonClient::tenant_name() const {
  std::lock_guard lock(mu_);
  return tenant_name_;
}

proto::GuardMode DaemonClient::guard_mode() const {
  std::lock_guard lock(mu_);
  return guard_mode_;
}

bool DaemonClient::overcommit() {
  if (answered_.load(std::memory_order_acquire)) return overcommit_.load(std::memory_order_acquire);
  std::lock_guard lock(mu_);
  if (!fd_) (void)connect_locked();
  return overcommit_.load(std::memory_order_acquire);
}

std::uint64_t DaemonClient::granularity() const {
  std::lock_guard lock(mu_);
  return granularity_;
}

template <class Msg>
bool DaemonClient::send_oneway(Msg m) {
  std::lock_guard lock(mu_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!fd_ && !connect_locked()) return false;
    m.h = proto::make<Msg>(next_request_++).h;
    try {
      send_with_fds(fd_.get(), proto::encode(m), {});
      return true;
    } catch (const std::system_error& e) {
      const int err = e.code().value();
      last_error_ = std::string("send: ") + std::strerror(err);
      fd_.reset();
      if (!is_broken_errno(err)) return false;
    }
  }
  return false;
}

bool DaemonClient::send_guard_event(proto::GuardEvent event) { return send_oneway(event); }

bool DaemonClient::send_readonly_write(proto::ReadOnlyWrite m) { return send_oneway(m); }

DaemonClient::Passthrough DaemonClient::ask_passthrough() {
  std::lock_guard lock(mu_);
  ask_passthrough_ = true;
  const bool connected = connect_locked();
  ask_passthrough_ = false;
  if (passthrough_) return Passthrough::allowed;
  if (connected) return Passthrough::refused;
  retry_after_ = std::chrono::steady_clock::now() + kConnectHoldOff;
  return Passthrough::unreachable;
}

std::string DaemonClient::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

bool DaemonClient::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

// Opens the socket and says Hello (with the old session, if any). Caller holds mu_.
bool DaemonClient::connect_locked() {
  fd_.reset();
  refused_ = false;
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s) {
    last_error_ = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  const timeval tv = to_timeval(timeout_);
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof addr.sun_path) {
    last_error_ = "socket path too long";
    return false;
  }
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  int rc = -1;
  do {
    rc = ::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    last_error_ = std::string("connect: ") + std::strerror(errno);
    return false;
  }
  fd_ = std::move(s);

  auto hello = proto::make<proto::Hello>(next_request_++);
  hello.pid = static_cast<std::uint32_t>(::getpid());
  hello.old_session = session_;
  hello.flags = (pressure_ ? proto::kHelloPressure : 0u) | (ask_passthrough_ ? proto::kHelloPassthrough : 0u);
  if (wait_) {
    hello.flags |= proto::kHelloWait;
    hello.wait_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(wait_->count(), proto::kMaxWaitMs));
  }
  std::snprintf(hello.client, sizeof hello.client, "vlake-hook 0.1.0");
  proto::HelloAck ack{};
  last_error_status_ = proto::Status::ok;
  const Io io = roundtrip_locked(hello, ack, nullptr);
  if (io != Io::ok) {
    if (io == Io::broken) last_error_ = "the daemon closed the connection during Hello";
    if (last_error_status_ == proto::Status::limit_reached) {
      // Reachable, but at a limit: last_error_ carries the daemon's text.
      refused_ = true;
      last_error_ = "vlaked refused this process (" + last_error_.substr(std::string("daemon error: ").size()) + ")";
    }
    fd_.reset();
    return false;
  }
  if (ack.status == proto::Status::passthrough && ask_passthrough_) {
    passthrough_ = true;
    tenant_name_.assign(ack.tenant_name, strnlen(ack.tenant_name, sizeof ack.tenant_name));
    last_error_ = "passing through (VLAKE_DISABLE allowed)";
    fd_.reset();
    return false;
  }
  if (ack.status != proto::Status::ok) {
    last_error_ = "the daemon refused Hello (status " + std::to_string(static_cast<int>(ack.status)) + ")";
    fd_.reset();
    return false;
  }
  if (session_ != 0 && ack.session_id != session_) {
    log(LogLevel::info, "daemon started a new session %llu (was %llu)", static_cast<unsigned long long>(ack.session_id),
        static_cast<unsigned long long>(session_));
  } else if (session_ != 0) {
    log(LogLevel::info, "reconnected to %s, session %llu kept", path_.c_str(),
        static_cast<unsigned long long>(session_));
  }
  session_ = ack.session_id;
  generation_.fetch_add(1, std::memory_order_acq_rel);  // kept mappings of older connections are dropped
  tenant_name_.assign(ack.tenant_name, strnlen(ack.tenant_name, sizeof ack.tenant_name));
  guard_mode_ = ack.guard_mode;
  overcommit_.store((ack.flags & proto::kAckOvercommit) != 0, std::memory_order_release);
  answered_.store(true, std::memory_order_release);
  {
    std::lock_guard side(side_mu_);
    side_fd_.reset(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  }
  granularity_ = ack.granularity;
  if (ack.wait_ms > 0) {
    // A grant may wait that long for memory (docs/quota.md, "Waiting for memory"): replies are
    // awaited that long, and VLAKE_TIMEOUT more.
    const timeval longer = to_timeval(timeout_ + std::chrono::milliseconds(ack.wait_ms));
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &longer, sizeof longer);
  }
  log(LogLevel::debug, "connected to %s as tenant %s (session %llu)", path_.c_str(), tenant_name_.c_str(),
      static_cast<unsigned long long>(session_));
  flush_pending_locked();
  return fd_.valid();
}

template <class Req, class Rep>
DaemonClient::Io DaemonClient::roundtrip_locked(Req& request, Rep& reply, std::vector<UniqueFd>* fds) {
  try {
    send_with_fds(fd_.get(), proto::encode(request), {});
  } catch (const std::system_error& e) {
    const int err = e.code().value();
    last_error_ = std::string("send: ") + std::strerror(err);
    return is_broken_errno(err) ? Io::broken : Io::failed;
  }
  alignas(8) std::byte buf[proto::kMaxMessageBytes];
  Received got;
  std::optional<proto::Decoded> d;
  // Pressure messages may precede the reply: keep them and read on.
  for (;;) {
    try {
      got = recv_with_fds(fd_.get(), std::span<std::byte>(buf, sizeof buf));
    } catch (const std::system_error& e) {
      const int err = e.code().value();
      if (err == EAGAIN || err == EWOULDBLOCK) {
        last_error_ = "no reply within VLAKE_TIMEOUT";
        return Io::failed;
      }
      last_error_ = std::string("recv: ") + std::strerror(err);
      return is_broken_errno(err) ? Io::broken : Io::failed;
    } catch (const std::exception& e) {
      last_error_ = e.what();
      return Io::failed;
    }
    if (got.bytes == 0) {
      last_error_ = "the daemon closed the connection";
      return Io::broken;
    }
    d.emplace(proto::decode(std::span<const std::byte>(buf, got.bytes), got.fds.size()));
    if (!*d) {
      last_error_ = "malformed reply: " + d->error().reason;
      return Io::failed;
    }
    if (!keep_unsolicited_locked(*d, got.fds)) break;
  }
  if (const proto::Error* err = d->get<proto::Error>()) {
    last_error_status_ = err->status;
    last_error_ = "daemon error: ";
    last_error_.append(err->message, strnlen(err->message, sizeof err->message));
    return Io::failed;
  }
  const Rep* r = d->get<Rep>();
  if (r == nullptr || r->h.request_id != request.h.request_id) {
    last_error_ = "unexpected reply from the daemon";
    return Io::failed;
  }
  if (!got.fds.empty() && fds == nullptr) {
    last_error_ = "descriptors attached to a reply that carries none";
    return Io::failed;
  }
  reply = *r;
  if (fds != nullptr) *fds = std::move(got.fds);
  return Io::ok;
}

template <class Req, class Rep>
std::optional<Rep> DaemonClient::exchange_locked(Req request, std::vector<UniqueFd>* fds) {
  if constexpr (!std::is_same_v<Req, proto::UsageQuery>) changes_.fetch_add(1, std::memory_order_acq_rel);
  bool broke = false;
  std::chrono::steady_clock::time_point deadline{};
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (!fd_) {
      if (!broke && now < retry_after_) return std::nullopt;
      if (!connect_locked()) {
        if (broke && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(kReconnectPause);
          continue;
        }
        retry_after_ = std::chrono::steady_clock::now() + kConnectHoldOff;
        return std::nullopt;
      }
    }
    request.h.request_id = next_request_++;
    Rep reply{};
    const Io io = roundtrip_locked(request, reply, fds);
    if (io == Io::ok) return reply;
    fd_.reset();
    if (io == Io::failed) return std::nullopt;
    if (!broke) {
      broke = true;
      deadline = std::chrono::steady_clock::now() + reconnect_timeout_;
      log(LogLevel::info, "connection to %s broke (%s); reconnecting", path_.c_str(), last_error_.c_str());
    }
  }
}

void DaemonClient::flush_pending_locked() {
  while (!pending_releases_.empty() && fd_) {
    changes_.fetch_add(1, std::memory_order_acq_rel);
    const auto [grant, flags] = pending_releases_.back();
    auto r = proto::make<proto::Release>(next_request_++);
    r.grant_id = grant;
    r.flags = flags;
    proto::ReleaseAck ack{};
    if (roundtrip_locked(r, ack, nullptr) != Io::ok) {
      fd_.reset();
      return;
    }
    pending_releases_.pop_back();
  }
}

std::optional<GrantResult> DaemonClient::grant(const Uuid& device, std::uint64_t bytes, proto::GrantPurpose purpose,
                                               std::uint32_t flags) {
  auto req = proto::make<proto::GrantRequest>();
  device.copy_to(req.device_uuid);
  req.bytes = bytes;
  req.purpose = purpose;
  req.flags = flags;
  std::vector<UniqueFd> fds;
  std::lock_guard lock(mu_);
  auto rep = exchange_locked<proto::GrantRequest, proto::GrantReply>(req, &fds);
  if (!rep) return std::nullopt;
  GrantResult out;
  out.status = rep->status;
  out.grant_id = rep->grant_id;
  out.bytes = rep->bytes;
  out.limit = rep->limit;
  out.used = rep->used;
  out.handles.assign(rep->handles, rep->handles + rep->handle_count);  // <= kMaxHandlesPerGrant
  out.fds = std::move(fds);
  return out;
}

std::optional<proto::Status> DaemonClient::release(std::uint64_t grant_id, std::uint32_t flags) {
  auto req = proto::make<proto::Release>();
  req.grant_id = grant_id;
  req.flags = flags;
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    // Another thread holds the connection, maybe for minutes (a parked grant, and vlaked may be
    // waiting for this very memory): sent beside its request; the ack is not waited for.
    req.h.request_id = next_side_id();
    if (send_beside(proto::encode(req))) {
      changes_.fetch_add(1, std::memory_order_acq_rel);
      return proto::Status::ok;
    }
    lock.lock();
  }
  auto rep = exchange_locked<proto::Release, proto::ReleaseAck>(req, nullptr);
  if (!rep) {
    pending_releases_.emplace_back(grant_id, flags);
    return std::nullopt;
  }
  return rep->status;
}

std::optional<UsageResult> DaemonClient::usage(const Uuid& device) {
  auto req = proto::make<proto::UsageQuery>();
  device.copy_to(req.device_uuid);
  std::lock_guard lock(mu_);
  auto rep = exchange_locked<proto::UsageQuery, proto::UsageReply>(req, nullptr);
  if (!rep) return std::nullopt;
  return UsageResult{rep->status, rep->total, rep->limit, rep->used};
}

std::optional<proto::ContextReply> DaemonClient::context(const Uuid& device, proto::ContextOp op) {
  auto req = proto::make<proto::ContextRequest>();
  device.copy_to(req.device_uuid);
  req.op = op;
  std::lock_guard lock(mu_);
  return exchange_locked<proto::ContextRequest, proto::ContextReply>(req, nullptr);
}

std::optional<proto::ShareReply> DaemonClient::share(const proto::ShareRequest& request, std::vector<UniqueFd>& fds) {
  std::lock_guard lock(mu_);
  return exchange_locked<proto::ShareRequest, proto::ShareReply>(request, &fds);
}

std::optional<proto::ShareAck> DaemonClient::share_commit(const proto::ShareCommit& request) {
  std::lock_guard lock(mu_);
  return exchange_locked<proto::ShareCommit, proto::ShareAck>(request, nullptr);
}

std::optional<proto::IpcExportReply> DaemonClient::ipc_export(std::uint64_t grant_id) {
  auto req = proto::make<proto::IpcExport>();
  req.grant_id = grant_id;
  std::lock_guard lock(mu_);
  return exchange_locked<proto::IpcExport, proto::IpcExportReply>(req, nullptr);
}

std::optional<proto::IpcOpenReply> DaemonClient::ipc_open(std::uint64_t token, std::uint64_t secret,
                                                          std::vector<UniqueFd>& fds) {
  auto req = proto::make<proto::IpcOpen>();
  req.token = token;
  req.secret = secret;
  std::lock_guard lock(mu_);
  return exchange_locked<proto::IpcOpen, proto::IpcOpenReply>(req, &fds);
}

std::optional<proto::IpcCloseAck> DaemonClient::ipc_close(std::uint64_t import_id) {
  auto req = proto::make<proto::IpcClose>();
  req.import_id = import_id;
  std::lock_guard lock(mu_);
  return exchange_locked<proto::IpcClose, proto::IpcCloseAck>(req, nullptr);
}

void DaemonClient::prepare_fork() noexcept {
  mu_.lock();
  pressure_mu_.lock();
  side_mu_.lock();
}

void DaemonClient::parent_after_fork() noexcept {
  side_mu_.unlock();
  pressure_mu_.unlock();
  mu_.unlock();
}

void DaemonClient::child_after_fork() noexcept {
  // Closing our copy of the descriptor leaves the parent's connection intact (no shutdown()).
  fd_.reset();
  session_ = 0;
  tenant_name_.clear();
  guard_mode_ = proto::GuardMode::off;
  granularity_ = 0;
  pending_releases_.clear();
  retry_after_ = {};
  pressure_notes_.clear();
  drop_keys_.clear();
  swap_notices_.clear();
  tier_notices_.clear();
  tier_plans_.clear();
  new (&plan_cv_) std::condition_variable();  // the parent's waiters are not the child's
  side_fd_.reset();
  side_mu_.unlock();
  generation_.fetch_add(1, std::memory_order_acq_rel);
  pressure_mu_.unlock();
  mu_.unlock();
}

}  // namespace vlake::hook
