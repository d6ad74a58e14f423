// The simulated driver's streams, events and context synchronization: cuCtxSynchronize(_v2),
// cuStream{Create,Destroy_v2,Synchronize,Query,WaitEvent}, cuEvent{Create,Record,Query,
// Synchronize,Destroy_v2,ElapsedTime_v2} and their per-thread variants. Streams are
// synchronous: every operation has completed when its call returns; VLAKE_SIM_EVENT_LAG_MS
// makes events (and what waits for them) complete later (docs/simulator.md).
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

// VLAKE_SIM_EVENT_LAG_MS (docs/simulator.md): a GPU still working through its streams, as seen
// through events. An event recorded at t completes at t + lag; stream and context
// synchronizations wait for every event recorded before them, stream queries answer
// CUDA_ERROR_NOT_READY until then. 0 (unset): events complete when recorded.
std::chrono::milliseconds event_lag() {
  static const std::chrono::milliseconds lag = [] {
    const char* v = std::getenv("VLAKE_SIM_EVENT_LAG_MS");
    if (v == nullptr || *v == '\0') return std::chrono::milliseconds(0);
    char* end = nullptr;
    const long ms = std::strtol(v, &end, 10);
    return *end == '\0' && ms > 0 ? std::chrono::milliseconds(ms) : std::chrono::milliseconds(0);
  }();
  return lag;
}

// The completion time of the latest event recorded in this process (steady clock, ns).
std::atomic<std::int64_t> g_events_done_ns{0};

std::int64_t ns_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Waits until every event recorded so far is complete (lag only).
void wait_recorded_events() {
  if (event_lag().count() == 0) return;
  const std::int64_t done = g_events_done_ns.load(std::memory_order_acquire);
  const std::int64_t now = ns_of(std::chrono::steady_clock::now());
  if (done > now) std::this_thread::sleep_for(std::chrono::nanoseconds(done - now));
}

bool recorded_events_pending() {
  return event_lag().count() != 0 &&
         g_events_done_ns.load(std::memory_order_acquire) > ns_of(std::chrono::steady_clock::now());
}

// Registers a new stream or event of `ctx` with `flags` in `live` (g_proc->streams or ->events)
// and hands it out through `out`.
template <class Set, class Obj>
CUresult register_new(Set& live, CUctx_st* ctx, unsigned flags, Obj** out) {
  auto o = std::make_unique<Obj>();
  o->ctx = ctx;
  o->flags = flags;
  std::unique_lock lock(g_proc->mu);
  live.insert(o.get());
  *out = o.release();
  return CUDA_SUCCESS;
}

// Destroys a stream or event registered in `live`; one not there is rules::kBadStreamOrEvent.
template <class Set>
CUresult destroy_registered(Set& live, typename Set::key_type h) {
  return in_context([&](CUctx_st*) -> CUresult {
    std::unique_lock lock(g_proc->mu);
    if (live.erase(h) == 0) return rules::kBadStreamOrEvent;
    delete h;
    return CUDA_SUCCESS;
  });
}

}  // namespace

VLAKE_SIM_API CUresult cuCtxSynchronize() {
  VLAKE_SIM_COUNT(cuCtxSynchronize);
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  wait_recorded_events();
  vlake::sim::pools::synchronized();
  return CUDA_SUCCESS;
}

// CUDA 13: synchronizes `ctx` (null: the current context) without making it current. A handle
// that is not a live primary context is CUDA_ERROR_INVALID_CONTEXT; the context's sticky error
// is returned like cuCtxSynchronize's.
VLAKE_SIM_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  VLAKE_SIM_COUNT(cuCtxSynchronize_v2);
  if (ctx == nullptr) return cuCtxSynchronize();
  if (CUresult rc = check_init(); rc != CUDA_SUCCESS) return rc;
  CUctx_st* c = ctx_of_handle(ctx);
  if (c == nullptr || c->retains.load() <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult sticky = c->sticky.load(); sticky != CUDA_SUCCESS) return sticky;
  wait_recorded_events();
  vlake::sim::pools::synchronized();
  return CUDA_SUCCESS;
}

// =================================================================================================
// Streams and events (synchronous: every operation has completed when its call returns)
// =================================================================================================

VLAKE_SIM_API CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuStreamCreate);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    if (phStream == nullptr || (Flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return register_new(g_proc->streams, ctx, Flags, phStream);
  });
}

VLAKE_SIM_API CUresult cuStreamDestroy_v2(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamDestroy_v2);
  return destroy_registered(g_proc->streams, hStream);
}

namespace {

CUresult stream_sync(CUstream hStream, bool query) {
  return in_context([&](CUctx_st*) -> CUresult {
    if (!stream_ok(hStream)) return rules::kBadStreamOrEvent;
    if (vlake::sim::pools::capturing(hStream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (query && recorded_events_pending()) return CUDA_ERROR_NOT_READY;
    wait_recorded_events();
    vlake::sim::pools::synchronized();
    return CUDA_SUCCESS;
  });
}
}  // namespace

VLAKE_SIM_API CUresult cuStreamSynchronize(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamSynchronize);
  return stream_sync(hStream, false);
}

VLAKE_SIM_API CUresult cuStreamQuery(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamQuery);
  return stream_sync(hStream, true);
}

VLAKE_SIM_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuStreamWaitEvent);
  return in_context([&](CUctx_st*) -> CUresult {
    if ((Flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::shared_lock lock(g_proc->mu);
    if (!valid_stream(hStream) || g_proc->events.count(hEvent) == 0) {
      return rules::kBadStreamOrEvent;
    }
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuEventCreate);
  return in_context([&](CUctx_st* ctx) -> CUresult {
    const unsigned allowed = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == nullptr || (Flags & ~allowed) != 0) return CUDA_ERROR_INVALID_VALUE;
    return register_new(g_proc->events, ctx, Flags, phEvent);
  });
}

VLAKE_SIM_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  VLAKE_SIM_COUNT(cuEventRecord);
  return in_context([&](CUctx_st*) -> CUresult {
    std::unique_lock lock(g_proc->mu);
    if (g_proc->events.count(hEvent) == 0 || !valid_stream(hStream)) {
      return rules::kBadStreamOrEvent;
    }
    hEvent->recorded = true;
    hEvent->when = std::chrono::steady_clock::now();
    hEvent->done = hEvent->when + event_lag();
    if (event_lag().count() != 0) {
      const std::int64_t done = ns_of(hEvent->done);
      std::int64_t prev = g_events_done_ns.load(std::memory_order_acquire);
      while (prev < done && !g_events_done_ns.compare_exchange_weak(prev, done, std::memory_order_acq_rel)) {
      }
    }
    return CUDA_SUCCESS;
  });
}

namespace {
// CUDA_SUCCESS, CUDA_ERROR_NOT_READY (VLAKE_SIM_EVENT_LAG_MS: recorded, not complete yet; `done`
// says when it will be) or an invalid handle.
CUresult event_query(CUevent hEvent, std::chrono::steady_clock::time_point* done = nullptr) {
  return in_context([&](CUctx_st*) -> CUresult {
    std::shared_lock lock(g_proc->mu);
    if (g_proc->events.count(hEvent) == 0) return rules::kBadStreamOrEvent;
    if (hEvent->recorded && hEvent->done > std::chrono::steady_clock::now()) {
      if (done != nullptr) *done = hEvent->done;
      return CUDA_ERROR_NOT_READY;
    }
    return CUDA_SUCCESS;
  });
}
}  // namespace

VLAKE_SIM_API CUresult cuEventQuery(CUevent hEvent) {
  VLAKE_SIM_COUNT(cuEventQuery);
  return event_query(hEvent);
}

VLAKE_SIM_API CUresult cuEventSynchronize(CUevent hEvent) {
  VLAKE_SIM_COUNT(cuEventSynchronize);
  std::chrono::steady_clock::time_point done{};
  CUresult rc = event_query(hEvent, &done);
  if (rc == CUDA_ERROR_NOT_READY) {
    std::this_thread::sleep_until(done);
    rc = CUDA_SUCCESS;
  }
  if (rc == CUDA_SUCCESS) vlake::sim::pools::synchronized();
  return rc;
}

VLAKE_SIM_API CUresult cuEventDestroy_v2(CUevent hEvent) {
  VLAKE_SIM_COUNT(cuEventDestroy_v2);
  return destroy_registered(g_proc->events, hEvent);
}

VLAKE_SIM_API CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  VLAKE_SIM_COUNT(cuEventElapsedTime_v2);
  return in_context([&](CUctx_st*) -> CUresult {
    if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_proc->mu);
    if (g_proc->events.count(hStart) == 0 || g_proc->events.count(hEnd) == 0) {
      return rules::kBadStreamOrEvent;
    }
    if (!hStart->recorded || !hEnd->recorded || ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING) != 0) {
      return rules::kElapsedUnrecorded;
    }
    *pMilliseconds = std::chrono::duration<float, std::milli>(hEnd->when - hStart->when).count();
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamSynchronize_ptsz);
  return cuStreamSynchronize(hStream);
}

VLAKE_SIM_API CUresult cuStreamQuery_ptsz(CUstream hStream) {
  VLAKE_SIM_COUNT(cuStreamQuery_ptsz);
  return cuStreamQuery(hStream);
}

VLAKE_SIM_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  VLAKE_SIM_COUNT(cuStreamWaitEvent_ptsz);
  return cuStreamWaitEvent(hStream, hEvent, Flags);
}

VLAKE_SIM_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  VLAKE_SIM_COUNT(cuEventRecord_ptsz);
  return cuEventRecord(hEvent, hStream);
}
