// Dedup, hook side (docs/dedup.md): vlake_share_readonly() (public header
// hook/include/vlake/share.h) re-lays one allocation out as the daemon plans it — shared chunks
// mapped read-only, private copies and kept handles read-write — and the bookkeeping the rest of
// the hook needs: which grants hold shared chunks (their memory never enters the local reserve,
// a kernel fault in a process holding shared chunks is reported with that attribute, and a
// refused copy or memset into a shared range is reported as such: readonly_hit()).
// Transparent mode (docs/dedup.md "Transparent mode"): offer_upload() is called by the
// cuMemcpyHtoD wrappers after a successful copy and shares the allocation when the upload filled
// it whole (ShareRequest flag kShareTransparent). Its failures never reach the application.
//
// Thread-safety: every function may be called from any thread (one internal mutex for the
// table; the daemon connection serializes requests itself).
#pragma once

#include <cstdint>
#include <optional>

#include "vlake/share.h"

namespace vlake::hook {

struct State;

namespace share {

// The implementation of vlake_share_readonly_ex (never throws: errors become statuses).
int share_readonly(State& s, std::uint64_t ptr, std::uint64_t bytes, vlake_share_result* out) noexcept;
// After a successful host-to-device copy of `bytes` to `dst`: if `dst` is exactly the pointer of
// an alloc-path allocation, the copy covers its whole requested size, the allocation holds at
// least one whole chunk, it was neither shared nor offered before, and this process's connection
// was not told dedup_disabled, shares the allocation with kShareTransparent. The caller has made
// sure the copied data is in place (Async: the stream is synchronized; the share also fences the
// allocation's context). dedup_disabled is remembered (no more offers) until the process forks
// (the child asks again). Failures are logged at debug only. Never throws.
void offer_upload(State& s, std::uint64_t dst, std::uint64_t bytes) noexcept;
// True if offer_upload(s, dst, bytes) would offer the allocation now (same rules, nothing
// recorded): the Async wrapper synchronizes its stream only then. Never throws.
[[nodiscard]] bool would_offer(State& s, std::uint64_t dst, std::uint64_t bytes) noexcept;
// Cheap pre-check for the wrappers: false once this process was told dedup_disabled, or when
// `bytes` is too small to hold a whole chunk.
[[nodiscard]] bool may_offer(const State& s, std::uint64_t bytes) noexcept;
// True if grant `grant_id` holds shared chunks (its allocation must not be reused privately).
[[nodiscard]] bool is_shared(std::uint64_t grant_id) noexcept;
// The grant was released: forget it.
void forget(std::uint64_t grant_id) noexcept;
// True if this process holds shared chunks on `device`.
[[nodiscard]] bool holds_shared(int device) noexcept;

// Where the destination [dst, dst + bytes) of a write overlaps shared read-only chunks of this
// process: the allocation (the one holding its first byte, else its last byte), the offset of
// the first shared byte it overlaps from the allocation's pointer, and the shared bytes it
// overlaps. For the failure path of copies and memsets only: a process that shares nothing
// answers without a lock. Never throws.
struct ReadOnlyHit {
  std::uint64_t grant_id = 0;
  int device = 0;
  std::uint64_t alloc_ptr = 0;     // the allocation's pointer
  std::uint64_t alloc_bytes = 0;   // its requested size
  std::int64_t alloc_born_ns = 0;  // its creation time (steady clock, ns since its epoch)
  std::uint64_t shared_offset = 0;
  std::uint64_t shared_bytes = 0;
};
[[nodiscard]] std::optional<ReadOnlyHit> readonly_hit(State& s, std::uint64_t dst, std::uint64_t bytes) noexcept;

}  // namespace share
}  // namespace vlake::hook
