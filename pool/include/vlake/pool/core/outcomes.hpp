// vlake::pool outcomes of Node operations: what the loop observed (Now, Peer, AllocationInfo)
// and what an operation answers (Malformed, Fatal, HelloOut, GrantOut, ShareOut, Completion).
//
// Plain values. Descriptors in Granted and ShareOut are borrowed from the Node's pools: valid
// until the next call on the Node.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/allocation.hpp"
#include "vlake/contracts/protocol.hpp"

namespace vlake::pool {

// The time an operation runs at (the loop reads its clocks once per event).
struct Now {
  std::chrono::steady_clock::time_point steady{};
  std::uint64_t unix_ns = 0;  // CLOCK_REALTIME, for records operators read
};

// The loop's name for a connection (never reused while the daemon runs); 0: none.
using ConnId = std::uint64_t;

// Who is on a connection, as the loop observed it.
struct Peer {
  ConnId conn = 0;
  std::uint32_t pid = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint64_t start_time = 0;  // /proc/<pid>/stat start time; 0: the process is gone
  std::string alloc_id;          // the Kubernetes allocation socket it came through; "": host socket
};

// ---- outcomes ------------------------------------------------------------------------------

// The message broke a rule that needs the node's state to see; the loop drops the connection.
struct Malformed {
  std::string reason;
};
// The request cannot be served and the connection ends: an Error(status, text), then close.
struct Fatal {
  proto::Status status = proto::Status::internal;
  std::string text;
};

struct HelloOut {
  std::variant<proto::HelloAck, Malformed, Fatal> answer;
  std::uint64_t session = 0;  // the session now bound to the connection
  bool opened = false;        // a new session (the loop starts watching its process)
  ConnId close = 0;           // the session's previous connection, to close
};

// A Pressure message for a session's connection.
struct PressureNote {
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::Pressure msg{};
};

// `reply` answered with `status`.
template <class Reply>
Reply with_status(Reply reply, proto::Status status) {
  reply.status = status;
  return reply;
}

struct Granted {
  proto::GrantReply reply{};
  std::vector<int> fds;  // borrowed, one per handle, in reply order
  std::uint64_t grant = 0;
};
struct Refused {
  proto::GrantReply reply{};  // status says why (over_limit, namespace_over_limit, guarantee,
                              // out_of_memory, unknown_device, internal, limit_reached: the
                              // tenant's grant cap or the grant table, used/limit = grants/cap)
};
struct Parked {
  std::vector<PressureNote> pressure;  // to send now (empty when a retried grant stays parked)
};
using GrantOut = std::variant<Granted, Refused, Parked, Malformed>;

// A parked grant's answer, for the connection that asked.
struct Completion {
  ConnId conn = 0;
  std::chrono::steady_clock::time_point received{};
  GrantOut out;
};

struct ShareOut {
  proto::ShareReply reply{};
  std::vector<int> fds;  // borrowed
};

// A TierStep's answer (docs/swap.md, "Host tier"): the next grant to move, with its pieces'
// descriptors (borrowed from the host tier or the pool).
struct TierOut {
  proto::TierPlan reply{};
  std::vector<int> fds;  // borrowed
};

// A Kubernetes allocation (docs/device-plugin.md) as the loop read it from its directory.
struct AllocationInfo {
  std::string id;
  DeviceOrdinal device{0};
  Bytes bytes{0};
  std::optional<alloc::Owner> owner;
};
}  // namespace vlake::pool
