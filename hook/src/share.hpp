// Dedup, hook side (docs/dedup.md): vlake_share_readonly() (public header
// hook/include/vlake/share.h) re-lays one allocation out as the daemon plans it — shared chunks
// mapped read-only, private copies and kept handles read-write — and the bookkeeping the rest of
// the hook needs: which grants hold shared chunks (their memory never enters the local reserve,
// and a kernel fault in a process holding shared chunks is reported as kind `readonly`).
//
// Thread-safety: every function may be called from any thread (one internal mutex for the
// table; the daemon connection serializes requests itself).
#pragma once

#include <cstdint>

#include "vlake/share.h"

namespace vlake::hook {

struct State;

namespace share {

// The implementation of vlake_share_readonly_ex (never throws: errors become statuses).
int share_readonly(State& s, std::uint64_t ptr, std::uint64_t bytes, vlake_share_result* out) noexcept;
// True if grant `grant_id` holds shared chunks (its allocation must not be reused privately).
[[nodiscard]] bool is_shared(std::uint64_t grant_id) noexcept;
// The grant was released: forget it.
void forget(std::uint64_t grant_id) noexcept;
// True if this process holds shared chunks on `device`.
[[nodiscard]] bool holds_shared(int device) noexcept;

}  // namespace share
}  // namespace vlake::hook
