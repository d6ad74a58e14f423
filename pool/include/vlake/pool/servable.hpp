// vlake::pool servable — the largest grant the free pool can serve without creating a handle,
// the figure behind vlake_pool_fragmentation_ratio (docs/pool.md, "What the free pool can serve").
//
// A grant is served from free handles whose sizes add up to exactly its size, at most
// `max_handles` of them (proto::kMaxHandlesPerGrant = 32 for allocations, 1 for cuMemCreate
// grants), and with `--handle-reuse tenant` only from unbound handles and handles bound to the
// grant's tenant (planner.hpp: `foreign` handles are never stitched). So the largest grant
// tenant T can be served from the free pool alone is the sum of the `max_handles` largest free
// handles T may use — the planner's stitch search (largest sizes first, as many of each as fit)
// finds exactly that combination on its first path. Any larger grant needs a new handle
// (created in free GPU memory, or after releasing free handles).
//
// Contract:
//   largest_servable(free, t, k): sum of the k largest handles of `free` that are unbound or
//     bound to `t` (t nullopt: a tenant with no bound handle here, e.g. a new one: unbound
//     handles only). k = 0 counts as 1.
//   servable(free, k): `largest` = the maximum of largest_servable over every tenant that has
//     a bound handle in `free` and over a tenant that has none; `unbound` = the latter.
//   Pass `bound` only when binding is on (`--handle-reuse node`: every handle unbound).
// Not every smaller size is servable (sizes must add up exactly: 6 MiB from two free 4 MiB
// handles is not), and quota limits are not considered. Pure; thread-safe; O(n) for n free
// handles (selection of the k largest).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

struct ServableHandleView {
  Bytes size{0};
  std::optional<TenantId> bound;  // bound to this tenant (serves only it); nullopt: any tenant
};

struct Servable {
  Bytes largest{0};  // the largest grant one tenant can be served from the free pool
  Bytes unbound{0};  // the same for a tenant with no bound handle here (a new tenant)
};

Bytes largest_servable(std::span<const ServableHandleView> free, std::optional<TenantId> tenant,
                       std::uint32_t max_handles);

Servable servable(std::span<const ServableHandleView> free, std::uint32_t max_handles);

}  // namespace vlake::pool
