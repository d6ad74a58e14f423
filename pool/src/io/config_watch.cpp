#include "config_watch.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace vlake::pool {

namespace {

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

struct ConfigWatch::Shared {
  std::mutex mutex;
  std::optional<Result> result;  // guarded by mutex
  UniqueFd event;                // eventfd: written once per finished job
};

namespace {

// One look: reads the file (following symlinks) and fingerprints what was read; parses it
// when the job asks for this version. Runs on the worker (or at start-up); never throws.
ConfigWatch::Result run_job(const ConfigWatch::Job& job) {
  ConfigWatch::Result r;
  r.outcome.why = job.why;
  using Kind = ConfigWatch::Outcome::Kind;
  try {
    quota::FileRead read = quota::read_file(job.path);
    ConfigWatch::Fingerprint& f = r.fp;
    f.status = static_cast<int>(read.status);
    if (read.status != quota::FileRead::Status::missing) {
      f.exists = true;
      f.error = read.error;
      char real[PATH_MAX];
      if (::realpath(job.path.c_str(), real) != nullptr) f.real = real;
      f.dev = read.dev;
      f.ino = read.ino;
      f.type = read.type;
      f.mtime_ns = read.mtime_ns;
      f.size = read.size;
      f.hash = fnv1a(read.text);
    }
    if (job.poll) {
      // Only a change that held still for one period.
      if (f == job.seen || !(f == job.pending)) return r;
    } else if (!job.force && f == job.seen) {
      return r;
    }
    switch (read.status) {
      case quota::FileRead::Status::missing:
        r.outcome.kind = Kind::missing;
        r.outcome.error = read.error;
        return r;
      case quota::FileRead::Status::rejected:
        r.outcome.kind = Kind::rejected;
        r.outcome.error = quota::ConfigError(job.path, 0, 0, read.error).what();
        return r;
      case quota::FileRead::Status::ok: break;
    }
    try {
      r.outcome.config = quota::QuotaConfig::parse(read.text, job.path);
      r.outcome.kind = Kind::changed;
    } catch (const quota::ConfigError& e) {
      r.outcome.kind = Kind::rejected;
      r.outcome.error = e.what();
    }
  } catch (const std::exception& e) {
    r.outcome.config.reset();
    r.outcome.kind = Kind::rejected;
    r.outcome.error = quota::ConfigError(job.path, 0, 0, std::string("cannot load the file: ") + e.what()).what();
  }
  return r;
}

}  // namespace

ConfigWatch::ConfigWatch(std::string path, const Logger& log)
    : path_(std::move(path)), log_(log), shared_(std::make_shared<Shared>()) {}

// A worker still running keeps `Shared` (and its eventfd) alive until it finishes.
ConfigWatch::~ConfigWatch() = default;

ConfigWatch::Outcome ConfigWatch::load_now() {
  Job job{path_, "start-up", true, false, seen_, pending_};
  Result r = run_job(job);
  seen_ = pending_ = r.fp;
  return std::move(r.outcome);
}

void ConfigWatch::start_job(Job job) {
  std::shared_ptr<Shared> shared = shared_;
  try {
    std::thread([shared, job = std::move(job)] {
      Result r;
      try {
        r = run_job(job);
      } catch (...) {  // std::bad_alloc: report it rather than end the process
        r.outcome.kind = Outcome::Kind::rejected;
        r.outcome.error = "out of memory while reading the quota file";
      }
      {
        std::lock_guard<std::mutex> lock(shared->mutex);
        shared->result = std::move(r);
      }
      const std::uint64_t one = 1;
      (void)!::write(shared->event.get(), &one, sizeof one);
    }).detach();
  } catch (const std::system_error& e) {
    log_.warn(std::string("cannot start the quota file reader: ") + e.what() + "; the next change retries");
    return;
  }
  busy_ = true;
  busy_since_ = std::chrono::steady_clock::now();
  stuck_logged_ = false;
}

void ConfigWatch::request(const std::string& why, bool force) {
  if (busy_) {
    queued_force_ = queued_force_ || force;
    if (!queued_) queued_why_ = why;
    queued_ = true;
    return;
  }
  start_job(Job{path_, why, force, false, seen_, pending_});
}

void ConfigWatch::poll() {
  if (busy_) {
    const auto held = std::chrono::steady_clock::now() - busy_since_;
    if (held > std::chrono::seconds(10) && !stuck_logged_) {
      log_.warn("reading the quota file " + path_ + " has not finished for " +
                std::to_string(std::chrono::duration_cast<std::chrono::seconds>(held).count()) +
                " s (a hung file system?); reloads wait for it, the daemon keeps serving");
      stuck_logged_ = true;
    }
    return;
  }
  start_job(Job{path_, "file changed", false, true, seen_, pending_});
}

std::optional<ConfigWatch::Outcome> ConfigWatch::on_result() {
  std::uint64_t count = 0;
  (void)!::read(shared_->event.get(), &count, sizeof count);
  std::optional<Result> r;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    r.swap(shared_->result);
  }
  if (!r) return std::nullopt;
  busy_ = false;
  pending_ = r->fp;
  if (r->outcome.kind != Outcome::Kind::unchanged) seen_ = r->fp;
  if (queued_) {
    queued_ = false;
    const bool force = std::exchange(queued_force_, false);
    start_job(Job{path_, queued_why_, force, false, seen_, pending_});
  }
  if (r->outcome.kind == Outcome::Kind::unchanged) return std::nullopt;
  return std::move(r->outcome);
}

void ConfigWatch::start(Poller& poller) {
  shared_->event.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!shared_->event) throw std::system_error(errno, std::generic_category(), "eventfd");
  poller.add(shared_->event.get(), Source::config_result, 0);
  inotify_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  settle_timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!inotify_ || !settle_timer_) {
    log_.warn(std::string("inotify unavailable (") + std::strerror(errno) +
              "): quota file changes are noticed by the periodic check only");
    inotify_.reset();
    settle_timer_.reset();
    return;
  }
  poller.add(inotify_.get(), Source::config_watch, 0);
  poller.add(settle_timer_.get(), Source::config_settle, 0);
  add_watches();
}

// Watches the config's directory (a ConfigMap swaps its `..data` symlink there; an editor
// renames over the file) and, when the config is a symlink into another directory, that one.
void ConfigWatch::add_watches() {
  if (!inotify_) return;
  constexpr std::uint32_t kMask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB;
  const std::string dir = parent_dir(path_);
  if (watch_dir_ < 0) {
    watch_dir_ = ::inotify_add_watch(inotify_.get(), dir.c_str(), kMask);
    if (watch_dir_ < 0 && !watch_failed_logged_) {
      log_.warn("cannot watch " + dir + " (" + std::strerror(errno) +
                "): quota file changes are noticed by the periodic check only");
      watch_failed_logged_ = true;
    }
  }
  char real[PATH_MAX];
  const std::string real_dir = ::realpath(path_.c_str(), real) != nullptr ? parent_dir(real) : std::string();
  if (real_dir == watched_real_dir_) return;
  if (watch_real_dir_ >= 0 && watch_real_dir_ != watch_dir_) ::inotify_rm_watch(inotify_.get(), watch_real_dir_);
  watch_real_dir_ = -1;
  watched_real_dir_ = real_dir;
  if (!real_dir.empty() && real_dir != dir) {
    watch_real_dir_ = ::inotify_add_watch(inotify_.get(), real_dir.c_str(), kMask);
  }
}

void ConfigWatch::on_watch() {
  alignas(inotify_event) char buf[8192];
  bool any = false;
  for (;;) {
    const ssize_t n = ::read(inotify_.get(), buf, sizeof buf);
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
  ::timerfd_settime(settle_timer_.get(), 0, &its, nullptr);
}

void ConfigWatch::on_settle() {
  std::uint64_t expirations = 0;
  (void)!::read(settle_timer_.get(), &expirations, sizeof expirations);
  add_watches();  // after the daemon's reload: the symlink target may now live elsewhere
}

}  // namespace vlake::pool
