// The host tier's entry gate (contract in gate.hpp).
#include "gate.hpp"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "swap.hpp"

namespace vlake::hook::tier {
namespace {

std::mutex g_mu;
std::condition_variable g_cv;

// Frees a thread's slot at its exit: a pthread key whose value is the slot + 1 (a thread_local
// with a destructor would need glibc 2.18, above the hook's floor).
void free_slot(void* v) noexcept {
  const auto index = static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(v));
  if (index != 0 && index <= kSlots) {
    g_slots[index - 1].depth.store(0, std::memory_order_relaxed);
    g_slots[index - 1].used.store(false, std::memory_order_release);
  }
}
pthread_key_t slot_key() noexcept {
  static const pthread_key_t key = [] {
    pthread_key_t k{};
    (void)::pthread_key_create(&k, free_slot);
    return k;
  }();
  return key;
}

int membarrier_ready() noexcept {
  static const int ok = [] {
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 1 : 0;
  }();
  return ok;
}

}  // namespace

bool exempt() noexcept { return t_gate_exempt; }

std::uint32_t claim_slot() noexcept {
  for (std::uint32_t i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (!g_slots[i].used.load(std::memory_order_relaxed) &&
        g_slots[i].used.compare_exchange_strong(expected, true, std::memory_order_seq_cst)) {
      g_slots[i].depth.store(0, std::memory_order_relaxed);
      t_slot = i + 1;
      (void)::pthread_setspecific(slot_key(), reinterpret_cast<void*>(static_cast<std::uintptr_t>(i + 1)));
      return i + 1;
    }
  }
  g_unslotted.fetch_add(1, std::memory_order_relaxed);
  t_slot = kSlots + 1;
  return kSlots + 1;
}

void wait_open(Slot& s, std::uint32_t depth) noexcept {
  if (exempt()) return;
  for (;;) {
    s.depth.store(0, std::memory_order_release);
    {
      std::unique_lock lock(g_mu);
      g_cv.wait(lock, [] { return !g_gate_closed.load(std::memory_order_acquire); });
    }
    s.depth.store(depth, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!g_gate_closed.load(std::memory_order_relaxed)) return;
  }
}

bool close_and_drain(std::chrono::milliseconds timeout) noexcept {
  if (membarrier_ready() == 0 || g_unslotted.load(std::memory_order_relaxed) != 0) return false;
  {
    std::lock_guard lock(g_mu);
    g_gate_closed.store(true, std::memory_order_seq_cst);
  }
  if (::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
    open();
    return false;
  }
  const std::uint32_t own = t_slot;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool inside = false;
    for (std::uint32_t i = 0; i < kSlots && !inside; ++i) {
      if (i + 1 == own || !g_slots[i].used.load(std::memory_order_acquire)) continue;
      inside = g_slots[i].depth.load(std::memory_order_acquire) != 0;
    }
    if (!inside) return true;
    if (std::chrono::steady_clock::now() >= deadline) {
      open();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void open() noexcept {
  {
    std::lock_guard lock(g_mu);
    g_gate_closed.store(false, std::memory_order_release);
  }
  g_cv.notify_all();
}

void reset_after_fork() noexcept {
  g_gate_closed.store(false, std::memory_order_relaxed);
  const std::uint32_t own = t_slot;
  for (std::uint32_t i = 0; i < kSlots; ++i) {
    if (i + 1 == own) continue;
    g_slots[i].depth.store(0, std::memory_order_relaxed);
    g_slots[i].used.store(false, std::memory_order_relaxed);
  }
  new (&g_mu) std::mutex();
  new (&g_cv) std::condition_variable();
}

}  // namespace vlake::hook::tier
