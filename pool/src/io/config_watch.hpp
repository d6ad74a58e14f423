// vlake::pool::ConfigWatch — notices new versions of the quota file and reads and parses them
// off the event loop (internal to vlaked).
//
// Noticing: a ConfigMap update swaps a `..data` symlink in the file's directory, an editor
// renames over the file or rewrites it in place: the watch covers the file's directory and,
// when the file is a symlink into another directory, that one (inotify), debounced by a short
// timer; a periodic look (poll()) catches what inotify missed (a change that then held still
// for one period). A version is identified by a fingerprint (realpath, device, inode, type,
// mtime, size, content hash, read outcome).
//
// Reading: every look at the file after start-up runs on a worker thread: quota::read_file()
// (O_NONBLOCK, a regular file only, at most quota::kMaxFileBytes; symlinks are followed) and
// QuotaConfig::parse(). The loop never touches the file: it starts a worker, and picks the
// result up when Source::config_result (an eventfd) is readable (on_result()). One worker at a
// time: a request while one runs is remembered (once; `force` is merged) and started after it;
// a periodic look while one runs is skipped. A worker stuck in a read (a hung file system)
// holds later reloads back but never the loop; the daemon logs it once. Applying (validate
// against the GPUs, Node::apply or config_rejected) is the daemon's.
//
// Thread-safety: every method is for the event loop's thread; the worker shares only its
// result slot (a mutex) and the eventfd, which it owns jointly (a worker still running when
// the ConfigWatch is destroyed finishes on its own). Errors: start() logs and falls back to the
// periodic look when inotify is unavailable; read and parse errors are Outcomes; nothing else
// throws except std::bad_alloc and Poller::add's std::system_error.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "poller.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/quota/quota_config.hpp"

namespace vlake::pool {

class ConfigWatch {
 public:
  ConfigWatch(std::string path, const Logger& log);
  ~ConfigWatch();
  ConfigWatch(const ConfigWatch&) = delete;
  ConfigWatch& operator=(const ConfigWatch&) = delete;

  // What one look at the file found.
  struct Outcome {
    enum class Kind { unchanged, changed, missing, rejected };
    Kind kind = Kind::unchanged;
    std::string why;                           // the reason given to request() ("SIGHUP", "file changed")
    std::optional<quota::QuotaConfig> config;  // changed: the parsed file
    std::string error;                         // rejected: "<file>:<line>:<col>: ..."; missing: why
  };

  // Start-up (before the loop runs): reads and parses on the calling thread. changed, missing
  // or rejected; the version read becomes the one seen.
  Outcome load_now();

  // Registers the watch (Source::config_watch), the debounce timer (Source::config_settle) and
  // the worker's eventfd (Source::config_result).
  void start(Poller& poller);
  // A reload: the file is read and, when this version was not seen before or `force`, parsed;
  // the result comes through on_result().
  void request(const std::string& why, bool force);
  // The periodic fallback (sampling tick): a changed version that held still since the last
  // poll is reported by on_result() as a reload "file changed".
  void poll();
  // Source::config_result is readable: the finished worker's Outcome, when there is one to
  // apply (not `unchanged`). Starts a request that waited.
  std::optional<Outcome> on_result();
  // Source::config_watch is readable: drains it and arms the debounce timer.
  void on_watch();
  // Source::config_settle fired: re-points the watches (a symlink may now lead elsewhere).
  void on_settle();

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] bool busy() const noexcept { return busy_; }

  struct Fingerprint {
    bool exists = false;
    int status = 0;  // quota::FileRead::Status
    std::string error;
    std::string real;  // realpath
    std::uint64_t dev = 0;
    std::uint64_t ino = 0;
    std::uint32_t type = 0;
    std::int64_t mtime_ns = 0;
    std::int64_t size = 0;
    std::uint64_t hash = 0;  // FNV-1a of the content
    friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
  };

  // What a worker is asked and what it answers (public for the worker function only).
  struct Job {
    std::string path;
    std::string why;
    bool force = false;
    bool poll = false;
    Fingerprint seen;
    Fingerprint pending;
  };
  struct Result {
    Fingerprint fp;
    Outcome outcome;
  };
  struct Shared;

 private:
  void start_job(Job job);
  void add_watches();

  std::string path_;
  const Logger& log_;
  Fingerprint seen_;     // the version last applied or rejected
  Fingerprint pending_;  // the fallback's previous look (a change must hold still)
  std::shared_ptr<Shared> shared_;
  bool busy_ = false;
  std::chrono::steady_clock::time_point busy_since_{};
  bool stuck_logged_ = false;
  bool queued_ = false;
  bool queued_force_ = false;
  std::string queued_why_;
  UniqueFd inotify_;
  UniqueFd settle_timer_;
  int watch_dir_ = -1;
  int watch_real_dir_ = -1;
  std::string watched_real_dir_;
  bool watch_failed_logged_ = false;
};

}  // namespace vlake::pool
