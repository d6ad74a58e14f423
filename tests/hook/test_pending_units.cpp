// Unit tests of the hook's stream-ordered free bookkeeping (pending.hpp) and of its usage cache
// (usage_cache.hpp): plain classes, driven with fake events and an injected clock.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "kept.hpp"
#include "pending.hpp"
#include "units.hpp"
#include "usage_cache.hpp"

using namespace vlake;
using namespace vlake::hook;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

// Fake handles: only their values matter to the bookkeeping.
CUevent event_no(std::uintptr_t n) { return reinterpret_cast<CUevent>(n); }
CUcontext ctx_no(std::uintptr_t n) { return reinterpret_cast<CUcontext>(n); }

PendingFree free_of(std::uint64_t base, std::uintptr_t ev, std::uintptr_t ctx = 1) {
  PendingFree f;
  f.alloc.base = base;
  f.alloc.ptr = base;
  f.alloc.mapped = 2 * MiB;
  f.event = event_no(ev);
  f.ctx = ctx_no(ctx);
  return f;
}

std::vector<std::uint64_t> bases(const std::vector<PendingFree>& v) {
  std::vector<std::uint64_t> out;
  for (const PendingFree& f : v) out.push_back(f.alloc.base);
  return out;
}

Uuid uuid_no(std::uint8_t n) {
  Uuid u;
  u.bytes[0] = n;
  return u;
}

}  // namespace

TEST_CASE("PendingFrees: only frees whose event completed or failed are handed back") {
  PendingFrees q;
  q.push(free_of(0x1000, 1));
  q.push(free_of(0x2000, 2));
  q.push(free_of(0x3000, 3));
  std::map<CUevent, EventState> state{
      {event_no(1), EventState::pending}, {event_no(2), EventState::complete}, {event_no(3), EventState::failed}};
  auto query = [&](const PendingFree& f) { return state.at(f.event); };
  auto done = q.take_done(query);
  CHECK(bases(done) == std::vector<std::uint64_t>{0x2000, 0x3000});
  CHECK(done[0].state == EventState::complete);
  CHECK(done[1].state == EventState::failed);
  CHECK(q.size() == 1);
  // Still pending: never handed back, however often it is asked.
  for (int i = 0; i < 5; ++i) CHECK(q.take_done(query).empty());
  CHECK(q.size() == 1);
  state[event_no(1)] = EventState::complete;
  CHECK(bases(q.take_done(query)) == std::vector<std::uint64_t>{0x1000});
  CHECK(q.empty());
}

TEST_CASE("PendingFrees: frees pushed while the events are queried wait for the next round") {
  PendingFrees q;
  q.push(free_of(0x1000, 1));
  q.push(free_of(0x2000, 2));
  int asked = 0;
  auto query = [&](const PendingFree& f) {
    ++asked;
    if (f.alloc.base == 0x1000) q.push(free_of(0x3000, 3));  // another thread frees meanwhile
    return f.alloc.base == 0x2000 ? EventState::complete : EventState::pending;
  };
  CHECK(bases(q.take_done(query)) == std::vector<std::uint64_t>{0x2000});
  CHECK(asked == 2);  // the new entry was not asked about in that round
  CHECK(q.size() == 2);
  // Oldest first: the entry that was waiting comes before the one pushed during the round.
  CHECK(bases(q.take_all()) == std::vector<std::uint64_t>{0x1000, 0x3000});
  CHECK(q.empty());
}

TEST_CASE("PendingFrees: polling backs off while nothing completes and restarts after progress") {
  PendingFrees q;
  CHECK(q.next_poll() == PendingFrees::kMinPoll);
  q.push(free_of(0x1000, 1));
  bool ready = false;
  auto query = [&](const PendingFree&) { return ready ? EventState::complete : EventState::pending; };
  std::chrono::microseconds last = q.next_poll();
  for (int i = 0; i < 20; ++i) {
    CHECK(q.take_done(query).empty());
    const auto now = q.next_poll();
    CHECK(now >= last);
    CHECK(now <= PendingFrees::kMaxPoll);
    last = now;
  }
  CHECK(last == PendingFrees::kMaxPoll);
  q.push(free_of(0x2000, 2));  // a new free: asked again soon
  CHECK(q.next_poll() == PendingFrees::kMinPoll);
  CHECK(q.take_done(query).empty());
  CHECK(q.next_poll() == 2 * PendingFrees::kMinPoll);
  ready = true;
  CHECK(q.take_done(query).size() == 2);
  CHECK(q.next_poll() == PendingFrees::kMinPoll);
  // An empty queue does not back off.
  CHECK(q.take_done(query).empty());
  CHECK(q.next_poll() == PendingFrees::kMinPoll);
}

TEST_CASE("PendingFrees: a forked child forgets the parent's frees") {
  PendingFrees q;
  q.push(free_of(0x1000, 1));
  q.lock_all();
  q.clear_after_fork();  // unlocks
  CHECK(q.empty());
  q.push(free_of(0x2000, 2));
  CHECK(q.size() == 1);
}

TEST_CASE("EventPool: idle events are reused per context and the pool is bounded") {
  EventPool pool;
  CHECK(pool.acquire(ctx_no(1)) == nullptr);
  CHECK(pool.release(ctx_no(1), event_no(10)));
  CHECK(pool.release(ctx_no(2), event_no(20)));
  CHECK(pool.acquire(ctx_no(3)) == nullptr);  // events belong to their context
  CHECK(pool.acquire(ctx_no(2)) == event_no(20));
  CHECK(pool.acquire(ctx_no(2)) == nullptr);
  CHECK(pool.acquire(ctx_no(1)) == event_no(10));
  CHECK(pool.idle() == 0);
  for (std::size_t i = 0; i < EventPool::kMaxIdle; ++i) CHECK(pool.release(ctx_no(1), event_no(100 + i)));
  CHECK_FALSE(pool.release(ctx_no(1), event_no(99)));  // full: the caller destroys it
  CHECK(pool.idle() == EventPool::kMaxIdle);
  pool.lock_all();
  pool.clear_after_fork();
  CHECK(pool.idle() == 0);
}

TEST_CASE("UsageCache: an answer serves for its time to live and no longer") {
  UsageCache cache;
  const auto t0 = UsageCache::Clock::time_point{} + std::chrono::hours(1);
  const Uuid gpu = uuid_no(1);
  cache.put(gpu, UsageFigures{80 * GiB, 8 * GiB, 1 * GiB}, 7, t0);
  auto hit = cache.get(gpu, 7, t0 + std::chrono::milliseconds(99));
  REQUIRE(hit);
  CHECK(hit->limit == 8 * GiB);
  CHECK(hit->used == 1 * GiB);
  CHECK(hit->total == 80 * GiB);
  CHECK_FALSE(cache.get(gpu, 7, t0 + std::chrono::milliseconds(100)));
  CHECK_FALSE(cache.get(gpu, 7, t0 - std::chrono::milliseconds(1)));  // a clock before the question
  CHECK_FALSE(cache.get(uuid_no(2), 7, t0));                          // another GPU
}

TEST_CASE("UsageCache: any change of this process makes the answer stale") {
  UsageCache cache;
  const auto t0 = UsageCache::Clock::time_point{} + std::chrono::hours(1);
  const Uuid gpu = uuid_no(1);
  cache.put(gpu, UsageFigures{80 * GiB, 8 * GiB, 1 * GiB}, 7, t0);
  CHECK(cache.get(gpu, 7, t0));
  CHECK_FALSE(cache.get(gpu, 8, t0));  // a grant or release was sent since
  // A fresh answer at the new generation serves again; an older answer never replaces it.
  cache.put(gpu, UsageFigures{80 * GiB, 8 * GiB, 2 * GiB}, 8, t0 + std::chrono::milliseconds(10));
  cache.put(gpu, UsageFigures{80 * GiB, 8 * GiB, 1 * GiB}, 7, t0 + std::chrono::milliseconds(5));
  auto hit = cache.get(gpu, 8, t0 + std::chrono::milliseconds(20));
  REQUIRE(hit);
  CHECK(hit->used == 2 * GiB);
}

TEST_CASE("UsageCache: near the limit the daemon is asked every time") {
  UsageCache cache;
  const auto t0 = UsageCache::Clock::time_point{} + std::chrono::hours(1);
  const Uuid gpu = uuid_no(1);
  // Margin: max(256 MiB, 5 % of the limit).
  CHECK(cache.exact_margin(1 * GiB) == 256 * MiB);
  CHECK(cache.exact_margin(80 * GiB) == 4 * GiB);
  SECTION("small limit: the 256 MiB floor") {
    cache.put(gpu, UsageFigures{80 * GiB, 1 * GiB, 768 * MiB}, 1, t0);  // 256 MiB free: cached
    CHECK(cache.get(gpu, 1, t0));
    cache.put(gpu, UsageFigures{80 * GiB, 1 * GiB, 768 * MiB + 1}, 1, t0);  // one byte less
    CHECK_FALSE(cache.get(gpu, 1, t0));
  }
  SECTION("large limit: 5 percent") {
    cache.put(gpu, UsageFigures{80 * GiB, 80 * GiB, 76 * GiB}, 1, t0);  // 4 GiB free: cached
    CHECK(cache.get(gpu, 1, t0));
    cache.put(gpu, UsageFigures{80 * GiB, 80 * GiB, 76 * GiB + MiB}, 1, t0);
    CHECK_FALSE(cache.get(gpu, 1, t0));
  }
  SECTION("over the limit") {
    cache.put(gpu, UsageFigures{80 * GiB, 1 * GiB, 2 * GiB}, 1, t0);
    CHECK_FALSE(cache.get(gpu, 1, t0));
  }
}

TEST_CASE("UsageCache: a custom policy and more GPUs than slots") {
  UsageCachePolicy p;
  p.ttl = std::chrono::milliseconds(5);
  p.exact_floor = 0;
  p.exact_divisor = 0;
  UsageCache cache(p);
  const auto t0 = UsageCache::Clock::time_point{} + std::chrono::hours(1);
  for (std::uint8_t i = 0; i < UsageCache::kSlots + 2; ++i) {
    cache.put(uuid_no(i), UsageFigures{GiB, GiB, GiB}, 1, t0);  // full: free 0 is no longer "near"
  }
  for (std::uint8_t i = 0; i < UsageCache::kSlots; ++i) CHECK(cache.get(uuid_no(i), 1, t0));
  CHECK_FALSE(cache.get(uuid_no(UsageCache::kSlots), 1, t0));  // not kept
  CHECK_FALSE(cache.get(uuid_no(0), 1, t0 + std::chrono::milliseconds(5)));
  cache.lock_all();
  cache.clear_after_fork();
  CHECK_FALSE(cache.get(uuid_no(0), 1, t0));
}

namespace {

vlake::hook::KeptMappings::Entry kept_entry(int device, std::uint64_t mapped, std::uint64_t generation) {
  vlake::hook::KeptMappings::Entry e;
  e.alloc.device = device;
  e.alloc.mapped = mapped;
  e.alloc.base = 0x1000 * mapped;
  e.generation = generation;
  return e;
}
}  // namespace

TEST_CASE("KeptMappings: a key matches only its own generation and device and size and the rest comes back stale") {
  vlake::hook::KeptMappings k;
  k.put(1, kept_entry(0, 2 * kMiB, 7));
  k.put(2, kept_entry(0, 2 * kMiB, 7));
  k.put(3, kept_entry(1, 4 * kMiB, 7));
  CHECK(k.bytes(0) == 4 * kMiB);
  CHECK(k.bytes(1) == 4 * kMiB);
  std::vector<vlake::hook::KeptMappings::Entry> stale;
  // Same key, same generation, device and size: the entry itself.
  auto hit = k.take(1, 7, 0, 2 * kMiB, stale);
  REQUIRE(hit);
  CHECK(hit->alloc.base == 0x1000 * 2 * kMiB);
  CHECK(stale.empty());
  CHECK_FALSE(k.take(1, 7, 0, 2 * kMiB, stale));  // taken once
  // Another generation (a new connection), another device or size: removed and handed back.
  CHECK_FALSE(k.take(2, 8, 0, 2 * kMiB, stale));
  CHECK_FALSE(k.take(3, 7, 0, 4 * kMiB, stale));
  CHECK(stale.size() == 2);
  CHECK(k.size() == 0);
  CHECK_FALSE(k.take(99, 7, 0, 2 * kMiB, stale));  // unknown key: nothing
  CHECK(stale.size() == 2);
}

TEST_CASE("KeptMappings: take_keys skips unknown keys and take_if takes what matches with its key") {
  vlake::hook::KeptMappings k;
  k.put(1, kept_entry(0, 2 * kMiB, 1));
  k.put(2, kept_entry(1, 2 * kMiB, 1));
  k.put(3, kept_entry(0, 4 * kMiB, 2));
  const std::vector<std::uint64_t> keys = {2, 42};
  CHECK(k.take_keys(keys).size() == 1);
  auto old = k.take_if([](const vlake::hook::KeptMappings::Entry& e) { return e.generation != 2; });
  REQUIRE(old.size() == 1);
  CHECK(old[0].first == 1);
  CHECK(k.size() == 1);
  CHECK(k.bytes(0) == 4 * kMiB);
}
