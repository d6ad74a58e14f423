// Swapping to host memory (docs/swap.md): the gate every hooked call passes.
//
// Contract
// - vlaked tells a process of an overcommit namespace that it is about to be checkpointed
//   (SwapNotice{out}); the worker thread closes the gate (close_swap_gate()) and answers
//   SwapReady. From then on every hooked call of an application thread stops at the gate
//   (pass() in pass.hpp: one relaxed load while it is open) in wait_at_swap_gate(): one thread
//   asks vlaked to bring the process back (SwapIn) while the others wait for its answer; ok opens
//   the gate and every call goes on. A SwapNotice{back} (the swap was called off) opens it too.
// - The hook's worker thread is exempt (t_gate_exempt): it never asks, and while the process is
//   locked its driver calls block in the driver like any other.
// - g_cuda_active is set by every hooked call (a load, and a store only when it was clear); the
//   worker of an overcommit process clears it when it reports activity (kReportActive).
// Thread-safety: all of it may be used from any thread; fork() leaves the child with the gate
//   open (its parent's checkpoint is not its own).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "vlake/common/cuda_api.hpp"  // cuda.h as the hook compiles it

namespace vlake::hook {

inline std::atomic<bool> g_swap_gate_closed{false};
inline std::atomic<bool> g_cuda_active{false};
inline thread_local bool t_gate_exempt = false;

// Called by pass() when the gate is closed. CUDA_SUCCESS: go on. Otherwise the call fails with
// it: CUDA_ERROR_OUT_OF_MEMORY when vlaked found no room to bring the process back within its
// wait (the next call asks again), CUDA_ERROR_OPERATING_SYSTEM when the restore failed.
CUresult wait_at_swap_gate() noexcept;
// The same request from the worker thread (it asks even though it is exempt): a process on the
// host whose threads use the CPU is about to use the GPU, maybe through an entry point the hook
// does not intercept (which would block in the locked driver with nobody to ask).
CUresult ask_swap_in() noexcept;

// CPU time (ns) the threads of this process other than `except` (a thread id) have used, from
// /proc/self/task/*/schedstat; 0 when it cannot be read. Called by the worker only.
std::uint64_t app_cpu_ns(long except) noexcept;

// The worker's view of the application's CPU use, one sample per tick (about 50 ms):
// busy(window) is true when the threads other than the worker used more than a fifth of one CPU
// over the last `window` (so a process waking up to compute is not idle, and one on the host
// that starts computing is about to use the GPU).
class CpuWatch {
 public:
  void sample(std::uint64_t now_ns, std::uint64_t cpu_ns) noexcept;
  [[nodiscard]] bool busy(std::uint64_t window_ns) const noexcept;

 private:
  static constexpr int kSamples = 16;
  std::uint64_t at_[kSamples] = {};
  std::uint64_t cpu_[kSamples] = {};
  int next_ = 0;
  int count_ = 0;
};
void close_swap_gate() noexcept;
void open_swap_gate() noexcept;
// SwapIns answered ok since start (the process came back to the GPU).
std::uint64_t swap_ins() noexcept;

inline std::uint64_t app_cpu_ns(long except) noexcept {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return 0;
  std::uint64_t sum = 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    if (std::strtol(e->d_name, nullptr, 10) == except) continue;
    char path[300];
    std::snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[96] = {};
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n > 0) sum += std::strtoull(buf, nullptr, 10);  // first field: ns on the CPU
  }
  ::closedir(d);
  return sum;
}

inline void CpuWatch::sample(std::uint64_t now_ns, std::uint64_t cpu_ns) noexcept {
  at_[next_] = now_ns;
  cpu_[next_] = cpu_ns;
  next_ = (next_ + 1) % kSamples;
  if (count_ < kSamples) ++count_;
}

inline bool CpuWatch::busy(std::uint64_t window_ns) const noexcept {
  if (count_ < 2) return false;
  const int last = (next_ + kSamples - 1) % kSamples;
  // The oldest sample within the window (at least the one before the last).
  int from = (last + kSamples - 1) % kSamples;
  for (int i = 2; i < count_; ++i) {
    const int j = (last + kSamples - i) % kSamples;
    if (at_[last] - at_[j] > window_ns) break;
    from = j;
  }
  const std::uint64_t span = at_[last] - at_[from];
  const std::uint64_t used = cpu_[last] >= cpu_[from] ? cpu_[last] - cpu_[from] : 0;
  return span > 0 && used * 5 > span;
}

}  // namespace vlake::hook
