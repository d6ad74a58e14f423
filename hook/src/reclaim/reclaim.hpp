// Reclaim callbacks (include/vlake/reclaim.h, docs/hook.md "Reclaim"): frameworks in this process
// register a callback that empties their cache; a Pressure from vlaked that the local reserve
// cannot cover runs them on a thread of their own.
//
// Contract
// - add()/remove() register and unregister (fn, ctx) pairs (at most VLAKE_RECLAIM_MAX); remove()
//   returns after a run of the callbacks in progress has finished. Statuses: vlake_reclaim_status.
// - request(device, bytes) never blocks: it records the request (requests for one device merge,
//   the larger `bytes` wins) and wakes the thread, started by the first add(). The thread calls
//   every callback once per device request, with no lock held, then `after(device, bytes)`
//   (the hook returns what the frameworks freed into its reserve to vlaked).
// - registered() is true while at least one callback is registered (relaxed read; any thread).
// - stop() (at exit) makes the thread end after the run in progress; it is never joined.
// Thread-safety: every member may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "vlake/reclaim.h"

namespace vlake::hook {

class Reclaimer {
 public:
  using After = std::function<void(int device, std::uint64_t bytes)>;
  explicit Reclaimer(After after) : after_(std::move(after)) {}
  Reclaimer(const Reclaimer&) = delete;
  Reclaimer& operator=(const Reclaimer&) = delete;

  int add(vlake_reclaim_fn fn, void* ctx);
  int remove(vlake_reclaim_fn fn, void* ctx);
  [[nodiscard]] bool registered() const noexcept { return registered_.load(std::memory_order_relaxed); }
  void request(int device, std::uint64_t bytes);
  [[nodiscard]] std::uint64_t runs() const noexcept { return runs_.load(std::memory_order_relaxed); }
  void stop();
  // fork(): prepare_fork() locks, parent_after_fork() unlocks; the child has no thread and
  // forgets every registration (a framework registers again in the process that uses it).
  void prepare_fork() { mu_.lock(); }
  void parent_after_fork() { mu_.unlock(); }
  void child_after_fork();

 private:
  void main();

  const After after_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<vlake_reclaim_fn, void*>> fns_;  // guarded by mu_
  std::map<int, std::uint64_t> pending_;                 // guarded by mu_: device -> bytes
  bool started_ = false;                                 // guarded by mu_
  bool stopping_ = false;                                // guarded by mu_
  std::mutex run_mu_;                                    // held while callbacks run
  std::atomic<bool> registered_{false};
  std::atomic<std::uint64_t> runs_{0};
};

}  // namespace vlake::hook
