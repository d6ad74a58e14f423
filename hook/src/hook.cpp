// The hook's process state (hook.hpp): creation, fork handling, the current device.
#include "hook.hpp"

#include "gate.hpp"

#include "alloc/seams.hpp"

#include "alloc/internal.hpp"
#include "contexts.hpp"
#include "guarded_once.hpp"
#include "ipc.hpp"
#include "profile.hpp"
#include "share.hpp"
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

// ---- Process state ------------------------------------------------------------------------------

namespace {

std::atomic<State*> g_state{nullptr};
std::once_flag g_state_once;
thread_local bool t_creating = false;

void fork_prepare() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) return;
  contexts::lock_all();
  s->busy_mu.lock();
  s->settle_mu.lock();
  s->work_mu.lock();
  ipc::lock_all();
  s->client.prepare_fork();
  s->allocs.lock_all();
  s->creates.lock_all();
  s->managed.lock_all();
  s->reserve.lock_all();
  s->kept.lock_all();
  s->frees.lock_all();
  s->events.lock_all();
  s->usage_cache.lock_all();
  s->uuid_mu.lock();
  s->reclaim.prepare_fork();
}

void fork_parent() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) return;
  s->reclaim.parent_after_fork();
  s->uuid_mu.unlock();
  s->usage_cache.unlock_all();
  s->events.unlock_all();
  s->frees.unlock_all();
  s->kept.unlock_all();
  s->reserve.unlock_all();
  s->managed.unlock_all();
  s->creates.unlock_all();
  s->allocs.unlock_all();
  s->client.parent_after_fork();
  ipc::unlock_all();
  s->work_mu.unlock();
  s->settle_mu.unlock();
  s->busy_mu.unlock();
  contexts::unlock_all();
}

// VLAKE_RESERVE_STATS (docs/hook.md, "Choosing the reserve's defaults"): the local reserve's
// reuse statistics, written once at exit to "<path>.<pid>.json" (a forked child writes its own).
void write_reserve_stats() noexcept {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr || !s->reserve.stats_enabled()) return;
  try {
    const std::string path = s->config.reserve_stats + "." + std::to_string(::getpid()) + ".json";
    const std::string json = s->reserve.stats().to_json(s->reserve.max_bytes(), s->reserve.max_age()) + "\n";
    if (std::FILE* f = std::fopen(path.c_str(), "we")) {
      const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
      if (std::fclose(f) != 0 || !ok) log(LogLevel::warn, "writing %s failed", path.c_str());
    } else {
      log(LogLevel::warn, "cannot write the reserve statistics to %s: %s", path.c_str(), std::strerror(errno));
    }
  } catch (...) {
  }
}

// The child owns none of the parent's grants and must not talk on its connection: it forgets
// both and connects afresh when it uses CUDA.
void fork_child() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) return;
  s->reclaim.child_after_fork();
  s->uuid_mu.unlock();
  s->kept.clear_after_fork();
  s->usage_cache.clear_after_fork();
  s->events.clear_after_fork();  // the parent's events and frees: never touched here
  s->frees.clear_after_fork();
  s->reserve.clear_after_fork();
  s->managed.clear_after_fork();
  s->creates.clear_after_fork();
  s->allocs.clear_after_fork();
  s->client.child_after_fork();
  ipc::clear_after_fork();
  contexts::clear_after_fork();
  g_swap_gate_closed.store(false, std::memory_order_relaxed);  // the parent's swap is not the child's
  tier::reset_after_fork();                                    // nor its moves
  // The worker thread does not exist in the child; its queue holds the parent's grants.
  s->retire_queue.clear();
  s->after_reclaim.clear();
  s->kicked = false;
  s->frees_queued.store(0);
  s->frees_completed.store(0);
  s->worker_started = false;
  s->stopping = false;
  s->work_mu.unlock();
  s->settle_mu.unlock();
  s->busy_mu.unlock();
  s->refusals.reset();
  s->unreachable.reset();
  s->passthrough_warned.store(false);
  s->fault_reported.store(false);
}

void create_state() {
  Config c = Config::from_environment();
  set_log_level(c.log_level);
  for (const std::string& p : c.problems) log(LogLevel::warn, "%s", p.c_str());
  auto* s = new State(std::move(c));  // never destroyed: wrappers may run during exit
  ::pthread_atfork(fork_prepare, fork_parent, fork_child);
  if (s->config.disabled) {
    // VLAKE_DISABLE only where the quota file allows it (allow_disable); without a daemon there
    // is nothing to enforce (NVML attribution still charges the process's memory).
    switch (s->client.ask_passthrough()) {
      case DaemonClient::Passthrough::allowed:
        s->passthrough = true;
        log(LogLevel::info, "VLAKE_DISABLE is set and allowed for tenant %s: passing everything through",
            s->client.tenant_name().c_str());
        break;
      case DaemonClient::Passthrough::unreachable:
        s->passthrough = true;
        log(LogLevel::info, "VLAKE_DISABLE is set and vlaked is unreachable (%s): passing everything through",
            s->client.last_error().c_str());
        break;
      case DaemonClient::Passthrough::refused:
        log(LogLevel::warn,
            "VLAKE_DISABLE is set but the quota file does not allow it for tenant %s (allow_disable): the hook "
            "stays on",
            s->client.tenant_name().c_str());
        break;
    }
  }
  if (s->config.profile) Profile::get().enable();
  if (!s->config.reserve_stats.empty() && s->reserve.enabled()) {
    s->reserve.enable_stats();
    std::atexit(write_reserve_stats);
  }
  g_state.store(s, std::memory_order_release);
}

}  // namespace

State* state() noexcept {
  State* s = g_state.load(std::memory_order_acquire);
  if (s != nullptr) return s;
  if (!call_once_guarded(g_state_once, t_creating, create_state)) return nullptr;
  return g_state.load(std::memory_order_acquire);
}

// The state, or nullptr when the call must pass straight through (disabled or initializing).
State* active() noexcept {
  State* s = state();
  return s != nullptr && !s->passthrough ? s : nullptr;
}

// Records ctx -> device in the state's small table (first free or matching slot).
void remember_context(CUcontext ctx, int dev) noexcept {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr || ctx == nullptr) return;
  for (std::size_t i = 0; i < State::kContextSlots; ++i) {
    CUcontext seen = s->ctx_seen[i].load(std::memory_order_acquire);
    if (seen == ctx) return;
    if (seen == nullptr) {
      s->ctx_device[i].store(dev, std::memory_order_relaxed);
      CUcontext expected = nullptr;
      if (s->ctx_seen[i].compare_exchange_strong(expected, ctx, std::memory_order_acq_rel) || expected == ctx) {
        return;
      }
    }
  }
}

CUresult current_device(int& dev, CUcontext* ctx_out) {
  const UsedApi& api = used();
  if (api.cuCtxGetCurrent == nullptr || api.cuCtxGetDevice == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  CUcontext ctx = nullptr;
  if (CUresult rc = api.cuCtxGetCurrent(&ctx); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUdevice d = 0;
  if (CUresult rc = api.cuCtxGetDevice(&d); rc != CUDA_SUCCESS) return rc;
  dev = d;
  if (ctx_out != nullptr) *ctx_out = ctx;
  remember_context(ctx, d);
  return CUDA_SUCCESS;
}
// Every process reads Pressure (kHelloPressure): one that keeps no reserve may still register a
// reclaim callback later; the daemon asks only sessions that have something to give.
State::State(Config c)
    : config(std::move(c)),
      client(config, true),
      reserve(config.reserve_bytes, config.reserve_age),
      // Sizes up to 1/16 of the reserve, at most 1/8 of it per size in flight.
      prefetch(config.reserve_bytes > 0 ? config.prefetch : 0, config.reserve_bytes / 16, config.reserve_bytes / 8),
      reclaim([this](int device, std::uint64_t bytes) {
        {
          std::lock_guard lock(work_mu);
          after_reclaim.emplace_back(device, bytes);
          kicked = true;
        }
        work_cv.notify_one();
      }),
      seams(new alloc::ProcessSeams(*this)),
      policy(*seams, *seams, *seams, reserve, config.on_unreachable) {}

void start_worker(State& s) { ensure_worker(s); }
CUresult fence_allocation(const LogicalAlloc& a) {
  const UsedApi& api = used();
  if (a.ctx == nullptr || api.cuCtxGetCurrent == nullptr || api.cuCtxPushCurrent_v2 == nullptr ||
      api.cuCtxPopCurrent_v2 == nullptr) {
    return pass<Row::cuCtxSynchronize>(false);
  }
  CUcontext cur = nullptr;
  if (api.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == a.ctx) {
    return pass<Row::cuCtxSynchronize>(false);
  }
  if (CUresult rc = api.cuCtxPushCurrent_v2(a.ctx); rc != CUDA_SUCCESS) return rc;
  const CUresult rc = pass<Row::cuCtxSynchronize>(false);
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent_v2(&popped);
  return rc;
}

CUresult device_uuid(State& s, int dev, Uuid& out) {
  if (dev < 0 || dev >= static_cast<int>(proto::kMaxDevices)) return CUDA_ERROR_INVALID_DEVICE;
  {
    std::lock_guard lock(s.uuid_mu);
    if (s.uuids[static_cast<std::size_t>(dev)]) {
      out = *s.uuids[static_cast<std::size_t>(dev)];
      return CUDA_SUCCESS;
    }
  }
  const UsedApi& api = used();
  if (api.cuDeviceGetUuid_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUuuid u{};
  if (CUresult rc = api.cuDeviceGetUuid_v2(&u, dev); rc != CUDA_SUCCESS) return rc;
  out = Uuid::from_bytes(u.bytes);
  std::lock_guard lock(s.uuid_mu);
  s.uuids[static_cast<std::size_t>(dev)] = out;
  return CUDA_SUCCESS;
}

State* active_state() noexcept { return active(); }

State* existing_state() noexcept { return g_state.load(std::memory_order_acquire); }

CUresult current_device_of(int& dev) { return current_device(dev); }

bool stream_capturing(bool ptds, CUstream stream) { return capturing(effective_stream(ptds, stream)); }

bool capturing(CUstream stream) {
  const UsedApi& api = used();
  if (api.cuStreamIsCapturing == nullptr) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (api.cuStreamIsCapturing(stream, &st) != CUDA_SUCCESS) return false;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

CUstream effective_stream(bool ptds, CUstream s) { return ptds && s == nullptr ? CU_STREAM_PER_THREAD : s; }

}  // namespace vlake::hook
