// Unit tests of the hook's pure parts: configuration, byte formatting, rate limiting, the
// reference/mapping bookkeeping of the create path, and the destinations of copies/memsets.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <thread>

#include "config.hpp"
#include "log.hpp"
#include "swap.hpp"  // before tables.hpp: it includes cuda.h the way the hook compiles it
#include "tables.hpp"
#include "units.hpp"
#include "write_span.hpp"

using namespace vlake::hook;
using namespace std::chrono_literals;
using vlake::LogLevel;

namespace {

Config parse(const std::map<std::string, std::string>& env) {
  return Config::parse([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

CUmemAllocationProp device_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

vlake::UniqueFd some_fd() { return vlake::UniqueFd(::dup(STDERR_FILENO)); }

}  // namespace

namespace {

// The settings every variable below leaves at its default when unset or malformed.
void check_default_settings(const Config& c) {
  CHECK(c.socket_path == "/run/vlake/vlaked.sock");
  CHECK(c.on_unreachable == OnUnreachable::refuse);
  CHECK(c.reconnect_timeout == 5000ms);
  CHECK(c.timeout == 10000ms);
  CHECK(c.log_level == LogLevel::warn);
  CHECK_FALSE(c.disabled);
  CHECK_FALSE(c.wait.has_value());  // the namespace's `wait`
}

// Each variable of the tests below with a valid value and a malformed one.
struct Setting {
  const char* name;
  std::string valid;
  std::string malformed;
};

// Every variable set to its `valid` or its `malformed` value.
std::map<std::string, std::string> settings(std::string Setting::*value) {
  const Setting all[] = {
      {"VLAKE_SOCKET", "/tmp/x.sock", std::string(200, 'x')},
      {"VLAKE_ON_UNREACHABLE", "passthrough", "ignore"},
      {"VLAKE_RECONNECT_TIMEOUT", "250ms", "-1"},
      {"VLAKE_TIMEOUT", "2.5s", "0"},
      {"VLAKE_LOG", "debug", "loud"},
      {"VLAKE_WAIT", "30s", "11m"},
      {"VLAKE_DISABLE", "1", "maybe"},
  };
  std::map<std::string, std::string> env;
  for (const Setting& s : all) env[s.name] = s.*value;
  return env;
}

}  // namespace

TEST_CASE("config: defaults") {
  const Config c = parse({});
  check_default_settings(c);
  CHECK(c.reserve_bytes == std::uint64_t{512} << 20);  // measured: docs/hook.md
  CHECK(c.reserve_age == 5000ms);
  CHECK(c.reserve_stats.empty());
  CHECK(c.problems.empty());
}

TEST_CASE("config: every variable") {
  const Config c = parse(settings(&Setting::valid));
  CHECK(c.socket_path == "/tmp/x.sock");
  CHECK(c.wait == std::optional(30000ms));
  CHECK(c.on_unreachable == OnUnreachable::passthrough);
  CHECK(c.reconnect_timeout == 250ms);
  CHECK(c.timeout == 2500ms);
  CHECK(c.log_level == LogLevel::debug);
  CHECK(c.disabled);
  CHECK(c.problems.empty());
}

TEST_CASE("config: malformed values keep the default and are reported") {
  const Config c = parse(settings(&Setting::malformed));
  check_default_settings(c);
  CHECK(c.problems.size() == 7);
}

TEST_CASE("config: durations take the common grammar, a bare number is refused naming the variable") {
  // The grammar itself: tests/common/test_duration.cpp. Here: each variable reads it.
  for (const char* name : {"VLAKE_RECONNECT_TIMEOUT", "VLAKE_TIMEOUT", "VLAKE_WAIT", "VLAKE_RESERVE_AGE"}) {
    INFO(name);
    CHECK(parse({{name, "30s"}}).problems.empty());
    CHECK(parse({{name, "0.5m"}}).problems.empty());
    const Config c = parse({{name, "30"}});
    REQUIRE(c.problems.size() == 1);
    CHECK(c.problems[0] == "ignoring " + std::string(name) + "=\"30\": a duration needs a unit; write 30s or 30ms");
  }
  CHECK(parse({{"VLAKE_TIMEOUT", "30s"}}).timeout == 30s);
  CHECK(parse({{"VLAKE_TIMEOUT", "30"}}).timeout == 10s);  // refused: the default stays
  CHECK(parse({{"VLAKE_WAIT", "30s"}}).wait == std::optional(30000ms));
  CHECK_FALSE(parse({{"VLAKE_WAIT", "30"}}).wait.has_value());
  CHECK(parse({{"VLAKE_RECONNECT_TIMEOUT", "750ms"}}).reconnect_timeout == 750ms);
  CHECK(parse({{"VLAKE_RECONNECT_TIMEOUT", "0"}}).reconnect_timeout == 0ms);
  CHECK(parse({{"VLAKE_RESERVE_AGE", "1.5s"}}).reserve_age == 1500ms);
  CHECK(parse({{"VLAKE_TIMEOUT", "0"}}).problems.at(0) == "ignoring VLAKE_TIMEOUT=\"0\": must be greater than zero");
  CHECK(parse({{"VLAKE_WAIT", "11m"}}).problems.at(0) == "ignoring VLAKE_WAIT=\"11m\": must be at most 10m");
}

TEST_CASE("byte formatting") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(4096) == "4 KiB");
  CHECK(format_bytes(512ull << 20) == "512 MiB");
  CHECK(format_bytes(7ull << 29) == "3.5 GiB");
  CHECK(format_bytes((4ull << 30) - 1) == "3.9 GiB");  // never rounded up
}

TEST_CASE("rate limiter: one per interval, counting the rest") {
  RateLimiter r(100ms);
  std::uint64_t suppressed = 99;
  CHECK(r.allow(suppressed));
  CHECK(suppressed == 0);
  CHECK_FALSE(r.allow(suppressed));
  CHECK_FALSE(r.allow(suppressed));
  std::this_thread::sleep_for(120ms);
  CHECK(r.allow(suppressed));
  CHECK(suppressed == 2);
}

namespace {

LogicalAlloc logical(std::uint64_t base, std::uint64_t reserved, std::uint64_t mapped, std::uint64_t ptr,
                     std::uint64_t requested, std::uint64_t grant, int device,
                     std::chrono::steady_clock::time_point created = {}) {
  LogicalAlloc a;
  a.base = base;
  a.reserved = reserved;
  a.mapped = mapped;
  a.ptr = ptr;
  a.requested = requested;
  a.grant_id = grant;
  a.device = device;
  a.created = created;
  a.handles = {1, 2};
  return a;
}

}  // namespace

TEST_CASE("alloc table: lookups inside the reserved range") {
  AllocTable t;
  t.insert(logical(0x10000000, 4 << 20, 4 << 20, 0x10000000, 3 << 20, 7, 0));
  CHECK(t.find(0x10000000)->grant_id == 7);
  CHECK(t.find(0x10000000 + (4 << 20) - 1)->requested == (3u << 20));
  CHECK_FALSE(t.find(0x10000000 + (4 << 20)));
  CHECK_FALSE(t.find(0x0fffffff));
  CHECK_FALSE(t.take(0x10000001));
  auto a = t.take(0x10000000);
  REQUIRE(a);
  CHECK(a->handles == std::vector<std::uint64_t>{1, 2});
  CHECK(t.size() == 0);
}

TEST_CASE("alloc table: right-aligned pointers are found and taken by the returned pointer") {
  AllocTable t;
  // Fault-mode layout: 4 MiB mapped + 2 MiB guard; 3 MiB + 100 B requested, right-aligned.
  const std::uint64_t base = 0x20000000;
  const std::uint64_t req = (3u << 20) + 100;
  const std::uint64_t ptr = base + (4u << 20) - ((req + 255) / 256 * 256);
  t.insert(logical(base, 6 << 20, 4 << 20, ptr, req, 9, 0));
  REQUIRE(t.find(ptr));
  CHECK(t.find(ptr)->ptr == ptr);
  CHECK(t.find(base + (6 << 20) - 1)->grant_id == 9);  // the guard chunk belongs to it
  CHECK_FALSE(t.find(base + (6 << 20)));
  CHECK_FALSE(t.take(base));  // the reservation base is not the application's pointer
  CHECK_FALSE(t.take(ptr + 256));
  CHECK(t.size() == 1);
  REQUIRE(t.take(ptr));
  CHECK(t.size() == 0);
}

TEST_CASE("alloc table: newest allocations of a device, newest first") {
  AllocTable t;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < 12; ++i) {
    t.insert(logical(0x10000000 + i * (8 << 20), 4 << 20, 4 << 20, 0x10000000 + i * (8 << 20), 1 << 20, 100 + i,
                     i % 2 == 0 ? 0 : 1, t0 + std::chrono::milliseconds(i)));
  }
  CHECK(t.count(0) == 6);
  CHECK(t.count(1) == 6);
  CHECK(t.count(2) == 0);
  auto n = t.newest(0, 4);
  REQUIRE(n.size() == 4);
  CHECK(n[0].grant_id == 110);
  CHECK(n[1].grant_id == 108);
  CHECK(n[3].grant_id == 104);
  CHECK(t.newest(1, 8).size() == 6);
}

TEST_CASE("alloc table: peer sets are retagged per device and reported with the set they had") {
  AllocTable t;
  t.insert(logical(0x10000000, 4 << 20, 4 << 20, 0x10000000, 1 << 20, 1, 1));
  t.insert(logical(0x20000000, 4 << 20, 4 << 20, 0x20000000, 1 << 20, 2, 1));
  t.insert(logical(0x30000000, 4 << 20, 4 << 20, 0x30000000, 1 << 20, 3, 0));
  CHECK(t.set_peers(0x20000000, 0b1) == std::optional<std::uint32_t>{0});  // one already has GPU 0
  auto changed = t.retag(1, 0b1);
  REQUIRE(changed.size() == 1);
  CHECK(changed[0].grant_id == 1);
  CHECK(changed[0].peers == 0);  // the set it had
  CHECK(changed[0].mapped == (4u << 20));
  CHECK(t.find(0x10000000)->peers == 0b1);
  CHECK(t.find(0x30000000)->peers == 0);  // another device: untouched
  CHECK(t.retag(1, 0b1).empty());
  changed = t.retag(1, 0);
  CHECK(changed.size() == 2);
  auto taken = t.take(0x20000000);
  REQUIRE(taken);
  CHECK(taken->peers == 0);  // what a reserve block carries
  CHECK_FALSE(t.set_peers(0x20000000, 0b1));
}

TEST_CASE("create table: finished only without references and mappings") {
  CreateTable t;
  t.add(42, 1, 2 << 20, device_prop(), some_fd());
  bool ours = false;

  SECTION("release without mapping finishes") {
    auto f = t.released(42, ours);
    CHECK(ours);
    REQUIRE(f);
    CHECK(f->grant_id == 1);
    CHECK_FALSE(f->exported);
    CHECK(t.grants() == 0);
  }
  SECTION("mapped twice, retained, released: finished at the last unmap") {
    t.mapped(0x200000, 2 << 20, 42);
    t.mapped(0x800000, 2 << 20, 42);
    CHECK(t.retained(0x200000 + 5, 42));
    CHECK_FALSE(t.retained(0x200000 + 5, 43));  // another handle value
    CHECK_FALSE(t.released(42, ours));
    CHECK_FALSE(t.released(42, ours));
    CHECK_FALSE(t.owns(42));
    CHECK(t.unmapped(0x200000, 2 << 20).empty());
    // Retain through the remaining mapping makes the handle live again.
    CHECK(t.retained(0x800000, 42));
    CHECK(t.owns(42));
    CHECK(t.unmapped(0, 0x10000000).empty());
    auto f = t.released(42, ours);
    REQUIRE(f);
    CHECK(f->grant_id == 1);
  }
  SECTION("one unmap covering several mappings") {
    t.add(43, 2, 2 << 20, device_prop(), some_fd());
    t.mapped(0x200000, 2 << 20, 42);
    t.mapped(0x400000, 2 << 20, 43);
    CHECK_FALSE(t.released(42, ours));
    CHECK_FALSE(t.released(43, ours));
    auto done = t.unmapped(0x200000, 4 << 20);
    REQUIRE(done.size() == 2);
    CHECK(t.grants() == 0);
  }
  SECTION("export marks the grant and hands out a new descriptor") {
    auto fd = t.export_fd(42);
    REQUIRE(fd);
    CHECK(*fd >= 0);
    ::close(*fd);
    CHECK_FALSE(t.export_fd(99));
    auto f = t.released(42, ours);
    REQUIRE(f);
    CHECK(f->exported);
  }
  SECTION("foreign handles are not ours") {
    CHECK_FALSE(t.released(7, ours));
    CHECK_FALSE(ours);
    t.mapped(0x200000, 2 << 20, 7);
    CHECK(t.unmapped(0x200000, 2 << 20).empty());
    CHECK(t.grants() == 1);
  }
  SECTION("imports of a held handle count as references") {
    CHECK(t.add_reference(42));
    CHECK_FALSE(t.add_reference(8));
    CHECK_FALSE(t.released(42, ours));
    CHECK(t.released(42, ours));
  }
}

// ---- Local reserve and sizes ----------------------------------------------------------------

#include "reserve.hpp"

namespace {

vlake::hook::ReserveBlock block(int device, std::uint64_t mapped, std::uint64_t base, int age_ms) {
  vlake::hook::ReserveBlock b;
  b.alloc.device = device;
  b.alloc.mapped = mapped;
  b.alloc.base = base;
  b.alloc.grant_id = base;
  b.freed = std::chrono::steady_clock::now() - std::chrono::milliseconds(age_ms);
  return b;
}

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

}  // namespace

TEST_CASE("VLAKE_RESERVE takes the common size grammar, decimal units keep the default") {
  auto reserve = [](const std::string& v) { return parse({{"VLAKE_RESERVE", v}}); };
  CHECK(reserve("0").reserve_bytes == std::uint64_t{0});
  CHECK(reserve("4096B").reserve_bytes == std::uint64_t{4096});
  CHECK(reserve("8GiB").reserve_bytes == 8192 * kMiB);
  CHECK(reserve("512MiB").reserve_bytes == 512 * kMiB);
  CHECK(reserve("3Ki").reserve_bytes == std::uint64_t{3072});
  for (const char* bad :
       {"1GB", "2G", "", "-1", "8", "4096", "1.5GiB", "12XB", "99999999999999999999999", "20000000TiB"}) {
    INFO(bad);
    const Config c = reserve(bad);
    CHECK(c.reserve_bytes == 512 * kMiB);
    REQUIRE(c.problems.size() == 1);
    CHECK_THAT(c.problems[0], Catch::StartsWith("ignoring VLAKE_RESERVE=\"" + std::string(bad) + "\": "));
  }
  CHECK(reserve("1GB").problems[0] ==
        "ignoring VLAKE_RESERVE=\"1GB\": decimal units are ambiguous; write 1GiB (1073741824 bytes)");
  CHECK(reserve("8").problems[0] == "ignoring VLAKE_RESERVE=\"8\": a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB");
}

TEST_CASE("VLAKE_RESERVE and VLAKE_RESERVE_AGE are parsed, bad values keep the defaults") {
  std::map<std::string, std::string> env{{"VLAKE_RESERVE", "256MiB"}, {"VLAKE_RESERVE_AGE", "500ms"}};
  auto lookup = [&env](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto c = vlake::hook::Config::parse(lookup);
  CHECK(c.reserve_bytes == 256 * kMiB);
  CHECK(c.reserve_age == std::chrono::milliseconds(500));
  CHECK(c.problems.empty());
  env = {{"VLAKE_RESERVE", "lots"}, {"VLAKE_RESERVE_AGE", "0"}};
  c = vlake::hook::Config::parse(lookup);
  CHECK(c.reserve_bytes == 512 * kMiB);
  CHECK(c.reserve_age == std::chrono::seconds(5));
  CHECK(c.problems.size() == 2);
}

TEST_CASE("LocalReserve: fit within 1/8 slack, most recent of a size first, per device") {
  vlake::hook::LocalReserve r(1024 * kMiB, std::chrono::seconds(30));
  const std::uint64_t g = 2 * kMiB;
  CHECK(vlake::hook::LocalReserve::fit_limit(2 * kMiB, g) == 2 * kMiB);
  CHECK(vlake::hook::LocalReserve::fit_limit(20 * kMiB, g) == 22 * kMiB);
  CHECK(vlake::hook::LocalReserve::fit_limit(256 * kMiB, g) == 288 * kMiB);
  CHECK(r.put(block(0, 22 * kMiB, 0x1000, 50)).empty());
  CHECK(r.put(block(0, 4 * kMiB, 0x2000, 40)).empty());
  CHECK(r.put(block(0, 4 * kMiB, 0x3000, 10)).empty());
  CHECK(r.put(block(1, 2 * kMiB, 0x4000, 10)).empty());
  CHECK(r.bytes(0) == 30 * kMiB);
  CHECK(r.blocks(0) == 3);
  vlake::hook::ReserveBlock out;
  CHECK_FALSE(r.take(0, 2 * kMiB, g, out));  // 4 MiB is too big for 2 MiB; device 1 has one
  REQUIRE(r.take(0, 4 * kMiB, g, out));
  CHECK(out.alloc.base == 0x3000);            // the more recently freed
  CHECK_FALSE(r.take(0, 18 * kMiB, g, out));  // 22 MiB > 18 + 2
  REQUIRE(r.take(0, 20 * kMiB, g, out));
  CHECK(out.alloc.base == 0x1000);
  REQUIRE(r.take(1, 2 * kMiB, g, out));
  CHECK(r.total_bytes() == 4 * kMiB);
}

TEST_CASE("LocalReserve: byte cap evicts the oldest, expire and drain") {
  vlake::hook::LocalReserve r(10 * kMiB, std::chrono::milliseconds(100));
  CHECK(r.put(block(0, 4 * kMiB, 0x1000, 30)).empty());
  CHECK(r.put(block(0, 4 * kMiB, 0x2000, 20)).empty());
  auto out = r.put(block(0, 4 * kMiB, 0x3000, 10));
  REQUIRE(out.size() == 1);
  CHECK(out[0].alloc.base == 0x1000);
  CHECK(r.total_bytes() == 8 * kMiB);
  out = r.put(block(0, 12 * kMiB, 0x4000, 0));  // larger than the cap: straight back
  REQUIRE(out.size() == 1);
  CHECK(out[0].alloc.base == 0x4000);
  CHECK(r.put(block(1, 2 * kMiB, 0x5000, 500)).empty());  // exactly at the cap
  out = r.expire(std::chrono::steady_clock::now());
  REQUIRE(out.size() == 1);  // 500 ms idle >= 100 ms
  CHECK(out[0].alloc.base == 0x5000);
  out = r.expire(std::chrono::steady_clock::now() + std::chrono::milliseconds(85));
  REQUIRE(out.size() == 1);  // 0x2000: 20 + 85 >= 100; 0x3000: 10 + 85 < 100
  CHECK(out[0].alloc.base == 0x2000);
  CHECK(r.put(block(0, 2 * kMiB, 0x6000, 5)).empty());
  out = r.drain(0, 1);
  REQUIRE(out.size() == 1);
  CHECK(out[0].alloc.base == 0x3000);  // the least recently freed on device 0
  out = r.drain(0, 0);
  CHECK(out.size() == 1);
  CHECK(r.total_bytes() == 0);
}

#include "counted.hpp"

TEST_CASE("ReuseStats: bucket bounds") {
  using std::chrono::milliseconds;
  using vlake::hook::ReuseStats;
  CHECK(ReuseStats::gap_bucket(std::chrono::microseconds(999)) == 0);
  CHECK(ReuseStats::gap_bucket(milliseconds(1)) == 1);      // [1, 2) ms
  CHECK(ReuseStats::gap_bucket(milliseconds(3)) == 2);      // [2, 4)
  CHECK(ReuseStats::gap_bucket(milliseconds(1000)) == 10);  // [512, 1024)
  CHECK(ReuseStats::gap_bucket(milliseconds(1024)) == 11);
  CHECK(ReuseStats::gap_bucket(std::chrono::hours(100)) == ReuseStats::kGapBuckets - 1);
  CHECK(ReuseStats::stack_bucket(1) == 0);
  CHECK(ReuseStats::stack_bucket(kMiB) == 0);
  CHECK(ReuseStats::stack_bucket(kMiB + 1) == 1);  // (1, 2] MiB
  CHECK(ReuseStats::stack_bucket(2 * kMiB) == 1);
  CHECK(ReuseStats::stack_bucket(3 * kMiB) == 2);      // (2, 4]
  CHECK(ReuseStats::stack_bucket(1024 * kMiB) == 10);  // (512, 1024]
  CHECK(ReuseStats::stack_bucket(std::uint64_t{1} << 62) == ReuseStats::kStackBuckets - 1);
}

TEST_CASE("LocalReserve: reuse statistics record gap and LRU stack distance") {
  vlake::hook::LocalReserve r(10 * kMiB, std::chrono::milliseconds(100));
  const std::uint64_t g = 2 * kMiB;
  vlake::hook::ReserveBlock out;
  CHECK(r.put(block(0, 2 * kMiB, 0x1000, 0)).empty());  // not recorded: stats are off
  REQUIRE(r.take(0, 2 * kMiB, g, out));
  CHECK_FALSE(r.take(0, 2 * kMiB, g, out));
  CHECK(r.stats().puts == 0);
  CHECK(r.stats().misses == 0);

  r.enable_stats();
  CHECK(r.put(block(0, 4 * kMiB, 0x1000, 50)).empty());  // idle 50 ms, oldest
  CHECK(r.put(block(1, 2 * kMiB, 0x2000, 20)).empty());
  CHECK(r.put(block(0, 2 * kMiB, 0x3000, 10)).empty());
  REQUIRE(r.take(0, 4 * kMiB, g, out));  // 4 + 2 + 2 MiB freed at or after it
  CHECK_FALSE(r.take(0, 8 * kMiB, g, out));
  REQUIRE(r.take(0, 2 * kMiB, g, out));  // only itself
  auto s = r.stats();
  CHECK(s.puts == 3);
  CHECK(s.misses == 1);
  CHECK(s.miss_bytes == 8 * kMiB);
  CHECK(s.reuse_bytes == 6 * kMiB);
  CHECK(s.peak_bytes == 8 * kMiB);
  using vlake::hook::ReuseStats;
  CHECK(s.reuses[ReuseStats::gap_bucket(std::chrono::milliseconds(50))][ReuseStats::stack_bucket(8 * kMiB)] == 1);
  CHECK(s.reuses[ReuseStats::gap_bucket(std::chrono::milliseconds(10))][ReuseStats::stack_bucket(2 * kMiB)] == 1);

  auto left = r.put(block(0, 12 * kMiB, 0x4000, 0));  // over the cap
  CHECK(left.size() == 1);
  left = r.expire(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  CHECK(left.size() == 1);  // the device-1 block
  CHECK(r.put(block(0, 2 * kMiB, 0x5000, 0)).empty());
  CHECK(r.drain(0, 0).size() == 1);
  s = r.stats();
  CHECK(s.evicted == 1);
  CHECK(s.evicted_bytes == 12 * kMiB);
  CHECK(s.expired == 1);
  CHECK(s.expired_bytes == 2 * kMiB);
  CHECK(s.drained == 1);
  CHECK(s.drained_bytes == 2 * kMiB);
  const std::string j = s.to_json(10 * kMiB, std::chrono::milliseconds(100));
  CHECK_THAT(j, Catch::StartsWith("{\"reserve_cap\":10485760,\"reserve_age_ms\":100,\"reuse_bytes\":6291456,"));
  CHECK_THAT(j, Catch::Contains("\"misses\":1,"));
  CHECK_THAT(j, Catch::EndsWith("]]}"));
}

TEST_CASE("Ledger: growth is charged, a shrink by at least the slack consolidates") {
  using vlake::hook::Ledger;
  constexpr std::uint64_t M = 1 << 20;
  Ledger l;
  CHECK(l.charged() == 0);
  auto p = l.plan(4 * M, 2 * M);
  CHECK(p.charge == 4 * M);
  CHECK_FALSE(p.consolidate);
  l.add(1, 4 * M);
  l.add(2, 6 * M);
  CHECK(l.charged() == 10 * M);
  p = l.plan(10 * M, 2 * M);  // unchanged: nothing to do
  CHECK(p.charge == 0);
  CHECK_FALSE(p.consolidate);
  p = l.plan(9 * M, 2 * M);  // less than the slack below: kept
  CHECK(p.charge == 0);
  CHECK_FALSE(p.consolidate);
  p = l.plan(6 * M, 2 * M);  // released memory: everything goes back, 6 MiB charged afresh
  CHECK(p.consolidate);
  CHECK(p.charge == 6 * M);
  p = l.plan(0, 2 * M);
  CHECK(p.consolidate);
  CHECK(p.charge == 0);
  CHECK(l.take_all() == std::vector<std::uint64_t>{1, 2});
  CHECK(l.charged() == 0);
  CHECK(l.empty());
  CHECK(l.plan(0, 0).charge == 0);  // a zero slack behaves as one byte
}

TEST_CASE("CreateTable: a counted handle is released like a pool handle but not served") {
  vlake::hook::CreateTable t;
  t.add_counted(0x77, 9, 4 << 20);
  CHECK(t.owns(0x77));
  CHECK_FALSE(t.serves(0x77));
  CHECK_FALSE(t.props(0x77).has_value());  // the driver answers for its own handle
  CHECK_FALSE(t.export_fd(0x77).value_or(0) >= 0);
  t.mapped(0x1000000, 4 << 20, 0x77);
  bool ours = false;
  CHECK_FALSE(t.released(0x77, ours).has_value());  // still mapped
  CHECK(ours);
  auto done = t.unmapped(0x1000000, 4 << 20);
  REQUIRE(done.size() == 1);
  CHECK(done[0].grant_id == 9);
  CHECK(t.grants() == 0);
}

TEST_CASE("write spans: the bytes a memset or a 2D/3D copy writes, saturating", "[unit]") {
  CHECK(span_elems(1, 16) == 16);
  CHECK(span_elems(4, 16) == 64);
  CHECK(span_elems(2, 0) == 0);
  CHECK(span_elems(4, UINT64_MAX / 2) == UINT64_MAX);
  // 3 rows of 100 bytes, 256 apart: from the first byte to one past the last.
  CHECK(span_2d(256, 100, 3) == 2 * 256 + 100);
  CHECK(span_2d(256, 100, 1) == 100);
  CHECK(span_2d(256, 0, 3) == 0);
  CHECK(span_2d(256, 100, 0) == 0);
  CHECK(span_2d(UINT64_MAX / 2, 100, 4) == UINT64_MAX);

  CUDA_MEMCPY2D c{};
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = 0x7f0000000000;
  c.dstXInBytes = 8;
  c.dstY = 2;
  c.dstPitch = 512;
  c.WidthInBytes = 64;
  c.Height = 4;
  CHECK(dst_2d(&c) == std::pair<std::uint64_t, std::uint64_t>{0x7f0000000000 + 2 * 512 + 8, 3 * 512 + 64});
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  CHECK(dst_2d(&c).second == 3 * 512 + 64);
  c.dstMemoryType = CU_MEMORYTYPE_HOST;  // not device memory: nothing to look up
  CHECK(dst_2d(&c).second == 0);
  CHECK(dst_2d(nullptr).second == 0);

  CUDA_MEMCPY3D d{};
  d.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  d.dstDevice = 0x7f0000000000;
  d.dstXInBytes = 4;
  d.dstY = 1;
  d.dstZ = 2;
  d.dstPitch = 256;
  d.dstHeight = 8;  // a slice is 8 rows: 2048 bytes
  d.WidthInBytes = 16;
  d.Height = 3;
  d.Depth = 2;
  CHECK(dst_3d(&d) ==
        std::pair<std::uint64_t, std::uint64_t>{0x7f0000000000 + 2 * 2048 + 256 + 4, 2048 + 2 * 256 + 16});
  d.Depth = 0;
  CHECK(dst_3d(&d).second == 0);
  d.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  d.Depth = 2;
  CHECK(dst_3d(&d).second == 0);
}

TEST_CASE("swap: a process is busy when its other threads used more than a fifth of a CPU over the window") {
  using vlake::hook::CpuWatch;
  constexpr std::uint64_t ms = 1'000'000;
  CpuWatch w;
  CHECK_FALSE(w.busy(500 * ms));  // no samples
  std::uint64_t cpu = 0;
  // 50 ms ticks, idle (1 ms of CPU per tick: timers, heartbeats).
  for (int i = 0; i < 12; ++i) w.sample(static_cast<std::uint64_t>(i) * 50 * ms, cpu += ms);
  CHECK_FALSE(w.busy(500 * ms));
  CHECK_FALSE(w.busy(200 * ms));
  // It starts computing: 50 ms of CPU per 50 ms tick for two ticks.
  w.sample(12 * 50 * ms, cpu += 50 * ms);
  w.sample(13 * 50 * ms, cpu += 50 * ms);
  CHECK(w.busy(200 * ms));  // 102 of 200 ms
  CHECK(w.busy(500 * ms));  // 108 of 500 ms
  // Idle again for a second: no longer busy.
  for (int i = 14; i < 34; ++i) w.sample(static_cast<std::uint64_t>(i) * 50 * ms, cpu += ms);
  CHECK_FALSE(w.busy(500 * ms));
  // /proc/self/task is readable here: this thread's CPU time counts, the excluded one's does not.
  const std::uint64_t all = vlake::hook::app_cpu_ns(-1);
  CHECK(all > 0);
  CHECK(vlake::hook::app_cpu_ns(static_cast<long>(::gettid())) <= all);
}
