// vlake::pool::HandleBuilder — builds pool handles off the event loop (docs/pool.md, "Warm
// reserve and warm stock").
//
// build_handle(): one pool handle as DevicePool keeps it: cuMemCreate of `size` (POSIX-fd
// type), the one export, a VA reservation mapped read-write in this process and, with `zero`,
// filled with zeros (in 8 MiB pieces) and synchronized (a clean handle). Each call's duration is
// measured for the pool's cost model. Throws DriverError; what it made before a failure is
// released.
//
// HandleBuilder: one worker thread per GPU, each with its own queue of sizes to build. A job
// runs build_handle(zero = true) unless the GPU has less than `size + headroom` (that GPU's)
// free (then it ends as no_room, nothing built): the warm stock never takes the last memory a
// grant or a process outside vlake may need. Finished jobs wait in take() for the caller, who adopts the
// handles (DevicePool::adopt) or releases them (release_built).
//
// Contract
// - submit() and take() may be called from any thread (one mutex per GPU, held only to move
//   jobs and results); `on_ready` is called from a worker thread after each finished job and
//   must be cheap and thread-safe (vlaked writes an eventfd).
// - The destructor stops the workers after their current job and releases every handle built
//   and not taken. The Driver must outlive the builder.
// - Errors: a failing build ends as a Done with `error` set (the worker carries on).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/common/unique_fd.hpp"

namespace vlake::pool {

struct BuiltHandle {
  PhysicalHandle handle{};
  UniqueFd fd;
  DevicePtr va{};
  Bytes size{0};
  bool zeroed = false;
  // Measured durations (ns), folded into the pool's cost model on adoption (0: not measured).
  double create_ns = 0;
  double export_ns = 0;
  double map_ns = 0;
  double set_access_ns = 0;
  double scrub_ns = 0;
};

[[nodiscard]] BuiltHandle build_handle(Driver& driver, DeviceOrdinal device, Bytes size, Bytes granularity, bool zero);
// Unmaps and releases a built handle (its descriptor closes with it); never throws.
void release_built(Driver& driver, BuiltHandle& h) noexcept;

class HandleBuilder {
 public:
  struct Done {
    DeviceOrdinal device{0};
    Bytes size{0};
    std::optional<BuiltHandle> handle;  // set: built
    bool no_room = false;               // the GPU had less than size + headroom free
    std::string error;                  // set: the build failed (DriverError's text)
  };

  struct Gpu {
    DeviceOrdinal device{0};
    Bytes granularity{0};
    Bytes headroom{0};  // free memory a build must leave
  };
  HandleBuilder(Driver& driver, const std::vector<Gpu>& gpus, std::function<void()> on_ready);
  ~HandleBuilder();
  HandleBuilder(const HandleBuilder&) = delete;
  HandleBuilder& operator=(const HandleBuilder&) = delete;

  // Queues one handle of `size` on `device` (ignored for a GPU the builder does not serve).
  void submit(DeviceOrdinal device, Bytes size);
  // Every finished job since the last call.
  [[nodiscard]] std::vector<Done> take();
  // Releases `h` (release_built) on `device`'s worker, after the builds queued before it.
  void discard(DeviceOrdinal device, BuiltHandle h);

 private:
  struct Worker {
    DeviceOrdinal device{0};
    Bytes granularity{0};
    Bytes headroom{0};
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Bytes> jobs;  // Bytes{0}: the next of `discards`
    std::deque<BuiltHandle> discards;
    std::thread thread;
  };
  void run(Worker& w);

  Driver& driver_;
  std::function<void()> on_ready_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex done_mu_;
  std::vector<Done> done_;
  std::atomic<bool> stop_{false};  // set, then every worker's mu taken once before its notify
};

}  // namespace vlake::pool
