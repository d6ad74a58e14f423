// vlaked's event loop (Daemon::Impl, daemon_impl.hpp): waits on the epoll set, dispatches each
// event to its handler, decodes client messages (contracts/codec.hpp), calls the Node (every
// decision is its own, node.hpp) and encodes its answers; after each event it carries out what
// the Node asked for (parked grants to retry, builds, swaps, Drop messages). Replies that a
// socket does not take at once wait in the connection's Outbox (outbox.hpp). run() returns
// after SIGTERM/SIGINT and a graceful shutdown.
//
// The constructor runs the start-up steps in order (daemon_startup.cpp has them); accepting
// and closing connections are in connections.cpp.
#include "vlake/pool/daemon.hpp"

#include <cuda.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "daemon_impl.hpp"
#include "gpu_reading.hpp"
#include "process_control.hpp"
#include "vlake/common/excerpt.hpp"
#include "vlake/common/fixed_chars.hpp"
#include "vlake/common/proc.hpp"
#include "vlake/common/unix_socket.hpp"
#include "vlake/pool/holder_scan.hpp"
#include "vlake/pool/proc_identity.hpp"

namespace vlake::pool {

namespace {
// A rejected quota file's error in the log: one bounded line.
constexpr std::size_t kMaxErrorLogBytes = 1024;
}  // namespace

// ---------------------------------------------------------------------------------------------
// start-up, in order (the steps are in daemon_startup.cpp)

Daemon::Impl::Impl(const DaemonOptions& o, Logger& log)
    : opts_(o),
      log_(log),
      config_watch_(o.config, log),
      conn_limits_(ConnLimitSettings{o.max_connections_per_uid, o.max_unauthenticated, o.max_unauthenticated_per_uid,
                                     o.hello_timeout}) {
  block_signals();
  take_lock();
  const rlim_t nofile = raise_nofile();
  reserve_fd_ = open_reserve_fd();
  bool from_file = false;
  quota::QuotaConfig config = load_config(from_file);
  try {
    driver_ = open_driver(opts_.driver);
  } catch (const DriverError& e) {
    if (e.code() == CUDA_ERROR_SHARED_OBJECT_INIT_FAILED) {
      // The library is not there (or not loadable): say what to check, not a bare CUresult.
      throw StartupError("cannot load the CUDA driver " + opts_.driver + " (" + e.detail() +
                         "). Is the NVIDIA driver installed (nvidia-smi)? In a container the NVIDIA runtime "
                         "mounts it (runtimeClassName: nvidia, or CDI). For a dry run without a GPU, "
                         "--driver PATH/sim/libcuda.so.1 (the simulator built with vlake).");
    }
    throw StartupError("cannot open the CUDA driver " + opts_.driver + ": " + e.what());
  } catch (const std::exception& e) {
    throw StartupError("cannot open the CUDA driver " + opts_.driver + ": " + e.what());
  }
  if (driver_->device_count() <= 0) throw StartupError("no GPU found by " + opts_.driver);
  NodeSettings settings;
  settings.bulk_size = Bytes{opts_.bulk_size};
  settings.warm_reserve = Bytes{opts_.warm_reserve};
  settings.warm_stock = Bytes{opts_.warm_stock};
  settings.background_builds = true;
  settings.pool_idle_release = opts_.pool_idle_release;
  settings.pool_keep = Bytes{opts_.pool_keep};
  settings.pressure_wait = opts_.pressure_wait;
  settings.reclaim_deadline = opts_.reclaim_deadline;
  settings.reclaim_skip = opts_.reclaim_skip;
  // Two readings at least must see a counted grant unrealized before it is revoked.
  settings.counted_realize = opts_.counted_realize.count() <= 0
                                 ? std::chrono::milliseconds(0)
                                 : std::max(opts_.counted_realize, 2 * opts_.sample_interval);
  settings.swap_idle = opts_.swap_idle;
  settings.swap_margin = Bytes{opts_.swap_margin};
  settings.host_tier = Bytes{opts_.host_tier};
  settings.host_tier_piece = Bytes{opts_.host_tier_piece};
  settings.canary_interval = opts_.canary_interval;
  settings.daemon_pid = static_cast<std::uint32_t>(::getpid());
  settings.max_sessions_per_tenant = opts_.max_sessions_per_tenant;
  settings.max_grants_per_tenant = opts_.max_grants_per_tenant;
  settings.max_parked_per_tenant = opts_.max_parked_per_tenant;
  settings.guard_event_rate = opts_.guard_event_rate;
  settings.guard_event_burst = opts_.guard_event_burst;
  settings.bind_handles = opts_.bind_handles;
  // CUDA contexts (docs/quota.md, "Contexts"): measured through NVML unless a size is given;
  // without NVML nothing measures them, so auto charges nothing.
  settings.context_memory = opts_.context_memory ? std::optional<Bytes>(Bytes{*opts_.context_memory})
                            : (opts_.nvml.empty() || opts_.nvml == "none") ? std::optional<Bytes>(Bytes{0})
                                                                           : std::nullopt;
  try {
    node_ =
        std::make_unique<Node>(*driver_, log_, settings, NodeEnv{supplementary_groups, now, make_holder_scan(log_)});
  } catch (const std::exception& e) {
    throw StartupError(e.what());
  }
  for (const Node::Device& d : node_->devices()) {
    log_.info("GPU " + std::to_string(d.ordinal.value()) + ": " + d.uuid.to_string() + ", " +
              std::to_string(d.total.value() >> 20) + " MiB, granularity " +
              std::to_string(d.granularity.value() >> 10) + " KiB");
  }
  try {
    node_->validate(config);
  } catch (const quota::ConfigError& e) {
    throw StartupError(std::string("bad quota file: ") + e.what());
  }
  node_->apply(std::move(config), opts_.config, from_file, now(), "");

  if (opts_.nvml.empty()) {
    log_.info("NVML disabled (--nvml none): non-pool usage counts as 0");
  } else {
    try {
      nvml_ = open_nvml(opts_.nvml);
      device_files_ = driver_->device_files();
      log_.info("NVML " + opts_.nvml + ": sampling per-process usage every " +
                std::to_string(opts_.sample_interval.count()) + " ms");
    } catch (const std::exception& e) {
      log_.info(std::string("NVML unavailable (") + e.what() + "): non-pool usage counts as 0");
    }
  }
  open_state();
  try {
    node_->warm_up();
  } catch (const std::exception& e) {
    throw StartupError(e.what());
  }
  publisher_->publish(*node_);
  if (!opts_.metrics_address.empty()) {
    try {
      exporter::Exposure exposure;
      exposure.process_series = opts_.metrics_process_series;
      metrics_ = std::make_unique<exporter::MetricsServer>(opts_.metrics_address, opts_.state, exposure);
    } catch (const std::exception& e) {
      if (opts_.metrics_address_given) throw StartupError(std::string("metrics exporter: ") + e.what());
      log_.warn(std::string("metrics exporter not started: ") + e.what() +
                "; pass --metrics-address ADDR (or none) to choose");
    }
    if (metrics_) log_.info("metrics on http://" + metrics_->address() + "/metrics (health: /healthz)");
  } else {
    log_.info("metrics exporter disabled (--metrics-address none)");
  }
  bind_socket();
  add_sources();
  // One reading before the first Hello: vlaked's own context on every GPU is the context size
  // until processes' contexts are measured (docs/daemon.md, "Contexts").
  // (Last to first: GPU 0's context stays current, as before.)
  for (auto d = node_->devices().rbegin(); d != node_->devices().rend(); ++d) {
    try {
      driver_->make_current(d->ordinal);
    } catch (const std::exception& e) {
      log_.warn("GPU " + std::to_string(d->ordinal.value()) + ": no context to measure: " + e.what());
    }
  }
  sample_gpus(now());
  for (const Node::Device& d : node_->devices()) {
    log_.info("GPU " + std::to_string(d.ordinal.value()) + ": a CUDA context is charged " +
              std::to_string(node_->rooms().contexts.size(d.ordinal).value() >> 20) + " MiB (" +
              node_->rooms().contexts.source(d.ordinal) + ")");
  }
  publisher_->publish(*node_, now().unix_ns);
  log_.info("serving " + opts_.socket + " (" + std::to_string(node_->devices().size()) + " GPU(s), driver " +
            driver_->name() + ", state " + st::segment_path(opts_.state) + ")");
  log_.info("limits: " + std::to_string(opts_.max_sessions_per_tenant) + " sessions and " +
            std::to_string(opts_.max_grants_per_tenant) + " grants (" + std::to_string(opts_.max_parked_per_tenant) +
            " parked) per tenant, " + std::to_string(opts_.max_connections_per_uid) + " connections per uid, " +
            std::to_string(opts_.max_unauthenticated) + " awaiting Hello (" +
            std::to_string(opts_.max_unauthenticated_per_uid) + " per uid, " +
            std::to_string(opts_.hello_timeout.count()) + " ms), " + std::to_string(nofile) + " descriptors");
}

Daemon::Impl::~Impl() {
  // Normal paths go through shutdown(); this only runs after a failed start-up or an escaped
  // exception: release what this process holds, keep the segment (it may describe grants).
  metrics_.reset();
  node_.reset();
  if (socket_bound_) ::unlink(opts_.socket.c_str());
}

// ---------------------------------------------------------------------------------------------
// loop

int Daemon::Impl::run() {
  std::vector<epoll_event> events(64);
  while (!stop_) {
    const int n = ::epoll_wait(poller_.fd(), events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "epoll_wait");
    }
    for (int i = 0; i < n && !stop_; ++i) {
      const std::uint64_t t = events[static_cast<std::size_t>(i)].data.u64;
      const std::uint64_t serial = Poller::serial_of(t);
      try {
        switch (Poller::source_of(t)) {
          case Source::listen: on_accept(listen_fd_.get(), std::string(), Source::listen, 0); break;
          case Source::signal: on_signal(); break;
          case Source::timer: on_timer(); break;
          case Source::conn:
            if ((events[static_cast<std::size_t>(i)].events & EPOLLOUT) != 0) on_writable(serial);
            if ((events[static_cast<std::size_t>(i)].events & ~static_cast<std::uint32_t>(EPOLLOUT)) != 0) {
              on_readable(serial);
            }
            break;
          case Source::pidfd: on_process_exit(serial); break;
          case Source::config_watch: config_watch_.on_watch(); break;
          case Source::config_settle:
            reload("file changed", false);
            config_watch_.on_settle();
            break;
          case Source::park:
            drain(park_timer_.fd.get());
            park_timer_.fired();
            break;
          case Source::config_result:
            if (auto o = config_watch_.on_result()) apply_config(std::move(*o));
            break;
          case Source::hello: on_hello_timer(); break;
          case Source::builds: on_builds(); break;
          case Source::swaps: on_swaps(); break;
          case Source::host_builds: on_host_builds(); break;
          case Source::alloc_listen: {
            const auto [fd, id] = alloc_watch_->listener(serial);
            if (fd >= 0) on_accept(fd, id, Source::alloc_listen, serial);
            break;
          }
          case Source::alloc_watch: alloc_watch_->on_watch(); break;
          case Source::alloc_timer: alloc_watch_->on_timer(); break;
          case Source::alloc_scan: alloc_watch_->on_scanned(poller_, *node_); break;
        }
        apply(node_->settle(now()));
      } catch (const std::exception& e) {
        node_->log_limiter().write(LogLevel::error, "event", std::string("event handling failed: ") + e.what(),
                                   std::chrono::steady_clock::now());
      }
      publisher_->publish(*node_);
    }
  }
  shutdown();
  return 0;
}

void Daemon::Impl::on_signal() {
  signalfd_siginfo si{};
  while (::read(signal_fd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    if (si.ssi_signo == SIGHUP) {
      log_.info("received SIGHUP, reloading " + opts_.config);
      reload("SIGHUP", true);
      continue;
    }
    log_.info(std::string("received ") + (si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM") + ", stopping");
    stop_ = true;
  }
}

void Daemon::Impl::on_timer() {
  drain(timer_fd_.get());
  resume_accepting();
  // Safety net: a process whose pidfd event was somehow missed.
  std::vector<std::uint64_t> dead;
  for (const auto& [id, fd] : pidfds_) {
    if (pidfd_exited(fd.get())) dead.push_back(id);
  }
  for (std::uint64_t id : dead) on_process_exit(id);
  // Fallback for missed inotify events: a changed file that held still for one interval.
  config_watch_.poll();
  const Now t = now();
  node_->tick(t);
  sample_gpus(t);
  // Tenants left holding nothing (non-pool usage gone, a reload moved them) are freed.
  node_->free_idle_tenants();
  publisher_->publish(*node_, t.unix_ns);
}

// One NVML reading applied to the Node: per-process usage, the processes without a session,
// the device-file users NVML does not list. Runs on every timer tick and before a counted grant
// is decided when the last reading predates the requesting process's Hello or is older than
// kCountedResampleInterval: counted memory (created by the
// tenant's own process) is told apart from the rest of that process's memory (its context)
// by subtracting it from the process's NVML figure, so a reading older than a freshly created
// context would let the tenant run over its limit by that context.
void Daemon::Impl::sample_gpus(const Now& t) {
  last_sample_ = std::chrono::steady_clock::now();
  if (nvml_) {
    try {
      std::vector<std::pair<DeviceOrdinal, Uuid>> devs;
      for (const Node::Device& d : node_->devices()) devs.emplace_back(d.ordinal, d.uuid);
      const std::vector<GpuSample> sample = sample_nvml(*nvml_, devs);
      // Who the processes without a session are (/proc); the Node decides what it means.
      std::set<std::uint32_t> session_pids;
      for (const auto& [id, sess] : node_->sessions()) session_pids.insert(sess.pid);
      const ReadingSubjects subjects = reading_subjects(sample, session_pids, node_->settings().daemon_pid);
      std::vector<ProcessIdentity> ids;
      for (std::uint32_t pid : subjects.sessionless) {
        if (auto id = read_process_identity(pid, alloc_watch_.has_value())) ids.push_back(std::move(*id));
      }
      // Who has the driver's device files open (/proc/<pid>/fd): GPU users NVML may not list (a
      // process that creates memory without a CUDA context is not in its process list).
      // The scan reads every process's descriptor table: only when some GPU has memory to place.
      bool unlisted = false;
      for (const GpuSample& g : sample) unlisted = unlisted || node_->unlisted_memory(g) > kUnlistedTolerance;
      std::vector<ProcessIdentity> users;
      const std::vector<std::string> none;
      for (std::uint32_t pid : device_file_users(unlisted ? device_files_ : none, node_->settings().daemon_pid)) {
        if (subjects.listed.count(pid) != 0) continue;
        if (auto id = read_process_identity(pid, alloc_watch_.has_value())) users.push_back(std::move(*id));
      }
      node_->observe_gpus(sample, ids, t, users);  // kills: Effects::kills
      nvml_failed_logged_ = false;
    } catch (const std::exception& e) {
      if (!nvml_failed_logged_) log_.warn(std::string("NVML sampling failed: ") + e.what());
      nvml_failed_logged_ = true;
    }
  }
}

void Daemon::Impl::reload(const std::string& why, bool force) { config_watch_.request(why, force); }

void Daemon::Impl::apply_config(ConfigWatch::Outcome o) {
  using Kind = ConfigWatch::Outcome::Kind;
  if (o.kind == Kind::missing) {
    // A vanished file is not an invalid one (an editor may be between unlink and create).
    if (!config_missing_logged_) {
      log_.warn("quota file " + opts_.config + " is gone (" + o.why + "); keeping the configuration in force");
    }
    config_missing_logged_ = true;
    return;
  }
  config_missing_logged_ = false;
  std::string error = o.error;
  if (o.kind == Kind::changed && o.config) {
    try {
      node_->validate(*o.config);
      node_->apply(std::move(*o.config), opts_.config, true, now(), o.why);
      return;
    } catch (const quota::ConfigError& e) {
      error = e.what();
    }
  }
  // Every value quoted in a quota error is already cut (quota_config.hpp); this bounds the line.
  error = excerpt(error, kMaxErrorLogBytes);
  node_->config_rejected(error, now());
  log_.error("quota file rejected (" + o.why + "): " + error + "; the previous configuration stays in force");
}

void Daemon::Impl::on_readable(ConnId serial) {
  auto it = conns_.find(serial);
  if (it == conns_.end()) return;
  Connection& c = it->second;
  // One byte more than the largest message, so an oversized one shows as MSG_TRUNC.
  alignas(8) std::byte buf[proto::kMaxMessageBytes + 8];
  Received r;
  try {
    r = recv_with_fds(c.fd.get(), std::span<std::byte>(buf, sizeof buf));
  } catch (const std::system_error& e) {
    if (e.code().value() == EAGAIN || e.code().value() == EWOULDBLOCK) return;
    log_.debug("connection " + std::to_string(serial) + ": " + e.what());
    close_connection(serial);
    return;
  } catch (const std::exception& e) {
    // Truncated payload or descriptors (already closed by recv_with_fds).
    malformed(serial, e.what());
    return;
  }
  if (r.bytes == 0) {
    close_connection(serial);
    return;
  }
  if (!r.fds.empty()) {
    r.fds.clear();  // closes them
    return malformed(serial, "descriptors attached to a client message");
  }
  // Framing and every stateless field check: the codec all ends share (contracts/codec.hpp).
  const proto::Decoded d = proto::decode(std::span<const std::byte>(buf, r.bytes));
  const proto::Header* h = d.header();
  if (!d && d.error().kind != proto::DecodeError::Kind::fields) {
    if (d.error().kind == proto::DecodeError::Kind::version && h != nullptr && h->type == proto::MsgType::hello) {
      node_->log_limiter().warn("hello version uid " + std::to_string(c.uid),
                                "connection " + std::to_string(serial) + " (pid " + std::to_string(c.pid) +
                                    "): Hello with protocol version " + std::to_string(h->version) +
                                    ", this vlaked speaks " + std::to_string(proto::kVersion) + "; closing",
                                std::chrono::steady_clock::now());
      return fail(serial, h->request_id, proto::Status::version_mismatch,
                  "vlaked speaks protocol version " + std::to_string(proto::kVersion));
    }
    return malformed(serial, d.error().reason);
  }
  // Well framed (a body that fails its field checks included): the connection's state decides
  // which error it hears first.
  node_->count_request();
  const proto::MsgType type = h->type;
  if (type == proto::MsgType::hello && c.session != 0) return malformed(serial, "second Hello on a connection");
  const bool request =
      type == proto::MsgType::hello || type == proto::MsgType::grant_request || type == proto::MsgType::release ||
      type == proto::MsgType::usage_query || type == proto::MsgType::guard_event ||
      type == proto::MsgType::reserve_report || type == proto::MsgType::share_request ||
      type == proto::MsgType::share_commit || type == proto::MsgType::ipc_export || type == proto::MsgType::ipc_open ||
      type == proto::MsgType::ipc_close || type == proto::MsgType::readonly_write || type == proto::MsgType::dropped ||
      type == proto::MsgType::swap_ready || type == proto::MsgType::swap_in ||
      type == proto::MsgType::context_request || type == proto::MsgType::tier_step;
  if (!request) {
    return malformed(serial,
                     "message type " + std::to_string(static_cast<unsigned>(type)) + " is not a client request");
  }
  if (type != proto::MsgType::hello && c.session == 0) return malformed(serial, "request before Hello");
  if (!d) return malformed(serial, d.error().reason);
  on_message(serial, c, d.message());
}

void Daemon::Impl::on_message(ConnId serial, Connection& c, const proto::AnyMessage& msg) {
  if (const auto* hello = std::get_if<proto::Hello>(&msg)) {
    const std::uint64_t start = process_start_time(c.pid);
    UniqueFd pidfd(start != 0 ? pidfd_open(c.pid) : -1);
    if (start != 0 && !pidfd) {
      const std::string why = std::string("pidfd_open: ") + std::strerror(errno);
      node_->log_limiter().write(LogLevel::error, "pidfd",
                                 "cannot open a session for pid " + std::to_string(c.pid) + ": " + why,
                                 std::chrono::steady_clock::now());
      return fail(serial, hello->h.request_id, proto::Status::internal, why);
    }
    HelloOut out = node_->open_session(Peer{serial, c.pid, c.uid, c.gid, start, c.alloc_id}, *hello);
    if (const auto* m = std::get_if<Malformed>(&out.answer)) return malformed(serial, m->reason);
    if (const auto* f = std::get_if<Fatal>(&out.answer)) return fail(serial, hello->h.request_id, f->status, f->text);
    if (out.close != 0) {
      // The process reconnected before we saw its old connection close.
      auto old = conns_.find(out.close);
      if (old != conns_.end()) old->second.session = 0;
      close_connection(out.close);
    }
    if (const auto& ack = std::get<proto::HelloAck>(out.answer); ack.status == proto::Status::passthrough) {
      // VLAKE_DISABLE allowed: no session; the process passes through and NVML attributes it.
      (void)send(serial, ack);
      close_connection(serial);
      return;
    }
    c.session = out.session;
    c.hello_at = std::chrono::steady_clock::now();
    conn_limits_.authenticated(serial);
    if (out.opened) {
      poller_.add(pidfd.get(), Source::pidfd, out.session);
      pidfds_[out.session] = std::move(pidfd);
    }
    if (!send(serial, std::get<proto::HelloAck>(out.answer))) close_connection(serial);
    return;
  }
  const std::uint64_t s = c.session;
  // Answers with a reply, or drops the connection for a Malformed.
  auto answer = [&](auto&& out) {
    std::visit(
        [&](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, Malformed>) {
            malformed(serial, v.reason);
          } else if (!send(serial, v)) {
            close_connection(serial);
          }
        },
        out);
  };
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, proto::GrantRequest>) {
          if (m.purpose == proto::GrantPurpose::counted && nvml_ &&
              reading_stale(last_sample_, c.hello_at, std::chrono::steady_clock::now(), kCountedResampleInterval)) {
            sample_gpus(now());
          }
          deliver(serial, node_->grant(serial, s, m, now()), std::chrono::steady_clock::now());
        } else if constexpr (std::is_same_v<T, proto::Release>) {
          answer(node_->release(s, m));
        } else if constexpr (std::is_same_v<T, proto::UsageQuery>) {
          answer(node_->usage(s, m));
        } else if constexpr (std::is_same_v<T, proto::ContextRequest>) {
          // A context is admitted on the latest reading (its admission counts until NVML shows it).
          answer(node_->context(s, m, now()));
        } else if constexpr (std::is_same_v<T, proto::GuardEvent>) {
          if (auto bad = node_->guard_event(s, m, now())) malformed(serial, bad->reason);
        } else if constexpr (std::is_same_v<T, proto::ReadOnlyWrite>) {
          if (auto bad = node_->readonly_write(s, m, now())) malformed(serial, bad->reason);
        } else if constexpr (std::is_same_v<T, proto::Dropped>) {
          if (auto bad = node_->dropped(s, m)) malformed(serial, bad->reason);
        } else if constexpr (std::is_same_v<T, proto::SwapReady>) {
          if (auto bad = node_->swap_ready(s, m)) malformed(serial, bad->reason);
        } else if constexpr (std::is_same_v<T, proto::SwapIn>) {
          if (auto r = node_->swap_in(serial, s, m, now())) answer(std::variant<proto::SwapInReply, Malformed>(*r));
        } else if constexpr (std::is_same_v<T, proto::ReserveReport>) {
          if (auto bad = node_->reserve_report(s, m)) malformed(serial, bad->reason);
        } else if constexpr (std::is_same_v<T, proto::ShareRequest>) {
          auto out = node_->share_request(s, m);
          if (const auto* bad = std::get_if<Malformed>(&out)) return malformed(serial, bad->reason);
          const ShareOut& share = std::get<ShareOut>(out);
          if (!send(serial, share.reply, share.fds)) {
            node_->share_undeliverable(s);
            close_connection(serial);
          }
        } else if constexpr (std::is_same_v<T, proto::ShareCommit>) {
          answer(node_->share_commit(s, m));
        } else if constexpr (std::is_same_v<T, proto::IpcExport>) {
          answer(node_->ipc_export(s, m));
        } else if constexpr (std::is_same_v<T, proto::IpcOpen>) {
          auto out = node_->ipc_open(s, m, now());
          if (const auto* bad = std::get_if<Malformed>(&out)) return malformed(serial, bad->reason);
          const Node::IpcOpened& opened = std::get<Node::IpcOpened>(out);
          if (!send(serial, opened.reply, opened.fds)) {
            node_->ipc_undeliverable(opened.reply.import_id);
            close_connection(serial);
          }
        } else if constexpr (std::is_same_v<T, proto::IpcClose>) {
          answer(node_->ipc_close(s, m));
        } else if constexpr (std::is_same_v<T, proto::TierStep>) {
          auto out = node_->tier_step(s, m, now());
          if (const auto* bad = std::get_if<Malformed>(&out)) return malformed(serial, bad->reason);
          const TierOut& step = std::get<TierOut>(out);
          if (!send(serial, step.reply, step.fds)) close_connection(serial);
        }  // other types were refused by on_readable
      },
      msg);
}

void Daemon::Impl::on_process_exit(std::uint64_t session) {
  auto p = pidfds_.find(session);
  if (p != pidfds_.end()) {
    poller_.del(p->second.get());
    pidfds_.erase(p);
  }
  // What the process sent before it exited (a GuardEvent just before its end, releases) is
  // still in its socket: read it before the session ends, or it would be lost when the exit is
  // noticed first. Bounded by what the socket holds (the process is gone).
  if (const Node::Session* ss = node_->session(session); ss != nullptr && ss->conn != 0) {
    const ConnId live = ss->conn;
    for (int i = 0; i < 4096; ++i) {
      auto it = conns_.find(live);
      if (it == conns_.end()) break;
      pollfd pfd{it->second.fd.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 0) <= 0 || (pfd.revents & POLLIN) == 0) break;
      on_readable(live);
    }
  }
  const ConnId conn = node_->end_session(session, "process exited");
  auto c = conns_.find(conn);
  if (c != conns_.end()) {
    c->second.session = 0;
    close_connection(conn);
  }
}

// ---------------------------------------------------------------------------------------------
// what an event leaves to do (effects.hpp)

// Parked grants' answers (docs/pool.md, "Pressure protocol"), Drops of kept mappings
// (docs/hook.md; a client whose socket is full gets none, logged: its memory stays charged until
// it ends), warm builds and discards, swapping (docs/swap.md) and kills (`enforce: kill`), in
// that order.
void Daemon::Impl::apply(Effects&& fx) {
  // A notice for a session's connection (none when it is gone); one that cannot be sent is logged.
  auto notify = [&](ConnId conn, std::uint64_t session, const auto& msg, const char* what, const char* log_key) {
    auto it = conns_.find(conn);
    if (it == conns_.end()) return;
    try {
      send_with_fds(it->second.fd.get(), proto::encode(msg), {});
    } catch (const std::exception& e) {
      node_->log_limiter().warn(log_key,
                                "session " + std::to_string(session) + ": cannot send " + what + ": " + e.what(),
                                std::chrono::steady_clock::now());
    }
  };
  for (Completion& c : fx.completions) {
    if (conns_.count(c.conn) != 0) deliver(c.conn, std::move(c.out), c.received);
  }
  arm_park_timer();
  for (const DropOut& d : fx.drops) notify(d.conn, d.session, d.msg, "Drop", "drop");
  for (const BuildOut& b : fx.builds) {
    if (builder_) builder_->submit(b.device, b.size);
    else node_->build_failed(b.device, b.size, false);
  }
  for (DiscardOut& d : fx.discards) {
    if (builder_) builder_->discard(d.device, std::move(d.handle));
    else release_built(*driver_, d.handle);
  }
  for (const SwapNoticeOut& n : fx.swap_notices) notify(n.conn, n.session, n.msg, "SwapNotice", "swap notice");
  for (const SwapJob& j : fx.swap_jobs) {
    if (swapper_) {
      swapper_->submit(j);
    } else {
      node_->swap_done(j, false, Bytes{0}, std::chrono::nanoseconds(0), "swapping is off", now());
    }
  }
  for (const SwapInOut& r : fx.swap_replies) {
    if (conns_.count(r.conn) != 0 && !send(r.conn, r.reply)) close_connection(r.conn);
  }
  for (const KillOrder& k : fx.kills) node_->unhooked_killed(k, kill_process(k.pid, k.start_time));
  // The host tier (docs/swap.md): notices, pieces to make and to release, off the loop.
  for (const TierNoticeOut& n : fx.tier_notices) notify(n.conn, n.session, n.msg, "TierNotice", "tier notice");
  for (Bytes b : fx.host_builds) {
    if (host_builder_) host_builder_->build(b);
    else node_->host_build_failed(b, "the host tier is off");
  }
  for (HostPiece& p : fx.host_releases) {
    if (host_builder_) host_builder_->release(std::move(p));
    else driver_->release(p.handle);
  }
}

void Daemon::Impl::on_host_builds() {
  drain(host_fd_.get());
  if (!host_builder_) return;
  for (HostBuilder::Done& d : host_builder_->take()) {
    if (d.piece) node_->host_built(std::move(*d.piece));
    else node_->host_build_failed(d.size, d.error);
  }
}

void Daemon::Impl::on_builds() {
  drain(builds_fd_.get());
  if (!builder_) return;
  for (HandleBuilder::Done& d : builder_->take()) {
    if (d.handle) {
      node_->adopt(d.device, std::move(*d.handle));
      continue;
    }
    node_->build_failed(d.device, d.size, d.no_room);
    if (!d.error.empty()) {
      node_->log_limiter().warn("warm build",
                                "GPU " + std::to_string(d.device.value()) + ": building a " +
                                    std::to_string(d.size.value() >> 20) + " MiB warm handle failed: " + d.error,
                                std::chrono::steady_clock::now());
    }
  }
}

// Swapping (docs/swap.md): finished checkpoints and restores into the Node, then what it wants
// sent and run.
void Daemon::Impl::on_swaps() {
  drain(swaps_fd_.get());
  if (!swapper_) return;
  for (Swapper::Done& d : swapper_->take()) node_->swap_done(d.job, d.ok, d.freed, d.took, d.error, now());
}

void Daemon::Impl::arm_park_timer() { park_timer_.set(node_->next_deadline()); }

// ---------------------------------------------------------------------------------------------
// replies

namespace {
// Outbox::SendFn over a non-blocking socket: false when it would block.
Outbox::SendFn socket_sender(int fd) {
  return [fd](std::span<const std::byte> bytes, std::span<const int> fds) {
    try {
      send_with_fds(fd, bytes, fds);
      return true;
    } catch (const std::system_error& e) {
      if (e.code().value() == EAGAIN || e.code().value() == EWOULDBLOCK) return false;
      throw;
    }
  };
}
}  // namespace

template <class T>
bool Daemon::Impl::send(ConnId serial, const T& msg, std::span<const int> fds, std::uint64_t grant) {
  if (conns_.count(serial) == 0) return false;
  publisher_->publish(*node_);  // what the reply says is in the segment when it arrives
  return send_bytes(serial, proto::encode(msg), fds, grant);
}

// Sends now, or queues behind what the client has not taken yet (a stopped or slow client never
// stalls the loop); false when the connection is broken or its outbox is full: the caller closes
// it.
bool Daemon::Impl::send_bytes(ConnId serial, std::span<const std::byte> bytes, std::span<const int> fds,
                              std::uint64_t grant) {
  auto it = conns_.find(serial);
  if (it == conns_.end()) return false;
  Connection& c = it->second;
  try {
    const Outbox::Result r = c.outbox.send(bytes, fds, grant, socket_sender(c.fd.get()));
    if (r == Outbox::Result::queued && c.outbox.messages() == 1) {
      poller_.watch_writable(c.fd.get(), Source::conn, serial, true);
    }
    if (r != Outbox::Result::overflow) return true;
    node_->log_limiter().warn("send uid " + std::to_string(c.uid),
                              "connection " + std::to_string(serial) + " (pid " + std::to_string(c.pid) +
                                  "): the client has not read " + std::to_string(c.outbox.messages()) + " replies (" +
                                  std::to_string(c.outbox.bytes()) + " bytes); closing it",
                              std::chrono::steady_clock::now());
    return false;
  } catch (const std::exception& e) {
    node_->log_limiter().warn("send uid " + std::to_string(c.uid),
                              "connection " + std::to_string(serial) + " (pid " + std::to_string(c.pid) +
                                  "): cannot send a reply: " + e.what() + "; closing it",
                              std::chrono::steady_clock::now());
    return false;
  }
}

void Daemon::Impl::on_writable(ConnId serial) {
  auto it = conns_.find(serial);
  if (it == conns_.end()) return;
  Connection& c = it->second;
  try {
    if (c.outbox.flush(socket_sender(c.fd.get()))) poller_.watch_writable(c.fd.get(), Source::conn, serial, false);
  } catch (const std::exception& e) {
    node_->log_limiter().warn("send uid " + std::to_string(c.uid),
                              "connection " + std::to_string(serial) + " (pid " + std::to_string(c.pid) +
                                  "): cannot send a queued reply: " + e.what() + "; closing it",
                              std::chrono::steady_clock::now());
    close_connection(serial);
  }
}

void Daemon::Impl::deliver(ConnId serial, GrantOut out, std::chrono::steady_clock::time_point received) {
  if (auto* g = std::get_if<Granted>(&out)) {
    if (!send(serial, g->reply, g->fds, g->grant)) {
      // The client never got the descriptors: undo the grant.
      node_->undo_grant(g->grant);
      close_connection(serial);
      return;
    }
    node_->record_grant_latency(std::chrono::steady_clock::now() - received);
  } else if (auto* r = std::get_if<Refused>(&out)) {
    if (!send(serial, r->reply)) close_connection(serial);
  } else if (auto* p = std::get_if<Parked>(&out)) {
    arm_park_timer();
    for (const PressureNote& n : p->pressure) {
      // Queued like a reply when the client is not reading; a client over its outbox's bound
      // is closed like any other.
      if (conns_.count(n.conn) != 0 && !send_bytes(n.conn, proto::encode(n.msg), {}, 0)) close_connection(n.conn);
    }
  } else {
    malformed(serial, std::get<Malformed>(out).reason);
  }
}

void Daemon::Impl::fail(ConnId serial, std::uint64_t request_id, proto::Status s, const std::string& text) {
  auto it = conns_.find(serial);
  if (it == conns_.end()) return;
  proto::Error e = proto::make<proto::Error>(request_id);
  e.status = s;
  copy_chars(e.message, text);
  publisher_->publish(*node_);  // counters included: the client may look right after
  try {
    send_with_fds(it->second.fd.get(), proto::encode(e), {});
  } catch (...) {
    // best effort: the connection is being closed anyway
  }
  close_connection(serial);
}

void Daemon::Impl::malformed(ConnId serial, const std::string& reason) {
  auto it = conns_.find(serial);
  if (it == conns_.end()) return;
  node_->log_limiter().warn("malformed uid " + std::to_string(it->second.uid),
                            "dropping connection " + std::to_string(serial) + " (pid " +
                                std::to_string(it->second.pid) + ", uid " + std::to_string(it->second.uid) +
                                "): malformed message: " + reason,
                            std::chrono::steady_clock::now());
  node_->count_malformed();
  fail(serial, 0, proto::Status::bad_request, reason);
}

void Daemon::Impl::shutdown() {
  metrics_.reset();  // stops its threads before the segment may go
  builder_.reset();  // stops its workers; handles built and not adopted are released
  swapper_.reset();  // after the job in progress; swapped processes stay on the host
  host_builder_.reset();
  poller_.del(listen_fd_.get());
  listen_fd_.reset();
  if (socket_bound_) {
    ::unlink(opts_.socket.c_str());
    socket_bound_ = false;
  }
  std::vector<ConnId> serials;
  for (const auto& [serial, c] : conns_) serials.push_back(serial);
  for (ConnId serial : serials) close_connection(serial);
  const std::size_t held = node_->shutdown();
  const Now t = now();
  publisher_->publish(*node_, t.unix_ns);
  publisher_->mark_clean(t.unix_ns);
  if (held == 0) {
    seg_->remove();
    log_.info("stopped; no grant held, state segment removed");
  } else {
    log_.info("stopped; " + std::to_string(held) + " grant(s) of " + std::to_string(node_->sessions().size()) +
              " live session(s) still held: keeping " + st::segment_path(opts_.state) + " for the next vlaked");
  }
}

// ---------------------------------------------------------------------------------------------

Daemon::Daemon(const DaemonOptions& options, Logger& log) : impl_(std::make_unique<Impl>(options, log)) {}
Daemon::~Daemon() = default;
int Daemon::run() { return impl_->run(); }

int vlaked_main(int argc, const char* const* argv) noexcept {
  Logger log;
  DaemonOptions opts;
  try {
    opts = DaemonOptions::parse(argc, argv);
  } catch (const std::exception& e) {
    log.error(e.what());
    return 2;
  }
  if (opts.help) {
    std::cout << DaemonOptions::usage();
    return 0;
  }
  log.set_level(opts.log_level);
  try {
    Daemon d(opts, log);
    return d.run();
  } catch (const StartupError& e) {
    log.error(e.what());
    return 1;
  } catch (const std::exception& e) {
    log.error(std::string("fatal: ") + e.what());
    return 1;
  } catch (...) {
    log.error("fatal: unknown exception");
    return 1;
  }
}

}  // namespace vlake::pool
