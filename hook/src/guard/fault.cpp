// Fault and refused-write reports (hook.hpp, docs/guard.md).
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

// ---- Fault reporting ----------------------------------------------------------------------------

namespace {

// The device of the calling thread's current context, even when the context carries a sticky
// fault (then cuCtxGetDevice fails and the table of contexts seen earlier answers). -1 if
// unknown.
int faulting_device(State& s) {
  const UsedApi& api = used();
  CUcontext ctx = nullptr;
  if (api.cuCtxGetCurrent == nullptr || api.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    return -1;
  }
  CUdevice d = 0;
  if (api.cuCtxGetDevice != nullptr && api.cuCtxGetDevice(&d) == CUDA_SUCCESS) return d;
  for (std::size_t i = 0; i < State::kContextSlots; ++i) {
    if (s.ctx_seen[i].load(std::memory_order_acquire) == ctx) {
      return s.ctx_device[i].load(std::memory_order_relaxed);
    }
  }
  return -1;
}

std::string format_age(std::chrono::nanoseconds age) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(age).count();
  if (ms < 10000) return std::to_string(ms) + " ms";
  return std::to_string(ms / 1000) + " s";
}

void report_fault_impl(State& s, const char* call, CUresult rc) {
  int dev = faulting_device(s);
  if (dev < 0) {
    // No context to ask: the device of this process's newest allocation, else GPU 0.
    dev = 0;
    for (int d = 0; d < static_cast<int>(proto::kMaxDevices); ++d) {
      if (s.allocs.count(d) != 0) {
        dev = d;
        break;
      }
    }
  }
  proto::GuardEvent ev{};
  // What is known, no more: whether this process maps shared read-only chunks on that GPU (the
  // driver does not say which address faulted, docs/guard.md).
  ev.kind = share::holds_shared(dev) ? proto::GuardKind::fault_maps_shared : proto::GuardKind::fault;
  ev.cuda_status = static_cast<std::int32_t>(rc);
  std::snprintf(ev.call, sizeof ev.call, "%s", call);
  Uuid uuid{};
  const bool have_uuid = device_uuid(s, dev, uuid) == CUDA_SUCCESS;
  if (have_uuid) uuid.copy_to(ev.device_uuid);
  ev.live_allocations = static_cast<std::uint32_t>(s.allocs.count(dev));
  const auto now = std::chrono::steady_clock::now();
  const auto suspects = s.allocs.newest(dev, proto::kMaxGuardSuspects);
  std::string list;
  for (const LogicalAlloc& a : suspects) {
    const auto age = std::chrono::duration_cast<std::chrono::nanoseconds>(now - a.created);
    proto::GuardSuspect& g = ev.suspects[ev.suspect_count++];
    g.address = a.ptr;
    g.bytes = a.requested;
    g.age_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, age.count()));
    char item[96];
    std::snprintf(item, sizeof item, "%s0x%llx (%s, %s ago)", list.empty() ? "" : ", ",
                  static_cast<unsigned long long>(a.ptr), format_bytes(a.requested).c_str(), format_age(age).c_str());
    list += item;
  }
  if (list.empty()) list = "none (no live allocation served by vlake on this GPU)";
  std::string outcome;
  if (!have_uuid) {
    outcome = "not reported to vlaked (the GPU's UUID is unknown)";
  } else if (s.client.send_guard_event(ev)) {
    outcome = "reported to vlaked as a kernel fault";
  } else {
    outcome = "could not be reported to vlaked (" + s.client.last_error() + ")";
  }
  log(LogLevel::error, "GPU fault (%s) on GPU %d in %s; %s; the newest allocations were: %s",
      rc == CUDA_ERROR_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "error", dev, call, outcome.c_str(),
      list.c_str());
}

void report_refused_write_impl(State& s, const char* call, std::uint64_t dst, std::uint64_t bytes, CUresult rc) {
  const auto hit = share::readonly_hit(s, dst, bytes);
  if (!hit) return;
  proto::ReadOnlyWrite m{};
  m.grant_id = hit->grant_id;
  m.address = dst;
  m.bytes = bytes;
  m.alloc_address = hit->alloc_ptr;
  m.alloc_bytes = hit->alloc_bytes;
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  m.alloc_age_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, now_ns - hit->alloc_born_ns));
  m.shared_offset = hit->shared_offset;
  m.shared_bytes = hit->shared_bytes;
  m.cuda_status = static_cast<std::int32_t>(rc);
  std::snprintf(m.call, sizeof m.call, "%s", call);
  Uuid uuid{};
  std::string outcome;
  if (device_uuid(s, hit->device, uuid) != CUDA_SUCCESS) {
    outcome = "not reported to vlaked (the GPU's UUID is unknown)";
  } else {
    uuid.copy_to(m.device_uuid);
    outcome = s.client.send_readonly_write(m) ? "reported to vlaked"
                                              : "could not be reported to vlaked (" + s.client.last_error() + ")";
  }
  log(LogLevel::error,
      "%s into shared read-only memory refused by the driver (CUresult %d): destination 0x%llx, %s, overlaps %s "
      "shared from offset %llu of allocation 0x%llx (%s) on GPU %d; %s",
      call, static_cast<int>(rc), static_cast<unsigned long long>(dst), format_bytes(bytes).c_str(),
      format_bytes(hit->shared_bytes).c_str(), static_cast<unsigned long long>(hit->shared_offset),
      static_cast<unsigned long long>(hit->alloc_ptr), format_bytes(hit->alloc_bytes).c_str(), hit->device,
      outcome.c_str());
}

}  // namespace

__attribute__((cold, noinline)) void report_refused_write(const char* call, std::uint64_t dst, std::uint64_t bytes,
                                                          CUresult rc) noexcept {
  try {
    State* s = active();
    if (s == nullptr) return;
    report_refused_write_impl(*s, call, dst, bytes, rc);
  } catch (...) {
  }
}

__attribute__((cold, noinline)) void report_fault(const char* call, CUresult rc) noexcept {
  try {
    State* s = active();
    if (s == nullptr || s->fault_reported.exchange(true)) return;
    report_fault_impl(*s, call, rc);
  } catch (...) {
  }
}

}  // namespace vlake::hook
