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
// Every file read is bounded (alloc::read_bounded: non-blocking, no symlink, regular files of
// at most 4 KiB), so a rescan cannot stall the loop; warnings about one allocation are rate
// limited (one a minute per allocation).
//
// Thread-safety: none (the event loop). Errors: start() throws std::runtime_error; rescan()
// never throws (problems with one allocation are logged and it is skipped).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "poller.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/pool/node.hpp"

namespace vlake::pool {

class AllocWatch {
 public:
  AllocWatch(std::string root, const Logger& log) : root_(std::move(root)), log_(log) {}

  // Creates the root, registers the watch and the rescan timer (every `interval`), scans once.
  void start(Poller& poller, Node& node, std::chrono::milliseconds interval);
  // Brings the sockets in line with the directories. Never throws.
  void rescan(Poller& poller, Node& node);
  // Source::alloc_watch is readable / Source::alloc_timer fired: drains it, rescans.
  void on_watch(Poller& poller, Node& node);
  void on_timer(Poller& poller, Node& node);
  // The listening socket and allocation id of Source::alloc_listen `serial` (-1 / "": gone).
  [[nodiscard]] std::pair<int, std::string> listener(std::uint64_t serial) const;

 private:
  struct Entry {
    std::string id;
    std::uint64_t serial = 0;  // Source::alloc_listen serial of its socket
    UniqueFd fd;               // listening socket <dir>/vlaked.sock
  };
  void close(Poller& poller, Entry& e);
  void add(Poller& poller, Node& node, const alloc::Allocation& info, const std::string& dir);
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
  LogLimiter limited_{log_, 1.0 / 60, 1};  // warn(): one line a minute per allocation
};

}  // namespace vlake::pool
