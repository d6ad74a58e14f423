// Idle release of the free pool (docs/pool.md, "Idle release"): the decision
// (plan_idle_release, injected time) and vlaked against the simulator, whose real memory
// (sim_used) must fall back once freed memory stayed idle.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "daemon_grants.hpp"
#include "harness.hpp"
#include "unit_ids.hpp"
#include "units.hpp"
#include "vlake/pool/idle_release.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::pooltest;
using namespace vlake::literals;
using std::chrono::milliseconds;
namespace st = vlake::state;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

IdleHandleView view(std::uint64_t mib, std::uint64_t seq, milliseconds freed_at, bool bound = false,
                    bool clean = false) {
  return IdleHandleView{Bytes{mib * kMiB}, bound, clean, seq, kT0 + freed_at};
}

}  // namespace

TEST_CASE("idle release: nothing goes before the idle period", "[unit][idle]") {
  const std::vector<IdleHandleView> free = {view(64, 1, milliseconds(0)), view(2, 2, milliseconds(100), true)};
  CHECK(plan_idle_release(free, kT0 + milliseconds(199), milliseconds(200), 0_B).empty());
  // Exactly the period: the first one goes; the second is still young.
  CHECK(plan_idle_release(free, kT0 + milliseconds(200), milliseconds(200), 0_B) == std::vector<std::size_t>{0});
  CHECK(plan_idle_release(free, kT0 + milliseconds(300), milliseconds(200), 0_B) == std::vector<std::size_t>{0, 1});
  // Off.
  CHECK(plan_idle_release(free, kT0 + milliseconds(999'999), milliseconds(0), 0_B).empty());
}

TEST_CASE("idle release: oldest first down to the keep bound", "[unit][idle]") {
  // Listed out of LRU order: seq says which was freed first.
  const std::vector<IdleHandleView> free = {view(16, 3, milliseconds(0)), view(16, 1, milliseconds(0)),
                                            view(16, 4, milliseconds(0)), view(16, 2, milliseconds(0))};
  const auto now = kT0 + milliseconds(1000);
  // 64 MiB free, keep 32: the two least recently freed go.
  CHECK(plan_idle_release(free, now, milliseconds(200), 32_MiB) == std::vector<std::size_t>{1, 3});
  CHECK(plan_idle_release(free, now, milliseconds(200), 0_B) == std::vector<std::size_t>{1, 3, 0, 2});
  CHECK(plan_idle_release(free, now, milliseconds(200), 64_MiB).empty());
  // A keep that is not a multiple of the sizes: the unbound bytes never fall below it.
  CHECK(plan_idle_release(free, now, milliseconds(200), 40_MiB) == std::vector<std::size_t>{1});
}

TEST_CASE("idle release: a big old handle that would cross the keep bound is skipped for a smaller one",
          "[unit][idle]") {
  const std::vector<IdleHandleView> free = {view(64, 1, milliseconds(0)), view(8, 2, milliseconds(0))};
  CHECK(plan_idle_release(free, kT0 + milliseconds(500), milliseconds(200), 60_MiB) == std::vector<std::size_t>{1});
}

TEST_CASE("idle release: the warm reserve is kept and dirty handles go first", "[unit][idle]") {
  // Warm reserve: 2 clean handles of 32 MiB (oldest); a tenant freed a 64 MiB handle later.
  const std::vector<IdleHandleView> free = {view(32, 1, milliseconds(0), false, true),
                                            view(32, 2, milliseconds(0), false, true), view(64, 3, milliseconds(0))};
  const auto now = kT0 + milliseconds(1000);
  CHECK(plan_idle_release(free, now, milliseconds(200), 64_MiB) == std::vector<std::size_t>{2});
  // Keep 32: one clean handle goes too (after the dirty one, by age among the clean)...
  CHECK(plan_idle_release(free, now, milliseconds(200), 32_MiB) == std::vector<std::size_t>{0, 2});
  // ...unless the warm reserve is 64 MiB: its clean handles stay as they are.
  CHECK(plan_idle_release(free, now, milliseconds(200), 32_MiB, 64_MiB) == std::vector<std::size_t>{2});
}

TEST_CASE("idle release: bound handles age out whatever the keep bound", "[unit][idle]") {
  const std::vector<IdleHandleView> free = {view(16, 1, milliseconds(0), true), view(16, 2, milliseconds(0)),
                                            view(16, 3, milliseconds(300), true)};
  // Keep 16 MiB: counts unbound bytes only (bound ones serve one tenant); the young bound
  // handle stays.
  CHECK(plan_idle_release(free, kT0 + milliseconds(400), milliseconds(200), 16_MiB) == std::vector<std::size_t>{0});
  CHECK(plan_idle_release(free, kT0 + milliseconds(600), milliseconds(200), 16_MiB) == std::vector<std::size_t>{0, 2});
}

TEST_CASE("daemon: freed memory goes back to the simulated GPU after the idle period", "[daemon][sim][idle]") {
  DaemonProcess d("idle", kWholeGpuConfig);
  // 500 ms: the re-allocation below must come before it, also on a loaded machine.
  REQUIRE(d.start({"--pool-idle-release", "500ms"}));
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  const std::uint64_t base = sim_used(d.node);  // nothing of the pool yet
  auto g = a.ok("grant " + mib(64));
  REQUIRE(num(g, "status") == 0);
  a.ok("release " + g.at("id"));
  auto s = snapshot(d.state);
  const std::uint64_t created = s->counters.handles_created;
  const std::uint64_t reuses = s->counters.reuses;
  // Allocated again right away: the warm path (no handle created).
  g = a.ok("grant " + mib(64));
  REQUIRE(num(g, "status") == 0);
  s = snapshot(d.state);
  CHECK(s->counters.handles_created == created);
  CHECK(s->counters.reuses == reuses + 1);
  CHECK(s->devices[0].idle_released_bytes == 0);
  a.ok("release " + g.at("id"));
  const auto t0 = std::chrono::steady_clock::now();
  s = snapshot(d.state);
  CHECK(s->devices[0].free_bytes == 64 * kMiB);  // in the free pool, on the GPU
  refresh_until(
      s, d.state, [](const st::State& x) { return x.devices[0].pool_bytes == 0 && x.devices[0].held_fd_bytes == 0; },
      5000);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= milliseconds(400));  // not before the idle period (timer slack aside)
  CHECK(sim_used(d.node) == base);
  CHECK(s->devices[0].idle_released_bytes == 64 * kMiB);
  CHECK(s->devices[0].free_bytes == 0);
  const st::TenantRecord* t = tenant(*s, "user:4242");
  CHECK((t == nullptr || t->retained[0] == 0));
}

TEST_CASE("daemon: idle release keeps the warm reserve", "[daemon][sim][idle]") {
  DaemonProcess d("idle-warm", kWholeGpuConfig);
  REQUIRE(d.start({"--handle-reuse", "node", "--warm-reserve", "64MiB", "--pool-idle-release", "200ms"}));
  auto s = snapshot(d.state);
  REQUIRE(s->devices[0].free_bytes == 64 * kMiB);
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  const std::vector<std::string> ids = grant_each(a, 4, 128);  // larger than the reserve: new handles
  release_all(a, ids);
  refresh_until(
      s, d.state, [](const st::State& x) { return x.devices[0].pool_bytes == 64 * kMiB; }, 5000);
  CHECK(s->devices[0].free_bytes == 64 * kMiB);
  CHECK(s->devices[0].idle_released_bytes == 4 * 128 * kMiB);
  CHECK(sim_used(d.node) == 64 * kMiB);
  // It stays so (no refill and release loop).
  std::this_thread::sleep_for(milliseconds(400));
  s = snapshot(d.state);
  CHECK(s->devices[0].pool_bytes == 64 * kMiB);
  CHECK(s->devices[0].idle_released_bytes == 4 * 128 * kMiB);
}

TEST_CASE("daemon: idle release keeps --pool-keep bytes in the free pool", "[daemon][sim][idle]") {
  DaemonProcess d("idle-keep", kWholeGpuConfig);
  REQUIRE(d.start({"--handle-reuse", "node", "--pool-keep", "32MiB", "--pool-idle-release", "200ms"}));
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  const std::vector<std::string> ids = grant_each(a, 4, 16);
  release_all(a, ids);
  auto s = snapshot(d.state);
  refresh_until(
      s, d.state, [](const st::State& x) { return x.devices[0].idle_released_bytes == 32 * kMiB; }, 5000);
  CHECK(s->devices[0].pool_bytes == 32 * kMiB);
  CHECK(s->devices[0].free_handles == 2);
  CHECK(sim_used(d.node) == 32 * kMiB);
}

TEST_CASE("daemon: --pool-idle-release off keeps freed memory in the pool", "[daemon][sim][idle]") {
  DaemonProcess d("idle-off", kWholeGpuConfig);
  REQUIRE(d.start({"--pool-idle-release", "off"}));
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  auto g = a.ok("grant " + mib(16));
  REQUIRE(num(g, "status") == 0);
  a.ok("release " + g.at("id"));
  std::this_thread::sleep_for(milliseconds(300));
  auto s = snapshot(d.state);
  CHECK(s->devices[0].free_bytes == 16 * kMiB);
  CHECK(s->devices[0].idle_released_bytes == 0);
  CHECK(sim_used(d.node) >= 16 * kMiB);
}
