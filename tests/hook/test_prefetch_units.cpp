// Prefetch's decisions (hook/src/alloc/prefetch.hpp) and VLAKE_PREFETCH.
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <string>

#include "config.hpp"
#include "prefetch.hpp"
#include "units.hpp"

using namespace vlake::hook;
using namespace std::chrono_literals;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

const Prefetch::Clock::time_point kT0 = Prefetch::Clock::time_point(std::chrono::hours(1));
void* const kPrefetchCtx = reinterpret_cast<void*>(0x1000);

std::size_t count(const std::vector<Prefetch::Request>& v, std::uint64_t size) {
  std::size_t n = 0;
  for (const auto& r : v) n += r.size == size ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("prefetch: misses in a row double the batch up to the cap, a quiet window starts over", "[prefetch]") {
  Prefetch p(8, 32 * MiB, 64 * MiB, 1s);
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0));
  auto q = p.take();
  REQUIRE(q.size() == 1);
  CHECK(q[0].device == 0);
  CHECK(q[0].size == 2 * MiB);
  CHECK(q[0].ctx == kPrefetchCtx);
  p.done(0, 2 * MiB);
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 10ms));
  q = p.take();
  CHECK(q.size() == 2);
  for (const auto& r : q) p.done(r.device, r.size);
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 20ms));
  CHECK(p.take().size() == 4);  // still in flight: not done yet
  // At most 8 in flight for a size: 4 more.
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 30ms));
  CHECK(p.take().size() == 4);
  CHECK_FALSE(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 40ms));
  for (int i = 0; i < 8; ++i) p.done(0, 2 * MiB);
  // After a quiet window: one again.
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 2s));
  CHECK(p.take().size() == 1);
}

TEST_CASE("prefetch: bytes per size and the largest size are bounded", "[prefetch]") {
  Prefetch p(8, 32 * MiB, 64 * MiB, 1s);
  CHECK_FALSE(p.miss(0, 64 * MiB, kPrefetchCtx, kT0));  // above max_size
  CHECK(p.take().empty());
  // 32 MiB: at most 64 MiB in flight, so two blocks whatever the streak.
  for (int i = 0; i < 5; ++i) (void)p.miss(0, 32 * MiB, kPrefetchCtx, kT0 + std::chrono::milliseconds(i));
  CHECK(count(p.take(), 32 * MiB) == 2);
  // Sizes and devices are counted apart.
  CHECK(p.miss(1, 32 * MiB, kPrefetchCtx, kT0));
  CHECK(p.miss(0, 4 * MiB, kPrefetchCtx, kT0));
  const auto q = p.take();
  CHECK(q.size() == 2);
}

TEST_CASE("prefetch: a used prefetched block is replaced only while its size still misses", "[prefetch]") {
  Prefetch p(8, 32 * MiB, 64 * MiB, 1s);
  CHECK_FALSE(p.hit(0, 2 * MiB, kPrefetchCtx, kT0));  // never missed
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0));
  for (const auto& r : p.take()) p.done(r.device, r.size);
  CHECK(p.hit(0, 2 * MiB, kPrefetchCtx, kT0 + 100ms));
  CHECK(p.take().size() == 1);
  p.done(0, 2 * MiB);
  CHECK_FALSE(p.hit(0, 2 * MiB, kPrefetchCtx, kT0 + 2s));  // the burst is over
  CHECK(p.take().empty());
}

TEST_CASE("prefetch: a refused prefetch stops that size for a window and drops what was queued", "[prefetch]") {
  Prefetch p(8, 32 * MiB, 64 * MiB, 1s);
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0));
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 1ms));  // 1 + 2 queued
  CHECK(p.queued() == 3);
  p.failed(0, 2 * MiB, kT0 + 2ms);  // the worker's first one was refused
  CHECK(p.queued() == 0);
  CHECK_FALSE(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 500ms));
  CHECK(p.miss(0, 2 * MiB, kPrefetchCtx, kT0 + 1100ms));
  CHECK(p.take().size() == 1);
}

TEST_CASE("prefetch: off does nothing", "[prefetch]") {
  Prefetch p(0, 32 * MiB, 64 * MiB);
  CHECK_FALSE(p.enabled());
  CHECK_FALSE(p.miss(0, 2 * MiB, kPrefetchCtx, kT0));
  CHECK(p.take().empty());
}

TEST_CASE("config: VLAKE_PREFETCH is a count from 0 to 64, off by default", "[prefetch]") {
  auto parse = [](const std::map<std::string, std::string>& env) {
    return Config::parse([&env](const char* name) -> const char* {
      const auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  CHECK(parse({}).prefetch == 0);
  CHECK(parse({{"VLAKE_PREFETCH", "8"}}).prefetch == 8);
  CHECK(parse({{"VLAKE_PREFETCH", "0"}}).prefetch == 0);
  for (const char* bad : {"65", "-1", "x", "", "4k"}) {
    const Config c = parse({{"VLAKE_PREFETCH", bad}});
    CHECK(c.prefetch == 0);
    REQUIRE(c.problems.size() == 1);
    CHECK(c.problems[0].find("VLAKE_PREFETCH") != std::string::npos);
  }
}
