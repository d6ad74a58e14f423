#include "config_watch.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

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

// Reads the file (following symlinks) and fingerprints what was read.
ConfigWatch::Fingerprint ConfigWatch::fingerprint(std::string* content) const {
  Fingerprint f;
  UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
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
    if (data.size() > (64u << 20)) break;  // not a quota file; parsing will say so
  }
  char real[PATH_MAX];
  if (::realpath(path_.c_str(), real) != nullptr) f.real = real;
  f.exists = true;
  f.dev = static_cast<std::uint64_t>(sb.st_dev);
  f.ino = static_cast<std::uint64_t>(sb.st_ino);
  f.mtime_ns = static_cast<std::int64_t>(sb.st_mtim.tv_sec) * 1'000'000'000LL + sb.st_mtim.tv_nsec;
  f.size = static_cast<std::int64_t>(sb.st_size);
  f.hash = fnv1a(data);
  if (content != nullptr) *content = std::move(data);
  return f;
}

ConfigWatch::Look ConfigWatch::look(bool force, std::string& text) {
  const Fingerprint fp = fingerprint(&text);
  pending_ = fp;
  if (!force && fp == seen_) return Look::unchanged;
  seen_ = fp;
  return fp.exists ? Look::changed : Look::missing;
}

bool ConfigWatch::settled() {
  const Fingerprint now = fingerprint(nullptr);
  if (now == seen_) {
    pending_ = now;
    return false;
  }
  if (now == pending_) return true;
  pending_ = now;
  return false;
}

void ConfigWatch::start(Poller& poller) {
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
