// Stream-ordered frees of served memory (cuMemFreeAsync, docs/hook.md "Stream-ordered frees"):
// the allocation leaves the application's table at once and waits here, behind an event
// recorded on the stream at the free, until the stream has reached that point; only then does
// the hook's worker free it (local reserve, or unmap and release the grant). The caller's thread
// never waits for the stream.
//
// Contract
// - PendingFrees and EventPool are plain bookkeeping: no driver or daemon call, no clock of
//   their own. Each has one internal mutex; every method may be called from any thread.
// - PendingFrees::take_done(query) asks `query(entry)` about every entry, without holding the
//   mutex while it does (entries pushed meanwhile wait for the next call), and removes and
//   returns, oldest first, those whose answer is not EventState::pending (complete; or failed:
//   a stream that reports an error runs nothing more that could touch the memory). Several
//   threads may call it at once (the worker, an application thread settling before a retry):
//   each entry is asked about and handed back by one call only.
// - Polling: next_poll() is how long the worker may sleep before asking again: kMinPoll after a
//   push or after a take_done() that completed something, then doubling after every take_done()
//   that completed nothing, up to kMaxPoll. So memory comes back within kMaxPoll of its stream
//   reaching the free (sooner for short waits), and a long wait costs at most 1/kMaxPoll
//   queries a second.
// - EventPool keeps up to kMaxIdle idle events (they belong to a context) for reuse: acquire(ctx)
//   returns one of that context's or nullptr; release() returns false when the pool is full
//   (the caller destroys the event).
// - Fork: lock_all()/unlock_all() bracket fork() in the parent; clear_after_fork() in the child
//   forgets every entry and event without touching them (they are the parent's) and unlocks.
#pragma once

#include "vlake/common/cuda_api.hpp"  // cuda.h as the hook sees it (legacy names visible)

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "fork_lock.hpp"
#include "tables.hpp"

namespace vlake::hook {

enum class EventState { pending, complete, failed };

struct PendingFree {
  LogicalAlloc alloc;                      // already removed from the AllocTable
  CUevent event = nullptr;                 // recorded on the freeing stream right after the application's work
  CUcontext ctx = nullptr;                 // the context the event belongs to
  EventState state = EventState::pending;  // the last answer of take_done()'s query
};

class PendingFrees : public ForkLock {
 public:
  static constexpr std::chrono::microseconds kMinPoll{50};
  static constexpr std::chrono::microseconds kMaxPoll{2000};

  void push(PendingFree f);
  std::vector<PendingFree> take_done(const std::function<EventState(const PendingFree&)>& query);
  // Every entry, oldest first (exit: the caller waits for them or leaves them to the daemon).
  std::vector<PendingFree> take_all();
  [[nodiscard]] bool empty() const;
  [[nodiscard]] std::size_t size() const;
  // size() != 0 without the mutex (one atomic load): for the application's hot paths.
  [[nodiscard]] bool maybe_pending() const noexcept { return count_.load(std::memory_order_acquire) != 0; }
  [[nodiscard]] std::chrono::microseconds next_poll() const;

  void clear_after_fork() noexcept;

 private:
  std::vector<PendingFree> entries_;
  std::atomic<std::size_t> count_{0};  // entries_ plus those being queried by take_done()
  std::chrono::microseconds poll_ = kMinPoll;
};

class EventPool : public ForkLock {
 public:
  static constexpr std::size_t kMaxIdle = 64;

  [[nodiscard]] CUevent acquire(CUcontext ctx);
  bool release(CUcontext ctx, CUevent event);
  [[nodiscard]] std::size_t idle() const;

  void clear_after_fork() noexcept;

 private:
  std::vector<std::pair<CUcontext, CUevent>> idle_;
};

}  // namespace vlake::hook
