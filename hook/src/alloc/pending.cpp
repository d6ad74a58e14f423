#include "pending.hpp"

#include <algorithm>
#include <iterator>

namespace vlake::hook {

void PendingFrees::push(PendingFree f) {
  std::lock_guard lock(mu_);
  entries_.push_back(std::move(f));
  count_.fetch_add(1, std::memory_order_acq_rel);
  poll_ = kMinPoll;
}

std::vector<PendingFree> PendingFrees::take_done(const std::function<EventState(const PendingFree&)>& query) {
  std::vector<PendingFree> batch;
  {
    std::lock_guard lock(mu_);
    batch.swap(entries_);
  }
  std::vector<PendingFree> done;
  std::vector<PendingFree> waiting;
  for (PendingFree& f : batch) {
    f.state = query(f);
    (f.state == EventState::pending ? waiting : done).push_back(std::move(f));
  }
  std::lock_guard lock(mu_);
  count_.fetch_sub(done.size(), std::memory_order_acq_rel);
  // Entries pushed while the queries ran are newer than the ones still waiting.
  waiting.insert(waiting.end(), std::make_move_iterator(entries_.begin()), std::make_move_iterator(entries_.end()));
  entries_.swap(waiting);
  if (!done.empty()) {
    poll_ = kMinPoll;
  } else if (!batch.empty()) {
    poll_ = std::min(poll_ * 2, kMaxPoll);
  }
  return done;
}

std::vector<PendingFree> PendingFrees::take_all() {
  std::lock_guard lock(mu_);
  std::vector<PendingFree> out;
  out.swap(entries_);
  count_.fetch_sub(out.size(), std::memory_order_acq_rel);
  poll_ = kMinPoll;
  return out;
}

bool PendingFrees::empty() const {
  std::lock_guard lock(mu_);
  return entries_.empty();
}

std::size_t PendingFrees::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

std::chrono::microseconds PendingFrees::next_poll() const {
  std::lock_guard lock(mu_);
  return poll_;
}

void PendingFrees::clear_after_fork() noexcept {
  entries_.clear();
  count_.store(0);
  poll_ = kMinPoll;
  unlock_after_fork();
}

CUevent EventPool::acquire(CUcontext ctx) {
  std::lock_guard lock(mu_);
  for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) {
    if (it->first == ctx) {
      const CUevent e = it->second;
      idle_.erase(std::next(it).base());
      return e;
    }
  }
  return nullptr;
}

bool EventPool::release(CUcontext ctx, CUevent event) {
  std::lock_guard lock(mu_);
  if (idle_.size() >= kMaxIdle) return false;
  idle_.emplace_back(ctx, event);
  return true;
}

std::size_t EventPool::idle() const { return locked_size(idle_); }

void EventPool::clear_after_fork() noexcept { clear_and_unlock(idle_); }

}  // namespace vlake::hook
