// vlake::pool planner — which handles serve a grant (docs/pool.md, "Planner and cost model").
//
// Pure logic: no driver, no clock. The DevicePool describes its free handles and the GPU's free
// memory; plan() returns the cheapest way to serve `bytes` as a list of handles whose sizes sum
// to exactly `bytes`:
// Free handles marked `foreign` (bound to another tenant, docs/pool.md "Handle binding") are
// never used for exact/stitch; release_create may release them.
//   exact          one free handle of that size
//   stitch         several free handles (any sizes, any previous tenant) mapped back to back
//   create         one new handle of that size (needs room on the GPU)
//   release_create free handles released (least recently freed first), then one new handle
//   none           none of these is possible (the caller may apply pressure)
// Costs are estimated from a CostModel: per-call driver costs the daemon measures on itself
// (EWMA, per GPU, seeded with H100 medians: docs/pool.md) plus the tenant's per-handle cost of
// import + map + set-access, estimated from the same measured calls (the tenant uses the same
// driver on the same GPU).
//
// Thread-safety: CostModel is a plain value (no locking); plan() is a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

// Per-call costs in nanoseconds. Seeds: medians measured on an H100 80GB, driver 580 (docs/pool.md,
// "Planner and cost model").
struct CostModel {
  enum class Call { create, export_fd, map, set_access, release, scrub };

  double create_ns = 15'000;      // cuMemCreate (12-17 us for 2 MiB)
  double export_ns = 33'000;      // cuMemExportToShareableHandle
  double map_ns = 1'000;          // cuMemMap
  double set_access_ns = 33'000;  // cuMemSetAccess, one mapping (20-47 us; 17 ms / 512)
  double release_ns = 33'000;     // cuMemUnmap (15-28 us) + cuMemRelease (13 us) of a daemon handle
  double scrub_ns_per_mib = 700;  // memset bandwidth part of a scrub (~1.5 TB/s)
  // Fixed part of one scrub (launch + synchronize); not updated (the per-MiB part absorbs drift).
  static constexpr double kScrubFixedNs = 10'000;
  // A tenant imports an fd in 21-96 us where the daemon exports in ~33 us: import is estimated
  // as this multiple of the measured export cost.
  static constexpr double kImportPerExport = 1.5;
  // EWMA weight of a new sample.
  double alpha = 0.2;

  // Folds one measured duration into the model (bytes: the scrubbed size, for Call::scrub).
  void observe(Call c, double ns, Bytes bytes = Bytes{0});

  // What one more handle in a grant costs the tenant: import + map + set-access.
  [[nodiscard]] double tenant_per_handle() const { return kImportPerExport * export_ns + map_ns + set_access_ns; }
  // What creating one handle costs the daemon: create + export + map + set-access (its own
  // read-write mapping, for scrubbing).
  [[nodiscard]] double daemon_create() const { return create_ns + export_ns + map_ns + set_access_ns; }
  [[nodiscard]] double scrub(Bytes b) const {
    return kScrubFixedNs + scrub_ns_per_mib * static_cast<double>(b.value()) / static_cast<double>(1u << 20);
  }
};

// One free handle as the planner sees it.
struct FreeHandleView {
  Bytes size;
  std::optional<TenantId> last_tenant;  // nullopt: never granted
  bool clean = false;                   // holds zeros (warm reserve): no scrub for anyone
  std::uint64_t freed_seq = 0;          // when it entered the free pool (larger: more recent)
  bool foreign = false;                 // bound to another tenant: never used, may be released
  bool kept_here = false;               // the requesting process keeps it mapped: preferred
  // Another process keeps it mapped (docs/hook.md, "Kept mappings"): taken whole (an exact
  // fit), or in a stitch only when the GPU has no room for a new handle (it would cost that
  // process its mapping and this grant an import per handle).
  bool kept_elsewhere = false;
};

struct PlanInput {
  Bytes bytes;  // a positive multiple of the granularity
  TenantId tenant;
  std::vector<FreeHandleView> free;
  Bytes device_free{0};            // what the GPU can still give (cuMemGetInfo free)
  std::uint32_t max_handles = 32;  // 1 for grants whose handle goes to the application
};

enum class PlanKind { none, exact, stitch, create, release_create };
const char* plan_kind_name(PlanKind k) noexcept;

struct Plan {
  PlanKind kind = PlanKind::none;
  std::vector<std::size_t> use;      // indices into PlanInput::free, in VA order
  std::vector<std::size_t> release;  // indices into PlanInput::free to release first
  double cost_ns = 0;
  std::uint32_t scrubs = 0;   // handles that need zeroing
  bool cross_tenant = false;  // uses a handle another tenant freed
};

// True if handing `h` to `tenant` needs a scrub.
bool needs_scrub(const FreeHandleView& h, TenantId tenant) noexcept;

// The cheapest plan (kind none when none is possible). Ties go to the earlier kind in the list
// above. The stitch search is bounded (a few thousand steps) and prefers few, large handles
// and, within one size, handles last used by the same tenant, then clean ones.
Plan plan(const PlanInput& in, const CostModel& costs);

// The estimated cost of a given plan (for tests and logs).
double plan_cost(const PlanInput& in, const CostModel& costs, PlanKind kind, const std::vector<std::size_t>& use,
                 const std::vector<std::size_t>& release);

}  // namespace vlake::pool
