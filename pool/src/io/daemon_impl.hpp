// vlake::pool::Daemon::Impl — vlaked's state and the loop's handlers (internal). It owns
// everything the daemon holds: the driver, the Node (every decision, node.hpp), the state
// segment and its publisher, the worker threads (HandleBuilder, Swapper), the watchers, the
// epoll set and the connections. The handlers only decode, call the Node and encode.
//
// Its member functions live in one file per concern, all in this folder:
//   daemon.cpp           construction (the start-up steps in order), the loop (poll,
//                        dispatch), messages in (decode, call the Node), what the Node wants
//                        done after each event, replies out, shutdown
//   daemon_startup.cpp   the start-up steps: signals, the lock, the quota file, the state
//                        segment (resuming sessions), the socket, the loop's sources
//   connections.cpp      accepting connections (SO_PEERCRED, caps, out of descriptors), the
//                        Hello deadline, closing a connection
// Helpers without daemon state: loop_timers.hpp (clock, timerfd, eventfd),
// process_control.hpp (pidfds, kill, groups), gpu_reading.hpp (who a reading is about).
//
// Thread-safety: the loop thread only; worker threads reach it through eventfds (builds_fd_,
// swaps_fd_). Errors: start-up throws StartupError; a handler's exception is logged by the loop
// and the loop goes on.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "alloc_watch.hpp"
#include "config_watch.hpp"
#include "loop_timers.hpp"
#include "poller.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/contracts/codec.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/exporter/server.hpp"
#include "vlake/pool/conn_limits.hpp"
#include "vlake/pool/daemon.hpp"
#include "vlake/pool/handle_builder.hpp"
#include "vlake/pool/host_builder.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/nvml_source.hpp"
#include "vlake/pool/outbox.hpp"
#include "vlake/pool/publisher.hpp"
#include "vlake/pool/swapper.hpp"

namespace vlake::pool {

class Daemon::Impl {
 public:
  Impl(const DaemonOptions& o, Logger& log);
  ~Impl();
  int run();

 private:
  struct Connection {
    UniqueFd fd;
    std::uint32_t pid = 0;
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    std::uint64_t session = 0;
    std::string alloc_id;  // accepted on that allocation's socket: its identity
    // When the process said Hello: its first counted grant needs an NVML reading taken after
    // this (its context exists by then), whatever kCountedResampleInterval says.
    std::chrono::steady_clock::time_point hello_at{};
    Outbox outbox{};  // replies its socket did not take yet (outbox.hpp)
  };

  // start-up steps (daemon_startup.cpp), in the order the constructor (daemon.cpp) takes them
  static void block_signals();
  // Raises the descriptor limit's soft value to the hard one (every connection is a descriptor);
  // returns the soft limit in force.
  static rlim_t raise_nofile();
  void take_lock();
  quota::QuotaConfig load_config(bool& from_file);
  void open_state();
  void bind_socket();
  void add_sources();

  // connections (connections.cpp)
  void on_accept(int listen_fd, const std::string& alloc_id, Source src, std::uint64_t src_serial);
  bool accept_without_descriptors(int listen_fd, int err, Source src, std::uint64_t src_serial);
  void resume_accepting();
  void on_hello_timer();
  void arm_hello_timer();
  void close_connection(ConnId serial);
  // The descriptor kept in reserve for accepting when out of descriptors (/dev/null).
  static UniqueFd open_reserve_fd();

  // loop (daemon.cpp)
  void sample_gpus(const Now& t);
  void on_signal();
  void on_timer();
  void on_readable(ConnId serial);
  void on_writable(ConnId serial);
  void on_message(ConnId serial, Connection& c, const proto::AnyMessage& msg);
  void on_process_exit(std::uint64_t session);
  void reload(const std::string& why, bool force);
  void apply_config(ConfigWatch::Outcome o);
  // What the Node wants done after an event (effects.hpp), carried out in one place.
  void apply(Effects&& fx);
  void on_swaps();
  void on_builds();
  void arm_park_timer();
  void shutdown();

  // replies (daemon.cpp)
  template <class T>
  bool send(ConnId serial, const T& msg, std::span<const int> fds = {}, std::uint64_t grant = 0);
  bool send_bytes(ConnId serial, std::span<const std::byte> bytes, std::span<const int> fds, std::uint64_t grant);
  void deliver(ConnId serial, GrantOut out, std::chrono::steady_clock::time_point received);
  void malformed(ConnId serial, const std::string& reason);
  void fail(ConnId serial, std::uint64_t request_id, proto::Status s, const std::string& text);

  const DaemonOptions opts_;
  Logger& log_;
  UniqueFd lock_fd_;
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<Node> node_;
  // Warm reserve and stock builds off the loop (handle_builder.hpp); its workers write builds_fd_.
  UniqueFd builds_fd_;
  std::unique_ptr<HandleBuilder> builder_;
  // Process checkpoints off the loop (swapper.hpp, docs/swap.md); its thread writes swaps_fd_.
  UniqueFd swaps_fd_;
  std::unique_ptr<Swapper> swapper_;
  // The host tier's pinned memory, made and released off the loop (host_builder.hpp); its
  // thread writes host_fd_.
  UniqueFd host_fd_;
  std::unique_ptr<HostBuilder> host_builder_;
  void on_host_builds();
  std::unique_ptr<NvmlSource> nvml_;
  std::vector<std::string> device_files_;  // driver_->device_files(), for the GPU-user scan
  bool nvml_failed_logged_ = false;
  // When sample_gpus() last ran; a counted grant resamples when it is older than this.
  std::chrono::steady_clock::time_point last_sample_{};
  static constexpr std::chrono::milliseconds kCountedResampleInterval{100};
  std::unique_ptr<st::StateSegment> seg_;
  std::unique_ptr<StatePublisher> publisher_;
  std::unique_ptr<exporter::MetricsServer> metrics_;  // its own threads; reads the segment
  ConfigWatch config_watch_;
  bool config_missing_logged_ = false;
  std::optional<AllocWatch> alloc_watch_;

  Poller poller_;
  std::unordered_map<ConnId, Connection> conns_;
  std::unordered_map<std::uint64_t, UniqueFd> pidfds_;  // by session
  ConnId next_conn_ = 1;
  UniqueFd listen_fd_;
  UniqueFd signal_fd_;
  UniqueFd timer_fd_;
  DeadlineTimer park_timer_;
  DeadlineTimer hello_timer_;
  ConnLimits conn_limits_;
  UniqueFd reserve_fd_;  // closed to accept-and-close a connection when out of descriptors
  struct Paused {
    int fd;
    Source src;
    std::uint64_t serial;
  };
  std::vector<Paused> paused_;  // listeners not polled until the next tick (out of descriptors)
  bool stop_ = false;
  bool socket_bound_ = false;
};

}  // namespace vlake::pool
