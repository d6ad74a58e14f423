// AllocPolicy: how the hook obtains memory for an allocation (docs/hook.md, "Allocations"):
// which source serves it (the local reserve, a daemon grant, the driver directly), how often the
// daemon is asked, and what happens when it says no.
//
// The rules, in order
// - Overcommit tenants (docs/swap.md) are served by the driver after a counted grant (the
//   counted path), as cuMemAllocManaged always is: refused -> nothing allocated; the driver fails
//   -> the grant is given back; unreachable with passthrough -> the driver, uncharged.
// - Reserve hit: with the reserve usable (enabled, not in guard canary mode) and the granularity
//   known, a block that fits is placed without asking the daemon; a prefetched block used tells
//   the prefetcher (Driver::prefetch_hit).
// - Ask: a GrantRequest; an answer drop_kept drops this process's kept mappings on the device
//   and asks again, at most kDropKeptRounds times.
// - Refusals: the daemon refusing the process for a limit (Answer::Kind::refused) is never a
//   passthrough; unreachable is a passthrough only under VLAKE_ON_UNREACHABLE=passthrough.
//   A refusal for quota or memory (over_limit, namespace_over_limit, guarantee, out_of_memory)
//   while the reserve is usable or stream-ordered frees are outstanding settles those frees
//   (Driver::settle_frees), drains the device's reserve and asks once more, provided either gave
//   something back; it is reported once: after the retry, or at once when there was nothing to
//   retry with. Other refusals are reported as they stand.
// - A grant the driver cannot map is given back (release with no flags) and reported.
// - Prefetch: after a reserve miss served by a grant, a tenant with room for four times the
//   granted size tells the prefetcher (Driver::prefetch_miss).
//
// Contract: a decision class. Every effect goes through the seams (Daemon, Driver, Reports) and
// the reserve; it owns no socket, descriptor, clock or lock. Thread-safety: all methods may run
// concurrently if the seams and the reserve allow it (the hook's do); the last grant's facts
// are atomics. Errors: CUresults; exceptions of the seams propagate.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "vlake/common/cuda_api.hpp"  // first: cuda.h as the hook compiles it

#include "client.hpp"
#include "config.hpp"
#include "reserve.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/common/uuid.hpp"

namespace vlake::hook::alloc {

// A non-owning reference to a callable returning CUresult (no allocation on the hot path).
class CallRef {
 public:
  // `f` must outlive the CallRef (a temporary lives to the end of the full expression).
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, CallRef>>>
  CallRef(F&& f) noexcept  // NOLINT(google-explicit-constructor)
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o) -> CUresult { return (*static_cast<std::remove_reference_t<F>*>(o))(); }) {}
  CUresult operator()() const { return call_(obj_); }

 private:
  void* obj_;
  CUresult (*call_)(void*);
};

// The daemon's answer to one GrantRequest.
struct Answer {
  enum class Kind {
    reply,        // result holds the daemon's status (ok or a refusal)
    refused,      // the daemon refuses this process for a limit (why: its text)
    unreachable,  // no answer (why: the connection's error)
  };
  Kind kind = Kind::unreachable;
  GrantResult result;
  std::string why;
  // From the connection that answered (HelloAck): read on the hot path afterwards.
  std::uint64_t granularity = 0;
  proto::GuardMode guard = proto::GuardMode::off;
};

// The daemon side: grants and releases. Implemented over DaemonClient by the hook.
class Daemon {
 public:
  virtual ~Daemon() = default;
  // `flags`: GrantRequest::flags (proto::kGrantNoWait: refused at once rather than waiting).
  virtual Answer grant(const Uuid& gpu, Bytes bytes, proto::GrantPurpose purpose, std::uint32_t flags) = 0;
  virtual void release(std::uint64_t grant_id, std::uint32_t flags) = 0;
  // Drops this process's kept mappings on `device` and tells the daemon (Dropped).
  virtual void drop_kept(DeviceOrdinal device) = 0;
  // The tenant overcommits (docs/swap.md): device memory is the driver's, counted.
  virtual bool overcommit() = 0;
};

// The driver side and the process's books: imports, maps, unmaps, stream-ordered frees.
class Driver {
 public:
  virtual ~Driver() = default;
  virtual CUresult device_uuid(DeviceOrdinal device, Uuid& out) = 0;
  // Imports, maps and records the grant's memory as an allocation of `requested` bytes.
  virtual CUresult map(GrantResult& g, DeviceOrdinal device, CUcontext ctx, Bytes requested, CUdeviceptr* dptr) = 0;
  // Records mapped memory (a reserve block) as an allocation; `guard`: right-aligned.
  virtual void place(LogicalAlloc a, bool guard, CUcontext ctx, Bytes requested, CUdeviceptr* dptr) = 0;
  // Unmaps blocks that left the reserve and releases their grants.
  virtual void retire(std::vector<ReserveBlock>& blocks) = 0;
  // Records memory of the counted path (its free gives the grant back).
  virtual void record_counted(CUdeviceptr ptr, std::uint64_t grant_id) = 0;
  // Stream-ordered frees: handed over and completed so far (pending.hpp).
  virtual std::uint64_t frees_queued() = 0;
  virtual std::uint64_t frees_completed() = 0;
  // Completes the frees the streams have passed; `outstanding`: first wait for completions in
  // progress on other threads.
  virtual void settle_frees(bool outstanding) = 0;
  // Prefetch (prefetch.hpp): a prefetched block was used / the reserve missed this size.
  virtual void prefetch_hit(DeviceOrdinal device, Bytes size, CUcontext ctx) = 0;
  virtual void prefetch_miss(DeviceOrdinal device, Bytes size, CUcontext ctx) = 0;
};

// What the application is told about (logged, rate-limited by the implementation).
class Reports {
 public:
  virtual ~Reports() = default;
  virtual void refusal(const GrantResult& g, DeviceOrdinal device, Bytes requested) = 0;
  virtual void limit_refusal(const std::string& why, DeviceOrdinal device, Bytes requested) = 0;
  virtual void unreachable(const std::string& why, DeviceOrdinal device, Bytes requested) = 0;
  virtual void passthrough(const std::string& why) = 0;  // allocating without accounting
  virtual void map_failed(DeviceOrdinal device, Bytes granted, CUresult rc) = 0;
};

enum class Decision { granted, refused, passthrough };

struct Obtained {
  Decision decision = Decision::refused;
  CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
  GrantResult grant;  // granted, or refused by the daemon with a status
};

// Status drop_kept: drop the kept mappings and ask again, this many times at most.
inline constexpr int kDropKeptRounds = 4;
// Prefetch only while the tenant has room for this many times the granted size.
inline constexpr std::uint64_t kPrefetchRoom = 4;

// Refusals that returning this process's reserve or finishing its frees can change.
[[nodiscard]] bool quota_or_memory(proto::Status st) noexcept;

class AllocPolicy {
 public:
  AllocPolicy(Daemon& daemon, Driver& driver, Reports& reports, LocalReserve& reserve,
              OnUnreachable on_unreachable) noexcept
      : daemon_(daemon), driver_(driver), reports_(reports), reserve_(reserve), on_unreachable_(on_unreachable) {}

  // One request (with its drop_kept rounds) and the refusal and unreachable rules; a refusal
  // with a status is reported only if `report`. `flags`: the request's GrantRequest::flags.
  Obtained obtain(DeviceOrdinal device, Bytes bytes, proto::GrantPurpose purpose, bool report = true,
                  std::uint32_t flags = 0);

  // cuMemAlloc, cuMemAllocPitch and cuMemAllocAsync: `bytes` on `device` in `ctx`; `direct`
  // performs the call on the driver (passthrough and counted paths).
  CUresult serve_alloc(DeviceOrdinal device, CUcontext ctx, Bytes bytes, CUdeviceptr* dptr, CallRef direct);

  // The counted path: `allocate` (which sets *dptr) after a counted grant.
  CUresult serve_counted(DeviceOrdinal device, Bytes bytes, CUdeviceptr* dptr, CallRef allocate);

  // The reserve is used (enabled, and the guard is not in canary mode).
  [[nodiscard]] bool reserve_usable() const noexcept {
    return reserve_.enabled() && !canary_.load(std::memory_order_relaxed);
  }
  // From the last grant (0 / false before any).
  [[nodiscard]] std::uint64_t granularity() const noexcept { return granularity_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool canary() const noexcept { return canary_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool fault_guard() const noexcept { return fault_guard_.load(std::memory_order_relaxed); }

 private:
  Daemon& daemon_;
  Driver& driver_;
  Reports& reports_;
  LocalReserve& reserve_;
  const OnUnreachable on_unreachable_;
  std::atomic<std::uint64_t> granularity_{0};
  std::atomic<bool> canary_{false};       // guard canary mode: the reserve is not used
  std::atomic<bool> fault_guard_{false};  // guard fault mode: pointers are right-aligned
};

}  // namespace vlake::hook::alloc
