// What the free pool can serve without a new handle (docs/pool.md, "What the free pool can
// serve"), the figure behind vlake_pool_fragmentation_ratio: the computation
// (pool/include/vlake/pool/servable.hpp), checked against the planner's own search, and vlaked
// on a full simulated GPU, where a grant of the published size is stitched with no new handle
// and one granule more needs one.
#include <catch2/catch.hpp>

#include <random>

#include "daemon_grants.hpp"
#include "harness.hpp"
#include "unit_ids.hpp"
#include "units.hpp"
#include "vlake/exporter/collector.hpp"
#include "vlake/pool/planner.hpp"
#include "vlake/pool/servable.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::pooltest;
using namespace vlake::literals;
namespace st = vlake::state;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

constexpr std::uint32_t kMax = 32;  // proto::kMaxHandlesPerGrant
using namespace vlake::roomtest;    // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

std::vector<ServableHandleView> handles(std::uint64_t count, std::uint64_t mib,
                                        std::optional<TenantId> bound = std::nullopt) {
  return std::vector<ServableHandleView>(count, ServableHandleView{Bytes{mib * kMiB}, bound});
}
std::vector<ServableHandleView> operator+(std::vector<ServableHandleView> a, const std::vector<ServableHandleView>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

double ratio(const st::DeviceRecord& r) {
  return exporter::fragmentation_ratio(r.largest_servable_bytes, r.free_bytes);
}

}  // namespace

TEST_CASE("servable: many small handles are stitched into one grant", "[unit][servable]") {
  const auto free = handles(16, 2);
  const Servable s = servable(free, kMax);
  CHECK(s.largest == 32_MiB);  // all of the free pool: fragmentation 0
  CHECK(s.unbound == 32_MiB);
  CHECK(largest_servable(free, std::nullopt, kMax) == 32_MiB);
  CHECK(largest_servable(free, kA, kMax) == 32_MiB);
  // Mixed sizes: all of them, however small the largest handle is.
  CHECK(servable(handles(3, 8) + handles(10, 2) + handles(1, 64), kMax).largest == Bytes{108 * kMiB});
  CHECK(servable({}, kMax).largest == 0_B);
}

TEST_CASE("servable: a grant stitches at most 32 handles", "[unit][servable]") {
  CHECK(servable(handles(64, 2), kMax).largest == 64_MiB);  // 64 of 128 MiB: fragmentation 0.5
  // The largest 32: ten 8 MiB handles and 22 of the 2 MiB ones.
  CHECK(servable(handles(30, 2) + handles(10, 8), kMax).largest == Bytes{(80 + 44) * kMiB});
  // docs/pool.md's warm reserve of 8 GiB: 32 small handles, 127 bulk ones of 64 MiB.
  const auto warm = handles(16, 2) + handles(127, 64) + handles(16, 2);
  CHECK(servable(warm, kMax).largest == 2_GiB);  // 2 of 8 GiB: fragmentation 0.75
  // One-handle (cuMemCreate) grants: the largest handle; 0 counts as 1.
  CHECK(servable(warm, 1).largest == 64_MiB);
  CHECK(servable(warm, 0).largest == 64_MiB);
  CHECK(largest_servable(handles(5, 4), kB, 2) == 8_MiB);
}

TEST_CASE("servable: handles bound to another tenant serve only it", "[unit][servable]") {
  // A: four 4 MiB handles bound to it; B: three 8 MiB; three unbound 2 MiB handles.
  const auto free = handles(4, 4, kA) + handles(3, 8, kB) + handles(3, 2);
  CHECK(largest_servable(free, kA, kMax) == 22_MiB);
  CHECK(largest_servable(free, kB, kMax) == 30_MiB);
  CHECK(largest_servable(free, std::nullopt, kMax) == 6_MiB);  // a new tenant: unbound only
  CHECK(largest_servable(free, TenantId{3}, kMax) == 6_MiB);
  Servable s = servable(free, kMax);
  CHECK(s.largest == 30_MiB);  // 30 of 46 MiB: no tenant gets the rest in one grant
  CHECK(s.unbound == 6_MiB);
  // The piece limit applies to each tenant's own mix.
  CHECK(largest_servable(free, kA, 4) == 16_MiB);
  CHECK(largest_servable(free, kB, 4) == 26_MiB);
  CHECK(servable(free, 4).largest == 26_MiB);
  // Nothing unbound: a new tenant gets nothing without a new handle.
  s = servable(handles(2, 512, kA) + handles(2, 512, kB), kMax);
  CHECK(s.largest == 1_GiB);  // 1 of 2 GiB: fragmentation 0.5
  CHECK(s.unbound == 0_B);
  // Binding off (--handle-reuse node): DevicePool passes no binding, everything serves anyone.
  const auto node_mode = handles(4, 4) + handles(3, 8) + handles(3, 2);
  CHECK(servable(node_mode, kMax).largest == 46_MiB);
  CHECK(servable(node_mode, kMax).unbound == 46_MiB);
}

TEST_CASE(
    "servable: the planner stitches exactly the largest servable size and no plan without a new handle "
    "serves one granule more",
    "[unit][servable]") {
  // Random free pools; the planner must agree for every tenant. Creating is made prohibitively
  // expensive, so that only a plan from the free pool can win when there is one.
  CostModel costs;
  costs.create_ns = 1e15;
  std::mt19937 rng(16);
  const std::uint64_t sizes_mib[] = {2, 2, 2, 4, 6, 8, 64, 66, 128};
  for (int round = 0; round < 300; ++round) {
    std::vector<ServableHandleView> free;
    std::vector<FreeHandleView> planner_free;
    const int n = static_cast<int>(rng() % 80);
    for (int i = 0; i < n; ++i) {
      const Bytes size{sizes_mib[rng() % std::size(sizes_mib)] * kMiB};
      const std::uint32_t b = rng() % 4;  // 0: unbound; 1..3: bound to that tenant
      const std::optional<TenantId> bound = b == 0 ? std::nullopt : std::optional<TenantId>(TenantId{b});
      free.push_back(ServableHandleView{size, bound});
      planner_free.push_back(FreeHandleView{size, bound, false, static_cast<std::uint64_t>(i) + 1});
    }
    for (std::uint32_t t = 1; t <= 4; ++t) {  // tenant 4 holds no bound handle
      const TenantId tenant{t};
      const Bytes want = largest_servable(free, tenant, kMax);
      PlanInput in;
      in.tenant = tenant;
      in.device_free = 0_B;
      in.max_handles = kMax;
      in.free = planner_free;
      for (std::size_t i = 0; i < free.size(); ++i) in.free[i].foreign = free[i].bound && *free[i].bound != tenant;
      INFO("round " << round << " tenant " << t << " servable " << want.value() / kMiB << " MiB");
      if (want.value() > 0) {
        in.bytes = want;
        const Plan p = plan(in, costs);
        REQUIRE((p.kind == PlanKind::exact || p.kind == PlanKind::stitch));
        std::uint64_t sum = 0;
        for (std::size_t i : p.use) {
          CHECK_FALSE(in.free[i].foreign);
          sum += in.free[i].size.value();
        }
        CHECK(sum == want.value());
        CHECK(p.use.size() <= kMax);
      }
      in.bytes = want + 2_MiB;
      const Plan more = plan(in, costs);
      CHECK(more.kind != PlanKind::exact);
      CHECK(more.kind != PlanKind::stitch);
    }
  }
}

TEST_CASE("daemon: the fragmentation ratio follows grants and a grant of the servable size needs no new handle",
          "[daemon][sim][servable]") {
  DaemonProcess d("servable", kWholeGpuConfig);
  REQUIRE(d.start({"--pool-idle-release", "off"}));  // default --handle-reuse tenant
  TwoTenants t(d);
  Helper& a = t.a;
  Helper& b = t.b;
  Helper& filler = t.filler;

  // A frees memory in 40 pieces of 2 MiB (bound to A): 80 MiB free, a grant stitches 32 of them.
  const std::vector<std::string> ids = grant_each(a, 40, 2);
  auto s = snapshot(d.state);
  CHECK(s->devices[0].largest_servable_bytes == 0);
  CHECK(ratio(s->devices[0]) == 0);  // empty free pool
  release_all(a, ids);
  s = snapshot(d.state);
  REQUIRE(s->devices[0].free_bytes == 80 * kMiB);
  REQUIRE(s->devices[0].free_handles == 40);
  CHECK(s->devices[0].largest_free_handle == 2 * kMiB);
  CHECK(s->devices[0].largest_servable_bytes == 64 * kMiB);
  CHECK(s->devices[0].largest_servable_unbound_bytes == 0);  // B gets none of it
  CHECK(ratio(s->devices[0]) == Approx(0.2));

  // The rest of the GPU goes to memory outside the pool: only the free pool can serve.
  filler.ok("own " + std::to_string(kGiB - s->devices[0].pool_bytes));
  REQUIRE(num(filler.ok("meminfo"), "used") == kGiB);

  // Exactly the servable size: stitched from 32 free handles, nothing created.
  std::uint64_t created = s->counters.handles_created;
  auto g = a.ok("grant " + mib(64));
  REQUIRE(num(g, "status") == 0);
  CHECK(num(g, "handles") == 32);
  a.ok("fill " + g.at("id") + " 77");
  CHECK(a.ok("check " + g.at("id") + " 77").at("match") == "1");
  s = snapshot(d.state);
  CHECK(s->counters.handles_created == created);
  CHECK(s->counters.grants_stitched == 1);
  CHECK(s->devices[0].free_bytes == 16 * kMiB);
  CHECK(s->devices[0].largest_servable_bytes == 16 * kMiB);
  CHECK(ratio(s->devices[0]) == 0);
  a.ok("release " + g.at("id"));
  s = snapshot(d.state);
  CHECK(s->devices[0].largest_servable_bytes == 64 * kMiB);
  CHECK(ratio(s->devices[0]) == Approx(0.2));

  // One granule more: no plan from the free pool; free handles are released (33 of them) to
  // make room for one new handle.
  const std::uint64_t released = s->counters.handles_released;
  g = a.ok("grant " + mib(66));
  REQUIRE(num(g, "status") == 0);
  CHECK(num(g, "handles") == 1);
  s = snapshot(d.state);
  CHECK(s->counters.handles_created == created + 1);
  CHECK(s->counters.grants_stitched == 1);
  CHECK(s->counters.handles_released == released + 33);
  CHECK(s->devices[0].free_bytes == 14 * kMiB);
  CHECK(s->devices[0].largest_servable_bytes == 14 * kMiB);
  CHECK(ratio(s->devices[0]) == 0);

  // B, a tenant with no bound handle: its servable size is 0, so even 2 MiB needs a new handle
  // (one of A's handles is released for it).
  created = s->counters.handles_created;
  g = b.ok("grant " + mib(2));
  REQUIRE(num(g, "status") == 0);
  s = snapshot(d.state);
  CHECK(s->counters.handles_created == created + 1);
  CHECK(s->devices[0].free_bytes == 12 * kMiB);
  b.ok("release " + g.at("id"));
  // Free: 12 MiB bound to A, 2 MiB bound to B. The largest single grant is A's 12 MiB.
  s = snapshot(d.state);
  CHECK(s->devices[0].free_bytes == 14 * kMiB);
  CHECK(s->devices[0].largest_servable_bytes == 12 * kMiB);
  CHECK(s->devices[0].largest_servable_unbound_bytes == 0);
  CHECK(ratio(s->devices[0]) == Approx(1.0 / 7.0));
  created = s->counters.handles_created;
  g = a.ok("grant " + mib(12));
  REQUIRE(num(g, "status") == 0);
  CHECK(num(g, "handles") == 6);
  s = snapshot(d.state);
  CHECK(s->counters.handles_created == created);
  CHECK(s->devices[0].largest_servable_bytes == 2 * kMiB);  // B's
  CHECK(ratio(s->devices[0]) == 0);
}

TEST_CASE("daemon: with --handle-reuse node a new tenant may be served every free handle", "[daemon][sim][servable]") {
  DaemonProcess d("servable-node", kWholeGpuConfig);
  REQUIRE(d.start({"--pool-idle-release", "off", "--handle-reuse", "node"}));
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  const std::vector<std::string> ids = grant_each(a, 34, 2);
  release_all(a, ids);
  const auto s = snapshot(d.state);
  REQUIRE(s->devices[0].free_bytes == 68 * kMiB);
  CHECK(s->devices[0].largest_servable_bytes == 64 * kMiB);
  CHECK(s->devices[0].largest_servable_unbound_bytes == 64 * kMiB);
  CHECK(ratio(s->devices[0]) == Approx(4.0 / 68.0));
}
