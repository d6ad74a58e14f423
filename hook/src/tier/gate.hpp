// The entry gate of the host tier (docs/swap.md, "Host tier"): while the hook's worker moves a
// grant between device and host memory, no application thread may be inside a hooked call.
//
// Contract
// - Every hooked entry point (the trampolines of interposer/exports.cpp) holds an EntryMark for
//   the call: it counts the calling thread as inside a hooked call (a per-thread depth in a
//   slot of a fixed table, claimed on the thread's first call) and, at the outermost level,
//   waits while the gate is closed. Nested calls (the hook calling hooked entry points for its
//   own work) never wait. Cost while the gate is open: a thread-local load, two relaxed stores
//   and one relaxed load.
// - close_and_drain(timeout) (the worker only): closes the gate, makes every thread's mark
//   visible (membarrier: a full barrier on every thread of the process, so a thread either is
//   seen inside a call or sees the gate closed), then waits until no thread other than the
//   caller is inside a hooked call. False, with the gate open again, when that does not happen
//   within `timeout`, when a thread has no slot (more threads than kSlots) or when the kernel
//   has no membarrier: the move is not made then.
// - WaitOutside (a scope inside a hooked call, around a wait for vlaked's answer that holds no
//   lock of the hook): the thread counts as outside a hooked call while the scope lasts, so a
//   move can start and run meanwhile; at the scope's end it waits while the gate is closed,
//   then counts as inside again at its old depth. Nothing for a thread that is not inside a
//   hooked call, has no slot, or is exempt.
// - open() opens the gate and wakes every waiting thread.
// - Threads exempt from the gate (t_gate_exempt, the worker) never wait but are counted.
// Thread-safety: all functions may be called from any thread; close_and_drain/open from one
// thread at a time (the worker). fork(): the child starts with the gate open and every slot but
// the forking thread's free (reset_after_fork()).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace vlake::hook::tier {

inline constexpr std::uint32_t kSlots = 4096;

struct alignas(64) Slot {
  std::atomic<std::uint32_t> depth{0};
  std::atomic<bool> used{false};
};

inline Slot g_slots[kSlots];
inline std::atomic<bool> g_gate_closed{false};
inline std::atomic<std::uint32_t> g_unslotted{0};  // threads that found no free slot
// The calling thread's slot + 1 (0: none yet; kSlots + 1: none free).
__attribute__((tls_model("initial-exec"))) inline thread_local std::uint32_t t_slot = 0;

// Claims a slot for the calling thread (released at its exit); slow path of EntryMark.
std::uint32_t claim_slot() noexcept;
// Waits while the gate is closed, the thread not counted meanwhile; then counts it at `depth`.
void wait_open(Slot& s, std::uint32_t depth = 1) noexcept;
bool exempt() noexcept;

class EntryMark {
 public:
  EntryMark() noexcept {
    std::uint32_t i = t_slot;
    if (i == 0) [[unlikely]]
      i = claim_slot();
    if (i > kSlots) [[unlikely]]
      return;
    slot_ = &g_slots[i - 1];
    const std::uint32_t d = slot_->depth.load(std::memory_order_relaxed);
    slot_->depth.store(d + 1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the closer's membarrier orders the rest
    if (d == 0 && g_gate_closed.load(std::memory_order_relaxed)) [[unlikely]]
      wait_open(*slot_);
  }
  ~EntryMark() {
    if (slot_ != nullptr)
      slot_->depth.store(slot_->depth.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }
  EntryMark(const EntryMark&) = delete;
  EntryMark& operator=(const EntryMark&) = delete;

 private:
  Slot* slot_ = nullptr;
};

class WaitOutside {
 public:
  WaitOutside() noexcept {
    const std::uint32_t i = t_slot;
    if (i == 0 || i > kSlots || exempt()) return;
    Slot& s = g_slots[i - 1];
    depth_ = s.depth.load(std::memory_order_relaxed);
    if (depth_ == 0) return;
    slot_ = &s;
    slot_->depth.store(0, std::memory_order_release);
  }
  ~WaitOutside() {
    if (slot_ == nullptr) return;
    slot_->depth.store(depth_, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // as EntryMark: the closer's membarrier orders the rest
    if (g_gate_closed.load(std::memory_order_relaxed)) [[unlikely]]
      wait_open(*slot_, depth_);
  }
  WaitOutside(const WaitOutside&) = delete;
  WaitOutside& operator=(const WaitOutside&) = delete;

 private:
  Slot* slot_ = nullptr;
  std::uint32_t depth_ = 0;
};

bool close_and_drain(std::chrono::milliseconds timeout) noexcept;
void open() noexcept;
[[nodiscard]] inline bool closed() noexcept { return g_gate_closed.load(std::memory_order_acquire); }
void reset_after_fork() noexcept;

}  // namespace vlake::hook::tier
