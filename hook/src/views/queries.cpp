// The virtualized memory queries (hook.hpp): cuMemGetInfo and cuDeviceTotalMem answer with the
// tenant's limit and usage (docs/hook.md "Memory queries").
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

std::uint64_t saturating_sub(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

std::optional<UsageResult> usage_of(State& s, const Uuid& uuid) {
  // The generation and the time are read before asking: a change racing the request leaves the
  // answer stale (usage_cache.hpp).
  const std::uint64_t generation = s.client.changes();
  const auto now = UsageCache::Clock::now();
  if (auto c = s.usage_cache.get(uuid, generation, now)) {
    return UsageResult{Status::ok, c->total, c->limit, c->used};
  }
  auto u = s.client.usage(uuid);
  if (u && u->status == Status::ok) s.usage_cache.put(uuid, UsageFigures{u->total, u->limit, u->used}, generation, now);
  return u;
}

void virtualize_memory_info(const UsageResult& u, std::size_t& free, std::size_t& total) noexcept {
  const std::uint64_t real_total = total;
  const std::uint64_t real_free = free;
  total = static_cast<std::size_t>(std::min(u.limit, real_total));
  free = static_cast<std::size_t>(std::min(saturating_sub(u.limit, u.used), real_free));
}

// ---- Virtualized queries ------------------------------------------------------------------------

CUresult on_cuMemGetInfo_v2(bool ptds, size_t* free, size_t* total) {
  const CUresult rc = pass<Row::cuMemGetInfo_v2>(ptds, free, total);
  State* s = active();
  if (rc != CUDA_SUCCESS || s == nullptr) return rc;
  int dev = 0;
  Uuid uuid{};
  if (current_device(dev) != CUDA_SUCCESS || device_uuid(*s, dev, uuid) != CUDA_SUCCESS) {
    return rc;
  }
  // Stream-ordered frees the stream has passed are freed first, including any the background
  // thread is completing right now (waited for: its release must precede this answer).
  settle_frees(*s,
               s->frees_queued.load(std::memory_order_acquire) != s->frees_completed.load(std::memory_order_acquire));
  if (auto u = usage_of(*s, uuid); u && u->status == Status::ok) {
    // Memory in this process's reserve is free to it: the next allocations reuse it.
    const std::uint64_t mine = s->reserve.bytes(dev);
    u->used = saturating_sub(u->used, mine);
    *free += static_cast<std::size_t>(mine);
    virtualize_memory_info(*u, *free, *total);
  }
  return rc;
}

CUresult on_cuDeviceTotalMem_v2(bool ptds, size_t* bytes, CUdevice dev) {
  const CUresult rc = pass<Row::cuDeviceTotalMem_v2>(ptds, bytes, dev);
  State* s = active();
  if (rc != CUDA_SUCCESS || s == nullptr) return rc;
  Uuid uuid{};
  if (device_uuid(*s, dev, uuid) != CUDA_SUCCESS) return rc;
  if (auto u = usage_of(*s, uuid); u && u->status == Status::ok) {
    *bytes = static_cast<size_t>(std::min<std::uint64_t>(u->limit, *bytes));
  }
  return rc;
}

}  // namespace vlake::hook
