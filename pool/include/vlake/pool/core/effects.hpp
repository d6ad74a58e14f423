// vlake::pool::Effects — what Node operations want done outside the Node, as one value.
//
// What it does
//   Node operations do not send, build, kill or run driver work themselves: they record here
//   the messages to send (parked grants' answers with their Pressure notes, Drops, SwapNotices,
//   SwapIn replies), the handles to build and to discard (HandleBuilder), the swap jobs
//   (Swapper) and the processes to kill (`enforce: kill`). The loop takes one Effects after
//   each event (Node::settle) and carries it out in one place, in the order of its members.
//   Changes is what the publisher writes to the state segment (Node::changes_to_publish): the
//   daemon publishes before every reply, so it is a separate stream, not part of an Effects.
// Ownership: DiscardOut owns its handle until the loop hands it to the builder or releases it.
// Thread-safety: none (plain values).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/pool/core/outcomes.hpp"
#include "vlake/pool/device_pool.hpp"
#include "vlake/pool/features/tier/host_tier.hpp"

namespace vlake::pool {

// A process to kill under `enforce: kill`: its tenant stayed over a limit for kill_grace while
// the process used GPU memory without a session. The loop kills (pid, start_time) only, and
// reports with Node::unhooked_killed().
struct KillOrder {
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  TenantId tenant;
  std::string tenant_name;
  Bytes bytes{0};  // its NVML figure, all GPUs
};

// A handle the warm reserve or stock wants built (the loop hands it to its HandleBuilder).
struct BuildOut {
  DeviceOrdinal device{0};
  Bytes size{0};
};

// A clean handle the warm stock no longer wants, out of the pool: the loop has it released
// (HandleBuilder::discard), off the event loop.
struct DiscardOut {
  DeviceOrdinal device{0};
  BuiltHandle handle;
};

// A Drop for one session (docs/hook.md, "Kept mappings"): the loop sends `msg` on `conn`.
struct DropOut {
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::Drop msg{};
};

// A SwapNotice for a session's connection.
struct SwapNoticeOut {
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::SwapNotice msg{};
};
// Driver work for the loop's swap thread: checkpoint (lock + checkpoint) or restore (restore +
// unlock) process `pid`; the result comes back through Node::swap_done().
struct SwapJob {
  std::uint64_t session = 0;
  std::uint32_t pid = 0;
  DeviceOrdinal device{0};  // where the memory it makes or needs room on is
  bool restore = false;
};
// A TierNotice for a session's connection (docs/swap.md, "Host tier").
struct TierNoticeOut {
  ConnId conn = 0;
  std::uint64_t session = 0;
  proto::TierNotice msg{};
};
// A SwapIn's answer, for the connection that asked.
struct SwapInOut {
  ConnId conn = 0;
  proto::SwapInReply reply{};
};

// Everything one event (or several, until the loop takes it) wants done outside the Node.
struct Effects {
  std::vector<Completion> completions;  // parked grants answered, or asking again (Pressure)
  std::vector<DropOut> drops;
  std::vector<BuildOut> builds;      // settings.background_builds: adopt()/build_failed() answer
  std::vector<DiscardOut> discards;  // surplus clean handles, released off the loop
  std::vector<SwapNoticeOut> swap_notices;
  std::vector<SwapJob> swap_jobs;  // swap_done() answers each
  std::vector<SwapInOut> swap_replies;
  std::vector<KillOrder> kills;  // unhooked_killed() answers each
  // The host tier (docs/swap.md): notices, pieces to make (host_built()/host_build_failed()
  // answer each) and pieces to release, both off the loop.
  std::vector<TierNoticeOut> tier_notices;
  std::vector<Bytes> host_builds;
  std::vector<HostPiece> host_releases;
  [[nodiscard]] bool empty() const noexcept {
    return completions.empty() && drops.empty() && builds.empty() && discards.empty() && swap_notices.empty() &&
           swap_jobs.empty() && swap_replies.empty() && kills.empty() && tier_notices.empty() && host_builds.empty() &&
           host_releases.empty();
  }
  // Appends `later`'s effects after these (each list keeps its order).
  void append(Effects&& later);
};

// What changed since the last take_changes(): what the publisher writes.
struct Changes {
  bool all = false;                    // everything (start-up, resume, reload, tick)
  std::set<std::uint32_t> tenants;     // tenant slots
  std::set<std::uint32_t> sessions;    // session slots (free slots are cleared)
  std::set<std::uint32_t> grants;      // grant slots (free slots are cleared)
  std::set<std::uint32_t> namespaces;  // namespace slots (free slots are cleared)
  bool devices = false;
  bool guard = false;     // the guard event log
  bool refusals = false;  // the refusal log
  [[nodiscard]] bool empty() const noexcept {
    return !all && !devices && !guard && !refusals && tenants.empty() && sessions.empty() && grants.empty() &&
           namespaces.empty();
  }
};
}  // namespace vlake::pool
