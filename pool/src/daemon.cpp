#include "vlake/pool/daemon.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "vlake/contracts/allocation.hpp"
#include "vlake/common/driver.hpp"
#include "vlake/contracts/codec.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/common/unix_socket.hpp"
#include "vlake/exporter/server.hpp"
#include "vlake/pool/accounting.hpp"
#include "dedup.hpp"
#include "vlake/pool/device_pool.hpp"
#include "vlake/pool/nvml_source.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/quota/quota_config.hpp"

namespace vlake::pool {

namespace {

namespace proto = vlake::proto;
namespace st = vlake::state;

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// /proc/<pid>/stat field 22 (start time in clock ticks since boot); 0 if the process is gone.
std::uint64_t process_start_time(std::uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  const auto rp = line.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream rest(line.substr(rp + 2));
  std::string field;
  // After ")": field 3 (state) is the first; we want field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return 0;
  }
  try {
    return std::stoull(field);
  } catch (...) {
    return 0;
  }
}

int pidfd_open(std::uint32_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
}

bool pidfd_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

std::vector<gid_t> supplementary_groups(uid_t uid, gid_t gid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* res = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &res) != 0 || res == nullptr) return {gid};
  int n = 64;
  std::vector<gid_t> groups(static_cast<std::size_t>(n));
  for (int attempt = 0; attempt < 4; ++attempt) {
    int count = n;
    if (::getgrouplist(pw.pw_name, gid, groups.data(), &count) >= 0) {
      groups.resize(static_cast<std::size_t>(count));
      return groups;
    }
    n = count + 16;
    groups.resize(static_cast<std::size_t>(n));
  }
  return {gid};
}

void mkdir_p(const std::string& dir) {
  if (dir.empty()) return;
  struct stat sb {};
  if (::stat(dir.c_str(), &sb) == 0) return;
  const auto slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) mkdir_p(dir.substr(0, slash));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw_errno("mkdir " + dir);
  ::chmod(dir.c_str(), 0755);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::uint64_t now_unix_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<std::uint64_t>(ts.tv_nsec);
}

// What identifies one version of the quota file: a ConfigMap update swaps a symlink, an editor
// renames over the file or rewrites it in place; all of these change at least one field.
struct FileFingerprint {
  bool exists = false;
  std::string real;  // realpath
  std::uint64_t dev = 0;
  std::uint64_t ino = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t size = 0;
  std::uint64_t hash = 0;  // FNV-1a of the content
  friend bool operator==(const FileFingerprint&, const FileFingerprint&) = default;
};

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

// Reads `path` (following symlinks) and fingerprints what was read. `content` receives it.
FileFingerprint fingerprint(const std::string& path, std::string* content) {
  FileFingerprint f;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return f;
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0) return f;
  std::string data;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<std::size_t>(n));
    if (data.size() > (64u << 20)) break;  // not a quota file; parse() will say so
  }
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) != nullptr) f.real = real;
  f.exists = true;
  f.dev = static_cast<std::uint64_t>(sb.st_dev);
  f.ino = static_cast<std::uint64_t>(sb.st_ino);
  f.mtime_ns = static_cast<std::int64_t>(sb.st_mtim.tv_sec) * 1'000'000'000LL + sb.st_mtim.tv_nsec;
  f.size = static_cast<std::int64_t>(sb.st_size);
  f.hash = fnv1a(data);
  if (content != nullptr) *content = std::move(data);
  return f;
}

template <std::size_t N>
void copy_name(char (&dst)[N], const std::string& src) {
  std::memset(dst, 0, N);
  std::memcpy(dst, src.data(), std::min(src.size(), N - 1));
}

// epoll tokens: kind in the top byte, a never-reused serial below.
enum class Kind : std::uint64_t { listen = 1, signal = 2, timer = 3, conn = 4, pidfd = 5, inotify = 6, reload = 7, park = 8,
                                  // Kubernetes allocations (--alloc-root): their sockets, the directory watch, the rescan
                                  alloc_listen = 20, alloc_watch = 21, alloc_timer = 22 };
std::uint64_t token(Kind k, std::uint64_t serial) { return (static_cast<std::uint64_t>(k) << 56) | serial; }
Kind kind_of(std::uint64_t t) { return static_cast<Kind>(t >> 56); }
std::uint64_t serial_of(std::uint64_t t) { return t & ((1ULL << 56) - 1); }

}  // namespace

class Daemon::Impl {
 public:
  Impl(const DaemonOptions& o, Logger& log);
  ~Impl();
  int run();

 private:
  struct Tenant {
    TenantId id;
    std::uint32_t slot;
    std::string name;
    quota::Limit limit = quota::Limit::bytes(Bytes{0});
    NamespaceId ns{0};
    bool have_ids = false;  // uid/gid known (created by a session of this daemon)
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    std::chrono::steady_clock::time_point last_refusal_log{};
    std::uint64_t refusals_unlogged = 0;
    proto::GuardMode guard = proto::GuardMode::off;
    std::string alloc_id{};  // a Kubernetes allocation's tenant (docs/device-plugin.md); "": uid/gid tenant
  };
  struct Namespace {
    NamespaceId id;
    std::uint32_t slot;
    quota::NamespaceSpec spec;
  };
  struct Connection {
    std::uint64_t serial;
    UniqueFd fd;
    std::uint32_t pid;
    std::uint32_t uid;
    std::uint32_t gid;
    std::uint64_t session = 0;
    std::string alloc_id{};  // accepted on that allocation's socket: its identity
  };
  struct Session {
    std::uint64_t id;
    std::uint32_t slot;
    std::uint32_t pid;
    std::uint64_t start_time;
    std::uint32_t uid;
    std::uint32_t gid;
    TenantId tenant;
    std::uint64_t conn = 0;  // 0: detached
    UniqueFd pidfd;
    std::vector<std::uint64_t> grants;
    std::string alloc_id{};  // opened through that allocation's socket
    bool pressure = false;   // its latest Hello set kHelloPressure
    std::array<std::uint64_t, st::kMaxDevices> reserve{};  // last ReserveReport per GPU
  };
  struct Grant {
    std::uint64_t id;
    std::uint32_t slot;
    std::uint64_t session;
    TenantId tenant;
    DeviceOrdinal device;
    Bytes bytes;
    proto::GrantPurpose purpose;
    bool orphaned = false;  // its handles died with a previous daemon
    std::vector<std::unique_ptr<PoolHandle>> handles;
    std::uint64_t requested = 0;        // GrantRequest::bytes
    std::uint64_t created_unix_ns = 0;
    bool canary = false;                // its slack holds the canary pattern (docs/guard.md)
  };
  struct DeviceInfo {
    DeviceOrdinal ordinal;
    Uuid uuid;
    Bytes total;
    Bytes granularity;
    std::unique_ptr<DevicePool> pool;
    Bytes granted{0};   // grants with handles
    Bytes orphaned{0};  // grants whose handles died with a previous daemon
    Bytes counted{0};   // `counted` grants
  };

  // start-up
  void take_lock();
  void load_config();
  void validate_config(const quota::QuotaConfig& cfg) const;
  void open_driver_and_devices();
  void open_nvml();
  void open_state();
  void init_fresh_state();
  void resume_state();
  void bind_socket();
  void setup_loop();
  void setup_watch();
  void add_watches();

  // loop
  void add_epoll(int fd, Kind k, std::uint64_t serial);
  void on_accept();
  // Accepts on `listen_fd`; connections get `alloc_id` as identity ("": SO_PEERCRED's uid/gid).
  void accept_on(int listen_fd, const std::string& alloc_id);
  void on_signal();
  void on_timer();
  void on_readable(std::uint64_t conn_serial);
  void on_process_exit(std::uint64_t session_id);
  void on_inotify();
  void on_reload_timer();
  void shutdown();

  // quota configuration
  // Reads the file; applies it if it changed (or `force`), or rejects it (logged, counted).
  void reload(const std::string& why, bool force);
  void apply_namespaces();
  void retarget_tenants();
  void move_session(Session& s, Tenant& to);
  NamespaceId namespace_id(const std::string& name) const;
  void publish_config();

  // messages
  void handle(Connection& c, const std::byte* data, std::size_t n);
  void on_hello(Connection& c, const proto::Hello& m);
  void on_grant(Connection& c, Session& s, const proto::GrantRequest& m);
  void on_release(Connection& c, Session& s, const proto::Release& m);
  void on_usage(Connection& c, Session& s, const proto::UsageQuery& m);
  void on_guard_event(Connection& c, Session& s, const proto::GuardEvent& m);
  // Dedup of read-only chunks (docs/dedup.md; the table is dedup.hpp).
  void on_share_request(Connection& c, Session& s, const proto::ShareRequest& m);
  void on_share_commit(Connection& c, Session& s, const proto::ShareCommit& m);
  Dedup& dedup();
  std::unique_ptr<Dedup> dedup_;  // created on first use

  // guards (docs/guard.md)
  // Fills grant g's slack [requested, bytes) with the canary pattern (throws DriverError).
  void canary_fill(const Grant& g);
  // Checks g's slack; on a changed byte records a canary alarm and re-arms the pattern.
  // Returns false when a changed byte was found. Never throws (driver failures are logged).
  bool canary_check(const Grant& g, const char* when);
  // Checks up to a bounded amount of canary slack, resuming where the last sweep stopped.
  void canary_sweep();
  void record_guard_event(const st::GuardEventRecord& e);
  void malformed(Connection& c, const std::string& reason);
  template <class T>
  bool send(Connection& c, const T& msg, std::span<const int> fds = {});
  void send_error(Connection& c, std::uint64_t request_id, proto::Status s, const std::string& text);
  void close_connection(std::uint64_t serial);

  // model
  Tenant& tenant_for(const quota::TenantSpec& spec, std::uint32_t uid, std::uint32_t gid);

  // Kubernetes allocations (--alloc-root; docs/device-plugin.md): one listening socket per
  // allocation directory; a connection on it is that allocation's tenant.
  struct Allocation {
    std::string id;
    std::string dir;
    std::uint64_t serial = 0;  // epoll serial of its socket
    UniqueFd fd;               // listening socket <dir>/vlaked.sock
    DeviceOrdinal device{0};
    Bytes bytes{0};
    std::optional<alloc::Owner> owner;
  };
  Tenant& tenant_for(const quota::TenantSpec& spec, std::uint32_t uid, std::uint32_t gid, const Allocation* alloc);
  void setup_allocs();
  // Brings allocs_ in line with the directories: binds new ones, closes gone ones, applies
  // changed owners (sessions move to the renamed tenant). Never throws.
  void rescan_allocs();
  void on_alloc_watch();
  void on_alloc_timer();
  void close_alloc(Allocation& a);
  // The tenant of allocation `a` (created or updated: name, namespace, per-GPU limits).
  Tenant& tenant_for_alloc(const Allocation& a);
  void reattribute(const Allocation& a);
  std::map<std::string, Allocation> allocs_;  // by allocation id
  std::unordered_map<std::uint64_t, std::string> alloc_serials_;  // socket serial -> id
  std::uint64_t next_alloc_serial_ = 1;
  UniqueFd alloc_inotify_fd_;
  UniqueFd alloc_timer_fd_;
  std::map<int, std::string> alloc_watches_;  // inotify wd -> allocation id ("" for the root)
  bool alloc_root_warned_ = false;
  Tenant* tenant_by_id(TenantId id);
  DeviceInfo* device_by_uuid(const std::uint8_t* uuid);
  void end_session(Session& s, const char* why);
  void finish_grant(Grant& g, TenantId releaser, bool exported);
  std::int32_t free_session_slot() const;
  std::int32_t free_grant_slot() const;
  proto::DeviceQuota device_quota(const Tenant& t, const DeviceInfo& d) const;

  // state segment
  void publish_tenant(const Tenant& t);
  void publish_namespace(const Namespace& n);
  void publish_device(const DeviceInfo& d);
  void publish_session(const Session& s);

  const DaemonOptions opts_;
  Logger& log_;
  UniqueFd lock_fd_;
  quota::QuotaConfig config_;
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<NvmlSource> nvml_;
  bool nvml_failed_logged_ = false;
  std::vector<DeviceInfo> devices_;
  std::unique_ptr<st::StateSegment> seg_;
  Accounting acct_;

  std::map<std::string, Namespace> namespaces_;  // by name
  bool config_from_file_ = false;
  FileFingerprint seen_fp_;     // the file version last applied or rejected
  FileFingerprint pending_fp_;  // the fallback check's previous look (a change must hold still)
  bool missing_logged_ = false;
  std::string last_rejected_;
  UniqueFd inotify_fd_;
  UniqueFd reload_timer_fd_;
  int watch_dir_ = -1;
  bool watch_failed_logged_ = false;
  int watch_real_dir_ = -1;
  std::string watched_real_dir_;

  std::unordered_map<std::string, TenantId> tenant_ids_;
  std::map<std::uint32_t, Tenant> tenants_;  // by TenantId value
  std::unordered_map<std::uint64_t, Session> sessions_;
  std::unordered_map<std::uint64_t, Grant> grants_;
  std::unordered_map<std::uint64_t, Connection> conns_;
  std::uint64_t next_conn_serial_ = 1;

  UniqueFd listen_fd_;
  UniqueFd signal_fd_;
  UniqueFd timer_fd_;
  UniqueFd epoll_fd_;
  bool stop_ = false;
  bool socket_bound_ = false;
  std::uint64_t handles_created_base_ = 0;
  std::uint64_t handles_released_base_ = 0;
  std::unique_ptr<exporter::MetricsServer> metrics_;  // its own threads; reads the segment
  std::chrono::steady_clock::time_point last_canary_sweep_ = std::chrono::steady_clock::now();
  std::uint64_t canary_cursor_ = 0;  // the sweep resumes after this grant id

  // Pool performance (docs/pool.md): pressure protocol, reserve reports, warm reserve.
  struct Parked {
    std::uint64_t conn;
    std::uint64_t session;
    proto::GrantRequest req;
    std::chrono::steady_clock::time_point received;
    std::chrono::steady_clock::time_point deadline;
  };
  const Parked* grant_retry_ = nullptr;  // set while retry_parked() re-runs a parked request
  bool grant_parked_ = false;            // on_grant() parked (or kept parked) its request
  // The pool could not serve `m`: parks it (pressure sent) or keeps a retried one parked until
  // its deadline. False: the caller answers out_of_memory.
  bool park_grant(Connection& c, Session& s, const proto::GrantRequest& m, const DeviceInfo& dev, Bytes bytes,
                  std::chrono::steady_clock::time_point received);
  void on_reserve_report(Connection& c, Session& s, const proto::ReserveReport& m);
  // Sends Pressure to the other flagged sessions holding reserve on `dev`; false if there is none.
  bool send_pressure(const Session& requester, const DeviceInfo& dev, Bytes shortfall);
  void retry_parked();
  void on_park_timer();
  void arm_park_timer();
  void refill_warm(std::uint64_t max_handles_per_gpu);
  std::vector<Parked> parked_;  // FIFO
  bool retry_parked_ = false;   // a release happened since the last retry
  UniqueFd park_timer_fd_;
};

namespace {
// The canary pattern: every slack byte holds kCanaryByte (docs/guard.md).
constexpr std::uint8_t kCanaryByte = 0xCB;
// A sweep checks at most this much slack (then resumes there on the next tick).
constexpr std::uint64_t kCanarySweepBytes = 64ull << 20;
const char* guard_kind_name(std::uint32_t k) {
  switch (static_cast<proto::GuardKind>(k)) {
    case proto::GuardKind::fault: return "fault";
    case proto::GuardKind::canary: return "canary";
    case proto::GuardKind::readonly: return "readonly";
  }
  return "unknown";
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// start-up

Daemon::Impl::Impl(const DaemonOptions& o, Logger& log) : opts_(o), log_(log) {
  // SIGTERM/SIGINT arrive through the signalfd; SIGPIPE never kills the daemon.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  take_lock();
  load_config();
  open_driver_and_devices();
  try {
    validate_config(config_);
  } catch (const quota::ConfigError& e) {
    throw StartupError(std::string("bad quota file: ") + e.what());
  }
  open_nvml();
  open_state();
  for (DeviceInfo& d : devices_) {
    try {
      d.pool->warm();
    } catch (const std::exception& e) {
      throw StartupError("cannot create pool memory on GPU " + std::to_string(d.ordinal.value()) + ": " + e.what());
    }
  }
  if (opts_.warm_reserve > 0) {
    try {
      refill_warm(UINT64_MAX);
    } catch (const std::exception& e) {
      throw StartupError(std::string("cannot create the warm reserve: ") + e.what());
    }
    for (const DeviceInfo& d : devices_) {
      log_.info("GPU " + std::to_string(d.ordinal.value()) + ": warm reserve " +
                std::to_string(d.pool->free_bytes().value() >> 20) + " MiB of " +
                std::to_string(opts_.warm_reserve >> 20) + " MiB (" + std::to_string(d.pool->free_bulk_handles()) +
                " bulk, " + std::to_string(d.pool->free_small_handles()) + " small handles)");
    }
  }
  if (!opts_.metrics_address.empty()) {
    try {
      metrics_ = std::make_unique<exporter::MetricsServer>(opts_.metrics_address, opts_.state);
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
  setup_loop();
  log_.info("serving " + opts_.socket + " (" + std::to_string(devices_.size()) + " GPU(s), driver " +
            driver_->name() + ", state " + st::segment_path(opts_.state) + ")");
}

Daemon::Impl::~Impl() {
  // Normal paths go through shutdown(); this only runs after a failed start-up or an escaped
  // exception: release what this process holds, keep the segment (it may describe grants).
  grants_.clear();
  devices_.clear();
  if (socket_bound_) ::unlink(opts_.socket.c_str());
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

void Daemon::Impl::load_config() {
  struct stat sb {};
  if (::stat(opts_.config.c_str(), &sb) != 0 && errno == ENOENT) {
    log_.info("no quota file at " + opts_.config + ": every uid is its own tenant with 100% of each GPU");
    return;
  }
  std::string text;
  seen_fp_ = fingerprint(opts_.config, &text);
  pending_fp_ = seen_fp_;
  if (!seen_fp_.exists) throw StartupError("bad quota file: " + opts_.config + ":0:0: cannot read the file");
  try {
    config_ = quota::QuotaConfig::parse(text, opts_.config);
  } catch (const quota::ConfigError& e) {
    throw StartupError(std::string("bad quota file: ") + e.what());
  }
  config_from_file_ = true;
  log_.info("quota file " + opts_.config + " loaded (default limit " + config_.default_limit().to_string() + ", " +
            std::to_string(config_.namespaces().size()) + " namespace(s))");
}

void Daemon::Impl::validate_config(const quota::QuotaConfig& cfg) const {
  if (cfg.namespaces().size() > st::kMaxNamespaces) {
    throw quota::ConfigError(cfg.file(), 0, 0,
                             std::to_string(cfg.namespaces().size()) + " namespaces (with 'default'); this vlaked supports " +
                                 std::to_string(st::kMaxNamespaces));
  }
  for (const DeviceInfo& d : devices_) cfg.check_device(d.total);
}

void Daemon::Impl::open_driver_and_devices() {
  try {
    driver_ = open_driver(opts_.driver);
  } catch (const std::exception& e) {
    throw StartupError("cannot open the CUDA driver " + opts_.driver + ": " + e.what());
  }
  const int n = driver_->device_count();
  if (n <= 0) throw StartupError("no GPU found by " + opts_.driver);
  if (static_cast<std::uint32_t>(n) > st::kMaxDevices) {
    throw StartupError(std::to_string(n) + " GPUs found; this vlaked supports at most " +
                       std::to_string(st::kMaxDevices));
  }
  for (int i = 0; i < n; ++i) {
    DeviceInfo d;
    d.ordinal = DeviceOrdinal{i};
    d.uuid = driver_->device_uuid(d.ordinal);
    d.total = driver_->total_memory(d.ordinal);
    d.granularity = driver_->granularity(d.ordinal);
    d.pool = std::make_unique<DevicePool>(*driver_, d.ordinal, log_, Bytes{opts_.bulk_size});
    acct_.set_capacity(d.ordinal, d.total);
    log_.info("GPU " + std::to_string(i) + ": " + d.uuid.to_string() + ", " +
              std::to_string(d.total.value() >> 20) + " MiB, granularity " +
              std::to_string(d.granularity.value() >> 10) + " KiB");
    devices_.push_back(std::move(d));
  }
}

void Daemon::Impl::open_nvml() {
  if (opts_.nvml.empty()) {
    log_.info("NVML disabled (--nvml none): non-pool usage counts as 0");
    return;
  }
  try {
    nvml_ = vlake::pool::open_nvml(opts_.nvml);
    log_.info("NVML " + opts_.nvml + ": sampling per-process usage every " +
              std::to_string(opts_.sample_interval.count()) + " ms");
  } catch (const std::exception& e) {
    log_.info(std::string("NVML unavailable (") + e.what() + "): non-pool usage counts as 0");
  }
}

void Daemon::Impl::open_state() {
  try {
    seg_ = std::make_unique<st::StateSegment>(opts_.state, opts_.state_mode, opts_.state_gid);
  } catch (const st::StateError& e) {
    throw StartupError(e.what());
  }
  {
    // The namespace table is rebuilt from the configuration on every start.
    st::StateSegment::Write w(*seg_);
    std::memset(seg_->state().namespaces, 0, sizeof seg_->state().namespaces);
    apply_namespaces();
  }
  if (seg_->origin() == st::StateSegment::Origin::created) {
    init_fresh_state();
  } else {
    resume_state();
  }
  st::StateSegment::Write w(*seg_);
  seg_->state().header.sample_interval_ms = static_cast<std::uint32_t>(opts_.sample_interval.count());
  seg_->state().header.updated_unix_ns = now_unix_ns();
  st::ConfigRecord& cr = seg_->state().config;
  ++cr.generation;
  cr.loaded_unix_ns = now_unix_ns();
  cr.rejected = 0;
  publish_config();
  for (const auto& [name, n] : namespaces_) publish_namespace(n);
}

void Daemon::Impl::init_fresh_state() {
  st::StateSegment::Write w(*seg_);
  st::State& s = seg_->state();
  s.header.daemon_pid = static_cast<std::uint32_t>(::getpid());
  s.header.daemon_start_time = process_start_time(s.header.daemon_pid);
  s.header.device_count = static_cast<std::uint32_t>(devices_.size());
  s.header.starts = 1;
  s.header.clean = 0;
  s.header.max_namespaces = st::kMaxNamespaces;
  for (const DeviceInfo& d : devices_) publish_device(d);
}

void Daemon::Impl::resume_state() {
  st::StateSegment::Write w(*seg_);
  st::State& s = seg_->state();
  const bool was_clean = s.header.clean != 0;
  handles_created_base_ = s.counters.handles_created;
  handles_released_base_ = s.counters.handles_released;

  // Old device ordinal -> current device (by UUID).
  std::vector<DeviceInfo*> old_to_new(st::kMaxDevices, nullptr);
  for (std::uint32_t i = 0; i < st::kMaxDevices; ++i) {
    if (s.devices[i].in_use != 0) old_to_new[i] = device_by_uuid(s.devices[i].uuid);
  }

  // Tenants keep their ids; usage is rebuilt from the grants below.
  for (std::uint32_t i = 0; i < st::kMaxTenants; ++i) {
    st::TenantRecord& r = s.tenants[i];
    if (r.in_use == 0) continue;
    const std::string name(r.name, strnlen(r.name, sizeof r.name));
    Tenant t{TenantId{i + 1}, i, name};
    // Until a live session re-resolves it: the namespace its name says, if still configured.
    const auto slash = name.find('/');
    t.ns = namespace_id(slash == std::string::npos ? std::string(quota::kDefaultNamespace) : name.substr(0, slash));
    if (t.ns.value() == 0) t.ns = namespace_id(quota::kDefaultNamespace);
    acct_.assign(t.id, t.ns);
    tenant_ids_[name] = t.id;
    tenants_[t.id.value()] = t;
    std::memset(r.granted, 0, sizeof r.granted);
    std::memset(r.nonpool, 0, sizeof r.nonpool);
  }

  std::size_t kept_sessions = 0;
  std::size_t dropped_sessions = 0;
  for (std::uint32_t i = 0; i < st::kMaxSessions; ++i) {
    st::SessionRecord& r = s.sessions[i];
    if (r.state == st::kSessionFree) continue;
    bool alive = r.start_time != 0 && process_start_time(r.pid) == r.start_time;
    UniqueFd pidfd;
    if (alive) {
      pidfd.reset(pidfd_open(r.pid));
      alive = pidfd.valid() && process_start_time(r.pid) == r.start_time;
    }
    if (!alive) {
      std::memset(&r, 0, sizeof r);
      ++dropped_sessions;
      continue;
    }
    const std::vector<gid_t> groups = supplementary_groups(r.uid, r.gid);
    // A Kubernetes allocation's session keeps its tenant; rescan_allocs() binds it to its
    // allocation again (by tenant name) once the allocation directories are read.
    auto old = tenants_.find(r.tenant);
    const bool pod_tenant = old != tenants_.end() &&
                            (old->second.name.rfind("pod:", 0) == 0 || old->second.name.rfind("alloc:", 0) == 0);
    Tenant& t = pod_tenant ? old->second : tenant_for(config_.resolve(r.uid, r.gid, groups), r.uid, r.gid);
    Session sess{r.id, i, r.pid, r.start_time, r.uid, r.gid, t.id, 0, std::move(pidfd), {}};
    r.tenant = t.id.value();
    r.state = st::kSessionDetached;
    r.grant_count = 0;
    sessions_.emplace(sess.id, std::move(sess));
    ++kept_sessions;
  }

  std::size_t kept_grants = 0;
  std::size_t dropped_grants = 0;
  for (std::uint32_t i = 0; i < st::kMaxGrants; ++i) {
    st::GrantRecord& r = s.grants[i];
    if (r.state == st::kGrantFree) continue;
    auto sit = sessions_.find(r.session);
    DeviceInfo* dev = r.device < st::kMaxDevices ? old_to_new[r.device] : nullptr;
    if (sit == sessions_.end() || dev == nullptr) {
      if (sit != sessions_.end()) {
        log_.warn("grant " + std::to_string(r.id) + " was on a GPU this node no longer has; dropped");
      }
      std::memset(&r, 0, sizeof r);
      ++s.counters.releases;
      ++dropped_grants;
      continue;
    }
    Session& sess = sit->second;
    const auto purpose = static_cast<proto::GrantPurpose>(r.purpose);
    Grant g{r.id, i, sess.id, sess.tenant, dev->ordinal, Bytes{r.bytes}, purpose, false, {}, r.requested,
            r.created_unix_ns, false};
    if (purpose == proto::GrantPurpose::counted) {
      dev->counted += g.bytes;
      r.state = st::kGrantLive;
    } else {
      g.orphaned = true;
      dev->orphaned += g.bytes;
      r.state = st::kGrantOrphaned;
    }
    r.tenant = sess.tenant.value();
    r.device = static_cast<std::uint32_t>(dev->ordinal.value());
    acct_.restore(sess.tenant, dev->ordinal, g.bytes);
    sess.grants.push_back(g.id);
    grants_.emplace(g.id, std::move(g));
    ++kept_grants;
  }
  for (auto& [id, sess] : sessions_) s.sessions[sess.slot].grant_count = static_cast<std::uint32_t>(sess.grants.size());

  // Device records describe this daemon's devices; the free pool died with the old daemon.
  std::memset(s.devices, 0, sizeof s.devices);
  s.header.device_count = static_cast<std::uint32_t>(devices_.size());
  s.header.daemon_pid = static_cast<std::uint32_t>(::getpid());
  s.header.daemon_start_time = process_start_time(s.header.daemon_pid);
  ++s.header.starts;
  s.header.clean = 0;
  for (const DeviceInfo& d : devices_) publish_device(d);
  for (const auto& [id, t] : tenants_) publish_tenant(t);

  log_.info(std::string("resumed state segment ") + st::segment_path(opts_.state) +
            (was_clean ? " (graceful stop)" : " (previous daemon died)") + ": " +
            std::to_string(kept_sessions) + " live session(s) detached, " + std::to_string(dropped_sessions) +
            " of dead processes dropped; " + std::to_string(kept_grants) + " grant(s) kept (orphaned), " +
            std::to_string(dropped_grants) + " dropped");
}

void Daemon::Impl::bind_socket() {
  listen_fd_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_fd_) throw StartupError(std::string("socket: ") + std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
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

void Daemon::Impl::setup_loop() {
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) throw StartupError(std::string("epoll_create1: ") + std::strerror(errno));
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  signal_fd_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_) throw StartupError(std::string("signalfd: ") + std::strerror(errno));
  timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_fd_) throw StartupError(std::string("timerfd_create: ") + std::strerror(errno));
  itimerspec its{};
  const auto ms = opts_.sample_interval.count();
  its.it_interval.tv_sec = ms / 1000;
  its.it_interval.tv_nsec = (ms % 1000) * 1'000'000;
  its.it_value = its.it_interval;
  ::timerfd_settime(timer_fd_.get(), 0, &its, nullptr);
  add_epoll(listen_fd_.get(), Kind::listen, 0);
  add_epoll(signal_fd_.get(), Kind::signal, 0);
  add_epoll(timer_fd_.get(), Kind::timer, 0);
  setup_watch();
  setup_allocs();
  // Sessions resumed from the state segment (open_state() ran before the epoll existed).
  for (auto& [id, sess] : sessions_) add_epoll(sess.pidfd.get(), Kind::pidfd, sess.id);
}

void Daemon::Impl::add_epoll(int fd, Kind k, std::uint64_t serial) {
  if (!epoll_fd_) return;  // before setup_loop(): registered there
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = token(k, serial);
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno("epoll_ctl");
}

// ---------------------------------------------------------------------------------------------
// loop

int Daemon::Impl::run() {
  std::vector<epoll_event> events(64);
  while (!stop_) {
    const int n = ::epoll_wait(epoll_fd_.get(), events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("epoll_wait");
    }
    for (int i = 0; i < n && !stop_; ++i) {
      const std::uint64_t t = events[static_cast<std::size_t>(i)].data.u64;
      try {
        switch (kind_of(t)) {
          case Kind::listen: on_accept(); break;
          case Kind::signal: on_signal(); break;
          case Kind::timer: on_timer(); break;
          case Kind::conn: on_readable(serial_of(t)); break;
          case Kind::pidfd: on_process_exit(serial_of(t)); break;
          case Kind::inotify: on_inotify(); break;
          case Kind::reload: on_reload_timer(); break;
          case Kind::alloc_listen: {
            auto a = alloc_serials_.find(serial_of(t));
            if (a != alloc_serials_.end()) accept_on(allocs_.at(a->second).fd.get(), a->second);
            break;
          }
          case Kind::alloc_watch: on_alloc_watch(); break;
          case Kind::alloc_timer: on_alloc_timer(); break;
          case Kind::park: on_park_timer(); break;
        }
        if (retry_parked_) retry_parked();
      } catch (const std::exception& e) {
        log_.error(std::string("event handling failed: ") + e.what());
      }
    }
  }
  shutdown();
  return 0;
}

void Daemon::Impl::on_accept() { accept_on(listen_fd_.get(), std::string()); }

void Daemon::Impl::accept_on(int listen_fd, const std::string& alloc_id) {
  for (;;) {
    UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      log_.warn(std::string("accept: ") + std::strerror(errno));
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      log_.warn(std::string("SO_PEERCRED: ") + std::strerror(errno));
      continue;
    }
    const std::uint64_t serial = next_conn_serial_++;
    Connection c{serial, std::move(fd), static_cast<std::uint32_t>(cred.pid), cred.uid, cred.gid, 0, alloc_id};
    add_epoll(c.fd.get(), Kind::conn, serial);
    log_.debug("connection " + std::to_string(serial) + " from pid " + std::to_string(cred.pid) + " uid " +
               std::to_string(cred.uid) + (alloc_id.empty() ? std::string() : " on allocation " + alloc_id));
    conns_.emplace(serial, std::move(c));
  }
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
  std::uint64_t expirations = 0;
  (void)!::read(timer_fd_.get(), &expirations, sizeof expirations);
  // Safety net: a process whose pidfd event was somehow missed.
  std::vector<std::uint64_t> dead;
  for (auto& [id, sess] : sessions_) {
    if (pidfd_exited(sess.pidfd.get())) dead.push_back(id);
  }
  for (std::uint64_t id : dead) on_process_exit(id);

  // Fallback for missed inotify events: a changed file that held still for one interval.
  {
    const FileFingerprint now = fingerprint(opts_.config, nullptr);
    if (now == seen_fp_) {
      pending_fp_ = now;
    } else if (now == pending_fp_) {
      reload("file changed", false);
    } else {
      pending_fp_ = now;
    }
  }

  // Warm reserve: back to the target, off the request path, a bounded step per tick.
  if (opts_.warm_reserve > 0 && parked_.empty()) {
    try {
      refill_warm(16);
    } catch (const std::exception& e) {
      log_.warn(std::string("warm reserve refill failed: ") + e.what());
    }
  }

  st::StateSegment::Write w(*seg_);
  if (nvml_) {
    NonpoolInputs in;
    in.daemon_pid = static_cast<std::uint32_t>(::getpid());
    for (const DeviceInfo& d : devices_) in.devices.emplace_back(d.ordinal, d.uuid);
    for (const auto& [id, sess] : sessions_) {
      in.pid_tenant.emplace(sess.pid, sess.tenant);
      for (std::uint64_t gid : sess.grants) {
        const Grant& g = grants_.at(gid);
        if (g.orphaned) in.orphaned[{sess.pid, g.device.value()}] += g.bytes;
      }
    }
    try {
      const NonpoolResult r = attribute_nonpool(*nvml_, in);
      for (const auto& [tid, t] : tenants_) {
        for (const DeviceInfo& d : devices_) {
          const auto it = r.find({tid, d.ordinal.value()});
          acct_.set_nonpool(t.id, d.ordinal, it == r.end() ? Bytes{0} : it->second);
        }
      }
      ++seg_->state().counters.nvml_samples;
      nvml_failed_logged_ = false;
    } catch (const std::exception& e) {
      if (!nvml_failed_logged_) log_.warn(std::string("NVML sampling failed: ") + e.what());
      nvml_failed_logged_ = true;
    }
  }
  for (const auto& [tid, t] : tenants_) publish_tenant(t);
  for (const auto& [name, n] : namespaces_) publish_namespace(n);
  for (const DeviceInfo& d : devices_) publish_device(d);
  seg_->state().header.updated_unix_ns = now_unix_ns();
  if (opts_.canary_interval.count() > 0 &&
      std::chrono::steady_clock::now() - last_canary_sweep_ >= opts_.canary_interval) {
    last_canary_sweep_ = std::chrono::steady_clock::now();
    canary_sweep();
  }
}

void Daemon::Impl::on_readable(std::uint64_t serial) {
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
    malformed(c, e.what());
    return;
  }
  if (r.bytes == 0) {
    close_connection(serial);
    return;
  }
  if (!r.fds.empty()) {
    r.fds.clear();  // closes them
    malformed(c, "descriptors attached to a client message");
    return;
  }
  handle(c, buf, r.bytes);
}

void Daemon::Impl::on_process_exit(std::uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  end_session(it->second, "process exited");
}

// ---------------------------------------------------------------------------------------------
// messages

template <class T>
bool Daemon::Impl::send(Connection& c, const T& msg, std::span<const int> fds) {
  try {
    send_with_fds(c.fd.get(), std::as_bytes(std::span<const T>(&msg, 1)), fds);
    return true;
  } catch (const std::exception& e) {
    log_.warn("connection " + std::to_string(c.serial) + " (pid " + std::to_string(c.pid) +
              "): cannot send a reply: " + e.what() + "; closing it");
    return false;
  }
}

void Daemon::Impl::send_error(Connection& c, std::uint64_t request_id, proto::Status s, const std::string& text) {
  proto::Error e{};
  e.h = proto::make_header<proto::Error>(proto::MsgType::error, request_id);
  e.status = s;
  copy_name(e.message, text);
  try {
    send_with_fds(c.fd.get(), std::as_bytes(std::span<const proto::Error>(&e, 1)), {});
  } catch (...) {
    // best effort: the connection is being closed anyway
  }
}

void Daemon::Impl::malformed(Connection& c, const std::string& reason) {
  log_.warn("dropping connection " + std::to_string(c.serial) + " (pid " + std::to_string(c.pid) + ", uid " +
            std::to_string(c.uid) + "): malformed message: " + reason);
  {
    st::StateSegment::Write w(*seg_);
    ++seg_->state().counters.malformed;
  }
  send_error(c, 0, proto::Status::bad_request, reason);
  close_connection(c.serial);
}

void Daemon::Impl::handle(Connection& c, const std::byte* data, std::size_t n) {
  // Framing and every stateless field check: the codec all ends share (contracts/codec.hpp).
  // Descriptors were refused before (on_readable).
  const proto::Decoded d = proto::decode(std::span<const std::byte>(data, n));
  const proto::Header* hp = d.header();
  if (!d && d.error().kind != proto::DecodeError::Kind::fields) {
    if (d.error().kind == proto::DecodeError::Kind::version && hp != nullptr &&
        hp->type == proto::MsgType::hello) {
      log_.warn("connection " + std::to_string(c.serial) + " (pid " + std::to_string(c.pid) +
                "): Hello with protocol version " + std::to_string(hp->version) + ", this vlaked speaks " +
                std::to_string(proto::kVersion) + "; closing");
      send_error(c, hp->request_id, proto::Status::version_mismatch,
                 "vlaked speaks protocol version " + std::to_string(proto::kVersion));
      close_connection(c.serial);
      return;
    }
    malformed(c, d.error().reason);
    return;
  }
  const proto::Header h = *hp;  // well framed (a body that fails its field checks included)
  {
    st::StateSegment::Write w(*seg_);
    ++seg_->state().counters.requests;
  }
  if (h.type == proto::MsgType::hello) {
    if (c.session != 0) return malformed(c, "second Hello on a connection");
    if (!d) return malformed(c, d.error().reason);
    on_hello(c, *d.get<proto::Hello>());
    return;
  }
  if (h.type != proto::MsgType::grant_request && h.type != proto::MsgType::release &&
      h.type != proto::MsgType::usage_query && h.type != proto::MsgType::guard_event &&
      h.type != proto::MsgType::reserve_report && h.type != proto::MsgType::share_request &&
      h.type != proto::MsgType::share_commit) {
    return malformed(c, "message type " + std::to_string(static_cast<unsigned>(h.type)) +
                            " is not a client request");
  }
  if (c.session == 0) return malformed(c, "request before Hello");
  auto sit = sessions_.find(c.session);
  if (sit == sessions_.end()) return malformed(c, "session is gone");
  if (!d) return malformed(c, d.error().reason);
  Session& s = sit->second;
  if (const auto* m = d.get<proto::GrantRequest>()) {
    on_grant(c, s, *m);
  } else if (const auto* m = d.get<proto::Release>()) {
    on_release(c, s, *m);
  } else if (const auto* m = d.get<proto::GuardEvent>()) {
    on_guard_event(c, s, *m);
  } else if (const auto* m = d.get<proto::ShareRequest>()) {
    on_share_request(c, s, *m);
  } else if (const auto* m = d.get<proto::ShareCommit>()) {
    on_share_commit(c, s, *m);
  } else if (const auto* m = d.get<proto::ReserveReport>()) {
    on_reserve_report(c, s, *m);
  } else if (const auto* m = d.get<proto::UsageQuery>()) {
    {
      st::StateSegment::Write w(*seg_);
      ++seg_->state().counters.usage_queries;
    }
    on_usage(c, s, *m);
  }
}

void Daemon::Impl::on_hello(Connection& c, const proto::Hello& m) {
  if ((m.flags & ~proto::kHelloKnownFlags) != 0) return malformed(c, "Hello has unknown flags");
  if (std::memchr(m.client, 0, sizeof m.client) == nullptr) return malformed(c, "Hello client name not terminated");
  const std::uint64_t start = process_start_time(c.pid);
  if (start == 0) return malformed(c, "peer process is gone");

  Session* sess = nullptr;
  if (m.old_session != 0) {
    auto it = sessions_.find(m.old_session);
    if (it != sessions_.end() && it->second.pid == c.pid && it->second.start_time == start &&
        it->second.alloc_id == c.alloc_id) {
      sess = &it->second;
      if (sess->conn != 0 && sess->conn != c.serial) {
        // The process reconnected before we saw its old connection close.
        const std::uint64_t old = sess->conn;
        sess->conn = 0;
        auto oc = conns_.find(old);
        if (oc != conns_.end()) oc->second.session = 0;
        close_connection(old);
      }
    } else {
      log_.warn("connection " + std::to_string(c.serial) + " (pid " + std::to_string(c.pid) +
                "): cannot re-bind session " + std::to_string(m.old_session) +
                " (unknown, or opened by another process); opening a new session");
    }
  }

  st::StateSegment::Write w(*seg_);
  st::State& state = seg_->state();
  if (sess == nullptr) {
    Tenant* t = nullptr;
    try {
      if (!c.alloc_id.empty()) {
        // Kubernetes: the allocation whose socket it came through is its identity.
        auto a = allocs_.find(c.alloc_id);
        if (a == allocs_.end()) throw std::runtime_error("allocation " + c.alloc_id + " is gone");
        t = &tenant_for_alloc(a->second);
      } else {
        const std::vector<gid_t> groups = supplementary_groups(c.uid, c.gid);
        t = &tenant_for(config_.resolve(c.uid, c.gid, groups), c.uid, c.gid);
      }
    } catch (const std::exception& e) {
      log_.error(e.what());
      send_error(c, m.h.request_id, proto::Status::internal, e.what());
      close_connection(c.serial);
      return;
    }
    const std::int32_t slot = free_session_slot();
    UniqueFd pidfd(pidfd_open(c.pid));
    if (slot < 0 || !pidfd) {
      const std::string why = slot < 0 ? "session table full" : std::string("pidfd_open: ") + std::strerror(errno);
      log_.error("cannot open a session for pid " + std::to_string(c.pid) + ": " + why);
      send_error(c, m.h.request_id, proto::Status::internal, why);
      close_connection(c.serial);
      return;
    }
    const std::uint64_t id = state.header.next_session_id++;
    Session ns{id, static_cast<std::uint32_t>(slot), c.pid, start, c.uid, c.gid, t->id, 0, std::move(pidfd), {}, c.alloc_id};
    add_epoll(ns.pidfd.get(), Kind::pidfd, id);
    sess = &sessions_.emplace(id, std::move(ns)).first->second;
    ++state.counters.sessions_opened;
    log_.info("session " + std::to_string(id) + ": pid " + std::to_string(c.pid) + " uid " + std::to_string(c.uid) +
              " -> tenant " + t->name + " (limit " + t->limit.to_string() + ")");
  } else {
    ++state.counters.sessions_rebound;
    log_.info("session " + std::to_string(sess->id) + ": re-bound by pid " + std::to_string(c.pid) + " (" +
              std::to_string(sess->grants.size()) + " grant(s))");
  }
  sess->conn = c.serial;
  // Pressure is sent only to sessions whose (latest) Hello asked for it.
  sess->pressure = (m.flags & proto::kHelloPressure) != 0;
  c.session = sess->id;
  publish_session(*sess);

  const Tenant& t = tenants_.at(sess->tenant.value());
  proto::HelloAck ack{};
  ack.h = proto::make_header<proto::HelloAck>(proto::MsgType::hello_ack, m.h.request_id);
  ack.status = proto::Status::ok;
  ack.tenant_id = t.id.value();
  ack.session_id = sess->id;
  ack.granularity = devices_.front().granularity.value();
  ack.device_count = static_cast<std::uint32_t>(devices_.size());
  ack.guard_mode = t.guard;
  copy_name(ack.tenant_name, t.name);
  for (const DeviceInfo& d : devices_) ack.devices[d.ordinal.value()] = device_quota(t, d);
  if (!send(c, ack)) close_connection(c.serial);
}

proto::DeviceQuota Daemon::Impl::device_quota(const Tenant& t, const DeviceInfo& d) const {
  proto::DeviceQuota q{};
  std::memcpy(q.uuid, d.uuid.data(), sizeof q.uuid);
  const Accounting::Usage u = acct_.usage(t.id, d.ordinal);
  q.total = d.total.value();
  q.limit = u.limit.value();
  q.used = u.used().value();
  return q;
}

void Daemon::Impl::on_grant(Connection& c, Session& s, const proto::GrantRequest& m) {
  if (m.reserved != 0) return malformed(c, "GrantRequest reserved field is not zero");
  if (m.purpose != proto::GrantPurpose::alloc && m.purpose != proto::GrantPurpose::create &&
      m.purpose != proto::GrantPurpose::counted) {
    return malformed(c, "GrantRequest purpose " + std::to_string(static_cast<unsigned>(m.purpose)) + " out of range");
  }
  if (m.bytes == 0) return malformed(c, "GrantRequest for 0 bytes");
  const auto received = grant_retry_ != nullptr ? grant_retry_->received : std::chrono::steady_clock::now();

  proto::GrantReply reply{};
  reply.h = proto::make_header<proto::GrantReply>(proto::MsgType::grant_reply, m.h.request_id);
  // State writes are bracketed one by one (not around the whole request): readers of the
  // segment then never wait for a handle creation, a scrub or a send.
  st::State& state = seg_->state();
  auto count = [&](std::uint64_t st::Counters::*field) {
    st::StateSegment::Write w(*seg_);
    ++(state.counters.*field);
  };

  DeviceInfo* dev = device_by_uuid(m.device_uuid);
  if (dev == nullptr) {
    count(&st::Counters::denials_unknown_device);
    reply.status = proto::Status::unknown_device;
    if (!send(c, reply)) close_connection(c.serial);
    return;
  }
  if (m.bytes > dev->total.value()) {
    return malformed(c, "GrantRequest for " + std::to_string(m.bytes) + " bytes, more than the GPU's " +
                            std::to_string(dev->total.value()));
  }
  const Tenant& t = tenants_.at(s.tenant.value());
  const Bytes bytes = round_up(Bytes{m.bytes}, dev->granularity);
  reply.bytes = bytes.value();

  Accounting::Usage before{};
  Refusal why = Refusal::none;
  std::optional<Accounting::Reservation> res = acct_.reserve(t.id, dev->ordinal, bytes, &before, &why);
  reply.limit = before.limit.value();
  reply.used = before.used().value();
  if (!res) {
    // The reason travels as the reply's status (the hook names the quota that was hit), goes
    // to the log and to a per-reason counter.
    count(&st::Counters::denials_over_limit);
    reply.status = proto::Status::over_limit;
    std::string detail;
    if (why == Refusal::namespace_limit) {
      count(&st::Counters::denials_namespace_limit);
      const auto nu = acct_.namespace_usage(t.ns, dev->ordinal);
      detail = "namespace limit: namespace uses " + std::to_string(nu.held().value()) + " of " +
               std::to_string(nu.limit.value());
      reply.status = proto::Status::namespace_over_limit;
      reply.limit = nu.limit.value();
      reply.used = nu.held().value();
    } else if (why == Refusal::guarantee) {
      count(&st::Counters::denials_guarantee);
      const auto du = acct_.device_usage(dev->ordinal);
      detail = "guarantee: memory above the namespace's guarantee is borrowed (" + std::to_string(du.borrowed.value()) +
               " bytes); the rest of the GPU is guaranteed to other namespaces (" +
               std::to_string(du.guaranteed.value()) + " bytes)";
      reply.status = proto::Status::guarantee;
    } else {
      count(&st::Counters::denials_tenant_limit);
      detail = "tenant limit: used " + std::to_string(reply.used) + " of " + std::to_string(reply.limit);
    }
    Tenant& tm = tenants_.at(s.tenant.value());
    const auto now = std::chrono::steady_clock::now();
    const std::string line = "tenant " + t.name + ": " + std::to_string(bytes.value()) + " bytes on GPU " +
                             std::to_string(dev->ordinal.value()) + " refused (" + detail + ")";
    if (now - tm.last_refusal_log >= std::chrono::seconds(1)) {
      const std::string note = tm.refusals_unlogged == 0
                                   ? std::string()
                                   : " (" + std::to_string(tm.refusals_unlogged) + " earlier refusal(s) not logged)";
      log_.info(line + note);
      tm.last_refusal_log = now;
      tm.refusals_unlogged = 0;
    } else {
      ++tm.refusals_unlogged;
      log_.debug(line);
    }
    if (!send(c, reply)) close_connection(c.serial);
    return;
  }

  const std::int32_t slot = free_grant_slot();
  if (slot < 0) {
    count(&st::Counters::denials_other);
    log_.error("grant table full (" + std::to_string(st::kMaxGrants) + " grants)");
    reply.status = proto::Status::internal;
    if (!send(c, reply)) close_connection(c.serial);
    return;  // the reservation rolls back
  }

  Grant g{state.header.next_grant_id, static_cast<std::uint32_t>(slot), s.id, t.id, dev->ordinal, bytes,
          m.purpose, false, {}, m.bytes, now_unix_ns(),
          m.purpose == proto::GrantPurpose::alloc && t.guard == proto::GuardMode::canary};
  std::vector<int> fds;
  if (m.purpose != proto::GrantPurpose::counted) {
    try {
      DevicePool::Served a = dev->pool->serve(
          bytes, t.id, m.purpose == proto::GrantPurpose::create ? 1u : proto::kMaxHandlesPerGrant);
      {
        st::StateSegment::Write pw(*seg_);
        st::Counters& k = state.counters;
        k.scrubs += a.scrubbed;
        if (a.reused > 0) ++k.reuses;
        switch (a.kind) {
          case PlanKind::exact: ++k.grants_exact; break;
          case PlanKind::stitch:
            ++k.grants_stitched;
            k.handles_stitched += a.handles.size();
            if (a.cross_tenant) ++k.stitched_cross_tenant;
            break;
          default: ++k.grants_new; break;
        }
      }
      g.handles = std::move(a.handles);
      if (g.canary) {
        try {
          canary_fill(g);
        } catch (...) {
          for (auto& h : g.handles) dev->pool->put_back(std::move(h), t.id);
          throw;
        }
      }
    } catch (const PoolOutOfMemory& e) {
      if (park_grant(c, s, m, *dev, bytes, received)) {
        publish_device(*dev);
        return;  // the reply waits (docs/pool.md, "Pressure protocol")
      }
      count(&st::Counters::denials_out_of_memory);
      reply.status = proto::Status::out_of_memory;
      log_.info("GPU " + std::to_string(dev->ordinal.value()) + ": no memory for " + std::to_string(bytes.value()) +
                " bytes (tenant " + t.name + ")");
      publish_device(*dev);
      if (!send(c, reply)) close_connection(c.serial);
      return;
    } catch (const std::exception& e) {
      count(&st::Counters::denials_other);
      reply.status = proto::Status::internal;
      log_.error("GPU " + std::to_string(dev->ordinal.value()) + ": grant failed: " + e.what());
      publish_device(*dev);
      if (!send(c, reply)) close_connection(c.serial);
      return;
    }
    std::uint64_t offset = 0;
    for (const auto& h : g.handles) {
      reply.handles[reply.handle_count++] = proto::HandleDesc{h->size.value(), offset};
      offset += h->size.value();
      fds.push_back(h->fd.get());
    }
  }
  std::optional<st::StateSegment::Write> w;
  w.emplace(*seg_);
  res->commit();
  ++state.header.next_grant_id;
  ++state.counters.grants;
  if (m.purpose == proto::GrantPurpose::counted) dev->counted += bytes;
  else dev->granted += bytes;

  st::GrantRecord& rec = state.grants[g.slot];
  rec = st::GrantRecord{g.id, s.id, bytes.value(), t.id.value(), static_cast<std::uint32_t>(dev->ordinal.value()),
                        static_cast<std::uint32_t>(m.purpose), static_cast<std::uint32_t>(g.handles.size()),
                        st::kGrantLive, static_cast<std::uint32_t>(g.canary ? proto::GuardMode::canary : t.guard),
                        g.requested, g.created_unix_ns};
  s.grants.push_back(g.id);
  const std::uint64_t gid = g.id;
  grants_.emplace(gid, std::move(g));
  publish_session(s);
  publish_tenant(t);
  publish_device(*dev);
  w.reset();

  reply.status = proto::Status::ok;
  reply.grant_id = gid;
  reply.used = acct_.usage(t.id, dev->ordinal).used().value();
  if (log_.enabled(LogLevel::debug)) {
    log_.debug("grant " + std::to_string(gid) + ": " + std::to_string(bytes.value()) + " bytes on GPU " +
               std::to_string(dev->ordinal.value()) + " to " + t.name + " (session " + std::to_string(s.id) + ")");
  }
  if (!send(c, reply, fds)) {
    // The client never got the descriptors: undo the grant.
    Grant& undo = grants_.at(gid);
    finish_grant(undo, t.id, false);
    close_connection(c.serial);
    return;
  }
  // Grant latency (receive -> reply sent) into the histogram: a few adds in one bracket.
  const auto ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - received).count());
  st::StateSegment::Write hw(*seg_);
  st::Counters& hc = state.counters;
  for (std::size_t i = 0; i < st::kGrantLatencyBuckets; ++i) {
    if (ns <= st::kGrantLatencyBoundsNs[i]) {
      ++hc.grant_latency_bucket[i];
      break;
    }
  }
  hc.grant_latency_sum_ns += ns;
  ++hc.grant_latency_count;
}

void Daemon::Impl::on_release(Connection& c, Session& s, const proto::Release& m) {
  if (m.reserved != 0) return malformed(c, "Release reserved field is not zero");
  if ((m.flags & ~static_cast<std::uint32_t>(proto::kReleaseExported)) != 0) {
    return malformed(c, "Release has unknown flags");
  }
  proto::ReleaseAck ack{};
  ack.h = proto::make_header<proto::ReleaseAck>(proto::MsgType::release_ack, m.h.request_id);
  auto it = std::find(s.grants.begin(), s.grants.end(), m.grant_id);
  if (it == s.grants.end()) {
    ack.status = proto::Status::unknown_grant;
    if (!send(c, ack)) close_connection(c.serial);
    return;
  }
  Grant& g = grants_.at(m.grant_id);
  const DeviceOrdinal d = g.device;
  finish_grant(g, s.tenant, (m.flags & proto::kReleaseExported) != 0);  // brackets its writes
  ack.status = proto::Status::ok;
  ack.used = acct_.usage(s.tenant, d).used().value();
  if (!send(c, ack)) close_connection(c.serial);
}

void Daemon::Impl::on_guard_event(Connection& c, Session& s, const proto::GuardEvent& m) {
  // Validate everything before recording: a client can only report on itself.
  if (m.kind != proto::GuardKind::fault && m.kind != proto::GuardKind::readonly) {
    return malformed(c, "GuardEvent kind " + std::to_string(static_cast<unsigned>(m.kind)) + " out of range");
  }
  if (m.suspect_count > proto::kMaxGuardSuspects) {
    return malformed(c, "GuardEvent suspect_count " + std::to_string(m.suspect_count) + " out of range");
  }
  if (std::memchr(m.call, 0, sizeof m.call) == nullptr) return malformed(c, "GuardEvent call name not terminated");
  const Tenant& t = tenants_.at(s.tenant.value());
  const DeviceInfo* dev = device_by_uuid(m.device_uuid);
  st::GuardEventRecord e{};
  e.kind = static_cast<std::uint32_t>(m.kind);
  e.tenant = t.id.value();
  e.device = dev != nullptr ? static_cast<std::uint32_t>(dev->ordinal.value()) : st::kGuardNoDevice;
  e.pid = s.pid;
  copy_name(e.tenant_name, t.name);
  e.cuda_status = m.cuda_status;
  e.suspect_count = m.suspect_count;
  e.live_allocations = m.live_allocations;
  std::memcpy(e.call, m.call, sizeof e.call);
  const std::uint64_t now = now_unix_ns();
  for (std::uint32_t i = 0; i < m.suspect_count && i < st::kGuardEventSuspects; ++i) e.suspects[i] = m.suspects[i];
  if (m.suspect_count > 0) {
    e.address = m.suspects[0].address;
    e.requested_bytes = m.suspects[0].bytes;
    e.allocated_unix_ns = m.suspects[0].age_ns < now ? now - m.suspects[0].age_ns : 0;
  }
  record_guard_event(e);
}

void Daemon::Impl::canary_fill(const Grant& g) {
  std::uint64_t base = 0;
  for (const auto& h : g.handles) {
    const std::uint64_t end = base + h->size.value();
    const std::uint64_t from = std::max(base, g.requested);
    if (from < end) driver_->fill_u8(DevicePtr{h->va.value() + (from - base)}, kCanaryByte, Bytes{end - from});
    base = end;
  }
  driver_->synchronize();
}

bool Daemon::Impl::canary_check(const Grant& g, const char* when) {
  std::uint64_t bad = UINT64_MAX;
  try {
    std::vector<std::uint8_t> buf;
    std::uint64_t base = 0;
    for (const auto& h : g.handles) {
      const std::uint64_t end = base + h->size.value();
      std::uint64_t from = std::max(base, g.requested);
      while (from < end && bad == UINT64_MAX) {
        const std::uint64_t n = std::min<std::uint64_t>(end - from, 4ull << 20);
        buf.resize(n);
        driver_->copy_to_host(buf.data(), DevicePtr{h->va.value() + (from - base)}, Bytes{n});
        for (std::uint64_t i = 0; i < n; ++i) {
          if (buf[i] != kCanaryByte) {
            bad = from + i;
            break;
          }
        }
        from += n;
      }
      base = end;
    }
  } catch (const std::exception& e) {
    log_.warn("grant " + std::to_string(g.id) + ": canary check failed: " + e.what());
    return true;
  }
  if (bad == UINT64_MAX) return true;
  st::GuardEventRecord e{};
  e.kind = static_cast<std::uint32_t>(proto::GuardKind::canary);
  e.tenant = g.tenant.value();
  e.device = static_cast<std::uint32_t>(g.device.value());
  auto sit = sessions_.find(g.session);
  e.pid = sit != sessions_.end() ? sit->second.pid : 0;
  if (const Tenant* t = tenant_by_id(g.tenant)) copy_name(e.tenant_name, t->name);
  e.grant_id = g.id;
  e.requested_bytes = g.requested;
  e.first_bad_offset = bad;
  e.allocated_unix_ns = g.created_unix_ns;
  copy_name(e.call, when);
  record_guard_event(e);
  // Re-arm, so a later overrun of the same allocation is seen again (and this one only once).
  try {
    canary_fill(g);
  } catch (const std::exception& ex) {
    log_.warn("grant " + std::to_string(g.id) + ": canary re-arm failed: " + ex.what());
  }
  return false;
}

void Daemon::Impl::canary_sweep() {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, g] : grants_) {
    if (g.canary && !g.orphaned && !g.handles.empty()) ids.push_back(id);
  }
  if (ids.empty()) return;
  std::sort(ids.begin(), ids.end());
  auto start = std::upper_bound(ids.begin(), ids.end(), canary_cursor_);
  if (start == ids.end()) start = ids.begin();
  std::uint64_t budget = 0;
  for (std::size_t k = 0; k < ids.size() && budget < kCanarySweepBytes; ++k) {
    const std::size_t idx = (static_cast<std::size_t>(start - ids.begin()) + k) % ids.size();
    const Grant& g = grants_.at(ids[idx]);
    budget += g.bytes.value() > g.requested ? g.bytes.value() - g.requested : 0;
    (void)canary_check(g, "sweep");
    canary_cursor_ = g.id;
  }
}

void Daemon::Impl::record_guard_event(const st::GuardEventRecord& in) {
  st::GuardEventRecord e = in;
  e.time_unix_ns = now_unix_ns();
  {
    st::StateSegment::Write w(*seg_);
    st::State& state = seg_->state();
    st::GuardLog& gl = state.guard;
    if (gl.next_seq == 0) gl.next_seq = 1;
    e.seq = gl.next_seq++;
    gl.events[(e.seq - 1) % st::kGuardEvents] = e;
    switch (static_cast<proto::GuardKind>(e.kind)) {
      case proto::GuardKind::fault: ++state.counters.guard_violations_fault; break;
      case proto::GuardKind::canary: ++state.counters.guard_violations_canary; break;
      case proto::GuardKind::readonly: ++state.counters.guard_violations_readonly; break;
    }
  }
  std::ostringstream l;
  l << "guard event kind=" << guard_kind_name(e.kind) << " tenant=" << e.tenant_name << " gpu=";
  if (e.device == st::kGuardNoDevice) l << "?";
  else l << e.device;
  if (static_cast<proto::GuardKind>(e.kind) == proto::GuardKind::canary) {
    l << " grant=" << e.grant_id << " size=" << e.requested_bytes << " first_bad_offset=" << e.first_bad_offset
      << " allocated_at=" << e.allocated_unix_ns << " check=" << e.call;
  } else {
    l << " call=" << e.call << " cuda_status=" << e.cuda_status << " live_allocations=" << e.live_allocations
      << " suspects=" << e.suspect_count;
    for (std::uint32_t i = 0; i < e.suspect_count && i < st::kGuardEventSuspects; ++i) {
      l << (i == 0 ? " suspect_list=" : ",") << "0x" << std::hex << e.suspects[i].address << std::dec << ":"
        << e.suspects[i].bytes;
    }
  }
  l << " pid=" << e.pid << " seq=" << e.seq;
  log_.warn(l.str());
}

void Daemon::Impl::on_usage(Connection& c, Session& s, const proto::UsageQuery& m) {
  proto::UsageReply r{};
  r.h = proto::make_header<proto::UsageReply>(proto::MsgType::usage_reply, m.h.request_id);
  DeviceInfo* dev = device_by_uuid(m.device_uuid);
  if (dev == nullptr) {
    r.status = proto::Status::unknown_device;
  } else {
    const Accounting::Usage u = acct_.usage(s.tenant, dev->ordinal);
    r.status = proto::Status::ok;
    r.total = dev->total.value();
    r.limit = u.limit.value();
    r.used = u.used().value();
  }
  if (!send(c, r)) close_connection(c.serial);
}

void Daemon::Impl::close_connection(std::uint64_t serial) {
  auto it = conns_.find(serial);
  if (it == conns_.end()) return;
  Connection c = std::move(it->second);
  conns_.erase(it);
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  c.fd.reset();
  if (c.session == 0) return;
  auto sit = sessions_.find(c.session);
  if (sit == sessions_.end() || sit->second.conn != serial) return;
  Session& s = sit->second;
  s.conn = 0;
  if (pidfd_exited(s.pidfd.get())) {
    end_session(s, "process exited");
    return;
  }
  st::StateSegment::Write w(*seg_);
  publish_session(s);
  log_.info("session " + std::to_string(s.id) + ": connection closed, process " + std::to_string(s.pid) +
            " alive: detached with " + std::to_string(s.grants.size()) + " grant(s)");
}

// ---------------------------------------------------------------------------------------------
// model

Daemon::Impl::Tenant& Daemon::Impl::tenant_for(const quota::TenantSpec& spec, std::uint32_t uid, std::uint32_t gid) {
  return tenant_for(spec, uid, gid, nullptr);
}

// `alloc`: a Kubernetes allocation's tenant: spec.limit applies on the allocation's GPU only
// (0 on the others), and the tenant has no uid/gid of its own.
Daemon::Impl::Tenant& Daemon::Impl::tenant_for(const quota::TenantSpec& spec, std::uint32_t uid, std::uint32_t gid,
                                               const Allocation* alloc) {
  std::string name = spec.name.substr(0, st::kTenantNameBytes - 1);
  auto it = tenant_ids_.find(name);
  Tenant* t = nullptr;
  if (it != tenant_ids_.end()) {
    t = &tenants_.at(it->second.value());
  } else {
    st::State& s = seg_->state();
    std::int32_t slot = -1;
    for (std::uint32_t i = 0; i < st::kMaxTenants; ++i) {
      if (s.tenants[i].in_use == 0) {
        slot = static_cast<std::int32_t>(i);
        break;
      }
    }
    if (slot < 0) throw std::runtime_error("tenant table full (" + std::to_string(st::kMaxTenants) + " tenants)");
    const TenantId id{static_cast<std::uint32_t>(slot) + 1};
    tenant_ids_[name] = id;
    t = &tenants_.emplace(id.value(), Tenant{id, static_cast<std::uint32_t>(slot), name}).first->second;
  }
  t->limit = spec.limit;
  t->guard = spec.guard;
  t->have_ids = alloc == nullptr;
  t->uid = uid;
  t->gid = gid;
  t->alloc_id = alloc != nullptr ? alloc->id : std::string();
  const NamespaceId old_ns = t->ns;
  t->ns = namespace_id(spec.ns);
  acct_.assign(t->id, t->ns);
  for (const DeviceInfo& d : devices_) {
    const bool here = alloc == nullptr || alloc->device == d.ordinal;
    acct_.set_limit(t->id, d.ordinal, here ? spec.limit.on_device(d.total) : Bytes{0});
  }
  st::StateSegment::Write w(*seg_);
  publish_tenant(*t);
  if (old_ns != t->ns) {
    for (const auto& [ns_name, n] : namespaces_) {
      if (n.id == old_ns) publish_namespace(n);
    }
  }
  return *t;
}

Daemon::Impl::DeviceInfo* Daemon::Impl::device_by_uuid(const std::uint8_t* uuid) {
  for (DeviceInfo& d : devices_) {
    if (std::memcmp(d.uuid.data(), uuid, 16) == 0) return &d;
  }
  return nullptr;
}

void Daemon::Impl::finish_grant(Grant& g, TenantId releaser, bool exported) {
  if (g.canary && !g.orphaned && !g.handles.empty()) (void)canary_check(g, "release");
  st::StateSegment::Write w(*seg_);
  st::State& state = seg_->state();
  DeviceInfo& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  if (dedup_) dedup_->release_grant(g.id, *dev.pool);  // shared chunks: drop its references
  for (auto& h : g.handles) {
    if (exported) dev.pool->retire(std::move(h));
    else dev.pool->put_back(std::move(h), releaser);
  }
  if (g.purpose == proto::GrantPurpose::counted) dev.counted -= g.bytes;
  else if (g.orphaned) dev.orphaned -= g.bytes;
  else dev.granted -= g.bytes;
  if (!acct_.uncharge(g.tenant, g.device, g.bytes)) {
    log_.error("accounting: tenant " + std::to_string(g.tenant.value()) + " had less than grant " +
               std::to_string(g.id) + "'s bytes charged");
  }
  ++state.counters.releases;
  if (exported) ++state.counters.releases_exported;
  std::memset(&state.grants[g.slot], 0, sizeof(st::GrantRecord));
  auto sit = sessions_.find(g.session);
  if (sit != sessions_.end()) {
    auto& v = sit->second.grants;
    v.erase(std::remove(v.begin(), v.end(), g.id), v.end());
    publish_session(sit->second);
  }
  if (Tenant* t = tenant_by_id(g.tenant)) publish_tenant(*t);
  publish_device(dev);
  if (!parked_.empty()) retry_parked_ = true;  // run() retries them after this event
  grants_.erase(g.id);  // g is gone from here on
}

Daemon::Impl::Tenant* Daemon::Impl::tenant_by_id(TenantId id) {
  auto it = tenants_.find(id.value());
  return it == tenants_.end() ? nullptr : &it->second;
}

void Daemon::Impl::end_session(Session& s, const char* why) {
  st::StateSegment::Write w(*seg_);
  st::State& state = seg_->state();
  const std::uint64_t id = s.id;
  const std::size_t n = s.grants.size();
  const std::vector<std::uint64_t> grant_ids = s.grants;
  for (std::uint64_t gid : grant_ids) {
    auto it = grants_.find(gid);
    if (it != grants_.end()) finish_grant(it->second, s.tenant, false);
  }
  if (s.conn != 0) {
    auto cit = conns_.find(s.conn);
    if (cit != conns_.end()) cit->second.session = 0;
    const std::uint64_t conn = s.conn;
    s.conn = 0;
    close_connection(conn);
  }
  if (s.pidfd) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, s.pidfd.get(), nullptr);
  std::memset(&state.sessions[s.slot], 0, sizeof(st::SessionRecord));
  // Its reserve leaves the tenant's and the GPU's figures.
  s.reserve.fill(0);
  for (const auto& [tid, t] : tenants_) publish_tenant(t);
  for (const DeviceInfo& d : devices_) publish_device(d);
  ++state.counters.process_exits;
  log_.info("session " + std::to_string(id) + " (pid " + std::to_string(s.pid) + ") ended: " + why + "; " +
            std::to_string(n) + " grant(s) returned");
  sessions_.erase(id);
}

std::int32_t Daemon::Impl::free_session_slot() const {
  const st::State& s = seg_->state();
  for (std::uint32_t i = 0; i < st::kMaxSessions; ++i) {
    if (s.sessions[i].state == st::kSessionFree) return static_cast<std::int32_t>(i);
  }
  return -1;
}

std::int32_t Daemon::Impl::free_grant_slot() const {
  const st::State& s = seg_->state();
  for (std::uint32_t i = 0; i < st::kMaxGrants; ++i) {
    if (s.grants[i].state == st::kGrantFree) return static_cast<std::int32_t>(i);
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// state segment

void Daemon::Impl::publish_tenant(const Tenant& t) {
  st::StateSegment::Write w(*seg_);
  st::TenantRecord& r = seg_->state().tenants[t.slot];
  std::uint32_t over = 0;
  r.in_use = 1;
  r.id = t.id.value();
  copy_name(r.name, t.name);
  for (const DeviceInfo& d : devices_) {
    const Accounting::Usage u = acct_.usage(t.id, d.ordinal);
    const auto i = static_cast<std::size_t>(d.ordinal.value());
    r.limit[i] = u.limit.value();
    r.granted[i] = u.granted.value();
    r.nonpool[i] = u.nonpool.value();
    if (u.used() > u.limit) over |= 1u << i;
    std::uint64_t reserve = 0;
    for (const auto& [sid, ss] : sessions_) {
      if (ss.tenant == t.id) reserve += ss.reserve[i];
    }
    r.reserve[i] = reserve;
  }
  r.namespace_id = t.ns.value();
  r.over_limit = over;
  for (const auto& [name, n] : namespaces_) {
    if (n.id == t.ns) publish_namespace(n);
  }
}

void Daemon::Impl::publish_namespace(const Namespace& n) {
  st::StateSegment::Write w(*seg_);
  st::NamespaceRecord& r = seg_->state().namespaces[n.slot];
  r.in_use = 1;
  r.id = n.id.value();
  copy_name(r.name, n.spec.name);
  r.priority = n.spec.priority;
  r.flags = (n.spec.limit ? st::kNamespaceHasLimit : 0u) | (n.spec.declared ? 0u : st::kNamespaceImplicit);
  std::uint32_t over = 0;
  for (const DeviceInfo& d : devices_) {
    const auto i = static_cast<std::size_t>(d.ordinal.value());
    const Accounting::NamespaceUsage u = acct_.namespace_usage(n.id, d.ordinal);
    r.limit[i] = n.spec.limit_on(d.total).value();
    r.guaranteed[i] = n.spec.guaranteed_on(d.total).value();
    r.used[i] = u.used().value();
    if (u.used().value() > r.limit[i]) over |= 1u << i;
  }
  r.over_limit = over;
  std::uint32_t count = 0;
  for (const auto& [id, t] : tenants_) count += t.ns == n.id ? 1 : 0;
  r.tenant_count = count;
}

void Daemon::Impl::publish_config() {
  st::StateSegment::Write w(*seg_);
  st::ConfigRecord& r = seg_->state().config;
  copy_name(r.path, opts_.config);
  r.from_file = config_from_file_ ? 1 : 0;
  r.namespace_count = static_cast<std::uint32_t>(namespaces_.size());
}

void Daemon::Impl::publish_device(const DeviceInfo& d) {
  st::StateSegment::Write w(*seg_);
  st::DeviceRecord& r = seg_->state().devices[d.ordinal.value()];
  std::memcpy(r.uuid, d.uuid.data(), sizeof r.uuid);
  r.total = d.total.value();
  r.granularity = d.granularity.value();
  r.pool_bytes = d.pool->pool_bytes().value();
  r.free_bytes = d.pool->free_bytes().value();
  r.free_handles = d.pool->free_handles();
  r.largest_free_handle = d.pool->largest_free_handle().value();
  r.granted_bytes = d.granted.value();
  r.free_small_handles = d.pool->free_small_handles();
  r.free_bulk_handles = d.pool->free_bulk_handles();
  r.warm_target_bytes = opts_.warm_reserve;
  r.pool_peak_bytes = std::max(r.pool_peak_bytes, d.pool->peak_bytes().value());
  r.dedup_logical_bytes = dedup_ ? dedup_->logical_bytes(d.ordinal).value() : 0;
  r.dedup_physical_bytes = dedup_ ? dedup_->physical_bytes(d.ordinal).value() : 0;
  {
    std::uint64_t hook_reserve = 0;
    for (const auto& [sid, ss] : sessions_) hook_reserve += ss.reserve[static_cast<std::size_t>(d.ordinal.value())];
    r.hook_reserve_bytes = hook_reserve;
  }
  r.orphaned_bytes = d.orphaned.value();
  r.counted_bytes = d.counted.value();
  std::uint64_t nonpool = 0;
  for (const auto& [tid, t] : tenants_) nonpool += acct_.usage(t.id, d.ordinal).nonpool.value();
  r.nonpool_bytes = nonpool;
  r.in_use = 1;
  r.ordinal = static_cast<std::uint32_t>(d.ordinal.value());
  const Accounting::DeviceEntry du = acct_.device_usage(d.ordinal);
  r.guaranteed_bytes = du.guaranteed.value();
  r.borrowed_bytes = du.borrowed.value();
  // Handle counters accumulate over daemon restarts: this daemon's pools count from a base.
  std::uint64_t created = 0;
  std::uint64_t released = 0;
  for (const DeviceInfo& x : devices_) {
    created += x.pool->handles_created();
    released += x.pool->handles_released();
  }
  st::Counters& c = seg_->state().counters;
  c.handles_created = handles_created_base_ + created;
  c.handles_released = handles_released_base_ + released;
}

void Daemon::Impl::publish_session(const Session& s) {
  st::StateSegment::Write w(*seg_);
  st::SessionRecord& r = seg_->state().sessions[s.slot];
  r.id = s.id;
  r.start_time = s.start_time;
  r.pid = s.pid;
  r.uid = s.uid;
  r.gid = s.gid;
  r.tenant = s.tenant.value();
  r.state = s.conn != 0 ? st::kSessionConnected : st::kSessionDetached;
  r.grant_count = static_cast<std::uint32_t>(s.grants.size());
}

void Daemon::Impl::shutdown() {
  metrics_.reset();  // stops its threads before the segment may go
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
  listen_fd_.reset();
  if (socket_bound_) {
    ::unlink(opts_.socket.c_str());
    socket_bound_ = false;
  }
  std::vector<std::uint64_t> serials;
  for (const auto& [serial, c] : conns_) serials.push_back(serial);
  for (std::uint64_t serial : serials) close_connection(serial);

  st::StateSegment::Write w(*seg_);
  st::State& state = seg_->state();
  // The daemon's handles go; granted memory lives on in the tenants that imported it.
  std::size_t held = 0;
  for (auto& [id, g] : grants_) {
    ++held;
    DeviceInfo& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
    for (auto& h : g.handles) dev.pool->retire(std::move(h));
    g.handles.clear();
  }
  if (dedup_) {
    std::map<int, DevicePool*> pools;
    for (DeviceInfo& d : devices_) pools[d.ordinal.value()] = d.pool.get();
    dedup_->retire_all(pools);
  }
  for (DeviceInfo& d : devices_) {
    d.pool->release_free();
    publish_device(d);
  }
  state.header.clean = 1;
  state.header.updated_unix_ns = now_unix_ns();
  if (held == 0) {
    seg_->remove();
    log_.info("stopped; no grant held, state segment removed");
  } else {
    log_.info("stopped; " + std::to_string(held) + " grant(s) of " + std::to_string(sessions_.size()) +
              " live session(s) still held: keeping " + st::segment_path(opts_.state) + " for the next vlaked");
  }
  grants_.clear();
}

// ---------------------------------------------------------------------------------------------
// dedup of read-only chunks (docs/dedup.md; the table and the planning are in dedup.cpp)

Dedup& Daemon::Impl::dedup() {
  if (!dedup_) dedup_ = std::make_unique<Dedup>(*driver_, log_);
  return *dedup_;
}

void Daemon::Impl::on_share_request(Connection& c, Session& s, const proto::ShareRequest& m) {
  if ((m.flags & ~std::uint32_t{proto::kShareTransparent}) != 0) {
    return malformed(c, "ShareRequest has unknown flags");
  }
  proto::ShareReply reply{};
  reply.h = proto::make_header<proto::ShareReply>(proto::MsgType::share_reply, m.h.request_id);
  reply.grant_id = m.grant_id;
  auto answer = [&](proto::Status st) {
    reply.status = st;
    if (!send(c, reply)) close_connection(c.serial);
  };
  if (std::find(s.grants.begin(), s.grants.end(), m.grant_id) == s.grants.end()) {
    return answer(proto::Status::unknown_grant);
  }
  Grant& g = grants_.at(m.grant_id);
  DeviceInfo& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  const std::uint64_t gran = dev.granularity.value();
  if (m.bytes == 0 || m.offset % gran != 0 || m.bytes % gran != 0 || m.offset > g.bytes.value() ||
      m.bytes > g.bytes.value() - m.offset) {
    return malformed(c, "ShareRequest range is not chunk-aligned inside grant " + std::to_string(g.id));
  }
  const Tenant& t = tenants_.at(s.tenant.value());
  if ((m.flags & proto::kShareTransparent) != 0 && m.first_piece == 0) {
    // Transparent mode (docs/dedup.md): only for tenants of a `dedup: transparent` namespace.
    // Cheap: nothing is planned. The hook asks once per connection and then stops.
    const quota::NamespaceSpec* ns = nullptr;
    for (const auto& [ns_name, n] : namespaces_) {
      if (n.id == t.ns) ns = config_.find_namespace(ns_name);
    }
    if (ns == nullptr || config_.dedup_of(*ns) != quota::DedupMode::transparent) {
      log_.info("tenant " + t.name + ": transparent share of grant " + std::to_string(g.id) +
                " refused: its namespace is not in dedup transparent mode");
      return answer(proto::Status::dedup_disabled);
    }
  }
  const Dedup::Plan* plan = nullptr;
  if (m.first_piece == 0) {
    if (g.purpose != proto::GrantPurpose::alloc || g.orphaned || g.canary || g.handles.empty() ||
        dedup().is_shared(g.id)) {
      log_.info("tenant " + t.name + ": grant " + std::to_string(g.id) +
                " cannot be shared (not a live alloc grant, canary guard, or shared already)");
      return answer(proto::Status::bad_request);
    }
    try {
      plan = &dedup().plan(s.id, g.id, *dev.pool, s.tenant, g.handles, Bytes{m.offset}, Bytes{m.bytes});
    } catch (const PoolOutOfMemory& e) {
      log_.info("tenant " + t.name + ": share of grant " + std::to_string(g.id) + ": no memory for the copies");
      publish_device(dev);
      return answer(proto::Status::out_of_memory);
    } catch (const std::exception& e) {
      log_.error("tenant " + t.name + ": share of grant " + std::to_string(g.id) + " failed: " + e.what());
      publish_device(dev);
      return answer(proto::Status::internal);
    }
    publish_device(dev);
  } else {
    plan = dedup().pending(s.id);
    if (plan == nullptr || plan->grant_id != g.id || m.first_piece >= plan->pieces.size()) {
      return malformed(c, "ShareRequest for a batch of no pending share");
    }
  }
  const auto total = static_cast<std::uint32_t>(plan->pieces.size());
  reply.first_piece = m.first_piece;
  reply.total_pieces = total;
  reply.shared_bytes = plan->shared.value();
  reply.merged_bytes = plan->merged.value();
  reply.copied_bytes = plan->copied.value();
  std::vector<int> fds;
  for (std::uint32_t i = m.first_piece; i < total && reply.piece_count < proto::kMaxHandlesPerGrant; ++i) {
    const Dedup::Piece& p = plan->pieces[i];
    proto::SharePiece& out = reply.pieces[reply.piece_count++];
    out.size = p.size.value();
    out.offset = p.offset.value();
    if (p.kind == Dedup::PieceKind::keep) {
      out.flags = proto::kShareKeep;
      out.keep_index = p.keep_index;
    } else if (p.kind == Dedup::PieceKind::shared) {
      out.flags = proto::kShareReadOnly;
      fds.push_back(-1);  // filled below
    } else {
      fds.push_back(p.fd());
    }
  }
  // Shared chunks' descriptors live in the table: resolve them after the loop (same order).
  {
    std::size_t k = 0;
    for (std::uint32_t i = m.first_piece; i < m.first_piece + reply.piece_count; ++i) {
      const Dedup::Piece& p = plan->pieces[i];
      if (p.kind == Dedup::PieceKind::keep) continue;
      if (p.kind == Dedup::PieceKind::shared) fds[k] = dedup_->chunk_fd(p.chunk);
      ++k;
    }
  }
  reply.status = proto::Status::ok;
  if (!send(c, reply, fds)) {
    dedup().abort(s.id, *dev.pool, s.tenant);
    publish_device(dev);
    close_connection(c.serial);
  }
}

void Daemon::Impl::on_share_commit(Connection& c, Session& s, const proto::ShareCommit& m) {
  if (m.reserved != 0) return malformed(c, "ShareCommit reserved field is not zero");
  if (m.commit > 1) return malformed(c, "ShareCommit commit out of range");
  proto::ShareAck ack{};
  ack.h = proto::make_header<proto::ShareAck>(proto::MsgType::share_ack, m.h.request_id);
  const Dedup::Plan* plan = dedup().pending(s.id);
  if (plan == nullptr || plan->grant_id != m.grant_id ||
      std::find(s.grants.begin(), s.grants.end(), m.grant_id) == s.grants.end()) {
    ack.status = proto::Status::unknown_grant;
    if (!send(c, ack)) close_connection(c.serial);
    return;
  }
  Grant& g = grants_.at(m.grant_id);
  DeviceInfo& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  const Tenant& t = tenants_.at(s.tenant.value());
  const std::uint64_t shared = plan->shared.value();
  const std::uint64_t merged = plan->merged.value();
  const std::uint64_t copied = plan->copied.value();
  if (m.commit == 1) {
    dedup().commit(s.id, g.handles, *dev.pool, s.tenant);
    ack.shared_bytes = shared;
    log_.info("tenant " + t.name + ": grant " + std::to_string(g.id) + " shares " + std::to_string(shared) +
              " bytes read-only on GPU " + std::to_string(dev.ordinal.value()) + " (" + std::to_string(merged) +
              " merged with existing chunks, " + std::to_string(copied) + " copied privately)");
  } else {
    dedup().abort(s.id, *dev.pool, s.tenant);
    log_.info("tenant " + t.name + ": share of grant " + std::to_string(g.id) + " aborted by the hook");
  }
  {
    st::StateSegment::Write w(*seg_);
    seg_->state().grants[g.slot].handle_count = static_cast<std::uint32_t>(g.handles.size());
    publish_device(dev);
  }
  ack.status = proto::Status::ok;
  if (!send(c, ack)) close_connection(c.serial);
}

// ---------------------------------------------------------------------------------------------
// pool performance: reserve reports, pressure, parked grants, warm reserve (docs/pool.md)

void Daemon::Impl::on_reserve_report(Connection& c, Session& s, const proto::ReserveReport& m) {
  DeviceInfo* dev = device_by_uuid(m.device_uuid);
  if (dev == nullptr) return malformed(c, "ReserveReport for a GPU this node does not have");
  if (m.bytes > dev->total.value()) return malformed(c, "ReserveReport bytes exceed the GPU's memory");
  if (m.blocks > m.bytes) return malformed(c, "ReserveReport has more blocks than bytes");
  // A reserve is part of what the session holds on that GPU: clamp (a Release may be in flight).
  std::uint64_t held = 0;
  for (std::uint64_t gid : s.grants) {
    const Grant& g = grants_.at(gid);
    if (g.device == dev->ordinal) held += g.bytes.value();
  }
  s.reserve[static_cast<std::size_t>(dev->ordinal.value())] = std::min(m.bytes, held);
  st::StateSegment::Write w(*seg_);
  ++seg_->state().counters.reserve_reports;
  if (Tenant* t = tenant_by_id(s.tenant)) publish_tenant(*t);
  publish_device(*dev);
}

bool Daemon::Impl::send_pressure(const Session& requester, const DeviceInfo& dev, Bytes shortfall) {
  const auto d = static_cast<std::size_t>(dev.ordinal.value());
  std::uint64_t sent = 0;
  for (const auto& [sid, ss] : sessions_) {
    if (sid == requester.id || !ss.pressure || ss.reserve[d] == 0 || ss.conn == 0) continue;
    auto cit = conns_.find(ss.conn);
    if (cit == conns_.end()) continue;
    proto::Pressure p{};
    p.h = proto::make_header<proto::Pressure>(proto::MsgType::pressure, 0);
    std::memcpy(p.device_uuid, dev.uuid.data(), sizeof p.device_uuid);
    p.bytes = shortfall.value();
    p.reason = proto::PressureReason::pool_exhausted;
    try {
      send_with_fds(cit->second.fd.get(), std::as_bytes(std::span<const proto::Pressure>(&p, 1)), {});
      ++sent;
      log_.info("GPU " + std::to_string(d) + ": pressure: asked session " + std::to_string(sid) + " (pid " +
                std::to_string(ss.pid) + ", reserve " + std::to_string(ss.reserve[d]) + " bytes) for " +
                std::to_string(shortfall.value()) + " bytes");
    } catch (const std::exception& e) {
      // A client that does not read its socket gets no more; its connection stays.
      log_.warn("session " + std::to_string(sid) + ": cannot send Pressure: " + e.what());
    }
  }
  if (sent > 0) {
    st::StateSegment::Write w(*seg_);
    seg_->state().counters.pressure_sent += sent;
  }
  return sent > 0;
}

bool Daemon::Impl::park_grant(Connection& c, Session& s, const proto::GrantRequest& m, const DeviceInfo& dev,
                              Bytes bytes, std::chrono::steady_clock::time_point received) {
  const auto now = std::chrono::steady_clock::now();
  if (grant_retry_ != nullptr) {
    if (now < grant_retry_->deadline) {
      grant_parked_ = true;
      return true;
    }
    st::StateSegment::Write w(*seg_);
    ++seg_->state().counters.parked_timeouts;
    log_.info("GPU " + std::to_string(dev.ordinal.value()) + ": parked grant of " + std::to_string(bytes.value()) +
              " bytes (session " + std::to_string(s.id) + ") waited " +
              std::to_string(opts_.pressure_wait.count()) + " ms; no memory came back: out of memory");
    return false;
  }
  if (opts_.pressure_wait.count() == 0) return false;
  const Bytes shortfall = std::max(dev.pool->shortfall(bytes), dev.granularity);
  if (!send_pressure(s, dev, shortfall)) return false;
  parked_.push_back(Parked{c.serial, s.id, m, received, now + opts_.pressure_wait});
  {
    st::StateSegment::Write w(*seg_);
    ++seg_->state().counters.grants_parked;
  }
  log_.info("GPU " + std::to_string(dev.ordinal.value()) + ": grant of " + std::to_string(bytes.value()) +
            " bytes (session " + std::to_string(s.id) + ") parked for up to " +
            std::to_string(opts_.pressure_wait.count()) + " ms while reserves are returned");
  arm_park_timer();
  grant_parked_ = true;
  return true;
}

void Daemon::Impl::retry_parked() {
  retry_parked_ = false;
  std::vector<Parked> todo;
  todo.swap(parked_);
  for (std::size_t i = 0; i < todo.size(); ++i) {
    const Parked& p = todo[i];
    auto cit = conns_.find(p.conn);
    auto sit = sessions_.find(p.session);
    if (cit == conns_.end() || sit == sessions_.end() || cit->second.session != p.session) continue;  // gone
    grant_retry_ = &p;
    grant_parked_ = false;
    try {
      on_grant(cit->second, sit->second, p.req);
    } catch (...) {
      grant_retry_ = nullptr;
      for (std::size_t j = i + 1; j < todo.size(); ++j) parked_.push_back(todo[j]);
      arm_park_timer();
      throw;
    }
    grant_retry_ = nullptr;
    if (grant_parked_) parked_.push_back(p);
  }
  grant_parked_ = false;
  arm_park_timer();
}

void Daemon::Impl::on_park_timer() {
  std::uint64_t expirations = 0;
  (void)!::read(park_timer_fd_.get(), &expirations, sizeof expirations);
  retry_parked();  // one last try for the expired ones, then out_of_memory
}

void Daemon::Impl::arm_park_timer() {
  if (!park_timer_fd_) {
    if (parked_.empty()) return;
    park_timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    if (!park_timer_fd_) throw_errno("timerfd_create");
    add_epoll(park_timer_fd_.get(), Kind::park, 0);
  }
  itimerspec its{};
  if (!parked_.empty()) {
    auto first = parked_.front().deadline;
    for (const Parked& p : parked_) first = std::min(first, p.deadline);
    const auto ns = std::max<std::int64_t>(
        1'000'000, std::chrono::duration_cast<std::chrono::nanoseconds>(first - std::chrono::steady_clock::now()).count());
    its.it_value.tv_sec = ns / 1'000'000'000;
    its.it_value.tv_nsec = ns % 1'000'000'000;
  }
  ::timerfd_settime(park_timer_fd_.get(), 0, &its, nullptr);
}

void Daemon::Impl::refill_warm(std::uint64_t max_handles_per_gpu) {
  for (DeviceInfo& d : devices_) {
    if (d.pool->free_bytes().value() >= opts_.warm_reserve) continue;
    const std::uint64_t made = d.pool->refill(Bytes{opts_.warm_reserve}, max_handles_per_gpu);
    if (made > 0) {
      log_.debug("GPU " + std::to_string(d.ordinal.value()) + ": warm reserve: " + std::to_string(made) +
                 " handle(s) created, " + std::to_string(d.pool->free_bytes().value()) + " bytes free in the pool");
    }
    publish_device(d);
  }
}

// ---------------------------------------------------------------------------------------------
// quota configuration: namespaces, hot reload

NamespaceId Daemon::Impl::namespace_id(const std::string& name) const {
  auto it = namespaces_.find(name);
  return it == namespaces_.end() ? NamespaceId{0} : it->second.id;
}

// Brings the namespace table in line with config_: existing namespaces keep their id, new ones
// get a free slot. Namespaces no longer configured stay until retarget_tenants() moved their
// tenants away (then reload() drops them).
void Daemon::Impl::apply_namespaces() {
  st::StateSegment::Write w(*seg_);
  st::State& state = seg_->state();
  for (const quota::NamespaceSpec& spec : config_.namespaces()) {
    auto it = namespaces_.find(spec.name);
    if (it == namespaces_.end()) {
      std::int32_t slot = -1;
      for (std::uint32_t i = 0; i < st::kMaxNamespaces; ++i) {
        if (state.namespaces[i].in_use == 0) {
          slot = static_cast<std::int32_t>(i);
          break;
        }
      }
      // validate_config() bounds the count; a full table here means stale namespaces remain.
      if (slot < 0) throw std::runtime_error("namespace table full (" + std::to_string(st::kMaxNamespaces) + ")");
      const auto u = static_cast<std::uint32_t>(slot);
      it = namespaces_.emplace(spec.name, Namespace{NamespaceId{u + 1}, u, spec}).first;
      state.namespaces[u].in_use = 1;  // reserve the slot now
    }
    it->second.spec = spec;
    for (const DeviceInfo& d : devices_) {
      acct_.set_namespace(it->second.id, d.ordinal, spec.limit_on(d.total), spec.guaranteed_on(d.total));
    }
    publish_namespace(it->second);
  }
}

void Daemon::Impl::move_session(Session& s, Tenant& to) {
  st::StateSegment::Write w(*seg_);
  st::State& state = seg_->state();
  const TenantId from = s.tenant;
  for (std::uint64_t gid : s.grants) {
    Grant& g = grants_.at(gid);
    acct_.uncharge(g.tenant, g.device, g.bytes);
    acct_.restore(to.id, g.device, g.bytes);  // already held: may exceed the new limit
    g.tenant = to.id;
    state.grants[g.slot].tenant = to.id.value();
  }
  s.tenant = to.id;
  publish_session(s);
  if (Tenant* old = tenant_by_id(from)) {
    log_.info("session " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) + ") moves from tenant " + old->name +
              " to " + to.name + " with " + std::to_string(s.grants.size()) + " grant(s)");
    publish_tenant(*old);
  }
  publish_tenant(to);
}

// Re-resolves every tenant against config_: live sessions by their uid/gid (a session whose
// tenant changed moves, grants and all), session-less tenants by the ids that created them.
void Daemon::Impl::retarget_tenants() {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, sess] : sessions_) ids.push_back(id);
  std::set<std::uint32_t> resolved;
  for (std::uint64_t id : ids) {
    Session& sess = sessions_.at(id);
    if (!sess.alloc_id.empty()) {
      // A Kubernetes allocation's session: re-resolved from its allocation (namespace,
      // pod_limit may have changed); an allocation already gone keeps its tenant.
      auto a = allocs_.find(sess.alloc_id);
      try {
        Tenant& t = a != allocs_.end() ? tenant_for_alloc(a->second) : tenants_.at(sess.tenant.value());
        resolved.insert(t.id.value());
        if (t.id != sess.tenant) move_session(sess, t);
      } catch (const std::exception& e) {
        log_.error("session " + std::to_string(id) + ": keeps its tenant: " + e.what());
      }
      continue;
    }
    const std::vector<gid_t> groups = supplementary_groups(sess.uid, sess.gid);
    try {
      Tenant& t = tenant_for(config_.resolve(sess.uid, sess.gid, groups), sess.uid, sess.gid);
      resolved.insert(t.id.value());
      if (t.id != sess.tenant) move_session(sess, t);
    } catch (const std::exception& e) {
      log_.error("session " + std::to_string(id) + ": keeps its tenant: " + e.what());
    }
  }
  std::vector<std::uint32_t> rest;
  for (const auto& [tid, t] : tenants_) {
    if (resolved.count(tid) == 0) rest.push_back(tid);
  }
  for (std::uint32_t tid : rest) {
    Tenant& t = tenants_.at(tid);
    if (t.have_ids) {
      const quota::TenantSpec spec = config_.resolve(t.uid, t.gid, supplementary_groups(t.uid, t.gid));
      if (spec.name.substr(0, st::kTenantNameBytes - 1) == t.name) {
        tenant_for(spec, t.uid, t.gid);
        continue;
      }
    }
    if (!t.alloc_id.empty()) {
      auto a = allocs_.find(t.alloc_id);
      if (a != allocs_.end() && alloc::tenant_name(a->first, a->second.owner) == t.name) {
        tenant_for_alloc(a->second);
        continue;
      }
    }
    // Holds nothing (no session): keep it, in the namespace its name says if still there.
    const auto slash = t.name.find('/');
    NamespaceId ns = namespace_id(slash == std::string::npos ? std::string(quota::kDefaultNamespace)
                                                             : t.name.substr(0, slash));
    if (ns.value() == 0) ns = namespace_id(quota::kDefaultNamespace);
    t.ns = ns;
    acct_.assign(t.id, ns);
    publish_tenant(t);
  }
}

void Daemon::Impl::reload(const std::string& why, bool force) {
  std::string text;
  const FileFingerprint fp = fingerprint(opts_.config, &text);
  pending_fp_ = fp;
  if (!force && fp == seen_fp_) return;
  st::StateSegment::Write w(*seg_);
  st::State& state = seg_->state();
  if (!fp.exists) {
    // A vanished file is not an invalid one (an editor may be between unlink and create).
    if (!missing_logged_) {
      log_.warn("quota file " + opts_.config + " is gone (" + why + "); keeping the configuration in force");
    }
    missing_logged_ = true;
    seen_fp_ = fp;
    return;
  }
  missing_logged_ = false;
  seen_fp_ = fp;
  quota::QuotaConfig next;
  try {
    next = quota::QuotaConfig::parse(text, opts_.config);
    validate_config(next);
  } catch (const quota::ConfigError& e) {
    ++state.counters.config_reload_errors;
    copy_name(state.config.last_error, e.what());
    state.config.error_unix_ns = now_unix_ns();
    state.config.rejected = 1;
    log_.error(std::string("quota file rejected (") + why + "): " + e.what() + "; the previous configuration stays in force");
    return;
  }
  config_ = std::move(next);
  config_from_file_ = true;
  apply_namespaces();
  retarget_tenants();
  // Namespaces gone from the file: their tenants have moved; drop them.
  std::vector<std::string> gone;
  for (const auto& [name, n] : namespaces_) {
    if (config_.find_namespace(name) == nullptr) gone.push_back(name);
  }
  for (const std::string& name : gone) {
    const Namespace& n = namespaces_.at(name);
    acct_.remove_namespace(n.id);
    std::memset(&state.namespaces[n.slot], 0, sizeof(st::NamespaceRecord));
    namespaces_.erase(name);
  }
  for (const auto& [id, t] : tenants_) publish_tenant(t);
  for (const DeviceInfo& d : devices_) publish_device(d);
  ++state.counters.config_reloads;
  ++state.config.generation;
  state.config.loaded_unix_ns = now_unix_ns();
  state.config.rejected = 0;
  publish_config();
  log_.info("config reloaded (" + why + "): " + opts_.config + ", generation " +
            std::to_string(state.config.generation) + ", " + std::to_string(namespaces_.size()) + " namespace(s), " +
            std::to_string(gone.size()) + " removed");
}

void Daemon::Impl::setup_watch() {
  inotify_fd_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  reload_timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!inotify_fd_ || !reload_timer_fd_) {
    log_.warn(std::string("inotify unavailable (") + std::strerror(errno) +
              "): quota file changes are noticed by the periodic check only");
    inotify_fd_.reset();
    reload_timer_fd_.reset();
    return;
  }
  add_epoll(inotify_fd_.get(), Kind::inotify, 0);
  add_epoll(reload_timer_fd_.get(), Kind::reload, 0);
  add_watches();
}

// Watches the config's directory (a ConfigMap swaps its `..data` symlink there; an editor
// renames over the file) and, when the config is a symlink into another directory, that one.
void Daemon::Impl::add_watches() {
  if (!inotify_fd_) return;
  constexpr std::uint32_t kMask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB;
  const std::string dir = parent_dir(opts_.config);
  if (watch_dir_ < 0) {
    watch_dir_ = ::inotify_add_watch(inotify_fd_.get(), dir.c_str(), kMask);
    if (watch_dir_ < 0 && !watch_failed_logged_) {
      log_.warn("cannot watch " + dir + " (" + std::strerror(errno) +
                "): quota file changes are noticed by the periodic check only");
      watch_failed_logged_ = true;
    }
  }
  char real[PATH_MAX];
  const std::string real_dir = ::realpath(opts_.config.c_str(), real) != nullptr ? parent_dir(real) : std::string();
  if (real_dir == watched_real_dir_) return;
  if (watch_real_dir_ >= 0 && watch_real_dir_ != watch_dir_) ::inotify_rm_watch(inotify_fd_.get(), watch_real_dir_);
  watch_real_dir_ = -1;
  watched_real_dir_ = real_dir;
  if (!real_dir.empty() && real_dir != dir) {
    watch_real_dir_ = ::inotify_add_watch(inotify_fd_.get(), real_dir.c_str(), kMask);
  }
}

void Daemon::Impl::on_inotify() {
  alignas(inotify_event) char buf[8192];
  bool any = false;
  for (;;) {
    const ssize_t n = ::read(inotify_fd_.get(), buf, sizeof buf);
    if (n <= 0) break;
    for (std::size_t off = 0; off + sizeof(inotify_event) <= static_cast<std::size_t>(n);) {
      inotify_event ev{};
      std::memcpy(&ev, buf + off, sizeof ev);
      if ((ev.mask & IN_IGNORED) != 0) {  // a watched directory went away
        if (ev.wd == watch_dir_) watch_dir_ = -1;
        if (ev.wd == watch_real_dir_) {
          watch_real_dir_ = -1;
          watched_real_dir_.clear();
        }
      }
      off += sizeof(inotify_event) + ev.len;
    }
    any = true;
  }
  if (!any) return;
  // Debounce: an editor's create + write + close, or a ConfigMap's renames, settle within this
  // delay; then the file is read once.
  itimerspec its{};
  its.it_value.tv_nsec = 100'000'000;
  ::timerfd_settime(reload_timer_fd_.get(), 0, &its, nullptr);
}

void Daemon::Impl::on_reload_timer() {
  std::uint64_t expirations = 0;
  (void)!::read(reload_timer_fd_.get(), &expirations, sizeof expirations);
  reload("file changed", false);
  add_watches();  // the symlink target may now live in another directory
}

// ---------------------------------------------------------------------------------------------
// Kubernetes allocations (--alloc-root; docs/device-plugin.md)

void Daemon::Impl::setup_allocs() {
  if (opts_.alloc_root.empty()) return;
  mkdir_p(opts_.alloc_root);
  alloc_inotify_fd_.reset(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!alloc_inotify_fd_) throw StartupError(std::string("inotify_init1: ") + std::strerror(errno));
  const int wd = ::inotify_add_watch(alloc_inotify_fd_.get(), opts_.alloc_root.c_str(),
                                     IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF);
  if (wd < 0) throw StartupError("inotify on " + opts_.alloc_root + ": " + std::strerror(errno));
  alloc_watches_[wd] = std::string();
  add_epoll(alloc_inotify_fd_.get(), Kind::alloc_watch, 0);
  alloc_timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!alloc_timer_fd_) throw StartupError(std::string("timerfd_create: ") + std::strerror(errno));
  itimerspec its{};
  const auto ms = opts_.sample_interval.count();
  its.it_interval.tv_sec = ms / 1000;
  its.it_interval.tv_nsec = (ms % 1000) * 1'000'000;
  its.it_value = its.it_interval;
  ::timerfd_settime(alloc_timer_fd_.get(), 0, &its, nullptr);
  add_epoll(alloc_timer_fd_.get(), Kind::alloc_timer, 0);
  log_.info("serving Kubernetes allocations under " + opts_.alloc_root);
  rescan_allocs();
}

void Daemon::Impl::on_alloc_watch() {
  alignas(inotify_event) char buf[8192];
  while (::read(alloc_inotify_fd_.get(), buf, sizeof buf) > 0) {
  }
  rescan_allocs();
}

void Daemon::Impl::on_alloc_timer() {
  std::uint64_t expirations = 0;
  (void)!::read(alloc_timer_fd_.get(), &expirations, sizeof expirations);
  rescan_allocs();
}

void Daemon::Impl::close_alloc(Allocation& a) {
  if (a.fd) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, a.fd.get(), nullptr);
    a.fd.reset();
  }
  alloc_serials_.erase(a.serial);
  for (auto it = alloc_watches_.begin(); it != alloc_watches_.end();) {
    if (it->second == a.id) {
      ::inotify_rm_watch(alloc_inotify_fd_.get(), it->first);
      it = alloc_watches_.erase(it);
    } else {
      ++it;
    }
  }
}

void Daemon::Impl::rescan_allocs() {
  if (opts_.alloc_root.empty()) return;
  std::set<std::string> seen;
  DIR* d = ::opendir(opts_.alloc_root.c_str());
  if (d == nullptr) {
    if (!alloc_root_warned_) log_.warn("cannot read " + opts_.alloc_root + ": " + std::strerror(errno));
    alloc_root_warned_ = true;
  } else {
    alloc_root_warned_ = false;
    while (const dirent* e = ::readdir(d)) {
      const std::string id = e->d_name;
      if (alloc::valid_id(id)) seen.insert(id);
    }
    ::closedir(d);
  }
  // Gone: close the socket. Sessions opened through it keep their tenant until they end.
  for (auto it = allocs_.begin(); it != allocs_.end();) {
    if (seen.count(it->first) == 0) {
      log_.info("allocation " + it->first + " removed: its socket is closed");
      close_alloc(it->second);
      it = allocs_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& id : seen) {
    const std::string dir = opts_.alloc_root + "/" + id;
    try {
      auto known = allocs_.find(id);
      if (known != allocs_.end()) {
        std::optional<alloc::Owner> owner = alloc::read_owner(dir);
        if (owner && owner != known->second.owner) {
          known->second.owner = owner;
          reattribute(known->second);
        }
        continue;
      }
      const std::optional<alloc::Allocation> info = alloc::read_allocation(dir);
      if (!info) continue;  // being written: the rename brings another event
      const auto uuid = Uuid::parse(info->gpu_uuid);
      const DeviceInfo* dev = uuid ? device_by_uuid(uuid->data()) : nullptr;
      if (dev == nullptr) {
        if (allocs_.count(id) == 0) log_.warn("allocation " + id + ": GPU " + info->gpu_uuid + " is not on this node");
        continue;
      }
      Allocation a;
      a.id = id;
      a.dir = dir;
      a.device = dev->ordinal;
      a.bytes = info->bytes;
      a.owner = alloc::read_owner(dir);
      const std::string path = dir + "/" + alloc::kSocketFile;
      a.fd.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!a.fd) throw_errno("socket");
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      if (path.size() >= sizeof addr.sun_path) throw std::runtime_error("socket path too long: " + path);
      std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
      ::unlink(path.c_str());  // left by an earlier vlaked
      if (::bind(a.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw_errno("bind " + path);
      ::chmod(path.c_str(), 0666);  // the directory mount is the access control
      if (::listen(a.fd.get(), 128) != 0) throw_errno("listen " + path);
      a.serial = next_alloc_serial_++;
      add_epoll(a.fd.get(), Kind::alloc_listen, a.serial);
      const int wd = ::inotify_add_watch(alloc_inotify_fd_.get(), dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE);
      if (wd >= 0) alloc_watches_[wd] = id;
      alloc_serials_[a.serial] = id;
      // Sessions resumed from a previous vlaked that came through this allocation.
      const std::string tname = alloc::tenant_name(id, a.owner);
      const std::string aname = alloc::tenant_name(id, std::nullopt);
      for (auto& [sid, sess] : sessions_) {
        const Tenant* st_old = tenant_by_id(sess.tenant);
        if (sess.alloc_id.empty() && st_old != nullptr && (st_old->name == tname || st_old->name == aname)) {
          sess.alloc_id = id;
        }
      }
      log_.info("allocation " + id + ": " + alloc::tenant_name(id, a.owner) + ", " + std::to_string(a.bytes.value()) +
                " bytes on GPU " + std::to_string(a.device.value()) + ", socket " + path);
      const Allocation& added = allocs_.emplace(id, std::move(a)).first->second;
      bool resumed = false;
      for (const auto& [sid, sess] : sessions_) resumed = resumed || sess.alloc_id == id;
      if (resumed) reattribute(added);
    } catch (const std::exception& e) {
      log_.warn("allocation " + id + ": " + e.what());
    }
  }
}

Daemon::Impl::Tenant& Daemon::Impl::tenant_for_alloc(const Allocation& a) {
  const quota::NamespaceSpec* ns = a.owner ? config_.find_namespace(a.owner->ns) : nullptr;
  if (ns == nullptr) ns = config_.find_namespace(quota::kDefaultNamespace);
  Bytes limit = a.bytes;
  for (const DeviceInfo& d : devices_) {
    if (d.ordinal == a.device && ns != nullptr && ns->pod_limit) limit = std::min(limit, ns->pod_limit->on_device(d.total));
  }
  const quota::TenantSpec spec{alloc::tenant_name(a.id, a.owner), quota::Limit::bytes(limit),
                               ns != nullptr ? ns->name : std::string(quota::kDefaultNamespace),
                               ns != nullptr && ns->guard ? *ns->guard : config_.default_guard()};
  return tenant_for(spec, 0, 0, &a);
}

void Daemon::Impl::reattribute(const Allocation& a) {
  Tenant& t = tenant_for_alloc(a);
  log_.info("allocation " + a.id + " belongs to " + t.name);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, s] : sessions_) {
    if (s.alloc_id == a.id && s.tenant != t.id) ids.push_back(id);
  }
  for (std::uint64_t id : ids) move_session(sessions_.at(id), t);
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
  } catch (const OptionsError& e) {
    log.error(e.what());
    return 2;
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
