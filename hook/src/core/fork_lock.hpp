// The fork protocol of a table behind one mutex, shared by the hook's process-local tables.
// The fork handlers (hook.cpp) call lock_all() before fork() and unlock_all() after it in the
// parent; in the child the table's clear_after_fork() forgets the parent's entries and releases
// the mutex fork() copied held (unlock_after_fork(), or clear_and_unlock() for plain containers).
// Thread-safety: the table's own members take mu_; lock_all()/unlock_all()/clear_after_fork() are
// for the fork handlers only. Not copyable (the mutex is not).
#pragma once

#include <cstddef>
#include <mutex>

namespace vlake::hook {

class ForkLock {
 public:
  void lock_all() noexcept { mu_.lock(); }
  void unlock_all() noexcept { mu_.unlock(); }

 protected:
  // In the child after fork(): releases the mutex the parent's lock_all() held.
  void unlock_after_fork() noexcept { mu_.unlock(); }
  // In the child after fork(): empties `tables`, then releases the mutex.
  template <class... Containers>
  void clear_and_unlock(Containers&... tables) noexcept {
    (tables.clear(), ...);
    mu_.unlock();
  }
  // The number of entries of `table`, read under the mutex.
  template <class Container>
  [[nodiscard]] std::size_t locked_size(const Container& table) const {
    std::lock_guard lock(mu_);
    return table.size();
  }

  mutable std::mutex mu_;
};

}  // namespace vlake::hook
