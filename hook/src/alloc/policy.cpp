// The allocation policy (policy.hpp).
#include "alloc/policy.hpp"

namespace vlake::hook::alloc {

using proto::GrantPurpose;
using proto::Status;

bool quota_or_memory(Status st) noexcept {
  return st == Status::over_limit || st == Status::namespace_over_limit || st == Status::guarantee ||
         st == Status::out_of_memory;
}

Obtained AllocPolicy::obtain(DeviceOrdinal device, Bytes bytes, GrantPurpose purpose, bool report,
                             std::uint32_t flags) {
  Obtained out;
  Uuid uuid{};
  if (CUresult rc = driver_.device_uuid(device, uuid); rc != CUDA_SUCCESS) {
    out.rc = rc;
    return out;
  }
  Answer a = daemon_.grant(uuid, bytes, purpose, flags);
  // The memory this process keeps mapped is what the request lacks (docs/hook.md, "Kept
  // mappings"): drop it (Dropped goes out before the next request) and ask again. Another thread
  // of this process (a reclaim callback emptying a framework's cache) may keep more meanwhile:
  // a few rounds.
  for (int round = 0; round < kDropKeptRounds && a.kind == Answer::Kind::reply && a.result.status == Status::drop_kept;
       ++round) {
    daemon_.drop_kept(device);
    a = daemon_.grant(uuid, bytes, purpose, flags);
  }
  switch (a.kind) {
    case Answer::Kind::refused:
      // The daemon is there and refuses this process for a limit: never a passthrough.
      reports_.limit_refusal(a.why, device, bytes);
      return out;
    case Answer::Kind::unreachable:
      if (on_unreachable_ == OnUnreachable::passthrough) {
        reports_.passthrough(a.why);
        out.decision = Decision::passthrough;
        return out;
      }
      reports_.unreachable(a.why, device, bytes);
      return out;
    case Answer::Kind::reply: break;
  }
  if (a.result.status != Status::ok) {
    if (report) reports_.refusal(a.result, device, bytes);
    out.grant = std::move(a.result);
    return out;
  }
  granularity_.store(a.granularity, std::memory_order_relaxed);
  canary_.store(a.guard == proto::GuardMode::canary, std::memory_order_relaxed);
  fault_guard_.store(a.guard == proto::GuardMode::fault, std::memory_order_relaxed);
  out.decision = Decision::granted;
  out.rc = CUDA_SUCCESS;
  out.grant = std::move(a.result);
  return out;
}

CUresult AllocPolicy::serve_counted(DeviceOrdinal device, Bytes bytes, CUdeviceptr* dptr, CallRef allocate) {
  Obtained o = obtain(device, bytes, GrantPurpose::counted);
  if (o.decision == Decision::refused) return o.rc;
  const CUresult rc = allocate();
  if (o.decision == Decision::passthrough) return rc;
  if (rc != CUDA_SUCCESS) {
    daemon_.release(o.grant.grant_id, 0);
    return rc;
  }
  driver_.record_counted(*dptr, o.grant.grant_id);
  return rc;
}

CUresult AllocPolicy::serve_alloc(DeviceOrdinal device, CUcontext ctx, Bytes bytes, CUdeviceptr* dptr, CallRef direct) {
  // Overcommit: the driver's memory, not the pool's, so that the process can be checkpointed.
  if (daemon_.overcommit()) return serve_counted(device, bytes, dptr, direct);
  const bool reserve = reserve_usable();
  if (reserve) {
    const std::uint64_t gran = granularity();
    ReserveBlock b;
    if (gran != 0 && reserve_.take(device.value(), round_up(bytes, Bytes{gran}).value(), gran, b)) {
      const bool prefetched = b.prefetched;
      const Bytes size{b.alloc.mapped};
      driver_.place(std::move(b.alloc), fault_guard(), ctx, bytes, dptr);
      // A prefetched block used: its replacement, while the size still misses.
      if (prefetched) driver_.prefetch_hit(device, size, ctx);
      return CUDA_SUCCESS;
    }
    if (gran == 0) reserve_.note_miss(bytes.value());  // the first grant tells the granularity
  }
  // Stream-ordered frees not completed yet: those the stream has passed (the application
  // synchronized) count before a refusal, whoever completes them.
  const std::uint64_t completed = driver_.frees_completed();
  const bool pending = driver_.frees_queued() != completed;
  const bool report_first = !reserve && !pending;
  Obtained o = obtain(device, bytes, GrantPurpose::alloc, report_first);
  if (!report_first && o.decision == Decision::refused && !quota_or_memory(o.grant.status)) {
    // Not a refusal that returning the reserve can change: reported as it stands.
    reports_.refusal(o.grant, device, bytes);
  }
  if (!report_first && o.decision == Decision::refused && quota_or_memory(o.grant.status)) {
    driver_.settle_frees(pending);
    const bool freed = driver_.frees_completed() != completed;
    auto mine = reserve_.drain(device.value(), 0);
    if (!mine.empty() || freed) {
      driver_.retire(mine);
      o = obtain(device, bytes, GrantPurpose::alloc);
    } else {
      reports_.refusal(o.grant, device, bytes);
    }
  }
  if (o.decision == Decision::passthrough) return direct();
  if (o.decision == Decision::refused) return o.rc;
  const std::uint64_t grant_id = o.grant.grant_id;
  const Bytes granted{o.grant.bytes};
  const Bytes room{o.grant.limit > o.grant.used ? o.grant.limit - o.grant.used : 0};
  const CUresult rc = driver_.map(o.grant, device, ctx, bytes, dptr);
  if (rc != CUDA_SUCCESS) {
    // vlaked granted the memory, but this process could not map it (the driver's own memory for
    // mappings may have run out on a full GPU): say so, the application only sees the CUresult.
    daemon_.release(grant_id, 0);
    reports_.map_failed(device, granted, rc);
    return rc;
  }
  // The reserve missed this size (docs/hook.md, "Prefetch"): the worker fetches more of it, as
  // long as the tenant has room for four times that.
  if (reserve && room >= kPrefetchRoom * granted) driver_.prefetch_miss(device, granted, ctx);
  return rc;
}

}  // namespace vlake::hook::alloc
