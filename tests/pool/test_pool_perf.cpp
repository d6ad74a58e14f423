// Pool performance against the simulator (docs/pool.md): cross-tenant stitching, the warm
// reserve, and the pressure protocol (parked grants, timeouts, clients without the flag).
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "daemon_grants.hpp"
#include "harness.hpp"
#include "units.hpp"

using namespace vlake;
using namespace vlake::pooltest;
namespace st = vlake::state;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

TEST_CASE("pool: cross-tenant stitching serves a grant from handles another tenant freed", "[pool][sim]") {
  DaemonProcess d("stitch", kWholeGpuConfig);
  REQUIRE(d.start({"--handle-reuse", "node"}));  // cross-tenant stitching is node mode only
  TwoTenants t(d);
  Helper& a = t.a;
  Helper& b = t.b;
  Helper& filler = t.filler;

  // A allocates four granularity-sized grants, writes them and frees them.
  const std::vector<std::string> ids = grant_each(a, 4, 2, 171);
  release_all(a, ids);
  auto s = snapshot(d.state);
  REQUIRE(s->devices[0].free_handles == 4);
  REQUIRE(s->devices[0].free_small_handles == 4);
  const std::uint64_t created = s->counters.handles_created;

  // The rest of the GPU goes to memory outside the pool: no new handle can be created.
  filler.ok("own " + std::to_string(kGiB - s->devices[0].pool_bytes));
  CHECK(num(filler.ok("meminfo"), "used") == kGiB);

  auto g = b.ok("grant " + mib(8));
  REQUIRE(num(g, "status") == 0);
  CHECK(num(g, "handles") == 4);
  CHECK(b.ok("sizes " + g.at("id")).at("sizes") == mib(2) + "," + mib(2) + "," + mib(2) + "," + mib(2));
  // Scrubbed: none of A's bytes reach B.
  CHECK(b.ok("check " + g.at("id") + " 0").at("match") == "1");
  // B maps the four handles back to back: writes and reads cross every boundary.
  b.ok("fill " + g.at("id") + " 90");
  CHECK(b.ok("check " + g.at("id") + " 90").at("match") == "1");
  for (int k = 1; k < 4; ++k) b.ok("poke " + g.at("id") + " " + std::to_string(k * 2 * kMiB - 8) + " 16 90");
  CHECK(b.ok("check " + g.at("id") + " 90").at("match") == "1");

  s = snapshot(d.state);
  CHECK(s->counters.handles_created == created);  // nothing was created
  CHECK(s->counters.grants_stitched == 1);
  CHECK(s->counters.handles_stitched == 4);
  CHECK(s->counters.stitched_cross_tenant == 1);
  CHECK(s->counters.scrubs == 4 + 4);  // four new handles for A, A's four again for B
  CHECK(s->counters.grants_new == 4);
  CHECK(s->devices[0].free_handles == 0);
  CHECK(s->devices[0].pool_peak_bytes == 8 * kMiB);
  CHECK(s->counters.requests >= 2 + 4 + 4 + 1);

  // Released, the four handles go back to the pool as they are.
  b.ok("release " + g.at("id"));
  s = snapshot(d.state);
  CHECK(s->devices[0].free_handles == 4);
}

TEST_CASE("pool: the warm reserve is created at start and serves a grant with no cuMemCreate", "[pool][sim]") {
  DaemonProcess d("warm", kWholeGpuConfig);
  REQUIRE(d.start({"--warm-reserve", "128MiB"}));
  auto s = snapshot(d.state);
  // 16 MiB of small handles, one 64 MiB bulk handle, the rest small.
  CHECK(s->devices[0].warm_target_bytes == 128 * kMiB);
  CHECK(s->devices[0].free_bytes == 128 * kMiB);
  CHECK(s->devices[0].free_bulk_handles == 1);
  CHECK(s->devices[0].free_small_handles == 32);
  CHECK(s->counters.handles_created == 33);
  const std::uint64_t created = s->counters.handles_created;

  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  auto g = a.ok("grant " + mib(64));
  REQUIRE(num(g, "status") == 0);
  CHECK(num(g, "handles") == 1);
  CHECK(a.ok("check " + g.at("id") + " 0").at("match") == "1");  // warm handles are zeroed
  s = snapshot(d.state);
  // Served by the warm bulk handle (the timer may already have created its replacement).
  CHECK(s->counters.grants_exact == 1);
  CHECK(s->counters.grants_new == 0);
  CHECK(s->counters.handles_created <= created + 1);
  CHECK(s->counters.scrubs == 0);  // zeroed at creation, not on the request path

  // The timer refills the reserve (one new bulk handle) while the grant is held.
  CHECK(eventually([&] {
    auto x = snapshot(d.state);
    return x->devices[0].free_bytes == 128 * kMiB && x->devices[0].free_bulk_handles == 1;
  }));
  s = snapshot(d.state);
  CHECK(s->counters.handles_created == created + 1);
  CHECK(s->devices[0].pool_peak_bytes == 192 * kMiB);
}

TEST_CASE("pool: the warm stock builds a size in demand on its worker and another tenant's grant takes it clean",
          "[pool][sim][warm]") {
  DaemonProcess d("stock", kWholeGpuConfig);
  REQUIRE(d.start({"--warm-stock", "64MiB"}));
  auto s = snapshot(d.state);
  CHECK(s->devices[0].free_bytes == 0);  // no demand yet: nothing built
  Helper a(d.node, 4242, 0);
  Helper b(d.node, 4243, 0);
  a.ok("connect " + d.socket);
  b.ok("connect " + d.socket);
  auto g = a.ok("grant " + mib(8));
  REQUIRE(num(g, "status") == 0);
  a.ok("fill " + g.at("id") + " 171");
  REQUIRE(num(a.ok("grant " + mib(8)), "status") == 0);  // asked for twice: in demand
  // The worker builds one clean 8 MiB handle; the loop adopts it.
  CHECK(eventually([&] {
    auto x = snapshot(d.state);
    return x->devices[0].free_bytes == 8 * kMiB && x->devices[0].free_handles == 1;
  }));
  s = snapshot(d.state);
  const std::uint64_t created = s->counters.handles_created;
  CHECK(created == 3);
  CHECK(s->counters.grants_new == 2);
  const std::uint64_t scrubs = s->counters.scrubs;  // the first grant's new handle was zeroed on its path
  auto h = b.ok("grant " + mib(8));
  REQUIRE(num(h, "status") == 0);
  CHECK(b.ok("check " + h.at("id") + " 0").at("match") == "1");  // zeroed by the worker
  s = snapshot(d.state);
  CHECK(s->counters.grants_exact == 1);
  CHECK(s->counters.scrubs == scrubs);
  // Its replacements follow, off the request path (asked for three times: two handles).
  CHECK(eventually([&] {
    auto x = snapshot(d.state);
    return x->counters.handles_created == created + 2 && x->devices[0].free_bytes == 16 * kMiB;
  }));
  // A's memory was never handed out: binding keeps it A's.
  CHECK(a.ok("check " + g.at("id") + " 171").at("match") == "1");
}

TEST_CASE("pool: pressure asks a flagged client for its reserve and the parked grant is served", "[pool][sim]") {
  DaemonProcess d("pressure", kWholeGpuConfig);
  REQUIRE(d.start({"--pressure-wait-ms", "5000"}));
  Helper a(d.node, 4242, 0);  // keeps a reserve, speaks the pressure protocol
  Helper n(d.node, 4243, 0);  // no kHelloPressure
  Helper b(d.node);           // needs memory
  Helper filler(d.node);
  a.ok("connectp " + d.socket);
  n.ok("connect " + d.socket);
  b.ok("connect " + d.socket);
  auto ga = a.ok("grant " + mib(8));
  REQUIRE(num(ga, "status") == 0);
  a.ok("reserve " + mib(8) + " 1");
  auto gn = n.ok("grant " + mib(2));
  REQUIRE(num(gn, "status") == 0);
  n.ok("reserve " + mib(2) + " 1");  // reported, but n never gets Pressure
  CHECK(eventually([&] {
    auto x = snapshot(d.state);
    const st::TenantRecord* t = tenant(*x, "uid:4242");
    return t != nullptr && t->reserve[0] == 8 * kMiB && x->devices[0].hook_reserve_bytes == 10 * kMiB &&
           x->counters.reserve_reports == 2;
  }));
  auto s = snapshot(d.state);
  filler.ok("own " + std::to_string(kGiB - s->devices[0].pool_bytes));

  std::string gb_reply;  // checked after join: Catch2 assertions are not thread-safe
  std::thread t([&] { gb_reply = b.cmd("grant " + mib(8)); });
  const auto p = a.ok("pressure 5000");
  CHECK(p.at("got") == "1");
  CHECK(num(p, "bytes") == 8 * kMiB);
  CHECK(num(p, "reason") == 1);
  CHECK(num(p, "request") == 0);
  // (the counters are written right after the message is sent)
  CHECK(eventually([&] {
    auto x = snapshot(d.state);
    return x->counters.grants_parked == 1 && x->counters.pressure_sent == 1;
  }));
  // The daemon keeps serving other connections while the grant waits.
  CHECK(num(n.ok("usage"), "status") == 0);
  a.ok("release " + ga.at("id"));
  t.join();
  INFO(gb_reply);
  REQUIRE(gb_reply.rfind("ok", 0) == 0);
  const auto gb = reply_fields(gb_reply);
  REQUIRE(num(gb, "status") == 0);
  CHECK(num(gb, "handles") == 1);
  CHECK(b.ok("check " + gb.at("id") + " 0").at("match") == "1");
  CHECK(n.ok("pressure 200").at("got") == "0");
  s = snapshot(d.state);
  CHECK(s->counters.parked_timeouts == 0);
  CHECK(s->counters.denials_out_of_memory == 0);
  // A's returned handle is bound to A (--handle-reuse tenant): it was retired (nobody held its
  // descriptor) and B got new memory in its place.
  CHECK(s->counters.grants_exact == 0);
  CHECK(s->counters.grants_new == 3);
  CHECK(s->devices[0].held_fd_bytes == 0);
}

TEST_CASE("pool: a parked grant times out as out_of_memory, and without flagged reserves none is parked",
          "[pool][sim]") {
  DaemonProcess d("pressure-timeout", kWholeGpuConfig);
  REQUIRE(d.start({"--pressure-wait-ms", "300"}));
  Helper a(d.node, 4242, 0);
  Helper n(d.node, 4243, 0);
  Helper b(d.node);
  auto filler = std::make_unique<Helper>(d.node);
  n.ok("connect " + d.socket);
  b.ok("connect " + d.socket);
  auto gn = n.ok("grant " + mib(4));
  REQUIRE(num(gn, "status") == 0);
  n.ok("reserve " + mib(4) + " 2");
  auto s = snapshot(d.state);
  filler->ok("own " + std::to_string(kGiB - s->devices[0].pool_bytes));

  // Only a client without the flag holds reserve: refused at once, nobody is asked.
  auto t0 = std::chrono::steady_clock::now();
  CHECK(num(b.ok("grant " + mib(4)), "status") == 2);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(250));
  CHECK(n.ok("pressure 200").at("got") == "0");
  s = snapshot(d.state);
  CHECK(s->counters.grants_parked == 0);
  CHECK(s->counters.pressure_sent == 0);

  // A flagged client that keeps its reserve: the grant waits --pressure-wait-ms, then fails.
  filler.reset();  // its memory goes back to the GPU; taken again below, after a's grant
  a.ok("connectp " + d.socket);
  auto ga = a.ok("grant " + mib(4));
  REQUIRE(num(ga, "status") == 0);
  a.ok("reserve " + mib(4) + " 1");
  Helper filler2(d.node);
  s = snapshot(d.state);
  filler2.ok("own " + std::to_string(kGiB - s->devices[0].pool_bytes));
  t0 = std::chrono::steady_clock::now();
  CHECK(num(b.ok("grant " + mib(4)), "status") == 2);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= std::chrono::milliseconds(280));
  CHECK(waited < std::chrono::milliseconds(3000));
  CHECK(a.ok("pressure 1000").at("got") == "1");
  CHECK(n.ok("pressure 100").at("got") == "0");
  s = snapshot(d.state);
  CHECK(s->counters.grants_parked == 1);
  CHECK(s->counters.parked_timeouts == 1);
  CHECK(s->counters.pressure_sent == 1);
  CHECK(s->counters.denials_out_of_memory == 2);
}
