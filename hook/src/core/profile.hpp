// Cold-path profile of the hook (VLAKE_PROFILE=1): wall time per phase of the allocations and
// frees that reach the daemon, printed as one stderr line per phase at process exit. Off by
// default; when off a PhaseTimer costs one relaxed load.
//
// Contract
// - enable() is called once at initialization (from the configuration), before any timer runs.
// - PhaseTimer measures from construction to destruction and adds to its phase (relaxed
//   atomics: any thread). report() prints the totals (count, mean, max, how many took at least
//   kSlowNs) once, at exit.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace vlake::hook {

enum class Phase : int { grant, import, reserve, map, access, unmap, release_handles, release_rpc, kept_reuse, count };

class Profile {
 public:
  static Profile& get() noexcept {
    static Profile p;
    return p;
  }
  void enable() noexcept;
  [[nodiscard]] bool on() const noexcept { return on_.load(std::memory_order_relaxed); }
  void add(Phase p, std::uint64_t ns) noexcept {
    const auto i = static_cast<std::size_t>(p);
    ns_[i].fetch_add(ns, std::memory_order_relaxed);
    n_[i].fetch_add(1, std::memory_order_relaxed);
    if (ns >= kSlowNs) slow_[i].fetch_add(1, std::memory_order_relaxed);
    std::uint64_t m = max_[i].load(std::memory_order_relaxed);
    while (ns > m && !max_[i].compare_exchange_weak(m, ns, std::memory_order_relaxed)) {
    }
  }
  // A phase this long counts as slow (the report gives how many were).
  static constexpr std::uint64_t kSlowNs = 250'000;
  void report() const noexcept;

 private:
  std::atomic<bool> on_{false};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(Phase::count)> ns_{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(Phase::count)> n_{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(Phase::count)> max_{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(Phase::count)> slow_{};
};

class PhaseTimer {
 public:
  explicit PhaseTimer(Phase p) noexcept : phase_(p), on_(Profile::get().on()) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (!on_) return;
    const auto d = std::chrono::steady_clock::now() - start_;
    Profile::get().add(phase_,
                       static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()));
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  Phase phase_;
  bool on_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace vlake::hook
