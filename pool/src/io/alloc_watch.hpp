// vlake::pool::AllocWatch — Kubernetes allocation directories under --alloc-root (internal to
// vlaked; format: contracts/allocation.hpp, docs/device-plugin.md).
//
// One listening socket per allocation directory (<dir>/vlaked.sock, Source::alloc_listen): a
// connection on it is that allocation's tenant. An allocation is served once the plugin's
// record <root>/records/<id>.allocation exists; its size and owner come from the records only,
// never from files in <dir> (mounted into the container). The root and the records are watched
// (inotify) and rescanned periodically. What it finds goes to the Node (allocation_added /
// allocation_owner / allocation_removed); the Node resolves the tenant through quota/. Sockets
// of removed allocations are closed; sessions opened through them keep their tenant until they
// end.
//
// Reading: after start-up every scan (listing the root, reading the records) runs on a worker
// thread (scan(), a plain function of the root); the loop picks its Scan up when
// Source::alloc_scan (an eventfd) is readable (on_scanned()) and only applies it (sockets,
// Node calls). One worker at a time: a request while one runs is remembered once and started
// after it. Every file read is bounded as well (alloc::read_bounded: non-blocking, no symlink,
// regular files of at most 4 KiB). Warnings about one allocation are rate limited (one a
// minute per allocation).
//
// Thread-safety: every method is for the event loop's thread; a worker shares only its result
// slot (a mutex) and the eventfd (a worker still running when the AllocWatch is destroyed
// finishes on its own). Errors: start() throws std::runtime_error; rescan() and on_scanned()
// never throw (problems with one allocation are logged and it is skipped).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "poller.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/pool/node.hpp"

namespace vlake::pool {

class AllocWatch {
 public:
  AllocWatch(std::string root, const Logger& log);
  ~AllocWatch();
  AllocWatch(const AllocWatch&) = delete;
  AllocWatch& operator=(const AllocWatch&) = delete;

  // What one scan found: per allocation directory (valid id), its records or why they could
  // not be read.
  struct Found {
    std::optional<alloc::Allocation> allocation;  // nullopt: no record (yet)
    std::optional<alloc::Owner> owner;
    std::string error;  // a record is unreadable or invalid
  };
  struct Scan {
    std::string root_error;  // the root could not be listed
    std::map<std::string, Found> found;
  };
  // Lists `root` and reads the records of each allocation directory. No side effects, no
  // logging; throws only std::bad_alloc. Any thread.
  [[nodiscard]] static Scan scan(const std::string& root);

  // Creates the root and records directory, registers the watch, the rescan timer (every
  // `interval`) and the worker's eventfd, scans once on the calling thread.
  void start(Poller& poller, Node& node, std::chrono::milliseconds interval);
  // Scans on the calling thread and applies it. Never throws.
  void rescan(Poller& poller, Node& node);
  // Source::alloc_watch is readable / Source::alloc_timer fired: drains it, asks the worker.
  void on_watch();
  void on_timer();
  // Source::alloc_scan is readable: applies the worker's Scan.
  void on_scanned(Poller& poller, Node& node);
  // The listening socket and allocation id of Source::alloc_listen `serial` (-1 / "": gone).
  [[nodiscard]] std::pair<int, std::string> listener(std::uint64_t serial) const;

 private:
  struct Entry {
    std::string id;
    std::uint64_t serial = 0;  // Source::alloc_listen serial of its socket
    UniqueFd fd;               // listening socket <dir>/vlaked.sock
  };
  struct Shared;
  void close(Poller& poller, Entry& e);
  void request();
  void apply(Poller& poller, Node& node, const Scan& s);
  void add(Poller& poller, Node& node, const alloc::Allocation& info, const std::optional<alloc::Owner>& owner,
           const std::string& dir);
  void warn(const std::string& id, const std::string& msg);

  std::string root_;
  const Logger& log_;
  std::map<std::string, Entry> entries_;                       // by allocation id
  std::unordered_map<std::uint64_t, std::string> serials_;     // socket serial -> id
  std::map<std::string, std::optional<alloc::Owner>> owners_;  // last owner read, by id
  std::uint64_t next_serial_ = 1;
  UniqueFd inotify_;
  UniqueFd timer_;
  bool root_warned_ = false;
  std::shared_ptr<Shared> shared_;
  bool busy_ = false;                      // a worker is scanning
  bool queued_ = false;                    // another scan was asked for meanwhile
  LogLimiter limited_{log_, 1.0 / 60, 1};  // warn(): one line a minute per allocation
};

}  // namespace vlake::pool
