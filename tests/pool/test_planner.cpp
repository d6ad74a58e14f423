// The pool planner (pool/include/vlake/pool/planner.hpp): pure logic, no driver.
#include <catch2/catch.hpp>

#include "unit_ids.hpp"
#include "units.hpp"
#include "vlake/pool/planner.hpp"

using namespace vlake;
using namespace vlake::pool;

namespace {
using namespace vlake::roomtest;   // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)
using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)
FreeHandleView fh(std::uint64_t mib, std::optional<TenantId> last, std::uint64_t seq, bool clean = false) {
  return FreeHandleView{Bytes{mib * kMiB}, last, clean, seq};
}
PlanInput input(std::uint64_t mib, TenantId t, std::vector<FreeHandleView> free, std::uint64_t room_mib) {
  PlanInput in;
  in.bytes = Bytes{mib * kMiB};
  in.tenant = t;
  in.free = std::move(free);
  in.device_free = Bytes{room_mib * kMiB};
  return in;
}
}  // namespace

TEST_CASE("planner: an exact fit is preferred over stitching and creating", "[planner]") {
  const CostModel m;
  const Plan p = plan(input(4, kB, {fh(2, kB, 1), fh(4, kA, 2), fh(2, kB, 3)}, 1024), m);
  REQUIRE(p.kind == PlanKind::exact);
  REQUIRE(p.use == std::vector<std::size_t>{1});
  CHECK(p.scrubs == 1);  // another tenant's handle is zeroed
  CHECK(p.release.empty());
}

TEST_CASE("planner: with no room on the GPU, another tenant's free handles are stitched", "[planner]") {
  const CostModel m;
  const Plan p = plan(input(8, kB, {fh(2, kA, 1), fh(2, kA, 2), fh(2, kA, 3), fh(2, kA, 4)}, 0), m);
  REQUIRE(p.kind == PlanKind::stitch);
  CHECK(p.use.size() == 4);
  CHECK(p.cross_tenant);
  CHECK(p.scrubs == 4);
  // Stitching beats giving the memory back and creating one handle (which rebuilds nothing).
  CHECK(p.cost_ns < plan_cost(input(8, kB, {fh(2, kA, 1), fh(2, kA, 2), fh(2, kA, 3), fh(2, kA, 4)}, 0), m,
                              PlanKind::release_create, {}, {0, 1, 2, 3}));
  // Sizes mix: 8 = 4 + 2 + 2, fewest handles first.
  const Plan q = plan(input(8, kB, {fh(2, kA, 1), fh(4, kA, 2), fh(2, kA, 3), fh(2, kA, 4)}, 0), m);
  REQUIRE(q.kind == PlanKind::stitch);
  CHECK(q.use.size() == 3);
  CHECK(q.use.front() == 1);
}

TEST_CASE("planner: the choice flips when measured costs change", "[planner]") {
  CostModel m;
  const PlanInput in = input(4, kB, {fh(2, kA, 1), fh(2, kA, 2)}, 1024);
  CHECK(plan(in, m).kind == PlanKind::create);  // seeds: one new handle beats two scrubbed ones
  for (int i = 0; i < 40; ++i) m.observe(CostModel::Call::create, 2'000'000);  // cuMemCreate now takes 2 ms
  CHECK(m.create_ns > 1'500'000);
  CHECK(plan(in, m).kind == PlanKind::stitch);
  for (int i = 0; i < 40; ++i) m.observe(CostModel::Call::create, 10'000);
  CHECK(plan(in, m).kind == PlanKind::create);
  // Scrub bandwidth is measured too: per MiB above the fixed part.
  m.observe(CostModel::Call::scrub, CostModel::kScrubFixedNs + 4 * 5000.0, Bytes{4 * kMiB});
  CHECK(m.scrub_ns_per_mib == Approx(0.8 * 700 + 0.2 * 5000));
}

TEST_CASE("planner: handles last used by the same tenant come first (no scrub)", "[planner]") {
  const CostModel m;
  const Plan p = plan(input(4, kA, {fh(4, kB, 9), fh(4, kA, 5), fh(4, std::nullopt, 7)}, 0), m);
  REQUIRE(p.kind == PlanKind::exact);
  CHECK(p.use == std::vector<std::size_t>{1});
  CHECK(p.scrubs == 0);
  CHECK_FALSE(p.cross_tenant);
  // A clean (warm) handle needs no scrub either, and is no other tenant's.
  const Plan q = plan(input(4, kA, {fh(4, kB, 9), fh(4, std::nullopt, 7, true)}, 0), m);
  CHECK(q.use == std::vector<std::size_t>{1});
  CHECK(q.scrubs == 0);
}

TEST_CASE("planner: release least recently freed handles, then create", "[planner]") {
  const CostModel m;
  // 8 MiB cannot be stitched from 2 + 2 and the GPU has 4 MiB: release seq 1 then seq 3.
  const Plan p = plan(input(8, kA, {fh(2, kA, 5), fh(2, kB, 1), fh(16, kB, 3)}, 4), m);
  REQUIRE(p.kind == PlanKind::release_create);
  CHECK(p.release == std::vector<std::size_t>{1, 2});
  CHECK(p.use.empty());
  // A grant whose handle goes to the application takes one handle: no stitching.
  PlanInput one = input(4, kB, {fh(2, kA, 1), fh(2, kA, 2)}, 0);
  one.max_handles = 1;
  const Plan q = plan(one, m);
  REQUIRE(q.kind == PlanKind::release_create);
  CHECK(q.release.size() == 2);
  // At most 32 handles per grant.
  std::vector<FreeHandleView> many;
  for (std::uint64_t i = 0; i < 40; ++i) many.push_back(fh(2, kA, i));
  CHECK(plan(input(80, kA, many, 0), m).kind == PlanKind::release_create);
  CHECK(plan(input(64, kA, many, 0), m).kind == PlanKind::stitch);
  // Nothing free, no room: no plan.
  CHECK(plan(input(2, kA, {}, 0), m).kind == PlanKind::none);
  CHECK(plan(input(8, kA, {fh(2, kA, 1)}, 4), m).kind == PlanKind::none);
}

TEST_CASE("planner: handles another process keeps mapped are taken whole or stitched only without room",
          "[planner][kept]") {
  const CostModel m;
  const TenantId t{1};
  auto kept = [&](std::uint64_t mib, std::uint64_t seq) {
    FreeHandleView v = fh(mib, t, seq);
    v.kept_elsewhere = true;
    return v;
  };
  // Four 256 MiB handles other processes keep: a 1 GiB grant creates rather than stitches them.
  const std::vector<FreeHandleView> four = {kept(256, 1), kept(256, 2), kept(256, 3), kept(256, 4)};
  CHECK(plan(input(1024, t, four, 8192), m).kind == PlanKind::create);
  // With no room for a new handle they are stitched after all.
  const Plan tight = plan(input(1024, t, four, 0), m);
  CHECK(tight.kind == PlanKind::stitch);
  CHECK(tight.use.size() == 4);
  // An exact fit is taken whole, the one no other process keeps first.
  std::vector<FreeHandleView> exact = {kept(256, 5), fh(256, t, 1)};
  const Plan e = plan(input(256, t, exact, 8192), m);
  REQUIRE(e.kind == PlanKind::exact);
  CHECK(e.use == std::vector<std::size_t>{1});
  exact = {kept(256, 5)};
  CHECK(plan(input(256, t, exact, 8192), m).kind == PlanKind::exact);
}
