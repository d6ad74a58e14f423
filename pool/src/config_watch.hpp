// vlake::pool::ConfigWatch — notices new versions of the quota file (internal to vlaked).
//
// A ConfigMap update swaps a `..data` symlink in the file's directory, an editor renames over
// the file or rewrites it in place: the watch covers the file's directory and, when the file is
// a symlink into another directory, that one (inotify), debounced by a short timer; a periodic
// look (settled()) catches what inotify missed. A version is identified by a fingerprint
// (realpath, device, inode, mtime, size, content hash). It only reads: parsing and applying are
// the daemon's and the Node's.
//
// Thread-safety: none (the event loop). Errors: start() logs and falls back to the periodic look
// when inotify is unavailable; nothing else throws except std::bad_alloc.
#pragma once

#include <cstdint>
#include <string>

#include "poller.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/unique_fd.hpp"

namespace vlake::pool {

class ConfigWatch {
 public:
  ConfigWatch(std::string path, const Logger& log) : path_(std::move(path)), log_(log) {}

  enum class Look { unchanged, changed, missing };
  // Reads the file; `changed` (with its text) when this version was not seen before, or when
  // `force`; `missing` when it cannot be read. The version read becomes the one seen.
  Look look(bool force, std::string& text);
  // The periodic fallback: true when the file changed and then held still for one period.
  bool settled();

  // Registers the watch (Source::config_watch) and the debounce timer (Source::config_settle).
  void start(Poller& poller);
  // Source::config_watch is readable: drains it and arms the debounce timer.
  void on_watch();
  // Source::config_settle fired: re-points the watches (a symlink may now lead elsewhere).
  void on_settle();

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  struct Fingerprint {
    bool exists = false;
    std::string real;  // realpath
    std::uint64_t dev = 0;
    std::uint64_t ino = 0;
    std::int64_t mtime_ns = 0;
    std::int64_t size = 0;
    std::uint64_t hash = 0;  // FNV-1a of the content
    friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
  };

 private:
  Fingerprint fingerprint(std::string* content) const;
  void add_watches();

  std::string path_;
  const Logger& log_;
  Fingerprint seen_;     // the version last applied or rejected
  Fingerprint pending_;  // the fallback's previous look (a change must hold still)
  UniqueFd inotify_;
  UniqueFd settle_timer_;
  int watch_dir_ = -1;
  int watch_real_dir_ = -1;
  std::string watched_real_dir_;
  bool watch_failed_logged_ = false;
};

}  // namespace vlake::pool
