// vlake::pool::Daemon — the node pool daemon (vlaked): owns the GPUs' memory, grants it to
// tenant processes over a Unix SOCK_SEQPACKET socket (protocol.hpp) within their quotas, and
// keeps node state in a shared-memory segment that survives its own restart.
//
// Lifecycle
// - The constructor does all start-up: takes the single-instance lock (<socket>.lock), loads
//   the quota file, opens the CUDA driver and (optionally) NVML, maps or creates the state
//   segment (resuming a previous daemon's sessions and grants), warms each GPU, starts the
//   Prometheus exporter (--metrics-address; vlake::exporter, civetweb threads that only read
//   the segment), binds the socket. Any failure throws StartupError with a one-line message
//   (an explicit --metrics-address that cannot be listened on included; the default address
//   in use only warns).
// - While running it hot-reloads the quota file (inotify on its directory, a periodic check,
//   SIGHUP): a valid file is applied to every live tenant, an invalid one is logged, counted in
//   the state segment and ignored (docs/quota.md).
// - run() serves until SIGTERM/SIGINT (signalfd), then shuts down gracefully (closes
//   connections, releases free pool handles, keeps the segment only while grants are held)
//   and returns the exit code (0).
// - vlaked_main() is the whole program: options, logger, Daemon, exit code.
//
// Thread-safety: single-threaded; construct and run on one thread. Signals SIGTERM, SIGINT and
// SIGHUP are blocked in the calling thread by the constructor (and SIGPIPE ignored).
#pragma once

#include <memory>
#include <stdexcept>

#include "vlake/common/log.hpp"
#include "vlake/pool/options.hpp"

namespace vlake::pool {

class StartupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Daemon {
 public:
  Daemon(const DaemonOptions& options, Logger& log);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The vlaked program. Returns the process exit code: 0 (stopped by a signal, or --help),
// 1 (start-up failed), 2 (bad command line).
int vlaked_main(int argc, const char* const* argv) noexcept;

}  // namespace vlake::pool
