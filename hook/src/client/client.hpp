// DaemonClient: the hook's connection to vlaked (protocol: vlake/contracts/protocol.hpp; every
// message is built, sent and checked with vlake/contracts/codec.hpp).
//
// Contract
// - One SOCK_SEQPACKET connection per process, opened lazily by the first request (Hello ->
//   HelloAck). Requests are serialized by a process-local mutex (the protocol allows one
//   request in flight per connection). Every socket operation has a timeout (VLAKE_TIMEOUT,
//   SO_RCVTIMEO/SO_SNDTIMEO): no call blocks longer than a few timeouts.
// - A connection that breaks (EOF, reset, EPIPE) is reopened with Hello{old_session}, retrying
//   for up to VLAKE_RECONNECT_TIMEOUT, and the request is sent again. A fresh connection that
//   cannot be opened is not retried within the same call, and later calls try again at most
//   once per second (so a missing daemon costs a failed connect(), not a wait, per call).
// - grant()/usage() return nullopt when the daemon is unreachable (last_error() says why);
//   the caller applies the VLAKE_ON_UNREACHABLE policy. A daemon that answered the Hello with
//   Error(limit_reached) (a cap or a full table: docs/daemon.md, "Limits") is reachable but
//   refuses this process: refused() is then true and last_error() is the daemon's text; the
//   caller refuses (no passthrough). A timeout or a malformed reply closes
//   the connection and counts as unreachable for that call.
// - release() that cannot reach the daemon is queued and sent after the next successful
//   (re)connection. While another thread holds the connection (a parked grant may hold it for
//   minutes) the Release goes out beside that request (as SwapReady) and its ack is not waited
//   for: it returns ok once sent. Answers to requests sent beside another carry kSideRequest in
//   their request_id; every reader keeps the TierPlans among them and drops the rest.
// - guard_mode()/granularity() are those of the last HelloAck (off / 0 before any connection).
// - send_guard_event() sends one GuardEvent (no reply expected), connecting first if needed
//   (ignoring the reconnect hold-off: it is sent once per process, just before an error
//   reaches the application). False (last_error() says why) if it could not be sent.
// - Fork: prepare_fork()/parent_after_fork() hold the mutex across fork(); child_after_fork()
//   forgets the inherited connection and session without telling the daemon (the parent still
//   owns them).
// - Pressure (docs/pool.md): with `pressure` (the hook always sets it), Hello says kHelloPressure
//   and the daemon may send unsolicited Pressure messages. Any that arrive while a reply is
//   awaited are kept (the reply is still read); poll_pressure() reads those waiting on an idle
//   connection without blocking (it gives up at once if another thread holds the connection)
//   and take_pressure() hands over everything kept so far.
// - send_reserve_report() sends one ReserveReport if a connection is open (never connects).
// - changes() counts the requests that may change this process's usage (every request but
//   UsageQuery, queued releases included), counted when they are sent, whatever the outcome:
//   a usage answer obtained after reading changes() == n is current as long as it stays n.
// - ask_passthrough() (VLAKE_DISABLE=1, docs/hook.md): opens the connection with a Hello that
//   says kHelloPassthrough. allowed: the daemon answered Status::passthrough (no session; the
//   connection is closed); refused: a normal HelloAck (the quota file does not allow it: the
//   session is open and the hook stays on); unreachable: no daemon answered. Later reconnections
//   never set the flag.
// - Thread-safety: every public method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/common/uuid.hpp"
#include "vlake/contracts/protocol.hpp"

namespace vlake::proto {
class Decoded;  // vlake/contracts/codec.hpp
}  // namespace vlake::proto

namespace vlake::hook {

struct GrantResult {
  proto::Status status = proto::Status::internal;
  std::uint64_t grant_id = 0;
  std::uint64_t bytes = 0;
  std::uint64_t limit = 0;
  std::uint64_t used = 0;
  std::vector<proto::HandleDesc> handles;
  std::vector<UniqueFd> fds;
};

struct PressureNote {
  Uuid device{};
  std::uint64_t bytes = 0;  // 0: all of it
};

struct UsageResult {
  proto::Status status = proto::Status::internal;
  std::uint64_t total = 0;
  std::uint64_t limit = 0;
  std::uint64_t used = 0;
};

class DaemonClient {
 public:
  // `pressure`: say kHelloPressure in Hello (the process answers Pressure: reserve, reclaim).
  DaemonClient(const Config& config, bool pressure);
  DaemonClient(const DaemonClient&) = delete;
  DaemonClient& operator=(const DaemonClient&) = delete;

  // `flags`: GrantRequest::flags (kGrantNoWait).
  [[nodiscard]] std::optional<GrantResult> grant(const Uuid& device, std::uint64_t bytes, proto::GrantPurpose purpose,
                                                 std::uint32_t flags = 0);
  // Status of the release, or nullopt when it was queued (daemon unreachable).
  std::optional<proto::Status> release(std::uint64_t grant_id, std::uint32_t flags);
  [[nodiscard]] std::optional<UsageResult> usage(const Uuid& device);
  // CUDA contexts (docs/hook.md, "Contexts"): one ContextRequest -> ContextReply. nullopt when
  // the daemon is unreachable or answered an Error (refused() then says whether it refuses this
  // process for a limit).
  [[nodiscard]] std::optional<proto::ContextReply> context(const Uuid& device, proto::ContextOp op);
  // Dedup (docs/dedup.md, share.cpp): one ShareRequest -> ShareReply (descriptors in `fds`), one
  // ShareCommit -> ShareAck. nullopt when the daemon is unreachable or answered an Error.
  [[nodiscard]] std::optional<proto::ShareReply> share(const proto::ShareRequest& request, std::vector<UniqueFd>& fds);
  [[nodiscard]] std::optional<proto::ShareAck> share_commit(const proto::ShareCommit& request);

  // CUDA IPC (docs/ipc.md, ipc.cpp): IpcExport -> IpcExportReply, IpcOpen -> IpcOpenReply
  // (descriptors in `fds`), IpcClose -> IpcCloseAck. nullopt when the daemon is unreachable or
  // answered an Error.
  [[nodiscard]] std::optional<proto::IpcExportReply> ipc_export(std::uint64_t grant_id);
  [[nodiscard]] std::optional<proto::IpcOpenReply> ipc_open(std::uint64_t token, std::uint64_t secret,
                                                            std::vector<UniqueFd>& fds);
  std::optional<proto::IpcCloseAck> ipc_close(std::uint64_t import_id);

  enum class Passthrough { allowed, refused, unreachable };
  [[nodiscard]] Passthrough ask_passthrough();

  bool send_guard_event(proto::GuardEvent event);
  bool send_readonly_write(proto::ReadOnlyWrite m);  // as send_guard_event (no reply)
  // `reclaim`: a reclaim callback is registered (ReserveReport::flags kReportReclaim).
  // `active`: a hooked CUDA call since the last such report (kReportActive, docs/swap.md).
  bool send_reserve_report(const Uuid& device, std::uint64_t bytes, std::uint64_t blocks, bool reclaim,
                           bool active = false);
  void poll_pressure();
  [[nodiscard]] std::vector<PressureNote> take_pressure();
  // Swapping (docs/swap.md): SwapNotices are kept like Pressure (take_swap_notices());
  // send_swap_ready() answers one; swap_in() asks vlaked to restore this process and waits for
  // the answer (up to the session's wait: minutes). nullopt: vlaked unreachable.
  [[nodiscard]] std::vector<proto::SwapNotice> take_swap_notices();
  bool send_swap_ready(std::uint64_t swap_id);
  [[nodiscard]] std::optional<proto::SwapInReply> swap_in();
  // The host tier (docs/swap.md, "Host tier"): TierNotices are kept like SwapNotices
  // (take_tier_notices()); tier_step() sends one TierStep and returns its TierPlan (descriptors
  // in `fds`). It never connects. With the connection free it is one exchange; when another
  // thread holds it (maybe for minutes: a parked grant), the step goes out beside that request
  // (as SwapReady) and its TierPlan is taken from whichever thread reads the connection (every
  // reader keeps TierPlans that are not its own reply), or read here once the connection is
  // free. nullopt when there is no connection, no answer within the longer of `wait` and
  // VLAKE_TIMEOUT, or vlaked answered something else.
  [[nodiscard]] std::vector<proto::TierNotice> take_tier_notices();
  [[nodiscard]] std::optional<proto::TierPlan> tier_step(const proto::TierStep& step, std::vector<UniqueFd>& fds,
                                                         std::chrono::milliseconds wait);
  // Kept mappings (docs/hook.md): Drop messages are kept like Pressure (read while a reply is
  // awaited or by poll_pressure()); take_drops() hands over their keys. send_dropped() sends
  // Dropped messages (kMaxDropKeys keys each) if a connection is open (never connects: a new
  // connection drops everything anyway). generation() changes with every new connection.
  [[nodiscard]] std::vector<std::uint64_t> take_drops();
  bool send_dropped(std::span<const std::uint64_t> keys);
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }
  [[nodiscard]] bool connected() const;
  [[nodiscard]] std::uint64_t changes() const noexcept { return changes_.load(std::memory_order_acquire); }

  [[nodiscard]] proto::GuardMode guard_mode() const;
  // Whether the tenant's namespace has `overcommit: true` (HelloAck kAckOvercommit; docs/swap.md):
  // device allocations are then the process's own, charged with counted grants. Connects first
  // when no Hello was answered yet (false if the daemon cannot be reached); afterwards one
  // atomic load: the answer of the last Hello.
  [[nodiscard]] bool overcommit();
  // A Hello was answered (this process has a session), without connecting.
  [[nodiscard]] bool answered() const noexcept { return answered_.load(std::memory_order_acquire); }
  // The last Hello's answer without connecting (false before any).
  [[nodiscard]] bool overcommit_known() const noexcept {
    return answered_.load(std::memory_order_acquire) && overcommit_.load(std::memory_order_acquire);
  }
  [[nodiscard]] std::uint64_t granularity() const;
  [[nodiscard]] std::string tenant_name() const;
  [[nodiscard]] std::string last_error() const;
  // The last failure was the daemon refusing the Hello for a limit (not unreachability).
  [[nodiscard]] bool refused() const;
  [[nodiscard]] const std::string& socket_path() const noexcept { return path_; }

  void prepare_fork() noexcept;
  void parent_after_fork() noexcept;
  void child_after_fork() noexcept;

 private:
  enum class Io { ok, broken, failed };

  // One request, its reply of type Rep (a malformed reply, an Error or another type fails).
  template <class Req, class Rep>
  std::optional<Rep> exchange_locked(Req request, std::vector<UniqueFd>* fds);
  template <class Req, class Rep>
  Io roundtrip_locked(Req& request, Rep& reply, std::vector<UniqueFd>* fds);
  // One message without a reply, connecting first if needed; one retry on a broken connection.
  template <class Msg>
  bool send_oneway(Msg m);
  bool connect_locked();
  void flush_pending_locked();
  void keep_pressure_locked(const proto::Pressure& p);

  const std::string path_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds reconnect_timeout_;
  const bool pressure_;
  const std::optional<std::chrono::milliseconds> wait_;  // VLAKE_WAIT, sent in Hello

  mutable std::mutex mu_;
  UniqueFd fd_;
  std::uint64_t session_ = 0;
  std::uint64_t next_request_ = 1;
  std::string tenant_name_;
  bool ask_passthrough_ = false;  // the next Hello says kHelloPassthrough
  bool passthrough_ = false;      // the daemon answered Status::passthrough
  proto::GuardMode guard_mode_ = proto::GuardMode::off;
  // A duplicate of the connection's descriptor, for SwapReady: sent by the worker while another
  // thread may hold mu_ for minutes (a parked grant, a SwapIn). Replaced at every connection.
  std::mutex side_mu_;
  UniqueFd side_fd_;                     // guarded by side_mu_
  std::atomic<bool> answered_{false};    // a Hello was answered (overcommit_ is that answer's)
  std::atomic<bool> overcommit_{false};  // HelloAck kAckOvercommit
  std::uint64_t granularity_ = 0;
  std::string last_error_;
  bool refused_ = false;               // the last connect failed on Error(limit_reached)
  proto::Status last_error_status_{};  // status of the last Error reply (ok: none)
  std::chrono::steady_clock::time_point retry_after_{};
  std::vector<std::pair<std::uint64_t, std::uint32_t>> pending_releases_;
  std::atomic<std::uint64_t> changes_{0};
  std::mutex pressure_mu_;  // after mu_ when both are held
  std::vector<PressureNote> pressure_notes_;
  std::vector<std::uint64_t> drop_keys_;         // guarded by pressure_mu_
  std::vector<proto::SwapNotice> swap_notices_;  // guarded by pressure_mu_
  std::vector<proto::TierNotice> tier_notices_;  // guarded by pressure_mu_
  // TierPlans answering steps sent beside another request (tier_step()), read by whoever read
  // the connection; plan_cv_ wakes tier_step(). Request ids of such steps have kSideRequest set.
  struct KeptPlan {
    proto::TierPlan plan{};
    std::vector<UniqueFd> fds;
  };
  static constexpr std::uint64_t kSideRequest = 1ULL << 63;
  std::vector<KeptPlan> tier_plans_;  // guarded by pressure_mu_
  std::condition_variable plan_cv_;
  std::atomic<std::uint64_t> side_requests_{0};
  void keep_plan(const proto::TierPlan& p, std::vector<UniqueFd> fds);
  // A message nobody asked for on this read (a Drop, notice or Pressure), or the answer to a
  // request sent beside another: kept (its descriptors taken from `fds`) or dropped; true. False:
  // a reply (or anything else) for the reader to handle. mu_ held.
  bool keep_unsolicited_locked(const proto::Decoded& d, std::vector<UniqueFd>& fds);
  std::uint64_t next_side_id() noexcept;  // a request id with kSideRequest set
  // Sends one message on side_fd_ (beside a request another thread may have in flight).
  bool send_beside(std::span<const std::byte> bytes);
  std::optional<proto::TierPlan> take_plan(std::uint64_t request_id, std::vector<UniqueFd>& fds);
  // One message read from the connection within `wait` (mu_ held): unsolicited ones kept, a
  // TierPlan kept (keep_plan). False when nothing came or the connection broke (then reset).
  bool read_one_locked(std::chrono::milliseconds wait);
  std::atomic<std::uint64_t> generation_{0};
  void keep_drop_locked(const proto::Drop& d);
  void keep_swap_locked(const proto::SwapNotice& n);
  void keep_tier_locked(const proto::TierNotice& n);
};

}  // namespace vlake::hook
