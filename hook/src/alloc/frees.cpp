// Frees of the alloc path (alloc/internal.hpp): into the reserve or released, and the
// stream-ordered frees (pending.hpp, docs/hook.md "Stream-ordered frees").
#include "hook.hpp"

#include "alloc/internal.hpp"
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

// Frees a logical allocation of the alloc path: into the local reserve (after the fence that
// cuMemFree implies, unless the caller already fenced), or unmapped and its grant released.
CUresult free_logical(State& s, LogicalAlloc a, bool fenced) {
  // Memory with shared read-only chunks (docs/dedup.md) is never reused: it goes back at once;
  // so does exported memory (docs/ipc.md): another process may map it until the daemon says.
  bool shared = share::is_shared(a.grant_id);
  if (shared) share::forget(a.grant_id);
  if (ipc::exported(a.grant_id)) {
    ipc::forget(a.grant_id);
    shared = true;
  }
  // Memory on the host tier (tier.hpp) never serves a new allocation from the reserve or a kept
  // mapping: the allocation would run over PCIe, and after a restart of vlaked nobody would move it back.
  shared = shared || a.on_host;
  if (reserve_usable(s) && !shared) {
    CUresult rc = fenced ? CUDA_SUCCESS : fence_allocation(a);
    if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFree", rc);
    ReserveBlock b;
    b.alloc = std::move(a);
    b.freed = std::chrono::steady_clock::now();
    auto out = s.reserve.put(std::move(b));
    ensure_worker(s);
    retire_later(s, std::move(out));
    return rc;
  }
  // No reserve: the grant goes back now; its mapping stays kept when it qualifies (after the
  // fence cuMemFree implies: the daemon may hand the memory to another process of the tenant).
  CUresult rc = CUDA_SUCCESS;
  const bool keep = !shared && keepable(s, a);
  if (keep && !fenced) {
    rc = fence_allocation(a);
    if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFree", rc);
  }
  release_alloc(s, std::move(a), keep && rc == CUDA_SUCCESS);
  return rc;
}

EventState query_free(const PendingFree& f) {
  CUresult rc = CUDA_ERROR_INVALID_CONTEXT;  // a context that cannot be pushed runs nothing more
  in_context(f.ctx, [&] { rc = pass<Row::cuEventQuery>(false, f.event); });
  if (rc == CUDA_ERROR_NOT_READY) return EventState::pending;
  return rc == CUDA_SUCCESS ? EventState::complete : EventState::failed;
}

// Keeps a completed free's event for reuse (or destroys it) and frees the memory: the stream
// has passed the free, so nothing queued before it can touch the memory any more.
void complete_free(State& s, PendingFree& f) {
  in_context(f.ctx, [&] {
    if (f.state == EventState::failed) {
      const CUresult rc = pass<Row::cuEventQuery>(false, f.event);
      if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFreeAsync", rc);
    }
    if (f.state == EventState::failed || !s.events.release(f.ctx, f.event)) used().cuEventDestroy_v2(f.event);
  });
  free_logical(s, std::move(f.alloc), /*fenced=*/true);
  s.frees_completed.fetch_add(1, std::memory_order_acq_rel);
}

// Completes the frees whose stream has reached them; how many. On the worker, and on an
// application thread before its refused allocation is retried or its memory query answered (a
// query of an event never waits). `wait`: wait for completions in progress on another thread
// (else, when another thread is completing frees, leave it to that one).
std::size_t finish_frees(State& s, bool wait) {
  if (!s.frees.maybe_pending()) return 0;
  std::unique_lock lock(s.settle_mu, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return 0;
  }
  auto done = s.frees.take_done(query_free);
  for (PendingFree& f : done) complete_free(s, f);
  return done.size();
}

void settle_frees(State& s, bool outstanding) {
  if (outstanding) {
    std::lock_guard lock(s.settle_mu);  // the worker's completions in progress are finished
  }
  finish_frees(s);
}

// After a successful synchronization: frees waiting for their stream are likely complete now;
// the worker looks at once (one atomic load when there are none).
void wake_for_frees() noexcept {
  State* s = existing_state();
  if (s == nullptr || !s->frees.maybe_pending()) return;
  {
    std::lock_guard lock(s->work_mu);
    s->kicked = true;
  }
  s->work_cv.notify_one();
}

// At exit (worker stopped): frees still waiting get up to kExitWait in all for their streams and
// are completed; what is left then is left to the daemon, which takes every grant of the
// process back when its connection closes (the driver tears the mappings down with the process).
constexpr auto kExitWait = std::chrono::seconds(1);

void drain_frees_at_exit(State& s) {
  const auto deadline = std::chrono::steady_clock::now() + kExitWait;
  for (;;) {
    try {
      finish_frees(s);
    } catch (...) {
    }
    if (!s.frees.maybe_pending() || std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(s.frees.next_poll());
  }
}

// The event entry points the hook calls itself (used.def), as cudaTypedefs.h types them.
static_assert(std::is_same_v<decltype(UsedApi::cuEventCreate), PFN_cuEventCreate_v2000>);
static_assert(std::is_same_v<decltype(UsedApi::cuEventRecord), PFN_cuEventRecord_v2000>);
static_assert(std::is_same_v<decltype(UsedApi::cuEventDestroy_v2), PFN_cuEventDestroy_v4000>);

// Records an event on `stream` behind the work queued so far: an idle event of the current
// context, or a new one (CU_EVENT_DISABLE_TIMING). Sets ctx and ev on success.
CUresult record_free_event(State& s, CUstream stream, CUcontext& ctx, CUevent& ev) {
  const UsedApi& api = used();
  if (api.cuCtxGetCurrent == nullptr || api.cuEventCreate == nullptr || api.cuEventRecord == nullptr ||
      api.cuEventDestroy_v2 == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (CUresult rc = api.cuCtxGetCurrent(&ctx); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const CUevent idle = s.events.acquire(ctx);
  if (idle != nullptr && api.cuEventRecord(idle, stream) == CUDA_SUCCESS) {
    ev = idle;
    return CUDA_SUCCESS;
  }
  CUresult rc = api.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  if (rc == CUDA_SUCCESS) {
    rc = api.cuEventRecord(ev, stream);
    if (rc != CUDA_SUCCESS) api.cuEventDestroy_v2(ev);
  }
  // The idle event failed where a fresh one worked: it is stale (its context was destroyed and
  // another got the same handle) and is dropped untouched. Where both failed the stream is the
  // cause (e.g. one of another context: the caller waits instead) and it stays idle.
  if (idle != nullptr && rc != CUDA_SUCCESS && !s.events.release(ctx, idle)) api.cuEventDestroy_v2(idle);
  return rc;
}

// Hands a recorded free to the worker. Without one (exit under way, no thread) the caller waits
// for the event and frees here, as before.
CUresult free_after_event(State& s, PendingFree f) {
  ensure_worker(s);
  bool queued = false;
  {
    std::lock_guard lock(s.work_mu);
    if (s.worker_started && !s.stopping) {
      s.frees_queued.fetch_add(1, std::memory_order_acq_rel);
      s.frees.push(std::move(f));
      s.kicked = true;
      queued = true;
    }
  }
  if (queued) {
    s.work_cv.notify_one();
    return CUDA_SUCCESS;
  }
  const CUresult rc = pass<Row::cuEventSynchronize>(false, f.event);
  if (!s.events.release(f.ctx, f.event)) used().cuEventDestroy_v2(f.event);
  if (rc != CUDA_SUCCESS) {
    if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFreeAsync", rc);
    s.allocs.insert(std::move(f.alloc));  // not freed: as a failed cuStreamSynchronize left it
    return rc;
  }
  return free_logical(s, std::move(f.alloc), /*fenced=*/true);
}

}  // namespace vlake::hook
