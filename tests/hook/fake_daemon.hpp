// FakeDaemon: a small vlaked for the hook tests. Serves protocol.hpp on a Unix SOCK_SEQPACKET
// socket from a thread of the test process, with handles created by vlake::Driver on the
// simulator. Messages are decoded with the daemon's codec (codec.hpp): a message vlaked would
// refuse as malformed closes the connection here too. It answers:
//   Hello -> HelloAck (one tenant, every device of the driver; Hello{old_session} of a known
//            session re-binds it)
//   GrantRequest -> rounds up to the granularity, checks the limit, creates the handle(s)
//            (alloc grants above `split_above` come as two handles, to exercise stitching),
//            exports them and replies with the descriptors
//   Release -> releases the daemon's handles and uncharges; UsageQuery -> usage/limit.
//   GuardEvent -> recorded (no reply), with the device it names (-1: unknown UUID).
//   ReserveReport -> recorded (no reply; not counted as a request for drop_on_request).
// HelloAck carries `guard_mode` from the options.
// A connection closed by the client (process exit) gives back its session's grants. Counters
// record what reached the daemon.
//
// Failure injection: `drop_on_request` closes the connection when the Nth request arrives
// (before handling it) without forgetting the session — a daemon restart as the hook sees it.
// With `vanish_on_drop` the daemon also stops listening then (it does not come back).
// `stall` leaves every request unanswered (a hung daemon). `grant_status` forces the status of
// every grant reply (e.g. out_of_memory).
//
// Thread-safety: counters()/set_limit() may be called from any thread while it serves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/common/uuid.hpp"
#include "vlake/contracts/protocol.hpp"

namespace hooktest {

struct FakeDaemonOptions {
  std::string socket_path;
  std::uint64_t limit = std::uint64_t{1} << 30;
  std::string tenant = "user:test";
  int drop_on_request = 0;                             // 0 = never
  bool vanish_on_drop = false;                         // the drop also closes the listening socket
  std::uint64_t split_above = std::uint64_t{4} << 20;  // alloc grants larger: two handles
  vlake::proto::Status grant_status = vlake::proto::Status::ok;
  bool stall = false;  // never answer requests (after Hello)
  vlake::proto::GuardMode guard_mode = vlake::proto::GuardMode::off;
  // A Hello with kHelloPassthrough (VLAKE_DISABLE=1) is answered Status::passthrough (no session)
  // as vlaked does for `allow_disable: true`; false: a normal HelloAck.
  bool allow_disable = false;
  // Pressure injection: answer every ReserveReport of a non-empty reserve with a Pressure
  // (bytes 0 = all), and/or send a Pressure just before the reply to the Nth alloc grant.
  bool pressure_on_report = false;
  int pressure_before_grant = 0;  // 0 = never
  bool overcommit = false;        // HelloAck says kAckOvercommit (docs/swap.md)
};

struct Counters {
  int reclaim_reports = 0;  // ReserveReports that said kReportReclaim
  int hellos = 0;
  int hellos_with_old_session = 0;
  int rebinds = 0;
  int grants_alloc = 0;
  int grants_create = 0;
  int grants_counted = 0;
  int refusals = 0;
  int releases = 0;
  int releases_exported = 0;
  int releases_unknown = 0;
  int usage_queries = 0;
  int contexts = 0;  // ContextRequest{admit} answered ok (every one is)
  int drops = 0;
  std::uint64_t last_grant_bytes = 0;
  std::uint64_t used = 0;       // device 0
  std::size_t outstanding = 0;  // grants not released
  std::set<int> hello_pids;
  std::vector<vlake::proto::GuardEvent> guard_events;
  std::vector<int> guard_event_devices;  // device of each event's UUID, -1 if unknown
  std::uint32_t hello_flags = 0;         // of the last Hello
  int reserve_reports = 0;
  std::uint64_t last_reserve_bytes = 0;
  std::uint64_t last_reserve_blocks = 0;
  int pressure_sent = 0;
};

class FakeDaemon {
 public:
  FakeDaemon(vlake::Driver& driver, FakeDaemonOptions options);
  ~FakeDaemon();
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  [[nodiscard]] Counters counters() const;
  void set_limit(std::uint64_t limit);
  [[nodiscard]] const std::string& socket_path() const { return options_.socket_path; }
  // Waits (up to `timeout`) until every client connection has been closed and handled, i.e.
  // the daemon has noticed that the tenant processes are gone. True if it has.
  bool wait_disconnected(std::chrono::milliseconds timeout) const;

 private:
  struct Grant {
    std::uint64_t session = 0;
    int device = 0;
    std::uint64_t bytes = 0;
    std::vector<vlake::PhysicalHandle> handles;
  };
  struct Session {
    int pid = 0;
  };

  void serve();
  void handle(int fd, std::span<const std::byte> datagram, std::size_t descriptors);
  void on_hello(int fd, const vlake::proto::Hello& m);
  void on_grant(int fd, const vlake::proto::GrantRequest& m);
  void on_release(int fd, const vlake::proto::Release& m);
  void on_usage(int fd, const vlake::proto::UsageQuery& m);
  void on_context(int fd, const vlake::proto::ContextRequest& m);
  void on_guard_event(const vlake::proto::GuardEvent& m);
  void on_reserve_report(int fd, const vlake::proto::ReserveReport& m);
  void send_pressure(int fd, const std::uint8_t* uuid);
  int device_of(const std::uint8_t* uuid) const;
  void release_grant_locked(std::map<std::uint64_t, Grant>::iterator it);
  void close_client(int fd, bool process_gone);

  vlake::Driver& driver_;
  FakeDaemonOptions options_;
  std::vector<vlake::Uuid> uuids_;
  std::vector<std::uint64_t> totals_;
  std::uint64_t granularity_ = 0;

  mutable std::mutex mu_;
  Counters counters_;
  std::vector<std::uint64_t> used_;
  std::map<std::uint64_t, Grant> grants_;
  std::map<std::uint64_t, Session> sessions_;
  std::map<int, std::uint64_t> clients_;  // fd -> session (0 before Hello)
  std::uint64_t next_session_ = 100;
  std::uint64_t next_grant_ = 1;
  int requests_ = 0;

  vlake::UniqueFd listen_;
  std::atomic<int> connections_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace hooktest
