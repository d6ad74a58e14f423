// The warm reserve and stock (docs/pool.md, "Warm reserve and warm stock"): WarmStock's
// decisions, and HandleBuilder's workers on the simulated driver.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "sim_gpu.hpp"
#include "unit_ids.hpp"
#include "units.hpp"
#include "vlake/pool/handle_builder.hpp"
#include "vlake/pool/warm_stock.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace std::chrono_literals;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

constexpr Bytes kG{2 * kMiB};
constexpr Bytes kBulk{64 * kMiB};
using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

Bytes mib_bytes(std::uint64_t n) { return Bytes{n * kMiB}; }

std::uint64_t count(const std::vector<Bytes>& v, Bytes b) {
  std::uint64_t n = 0;
  for (Bytes x : v) n += x == b ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("warm stock: without demand the warm reserve keeps its small and bulk classes", "[pool][warm]") {
  WarmStock w(mib_bytes(128), mib_bytes(1024), kG, kBulk);
  const WarmStock::Counts want = w.want(kT0);
  // 16 MiB of small handles, one bulk handle, the rest small: 32 small + 1 bulk.
  CHECK(want.at(kG.value()) == 32);
  CHECK(want.at(kBulk.value()) == 1);
  CHECK(w.wanted_bytes(kT0) == mib_bytes(128));
  const WarmStock::Plan p = w.plan({}, kT0, 100);
  CHECK(p.make.size() == 33);
  CHECK(p.release.empty());
  // Both off: nothing at all.
  WarmStock off(Bytes{0}, Bytes{0}, kG, kBulk);
  off.note(mib_bytes(8), kT0);
  CHECK(off.want(kT0).empty());
  CHECK(off.plan({}, kT0, 100).make.empty());
}

TEST_CASE("warm stock: a size asked for often gets more handles, and demand decays", "[pool][warm]") {
  WarmStock w(Bytes{0}, mib_bytes(1024), kG, kBulk, 10s);
  w.note(mib_bytes(8), kT0);
  CHECK(w.want(kT0).empty());  // asked for once: not worth a build yet
  w.note(mib_bytes(8), kT0);
  CHECK(w.want(kT0).at(8 * kMiB) == 1);
  for (int i = 0; i < 4; ++i) w.note(mib_bytes(8), kT0);
  CHECK(w.score(mib_bytes(8), kT0) == Approx(6));
  CHECK(w.want(kT0).at(8 * kMiB) == 3);  // ceil(6 / 2)
  for (int i = 0; i < 100; ++i) w.note(mib_bytes(8), kT0);
  CHECK(w.want(kT0).at(8 * kMiB) == WarmStock::kMaxPerSize);
  // Half-life 10 s: 106 -> 53 after 10 s.
  CHECK(w.score(mib_bytes(8), kT0 + 10s) == Approx(53));
  CHECK(w.want(kT0 + 10s).at(8 * kMiB) == WarmStock::kMaxPerSize);
  // After about 80 s nothing is left of it.
  CHECK(w.want(kT0 + 80s).empty());
  CHECK(w.wanted_bytes(kT0 + 80s) == Bytes{0});
}

TEST_CASE("warm stock: sizes above a quarter of the stock and counts past the budget are not stocked", "[pool][warm]") {
  WarmStock w(Bytes{0}, mib_bytes(64), kG, kBulk);
  w.note(mib_bytes(32), kT0);  // > 64 MiB / 4
  w.note(mib_bytes(32), kT0);
  CHECK(w.want(kT0).empty());
  for (int i = 0; i < 40; ++i) w.note(mib_bytes(16), kT0);  // wants 16, the budget holds 4
  CHECK(w.want(kT0).at(16 * kMiB) == 4);
  for (int i = 0; i < 60; ++i) w.note(mib_bytes(2), kT0);  // higher score: served first
  const WarmStock::Counts want = w.want(kT0);
  CHECK(want.at(2 * kMiB) == 16);  // 32 MiB
  CHECK(want.at(16 * kMiB) == 2);  // the 32 MiB left
  CHECK(w.wanted_bytes(kT0) == mib_bytes(64));
}

TEST_CASE("warm stock: plan makes one of each wanted size first and counts what is on hand and in flight",
          "[pool][warm]") {
  WarmStock w(Bytes{0}, mib_bytes(1024), kG, kBulk);
  for (int i = 0; i < 8; ++i) w.note(mib_bytes(4), kT0);  // wants 4
  for (int i = 0; i < 4; ++i) w.note(mib_bytes(8), kT0);  // wants 2
  WarmStock::Plan p = w.plan({}, kT0, 2);
  REQUIRE(p.make.size() == 2);
  CHECK(p.make[0] == mib_bytes(4));  // highest score first
  CHECK(p.make[1] == mib_bytes(8));  // then one of the next size, before a second 4 MiB
  WarmStock::View v;
  v.on_hand[4 * kMiB] = 2;
  v.in_flight[4 * kMiB] = 1;
  v.in_flight[8 * kMiB] = 2;
  p = w.plan(v, kT0, 10);
  CHECK(p.make.size() == 1);
  CHECK(count(p.make, mib_bytes(4)) == 1);
  CHECK(p.release.empty());
}

TEST_CASE("warm stock: over the budget the unwanted clean handles go first, within it nothing churns", "[pool][warm]") {
  WarmStock w(Bytes{0}, mib_bytes(32), kG, kBulk);
  WarmStock::View v;
  v.on_hand[8 * kMiB] = 3;  // 24 MiB of a size nobody asks for any more
  // Within the budget: kept (a grant may still want them; the idle release returns them).
  WarmStock::Plan p = w.plan(v, kT0, 10);
  CHECK(p.make.empty());
  CHECK(p.release.empty());
  // A new size wants 4 x 4 MiB = 16 MiB: 24 + 16 > 32, so two 8 MiB handles go.
  for (int i = 0; i < 8; ++i) w.note(mib_bytes(4), kT0);
  p = w.plan(v, kT0, 10);
  CHECK(count(p.make, mib_bytes(4)) == 4);
  CHECK(p.release.size() == 1);
  CHECK(count(p.release, mib_bytes(8)) == 1);
}

TEST_CASE("warm stock: at most kMaxSizes sizes are tracked, the lowest score goes", "[pool][warm]") {
  WarmStock w(Bytes{0}, Bytes{1ULL << 40}, kG, kBulk);
  for (int i = 0; i < 3; ++i) w.note(mib_bytes(2), kT0);
  for (std::uint64_t i = 0; i < WarmStock::kMaxSizes + 4; ++i) {
    w.note(mib_bytes(4 + 2 * i), kT0);
    w.note(mib_bytes(4 + 2 * i), kT0);
  }
  CHECK(w.score(mib_bytes(2), kT0) == Approx(3));
  CHECK(w.want(kT0).size() == WarmStock::kMaxSizes);
}

namespace {

using pooltest::SimGpu;

std::vector<HandleBuilder::Done> wait_done(HandleBuilder& b, std::size_t n) {
  std::vector<HandleBuilder::Done> all;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (all.size() < n && std::chrono::steady_clock::now() < until) {
    for (auto& d : b.take()) all.push_back(std::move(d));
    if (all.size() < n) std::this_thread::sleep_for(2ms);
  }
  return all;
}

}  // namespace

TEST_CASE(
    "handle builder: builds zeroed handles on its worker and releases discarded ones there and stops short of the "
    "headroom",
    "[pool][warm][sim]") {
  SimGpu gpu("warm");
  Driver& drv = gpu.driver();
  const DeviceOrdinal d0{0};
  const Bytes g = drv.granularity(d0);
  std::atomic<int> ready{0};
  {
    HandleBuilder b(drv, {{d0, g, mib_bytes(256)}}, [&] { ++ready; });
    b.submit(d0, mib_bytes(8));
    b.submit(d0, mib_bytes(2));
    b.submit(DeviceOrdinal{7}, mib_bytes(2));  // not a GPU it serves: ignored
    b.submit(d0, mib_bytes(900));              // 1 GiB GPU, 256 MiB headroom: no room
    std::vector<HandleBuilder::Done> done = wait_done(b, 3);
    REQUIRE(done.size() == 3);
    CHECK(ready.load() == 3);
    std::uint64_t built = 0;
    for (HandleBuilder::Done& d : done) {
      if (d.size == mib_bytes(900)) {
        CHECK(d.no_room);
        CHECK_FALSE(d.handle.has_value());
        continue;
      }
      REQUIRE(d.handle.has_value());
      ++built;
      CHECK(d.handle->zeroed);
      CHECK(d.handle->size == d.size);
      CHECK(d.handle->fd.get() >= 0);
      CHECK(d.handle->create_ns > 0);
      // Zeroed: the last bytes read back as 0.
      std::vector<unsigned char> tail(4096, 0xff);
      drv.copy_to_host(tail.data(), DevicePtr{d.handle->va.value() + d.size.value() - tail.size()}, Bytes{tail.size()});
      CHECK(std::all_of(tail.begin(), tail.end(), [](unsigned char c) { return c == 0; }));
      if (d.size == mib_bytes(8)) {
        b.discard(d0, std::move(*d.handle));  // released on the worker
      } else {
        release_built(drv, *d.handle);
      }
    }
    CHECK(built == 2);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (drv.memory_info(d0).free != drv.total_memory(d0) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    CHECK(drv.memory_info(d0).free == drv.total_memory(d0));
    // Built and never taken: the destructor releases it.
    b.submit(d0, mib_bytes(4));
    while (ready.load() < 4) std::this_thread::sleep_for(1ms);
  }
  CHECK(drv.memory_info(d0).free == drv.total_memory(d0));
}
