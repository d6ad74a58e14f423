// The background worker (alloc/internal.hpp): retires reserve blocks, expires idle ones,
// answers Pressure and swap notices, sends ReserveReports, completes frees and prefetches.
#include "hook.hpp"

#include "alloc/internal.hpp"
#include "ipc.hpp"
#include "profile.hpp"
#include "share.hpp"
#include "tier.hpp"
#include "write_span.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace vlake::hook {

using proto::GrantPurpose;
using proto::Status;

// Swapping (docs/swap.md): a process whose other threads used more than a fifth of a CPU over
// the last 500 ms is busy (it does not get ready to be swapped out); one on the host that did so
// over the last 200 ms is brought back at once.
constexpr std::uint64_t kBusyWindowNs = 500'000'000;
constexpr std::uint64_t kWakeWindowNs = 200'000'000;

// The worker's periodic duties; runs with busy_mu held.
void worker_tick(State& s, std::vector<ReserveBlock>& work, std::vector<std::pair<int, std::uint64_t>>& reclaimed,
                 std::array<std::uint64_t, proto::kMaxDevices>& reported,
                 std::array<bool, proto::kMaxDevices>& reported_reclaim,
                 std::chrono::steady_clock::time_point& last_report,
                 std::chrono::steady_clock::time_point& last_active_report) {
  retire_blocks(s, work, true);
  auto old = s.reserve.expire(std::chrono::steady_clock::now());
  bool urgent = !old.empty();
  retire_blocks(s, old, true);
  s.client.poll_pressure();
  // Swapping (docs/swap.md): close the gate and say ready, or open it (the swap was called off).
  if (s.client.overcommit_known()) {
    s.cpu.sample(static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()),
                 app_cpu_ns(static_cast<long>(::gettid())));
  }
  for (const proto::SwapNotice& n : s.client.take_swap_notices()) {
    if (n.phase == proto::SwapPhase::host) {
      s.on_host = g_swap_gate_closed.load(std::memory_order_acquire);  // the checkpoint is done
      continue;
    }
    if (n.phase == proto::SwapPhase::out) {
      if (s.cpu.busy(kBusyWindowNs)) {
        // Its threads are computing: not idle (vlaked leaves it alone when it does not answer).
        log(LogLevel::debug, "vlaked wants to move this process to host memory, but it is busy: not now");
        continue;
      }
      s.on_host = false;
      close_swap_gate();
      log(LogLevel::info, "vlaked is moving this idle process to host memory; its next CUDA call brings it back");
      (void)s.client.send_swap_ready(n.swap_id);
    } else {
      open_swap_gate();
    }
  }
  // The host tier (docs/swap.md, "Host tier"): moves of whole grants, the process running on.
  for (const proto::TierNotice& n : s.client.take_tier_notices()) run_move(s, n);
  // On the host, and its threads started computing: bring it back now, before one of them blocks
  // in a driver call the hook does not intercept (docs/swap.md).
  // (Not while the checkpoint runs: the driver's own work in the process uses the CPU then.)
  if (!g_swap_gate_closed.load(std::memory_order_acquire)) {
    s.on_host = false;
  } else if (s.on_host && s.cpu.busy(kWakeWindowNs)) {
    (void)ask_swap_in();
  }
  // Kept mappings: the daemon's Drop messages, and mappings kept under an older connection.
  if (std::vector<std::uint64_t> keys = s.client.take_drops(); !keys.empty()) {
    drop_entries(s, s.kept.take_keys(keys));
    (void)s.client.send_dropped(keys);
  }
  if (s.kept.size() > 0) {
    const std::uint64_t generation = s.client.generation();
    drop_kept_if(s, [generation](const KeptMappings::Entry& e) { return e.generation != generation; });
  }
  for (const PressureNote& n : s.client.take_pressure()) {
    const int dev = device_of_uuid(s, n.device);
    if (dev < 0) continue;
    const std::uint64_t had = s.reserve.bytes(dev);
    auto out = s.reserve.drain(dev, n.bytes);
    log(LogLevel::info, "vlaked asked for memory on GPU %d: returning %zu reserved block(s)", dev, out.size());
    urgent = true;
    retire_blocks(s, out);
    // More than the reserve held (or all of it): the frameworks' caches (docs/hook.md, "Reclaim").
    if (s.reclaim.registered() && (n.bytes == 0 || had < n.bytes))
      s.reclaim.request(dev, n.bytes == 0 ? 0 : n.bytes - had);
  }
  // What the reclaim callbacks freed went into the reserve, or stayed mapped as kept mappings
  // (blocks the reserve could not hold): both go back to vlaked.
  for (const auto& [dev, bytes] : reclaimed) {
    auto out = s.reserve.drain(dev, 0);
    urgent = true;
    retire_blocks(s, out);
    drop_kept(s, dev);
  }
  reclaimed.clear();
  const bool reclaim = s.reclaim.registered();
  const auto now = std::chrono::steady_clock::now();
  // Activity (vlakectl's IDLE column, vlake_process_idle_seconds; overcommit: vlaked swaps out
  // processes idle for a while): at most one report a second while the process makes CUDA calls.
  bool active = false;
  if (s.client.answered() && now - last_active_report >= std::chrono::seconds(1) &&
      g_cuda_active.exchange(false, std::memory_order_relaxed)) {
    active = true;
    last_active_report = now;
  }
  if (!urgent && !active && now - last_report < std::chrono::milliseconds(250)) return;
  last_report = now;
  for (std::size_t d = 0; d < proto::kMaxDevices; ++d) {
    std::optional<Uuid> u;
    {
      std::lock_guard lock(s.uuid_mu);
      u = s.uuids[d];
    }
    if (!u) continue;
    const std::uint64_t bytes = s.reserve.bytes(static_cast<int>(d));
    if (bytes == reported[d] && reclaim == reported_reclaim[d] && !active) continue;
    if (s.client.send_reserve_report(*u, bytes, s.reserve.blocks(static_cast<int>(d)), reclaim, active)) {
      reported[d] = bytes;
      reported_reclaim[d] = reclaim;
      active = false;  // one report says it
    }
  }
}

// Stream-ordered frees (defined with the free path below).

constexpr auto kWorkerPeriod = std::chrono::milliseconds(50);

void worker_main(State* s) {
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);  // the application's handlers never run here
  ::pthread_setname_np(::pthread_self(), "vlake-reserve");
  t_gate_exempt = true;  // never asks for a restore (swap.hpp)
  std::array<std::uint64_t, proto::kMaxDevices> reported{};
  std::array<bool, proto::kMaxDevices> reported_reclaim{};
  auto last_report = std::chrono::steady_clock::time_point{};
  auto last_active_report = std::chrono::steady_clock::time_point{};
  auto last_tick = std::chrono::steady_clock::time_point{};
  for (;;) {
    std::vector<ReserveBlock> work;
    std::vector<std::pair<int, std::uint64_t>> reclaimed;
    {
      std::unique_lock lock(s->work_mu);
      // Frees waiting for their stream are polled sooner (PendingFrees::next_poll()).
      const std::chrono::microseconds wait = s->frees.empty() ? kWorkerPeriod : s->frees.next_poll();
      s->work_cv.wait_for(lock, wait, [s] { return !s->retire_queue.empty() || s->kicked || s->stopping; });
      if (s->stopping) return;
      s->kicked = false;
      work.swap(s->retire_queue);
      reclaimed.swap(s->after_reclaim);
    }
    std::lock_guard busy(s->busy_mu);
    {
      std::lock_guard lock(s->work_mu);
      if (s->stopping) return;
    }
    try {
      finish_frees(*s);
    } catch (...) {
    }
    try {
      run_prefetch(*s);
    } catch (...) {
    }
    // A wake-up only to poll frees leaves the periodic duties to their own pace.
    const auto now = std::chrono::steady_clock::now();
    if (work.empty() && reclaimed.empty() && now - last_tick < kWorkerPeriod) continue;
    last_tick = now;
    try {
      worker_tick(*s, work, reclaimed, reported, reported_reclaim, last_report, last_active_report);
    } catch (...) {
    }
  }
}

// At exit (before the driver's own exit handlers, which were registered earlier): stop the
// worker and keep it off the driver for good.
void stop_worker() {
  State* s = existing_state();
  if (s == nullptr) return;
  {
    std::lock_guard lock(s->work_mu);
    if (!s->worker_started) return;
    s->stopping = true;
  }
  s->work_cv.notify_all();
  s->reclaim.stop();
  s->busy_mu.lock();  // waits for a tick in progress; never unlocked
  drain_frees_at_exit(*s);
}

void ensure_worker(State& s) {
  std::lock_guard lock(s.work_mu);
  if (s.worker_started || s.stopping) return;
  try {
    std::thread(worker_main, &s).detach();
  } catch (...) {
    return;  // no thread: blocks leave the reserve only on refusals (retired inline)
  }
  s.worker_started = true;
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(stop_worker); });
}

// Blocks to unmap and release off the caller's thread (inline if there is no worker).
void retire_later(State& s, std::vector<ReserveBlock> blocks) {
  if (blocks.empty()) return;
  ensure_worker(s);
  {
    std::lock_guard lock(s.work_mu);
    if (s.worker_started && !s.stopping) {
      for (auto& b : blocks) s.retire_queue.push_back(std::move(b));
      blocks.clear();
    }
  }
  if (blocks.empty()) {
    s.work_cv.notify_one();
    return;
  }
  retire_blocks(s, blocks);
}

// Wakes the worker for queued prefetches (starts it if needed).
void kick_prefetch(State& s) {
  ensure_worker(s);
  {
    std::lock_guard lock(s.work_mu);
    s.kicked = true;
  }
  s.work_cv.notify_one();
}

// Prefetch (prefetch.hpp, docs/hook.md "Prefetch"): the worker fetches the blocks that misses
// queued, in the context of the allocation that missed, into the local reserve. Its grants never
// wait for memory (kGrantNoWait: a worker parked for minutes could not answer Pressure or a host
// tier move). A refusal stops prefetching that size for a while; nothing is logged (the
// application asked for nothing). Runs with busy_mu held.
void run_prefetch(State& s) {
  for (const Prefetch::Request& r : s.prefetch.take()) {
    bool refused = false;
    auto* ctx = static_cast<CUcontext>(r.ctx);
    in_context(ctx, [&] {
      if (!reserve_usable(s)) return;
      Obtained o = obtain(s, r.device, r.size, GrantPurpose::alloc, /*report=*/false, proto::kGrantNoWait);
      if (o.decision != Decision::granted) {
        refused = o.decision == Decision::refused;
        return;
      }
      const std::uint64_t grant_id = o.grant.grant_id;
      LogicalAlloc a;
      bool guard = false;
      if (map_grant_only(s, o.grant, r.device, r.size, a, guard) != CUDA_SUCCESS) {
        give_back(s, grant_id, 0);
        return;
      }
      a.ctx = ctx;
      ReserveBlock b;
      b.alloc = std::move(a);
      b.freed = std::chrono::steady_clock::now();
      b.prefetched = true;
      auto out = s.reserve.put(std::move(b));
      retire_blocks(s, out, true);
    });
    if (refused) s.prefetch.failed(r.device, r.size, std::chrono::steady_clock::now());
    else s.prefetch.done(r.device, r.size);
  }
}

}  // namespace vlake::hook
