// Reclaim callbacks (contract in reclaim.hpp).
#include "reclaim.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <new>
#include <thread>

#include "log.hpp"

namespace vlake::hook {

int Reclaimer::add(vlake_reclaim_fn fn, void* ctx) {
  if (fn == nullptr) return VLAKE_RECLAIM_INVALID;
  std::lock_guard lock(mu_);
  const auto pair = std::make_pair(fn, ctx);
  if (std::find(fns_.begin(), fns_.end(), pair) != fns_.end()) return VLAKE_RECLAIM_OK;
  if (fns_.size() >= VLAKE_RECLAIM_MAX) return VLAKE_RECLAIM_FULL;
  if (!started_) {
    try {
      std::thread([this] { main(); }).detach();
    } catch (const std::exception& e) {
      log(LogLevel::error, "reclaim: cannot start a thread: %s", e.what());
      return VLAKE_RECLAIM_INTERNAL;
    }
    started_ = true;
  }
  fns_.push_back(pair);
  registered_.store(true, std::memory_order_relaxed);
  return VLAKE_RECLAIM_OK;
}

int Reclaimer::remove(vlake_reclaim_fn fn, void* ctx) {
  {
    std::lock_guard lock(mu_);
    auto it = std::find(fns_.begin(), fns_.end(), std::make_pair(fn, ctx));
    if (it == fns_.end()) return VLAKE_RECLAIM_INVALID;
    fns_.erase(it);
    registered_.store(!fns_.empty(), std::memory_order_relaxed);
  }
  std::lock_guard wait(run_mu_);  // a run that copied the old list has finished
  return VLAKE_RECLAIM_OK;
}

void Reclaimer::request(int device, std::uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    if (!started_ || stopping_) return;
    std::uint64_t& b = pending_[device];
    b = std::max(b, bytes);
  }
  cv_.notify_one();
}

void Reclaimer::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
}

void Reclaimer::child_after_fork() {
  // A run in progress in the parent held run_mu_: its thread does not exist here.
  new (&run_mu_) std::mutex();
  fns_.clear();
  pending_.clear();
  started_ = false;
  stopping_ = false;
  registered_.store(false, std::memory_order_relaxed);
  mu_.unlock();
}

void Reclaimer::main() {
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);  // the application's handlers never run here
  ::pthread_setname_np(::pthread_self(), "vlake-reclaim");
  for (;;) {
    std::map<int, std::uint64_t> todo;
    std::vector<std::pair<vlake_reclaim_fn, void*>> fns;
    std::unique_lock run(run_mu_, std::defer_lock);
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (stopping_) return;
      todo.swap(pending_);
      fns = fns_;
      run.lock();  // under mu_: remove() cannot slip between the copy and the run
    }
    for (const auto& [device, bytes] : todo) {
      std::uint64_t freed = 0;
      for (const auto& [fn, ctx] : fns) {
        try {
          freed += fn(ctx, device, bytes);
        } catch (...) {
        }
      }
      runs_.fetch_add(1, std::memory_order_relaxed);
      log(LogLevel::info, "vlaked asked for memory on GPU %d: %zu reclaim callback(s) freed %llu bytes", device,
          fns.size(), static_cast<unsigned long long>(freed));
      try {
        if (after_) after_(device, bytes);
      } catch (...) {
      }
    }
  }
}

}  // namespace vlake::hook
