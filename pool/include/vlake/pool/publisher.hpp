// vlake::pool::StatePublisher — writes a Node's state into the state segment (state.hpp).
//
// publish() runs after each event the daemon handled: it takes what the Node changed
// (Node::take_changes) and writes exactly those records, plus the header, counters, config
// record and guard log, inside one seqlock Write bracket (readers see all of an event or none
// of it, and never wait for a handle creation, a scrub or a send). Records of freed slots are
// zeroed. publish_all() rewrites every record (start-up, resume).
//
// Ownership: borrows the segment (it must outlive the publisher). Thread-safety: none; the
// daemon's event loop calls it. Never throws.
#pragma once

#include <cstdint>

#include "vlake/contracts/state.hpp"
#include "vlake/pool/node.hpp"

namespace vlake::pool {

class StatePublisher {
 public:
  // `daemon_pid`/`daemon_start_time`: written into the header (who writes the segment).
  StatePublisher(st::StateSegment& seg, std::uint32_t daemon_pid, std::uint64_t daemon_start_time,
                 std::uint32_t sample_interval_ms) noexcept;

  // Writes what changed since the last publish. `now_unix_ns` != 0 also refreshes
  // header.updated_unix_ns (the periodic sample).
  void publish(Node& node, std::uint64_t now_unix_ns = 0) noexcept;
  // Rewrites everything (every slot of every table).
  void publish_all(Node& node, std::uint64_t now_unix_ns) noexcept;
  // After a graceful shutdown: header.clean = 1.
  void mark_clean(std::uint64_t now_unix_ns) noexcept;

 private:
  void write(Node& node, const Changes& c, std::uint64_t now_unix_ns) noexcept;
  static void tenant(const Node& node, const Node::Tenant& t, st::State& s) noexcept;
  static void namespace_record(const Node& node, const Node::Namespace& n, st::State& s) noexcept;
  static void devices(const Node& node, st::State& s) noexcept;
  // A session's activity, swap state and wait (layout 9).
  static void session_activity(const Node& node, const Node::Session& sess, st::SessionRecord& r) noexcept;

  st::StateSegment& seg_;
  std::uint32_t daemon_pid_;
  std::uint64_t daemon_start_time_;
  std::uint32_t sample_interval_ms_;
};

}  // namespace vlake::pool
