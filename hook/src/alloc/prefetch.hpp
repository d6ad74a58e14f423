// Prefetch: grants the hook's worker asks for ahead of the application, for sizes the local
// reserve keeps missing (docs/hook.md, "Prefetch").
//
// A burst of allocations of one size that the reserve cannot serve (a working set growing for
// the first time) pays the cold path on every one of them: daemon round trip, import, map,
// set access. When a size misses, the worker fetches blocks of it in the background (real
// grants, charged to the tenant like any reserved block) and puts them in the local reserve,
// so that the burst's next allocations are warm.
//
// Contract
// - Plain decision class: no driver or daemon call, no clock of its own.
// - miss(dev, size, now): the reserve missed `size` and the application paid the cold path.
//   A miss within `window` of the previous miss of that size doubles the size's batch
//   (1, 2, 4, ... up to max_count, and at most max_bytes per batch); one after a quiet
//   window starts again at 1. The batch is queued (what is already queued counts).
// - hit(dev, size, now): a prefetched block was used: while that size missed within `window`,
//   one replacement is queued (the burst stays ahead).
// - failed(dev, size, now): a prefetch grant was refused: nothing more for that size until
//   `window` has passed (a tenant at its limit is never pushed over it by prefetching).
// - take(): the queued requests (device, size, context), oldest first, for the worker, which
//   calls done() for each (or failed() for a refused one).
// - Sizes above max_size are never prefetched. Off (max_count 0): every call does nothing.
// - Thread-safety: every method may be called from any thread (one internal mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace vlake::hook {

class Prefetch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Request {
    int device = 0;
    std::uint64_t size = 0;
    void* ctx = nullptr;  // the context the missing allocation was made in (CUcontext)
  };

  Prefetch(std::uint32_t max_count, std::uint64_t max_size, std::uint64_t max_bytes,
           std::chrono::milliseconds window = std::chrono::seconds(1)) noexcept
      : max_count_(max_count), max_size_(max_size), max_bytes_(max_bytes), window_(window) {}

  [[nodiscard]] bool enabled() const noexcept { return max_count_ > 0 && max_size_ > 0; }
  // Both return true if something was queued (wake the worker).
  bool miss(int dev, std::uint64_t size, void* ctx, Clock::time_point now);
  bool hit(int dev, std::uint64_t size, void* ctx, Clock::time_point now);
  void failed(int dev, std::uint64_t size, Clock::time_point now);
  [[nodiscard]] std::vector<Request> take();
  // The worker finished a request taken from take() (built, or not carried out).
  void done(int dev, std::uint64_t size);
  [[nodiscard]] std::size_t queued() const;

 private:
  struct Size {
    Clock::time_point last_miss{};
    Clock::time_point blocked_until{};
    std::uint32_t batch = 0;   // the last batch's count
    std::uint32_t queued = 0;  // requests in queue_ or being carried out
  };
  using Key = std::pair<int, std::uint64_t>;
  std::uint32_t limit(std::uint64_t size) const noexcept;
  void enqueue(const Key& k, Size& z, std::uint32_t n, void* ctx);

  const std::uint32_t max_count_;
  const std::uint64_t max_size_;
  const std::uint64_t max_bytes_;
  const std::chrono::milliseconds window_;
  mutable std::mutex mu_;
  std::map<Key, Size> sizes_;
  std::vector<Request> queue_;
};

}  // namespace vlake::hook
