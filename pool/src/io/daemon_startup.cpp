// vlaked's start-up steps (Daemon::Impl, daemon_impl.hpp), which the constructor (daemon.cpp)
// takes in order: the signals the loop reads, the descriptor limit, the single-instance lock
// (<socket>.lock, holding the daemon's pid), the quota file, the state segment (resuming the
// sessions of live processes), the listening socket and the loop's sources (signalfd, timers,
// worker counters, watchers). Every failure throws StartupError with a one-line message; ~Impl
// releases what was acquired.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "daemon_impl.hpp"
#include "process_control.hpp"
#include "vlake/common/proc.hpp"

namespace vlake::pool {

namespace {

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The signals the loop reads from its signalfd (blocked in the daemon's thread).
sigset_t loop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

// The warm reserve and stock leave a GPU at least total / this free (HandleBuilder headroom).
constexpr std::uint64_t kBuildHeadroomDivisor = 64;

}  // namespace

void Daemon::Impl::block_signals() {
  // SIGTERM/SIGINT/SIGHUP arrive through the signalfd; SIGPIPE never kills the daemon.
  const sigset_t set = loop_signals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

// Raises the descriptor limit's soft value to the hard one (every connection is a descriptor);
// returns the soft limit in force.
rlim_t Daemon::Impl::raise_nofile() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) return want.rlim_cur;
  }
  return rl.rlim_cur;
}

void Daemon::Impl::take_lock() {
  try {
    mkdir_p(parent_dir(opts_.socket));
  } catch (const std::exception& e) {
    throw StartupError(std::string("cannot create the socket directory: ") + e.what());
  }
  const std::string lock = opts_.lock_path();
  lock_fd_.reset(::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_fd_) throw StartupError("cannot open lock file " + lock + ": " + std::strerror(errno));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) throw StartupError("cannot lock " + lock + ": " + std::strerror(errno));
    char buf[32] = {};
    const ssize_t n = ::pread(lock_fd_.get(), buf, sizeof buf - 1, 0);
    std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "?";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw StartupError("another vlaked (pid " + pid + ") owns " + opts_.socket);
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_.get(), 0) != 0 || ::pwrite(lock_fd_.get(), me.data(), me.size(), 0) < 0) {
    log_.warn("cannot write the pid into " + lock + ": " + std::strerror(errno));
  }
}

quota::QuotaConfig Daemon::Impl::load_config(bool& from_file) {
  ConfigWatch::Outcome o = config_watch_.load_now();
  if (o.kind == ConfigWatch::Outcome::Kind::missing) {
    log_.info("no quota file at " + opts_.config + ": every uid is its own tenant with 100% of each GPU");
    return quota::QuotaConfig();
  }
  if (o.kind != ConfigWatch::Outcome::Kind::changed || !o.config) throw StartupError("bad quota file: " + o.error);
  from_file = true;
  log_.info("quota file " + opts_.config + " loaded (default limit " + o.config->default_limit().to_string() + ", " +
            std::to_string(o.config->namespaces().size()) + " namespace(s))");
  return std::move(*o.config);
}

void Daemon::Impl::open_state() {
  try {
    seg_ = std::make_unique<st::StateSegment>(opts_.state, opts_.state_mode, opts_.state_gid);
  } catch (const st::StateError& e) {
    throw StartupError(e.what());
  }
  const auto pid = static_cast<std::uint32_t>(::getpid());
  publisher_ = std::make_unique<StatePublisher>(*seg_, pid, process_start_time(pid),
                                                static_cast<std::uint32_t>(opts_.sample_interval.count()));
  if (seg_->origin() == st::StateSegment::Origin::resumed) {
    // Sessions of live processes (same pid and start time) keep their grants.
    const st::State& old = seg_->state();
    std::set<std::uint64_t> alive;
    for (const st::SessionRecord& r : old.sessions) {
      if (r.state == st::kSessionFree || r.start_time == 0 || process_start_time(r.pid) != r.start_time) continue;
      UniqueFd fd(pidfd_open(r.pid));
      if (!fd || process_start_time(r.pid) != r.start_time) continue;
      alive.insert(r.id);
      pidfds_[r.id] = std::move(fd);
    }
    log_.info("state segment " + st::segment_path(opts_.state) + " found");
    const std::vector<std::uint64_t> kept = node_->resume(old, alive);
    for (auto it = pidfds_.begin(); it != pidfds_.end();) {
      it = std::find(kept.begin(), kept.end(), it->first) == kept.end() ? pidfds_.erase(it) : std::next(it);
    }
  }
  publisher_->publish_all(*node_, now().unix_ns);
}

void Daemon::Impl::bind_socket() {
  listen_fd_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_fd_) throw StartupError(std::string("socket: ") + std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (opts_.socket.size() >= sizeof addr.sun_path) throw StartupError("socket path too long: " + opts_.socket);
  std::memcpy(addr.sun_path, opts_.socket.data(), opts_.socket.size());
  // We hold the lock: a socket file left here is stale.
  if (::unlink(opts_.socket.c_str()) == 0) log_.info("removed stale socket " + opts_.socket);
  if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw StartupError("cannot bind " + opts_.socket + ": " + std::strerror(errno));
  }
  socket_bound_ = true;
  ::chmod(opts_.socket.c_str(), 0666);
  if (::listen(listen_fd_.get(), 128) != 0) throw StartupError(std::string("listen: ") + std::strerror(errno));
}

// The loop's sources: signals, timers, the listening socket, the workers' counters, the pidfds
// of resumed sessions, the quota file's watch, the allocation directories.
void Daemon::Impl::add_sources() {
  const sigset_t sigs = loop_signals();
  signal_fd_.reset(::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_) throw StartupError(std::string("signalfd: ") + std::strerror(errno));
  timer_fd_ = make_timer();
  arm(timer_fd_.get(), opts_.sample_interval, opts_.sample_interval);
  park_timer_.fd = make_timer();
  hello_timer_.fd = make_timer();
  poller_.add(listen_fd_.get(), Source::listen, 0);
  poller_.add(hello_timer_.fd.get(), Source::hello, 0);
  poller_.add(signal_fd_.get(), Source::signal, 0);
  poller_.add(timer_fd_.get(), Source::timer, 0);
  poller_.add(park_timer_.fd.get(), Source::park, 0);
  if (opts_.warm_reserve > 0 || opts_.warm_stock > 0) {
    builds_fd_ = make_counter();
    std::vector<HandleBuilder::Gpu> gpus;
    for (const Node::Device& d : node_->devices()) {
      gpus.push_back({d.ordinal, d.granularity, Bytes{d.total.value() / kBuildHeadroomDivisor}});
    }
    builder_ = std::make_unique<HandleBuilder>(*driver_, gpus, ring(builds_fd_.get()));
    poller_.add(builds_fd_.get(), Source::builds, 0);
  }
  if (driver_->checkpoint_supported() && opts_.swap_idle.count() > 0) {
    swaps_fd_ = make_counter();
    swapper_ = std::make_unique<Swapper>(*driver_, ring(swaps_fd_.get()));
    poller_.add(swaps_fd_.get(), Source::swaps, 0);
  }
  if (opts_.host_tier > 0) {
    if (!driver_->host_memory_supported(DeviceOrdinal{0})) {
      throw StartupError(
          "--host-tier: this GPU's driver cannot make host-located VMM memory "
          "(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); "
          "run without --host-tier (overcommit namespaces are then checkpointed)");
    }
    host_fd_ = make_counter();
    host_builder_ = std::make_unique<HostBuilder>(*driver_, node_->devices().front().granularity, ring(host_fd_.get()));
    poller_.add(host_fd_.get(), Source::host_builds, 0);
  }
  for (const auto& [id, fd] : pidfds_) poller_.add(fd.get(), Source::pidfd, id);
  config_watch_.start(poller_);
  if (!opts_.alloc_root.empty()) {
    alloc_watch_.emplace(opts_.alloc_root, log_);
    try {
      alloc_watch_->start(poller_, *node_, opts_.sample_interval);
    } catch (const std::exception& e) {
      throw StartupError(e.what());
    }
  }
}

}  // namespace vlake::pool
