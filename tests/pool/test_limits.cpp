// Limits against hostile tenants (docs/daemon.md, "Limits"), vlaked run as a process against
// the simulator: per-tenant caps on sessions and grants, tenant records freed and the full
// table, connections that never say Hello, forged guard events. Tenants are forked children of
// this test that drop to their own uid (the test runs as root).
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "limits_util.hpp"

using namespace vlake;
using namespace vlake::pooltest;
using namespace vlake::pooltest::limits;
namespace st = vlake::state;
using proto::Status;

TEST_CASE("limits: one process opening sessions beyond the session cap is refused, others served", "[daemon][limits]") {
  DaemonProcess d("lsess", kConfig);
  REQUIRE(d.start());  // default cap: 128 sessions per tenant
  std::vector<std::unique_ptr<PoolClient>> mine;
  for (int i = 0; i < 128; ++i) {
    mine.push_back(std::make_unique<PoolClient>(d.socket));
    REQUIRE(try_hello(*mine.back()).ok);
  }
  PoolClient over(d.socket);
  const HelloResult r = try_hello(over);
  CHECK_FALSE(r.ok);
  CHECK(r.status == Status::limit_reached);
  CHECK(r.text == "session cap: tenant uid:0 holds 128 of 128 sessions (vlaked --max-sessions-per-tenant)");
  CHECK(over.wait_closed());
  CHECK(snapshot(d.state)->counters.denials_session_cap == 1);
  CHECK(live_sessions(*snapshot(d.state)) == 128);
  // Another tenant is served.
  Tenant other = Tenant::fork_one(d.socket, 4101, false);
  CHECK(other.finish() == kServed);
  CHECK_THAT(d.log(), Catch::Contains("session cap: tenant uid:0 holds 128 of 128 sessions"));
}

TEST_CASE("limits: a counted-grant flood stops at the tenant's grant cap, others are served", "[daemon][limits]") {
  DaemonProcess d("lgrant", kConfig);
  REQUIRE(d.start({"--max-grants-per-tenant", "64"}));
  PoolClient c(d.socket);
  const HelloResult h = try_hello(c);
  REQUIRE(h.ok);
  const Uuid dev = Uuid::from_bytes(h.ack.devices[0].uuid);
  int ok = 0;
  int capped = 0;
  for (int i = 0; i < 300; ++i) {
    const auto g = c.grant(dev, 1, proto::GrantPurpose::counted);
    if (g.reply.status == Status::ok) ++ok;
    if (g.reply.status == Status::limit_reached) {
      ++capped;
      CHECK(g.reply.used == 64);
      CHECK(g.reply.limit == 64);
    }
  }
  CHECK(ok == 64);
  CHECK(capped == 236);
  auto s = snapshot(d.state);
  CHECK(s->counters.denials_grant_cap == 236);
  CHECK(live_grants(*s) == 64);
  // Another tenant is served (in a second session of its own uid).
  Helper other(d.node, 4102, 0);  // gid 0: the simulated GPU's node file
  other.ok("connect " + d.socket);
  CHECK(num(other.ok("grant " + std::to_string(2 * kMiB)), "status") == 0);
  // The refusals were logged a few times, not 236 times.
  CHECK(d.log().size() < 64 * 1024);
  CHECK(snapshot(d.state)->counters.log_suppressed > 0);
}

TEST_CASE("limits: 300 distinct uids in turn are all served and their tenants freed", "[daemon][limits]") {
  DaemonProcess d("luids", kConfig);
  REQUIRE(d.start());
  int served = 0;
  for (std::uint32_t i = 0; i < 300; ++i) {
    Tenant t = Tenant::fork_one(d.socket, 20000 + i, false);
    served += t.finish() == kServed ? 1 : 0;
  }
  CHECK(served == 300);
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.tenants_freed == 300; }, 10000));
  auto s = snapshot(d.state);
  CHECK(s->counters.sessions_opened == 300);
  CHECK(s->counters.denials_tenant_table == 0);
  CHECK(tenant_records(*s) == 0);
  CHECK(live_sessions(*s) == 0);
}

TEST_CASE("limits: with 256 live tenants the 257th is refused with limit_reached and a clear text",
          "[daemon][limits]") {
  DaemonProcess d("lfull", kConfig);
  REQUIRE(d.start());
  std::vector<Tenant> live;
  for (std::uint32_t i = 0; i < st::kMaxTenants; ++i) live.push_back(Tenant::fork_one(d.socket, 30000 + i, true));
  auto s = snapshot(d.state);
  CHECK(tenant_records(*s) == st::kMaxTenants);
  {
    // The 257th tenant, seen from its own process: Error(limit_reached) with the text.
    int p[2];
    REQUIRE(::pipe(p) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(p[0]);
      std::string text = "setuid failed";
      if (::setgroups(0, nullptr) == 0 && ::setgid(39999) == 0 && ::setuid(39999) == 0) {
        try {
          PoolClient c(d.socket);
          const HelloResult r = try_hello(c);
          text = std::to_string(static_cast<int>(r.status)) + " " + r.text;
        } catch (const std::exception& e) {
          text = e.what();
        }
      }
      (void)!::write(p[1], text.data(), text.size());
      child_exit(0);
    }
    ::close(p[1]);
    std::string got;
    char buf[512];
    for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    ::close(p[0]);
    ::waitpid(pid, nullptr, 0);
    CHECK(got == "12 tenant table full: 256 of 256 tenants in use; tenant uid:39999 cannot be added");
  }
  CHECK(snapshot(d.state)->counters.denials_tenant_table == 1);
  // A uid already in the table is still served.
  Tenant again = Tenant::fork_one(d.socket, 30000, false);
  CHECK(again.finish() == kServed);
  int served = 0;
  for (Tenant& t : live) served += t.finish() == kServed ? 1 : 0;
  CHECK(served == static_cast<int>(st::kMaxTenants));
  REQUIRE(eventually([&] { return tenant_records(*snapshot(d.state)) == 0; }, 10000));
  // The table has room again.
  Tenant late = Tenant::fork_one(d.socket, 39999, false);
  CHECK(late.finish() == kServed);
  CHECK(snapshot(d.state)->counters.denials_tenant_table == 1);
}

TEST_CASE("limits: connections that never say Hello are closed and counted, others are served", "[daemon][limits]") {
  DaemonProcess d("lhello", kConfig);
  REQUIRE(d.start({"--hello-timeout-ms", "500"}));
  // 300 connections of one uid that say nothing: 64 may wait (per uid), the rest are closed at
  // once; the 64 are closed after the Hello timeout.
  std::vector<std::unique_ptr<PoolClient>> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(std::make_unique<PoolClient>(d.socket));
  // Another tenant is served meanwhile, within a second.
  const auto t0 = std::chrono::steady_clock::now();
  Tenant other = Tenant::fork_one(d.socket, 4103, false);
  CHECK(other.finish() == kServed);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.denials_unauthenticated == 300; }, 5000));
  int closed = 0;
  for (auto& c : idle) closed += c->wait_closed(2000) ? 1 : 0;
  CHECK(closed == 300);
  CHECK(d.log().size() < 64 * 1024);
  CHECK_THAT(d.log(), Catch::Contains("no Hello within 500 ms"));
  CHECK_THAT(d.log(), Catch::Contains("unauthenticated cap: uid 0 has 64 of 64 connections awaiting Hello"));
  CHECK(snapshot(d.state)->counters.log_suppressed > 200);
}

TEST_CASE("limits: a uid at its connection cap has further connections closed at accept", "[daemon][limits]") {
  DaemonProcess d("lconn", kConfig);
  REQUIRE(d.start({"--max-connections-per-uid", "20"}));
  std::vector<std::unique_ptr<PoolClient>> mine;
  for (int i = 0; i < 20; ++i) {
    mine.push_back(std::make_unique<PoolClient>(d.socket));
    REQUIRE(try_hello(*mine.back()).ok);
  }
  PoolClient over(d.socket);
  CHECK(over.wait_closed(2000));
  CHECK(eventually([&] { return snapshot(d.state)->counters.denials_connection_cap == 1; }));
  Tenant other = Tenant::fork_one(d.socket, 4104, false);
  CHECK(other.finish() == kServed);
  CHECK_THAT(d.log(), Catch::Contains("connection cap: uid 0 holds 20 of 20 connections"));
}

TEST_CASE("limits: forged guard events are rejected or limited, a real one is still recorded",
          "[daemon][limits][guard]") {
  DaemonProcess d("lguard", kConfig);
  REQUIRE(d.start());
  PoolClient forger(d.socket);
  const HelloResult h = try_hello(forger);
  REQUIRE(h.ok);
  const Uuid dev = Uuid::from_bytes(h.ack.devices[0].uuid);
  auto event = [&](std::uint64_t bytes) {
    proto::GuardEvent ev = proto::make<proto::GuardEvent>(forger.next_request_id());
    ev.kind = proto::GuardKind::fault;
    dev.copy_to(ev.device_uuid);
    ev.cuda_status = 700;
    ev.live_allocations = 1;
    ev.suspect_count = 1;
    ev.suspects[0] = proto::GuardSuspect{0x7f0000000000ULL, bytes, 1000};
    std::strcpy(ev.call, "cuStreamSynchronize");
    return ev;
  };
  // Holding nothing: every event is rejected, none recorded.
  for (int i = 0; i < 100; ++i) forger.send(event(4096));
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.guard_events_rejected == 100; }));
  CHECK(snapshot(d.state)->counters.kernel_faults[0] == 0);
  // Holding a grant: a flood of plausible events fills the burst (20), the rest is limited.
  REQUIRE(forger.grant(dev, 2 * kMiB).reply.status == Status::ok);
  for (int i = 0; i < 1000; ++i) forger.send(event(4096));
  REQUIRE(eventually([&] {
    const auto s = snapshot(d.state);
    return s->counters.kernel_faults[0] + s->counters.guard_events_limited == 1000;
  }));
  auto s = snapshot(d.state);
  CHECK(s->counters.kernel_faults[0] < 40);  // the burst, plus what the rate refilled
  CHECK(s->counters.guard_events_limited > 960);
  // Another tenant's real alarm, sent from its own process, is recorded: the newest event.
  const std::uint64_t before = s->counters.kernel_faults[0];
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = kOtherError;
    if (::setgroups(0, nullptr) == 0 && ::setgid(4105) == 0 && ::setuid(4105) == 0) {
      try {
        PoolClient c(d.socket);
        if (try_hello(c).ok && c.grant(dev, 2 * kMiB).reply.status == Status::ok) {
          proto::GuardEvent ev = event(8192);
          ev.h.request_id = c.next_request_id();
          c.send(ev);
          code = c.usage(dev).status == Status::ok ? kServed : kOtherError;  // the event was handled
        }
      } catch (...) {
        code = kOtherError;
      }
    }
    child_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == kServed));
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.kernel_faults[0] == before + 1; }));
  s = snapshot(d.state);
  REQUIRE_FALSE(st::ring_order(s->guard).empty());
  const st::GuardEventRecord& newest = *st::ring_order(s->guard).back();
  CHECK(std::string(newest.tenant_name) == "uid:4105");
  CHECK(newest.requested_bytes == 8192);
  CHECK(d.log().size() < 64 * 1024);
}

TEST_CASE("limits: out of descriptors, vlaked closes new connections without spinning", "[daemon][limits]") {
  DaemonProcess d("lemfile", kConfig);
  REQUIRE(d.start({"--hello-timeout-ms", "1000", "--max-unauthenticated-per-uid", "1000"}));
  // The daemon gets few descriptors: idle connections exhaust them.
  rlimit low{96, 96};
  REQUIRE(::prlimit(d.pid(), RLIMIT_NOFILE, &low, nullptr) == 0);
  // utime + stime of the daemon, in clock ticks (/proc/<pid>/stat fields 14 and 15).
  auto cpu_ticks = [&] {
    std::string stat;
    {
      std::ifstream in("/proc/" + std::to_string(d.pid()) + "/stat");
      std::getline(in, stat);
    }
    std::istringstream f(stat.substr(stat.rfind(')') + 2));
    std::string x;
    long long ticks = 0;
    for (int i = 3; i <= 15 && (f >> x); ++i) {
      if (i >= 14) ticks += std::stoll(x);
    }
    return ticks;
  };
  std::vector<std::unique_ptr<PoolClient>> idle;
  int refused = 0;  // the listen backlog fills while the daemon has no descriptor to accept with
  for (int i = 0; i < 300; ++i) {
    try {
      idle.push_back(std::make_unique<PoolClient>(d.socket));
    } catch (const std::system_error&) {
      ++refused;
    }
  }
  INFO("connections opened " << idle.size() << ", refused " << refused);
  REQUIRE(idle.size() > 96);  // more than the daemon's descriptors: it ran out
  const long long before = cpu_ticks();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long long spent = cpu_ticks() - before;  // clock ticks (1/100 s)
  CHECK(spent < 20);                             // far from a busy loop (50 ticks)
  // Once the idle connections time out, a tenant is served again.
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.denials_unauthenticated > 0; }, 5000));
  idle.clear();
  Tenant other = Tenant::fork_one(d.socket, 4106, false);
  CHECK(other.finish() == kServed);
  CHECK(snapshot(d.state)->counters.denials_connection_cap > 0);  // closed for lack of descriptors
  CHECK_THAT(d.log(), Catch::Contains("out of descriptors"));
  CHECK(d.log().size() < 64 * 1024);
}
