// vlake::scheduler::Plugin — the Kubernetes device plugin for vlake.io/gpu-memory
// (docs/device-plugin.md): a gRPC DevicePlugin server on <kubelet-dir>/<endpoint>, registered
// with the kubelet; per-container allocation directories for vlaked; attribution of
// allocations to pods through the kubelet's PodResources API, and their clean-up.
//
// Lifecycle: the constructor enumerates the GPUs (throws StartupError when that fails or
// there is none). run() serves until stop(): it starts the gRPC server, registers (retrying
// every second while the kubelet is not there), and then, on one thread, watches the kubelet
// directory (inotify: kubelet.sock recreated or our socket removed -> restart the server and
// register again), runs the health check every --health-interval (ListAndWatch streams send
// the list again when a GPU's health changes) and the attribution pass every
// --attribution-interval and right after each Allocate. On stop() it shuts the server down,
// removes its socket and returns.
//
// Thread-safety: stop(), registrations() and device_ids() may be called from any thread while
// run() runs; gRPC handlers run on gRPC's threads and share state under one mutex. Construct,
// run and destroy on one thread.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "vlake/common/log.hpp"
#include "vlake/scheduler/inventory.hpp"
#include "vlake/scheduler/options.hpp"

namespace vlake::scheduler {

class StartupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Plugin {
 public:
  Plugin(const PluginOptions& options, std::unique_ptr<Inventory> inventory, Logger& log);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  void run();
  void stop() noexcept;

  // Successful Register calls so far (1 after start-up, +1 per re-registration).
  [[nodiscard]] int registrations() const noexcept;
  // Every device id offered, GPU by GPU in index order.
  [[nodiscard]] std::vector<std::string> device_ids() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The vlake-device-plugin program: 0 after SIGTERM/SIGINT or --help, 1 when start-up fails,
// 2 for a bad command line.
int plugin_main(int argc, const char* const* argv) noexcept;

}  // namespace vlake::scheduler
