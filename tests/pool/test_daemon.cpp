// vlaked as a process, against the simulator: protocol, quotas, scrubbing, process death,
// concurrency, restart, malformed input, single instance, graceful stop.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "corpus.hpp"
#include "harness.hpp"
#include "pool_client.hpp"
#include "tenant_figures.hpp"
#include "units.hpp"

using namespace vlake;
using namespace vlake::pooltest;
namespace st = vlake::state;
using proto::GrantPurpose;
using proto::Status;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

// Tenants: root (the test process and root helpers), 4242 and 4243 (helpers that setuid;
// gid 0 so they may open the simulator's node file, which is 0660 root:root).
const char* const kConfig = R"(version: 1
default:
  limit: 16MiB
users:
  - uid: 0
    limit: 64MiB
  - uid: 4242
    limit: 64MiB
  - uid: 4243
    limit: 32MiB
)";

Uuid uuid_of(const proto::HelloAck& ack) { return Uuid::from_bytes(ack.devices[0].uuid); }

std::uint64_t granted(const st::State& s, const std::string& name) {
  const st::TenantRecord* t = tenant(s, name);
  return t == nullptr ? 0 : t->granted[0];
}

}  // namespace

TEST_CASE("daemon: Hello answers tenant, session, granularity and per-GPU quota", "[daemon]") {
  DaemonProcess d("hello", kConfig);
  REQUIRE(d.start());
  PoolClient c(d.socket);
  const proto::HelloAck ack = c.hello();
  CHECK(ack.status == Status::ok);
  CHECK(ack.session_id > 0);
  CHECK(ack.tenant_id > 0);
  CHECK(std::string(ack.tenant_name) == "user:0");
  CHECK(ack.granularity == 2 * kMiB);
  CHECK(ack.device_count == 1);
  CHECK(ack.devices[0].total == 1024 * kMiB);
  CHECK(ack.devices[0].limit == 64 * kMiB);
  CHECK(ack.devices[0].used == 0);

  const auto s = snapshot(d.state);
  CHECK(std::memcmp(s->devices[0].uuid, ack.devices[0].uuid, 16) == 0);
  CHECK(s->devices[0].total == 1024 * kMiB);
  CHECK(s->header.device_count == 1);
  CHECK(s->header.daemon_pid == static_cast<std::uint32_t>(d.pid()));
  REQUIRE(live_sessions(*s) == 1);
  for (const auto& r : s->sessions) {
    if (r.state == st::kSessionFree) continue;
    CHECK(r.id == ack.session_id);
    CHECK(r.pid == static_cast<std::uint32_t>(::getpid()));
    CHECK(r.state == st::kSessionConnected);
    CHECK(tenant_name(*s, r.tenant) == "user:0");
  }

  const proto::UsageReply u = c.usage(uuid_of(ack));
  CHECK(u.status == Status::ok);
  CHECK(u.total == 1024 * kMiB);
  CHECK(u.limit == 64 * kMiB);
  Uuid bogus{};
  bogus[0] = 0xee;
  CHECK(c.usage(bogus).status == Status::unknown_device);
  CHECK(c.grant(bogus, kMiB).reply.status == Status::unknown_device);

  // Another uid gets its own tenant and limit (helper as uid 4243).
  Helper h(d.node, 4243, 0);
  const auto kv = h.ok("connect " + d.socket);
  CHECK(kv.at("name") == "user:4243");
  CHECK(num(kv, "limit") == 32 * kMiB);
  CHECK(num(kv, "session") != ack.session_id);
  // An unlisted uid: the default.
  Helper h2(d.node, 4244, 0);
  const auto kv2 = h2.ok("connect " + d.socket);
  CHECK(kv2.at("name") == "uid:4244");
  CHECK(num(kv2, "limit") == 16 * kMiB);
}

TEST_CASE("daemon: grants within the limit succeed, over the limit charge nothing", "[daemon]") {
  DaemonProcess d("limit", kConfig);
  REQUIRE(d.start());
  PoolClient c(d.socket);
  const Uuid dev = uuid_of(c.hello());

  auto g1 = c.grant(dev, 3 * kMiB);  // rounded up to the granularity
  REQUIRE(g1.reply.status == Status::ok);
  CHECK(g1.reply.bytes == 4 * kMiB);
  CHECK(g1.reply.handle_count == 1);
  CHECK(g1.fds.size() == 1);
  CHECK(g1.reply.handles[0].size == 4 * kMiB);
  CHECK(g1.reply.handles[0].offset == 0);
  CHECK(g1.reply.used == 4 * kMiB);
  CHECK(g1.reply.limit == 64 * kMiB);

  auto g2 = c.grant(dev, 40 * kMiB, GrantPurpose::create);
  REQUIRE(g2.reply.status == Status::ok);
  CHECK(g2.reply.used == 44 * kMiB);

  auto counted = c.grant(dev, 10 * kMiB, GrantPurpose::counted);  // charged, no handle
  REQUIRE(counted.reply.status == Status::ok);
  CHECK(counted.reply.handle_count == 0);
  CHECK(counted.fds.empty());
  CHECK(counted.reply.used == 54 * kMiB);

  auto over = c.grant(dev, 11 * kMiB);  // 54 + 12 > 64
  CHECK(over.reply.status == Status::over_limit);
  CHECK(over.reply.bytes == 12 * kMiB);
  CHECK(over.reply.used == 54 * kMiB);
  CHECK(over.fds.empty());
  auto s = snapshot(d.state);
  CHECK(granted(*s, "user:0") == 54 * kMiB);
  CHECK(s->counters.denials_over_limit == 1);
  CHECK(s->counters.grants == 3);
  CHECK(live_grants(*s) == 3);
  CHECK(s->devices[0].granted_bytes == 44 * kMiB);
  CHECK(s->devices[0].counted_bytes == 10 * kMiB);
  CHECK(s->devices[0].pool_bytes == 44 * kMiB);

  // Exactly up to the limit is fine.
  auto exact = c.grant(dev, 10 * kMiB);
  CHECK(exact.reply.status == Status::ok);
  CHECK(exact.reply.used == 64 * kMiB);
  CHECK(c.grant(dev, 1).reply.status == Status::over_limit);

  CHECK(c.release(g2.reply.grant_id).used == 24 * kMiB);
  CHECK(c.release(counted.reply.grant_id).used == 14 * kMiB);
  CHECK(c.release(counted.reply.grant_id).status == Status::unknown_grant);
  CHECK(c.release(999999).status == Status::unknown_grant);
  // A grant of another session cannot be released from here.
  PoolClient other(d.socket);
  other.hello();
  CHECK(other.release(g1.reply.grant_id).status == Status::unknown_grant);
  CHECK(c.release(g1.reply.grant_id).status == Status::ok);
  // An exported handle is retired, not pooled; uncharged once no other process holds its
  // descriptor (this process closes the one it received first).
  const std::uint64_t pool_before = snapshot(d.state)->devices[0].pool_bytes;
  exact.fds.clear();
  CHECK(c.release(exact.reply.grant_id, proto::kReleaseExported).used == 0);
  s = snapshot(d.state);
  CHECK(granted(*s, "user:0") == 0);
  CHECK(s->devices[0].pool_bytes == pool_before - 10 * kMiB);
  CHECK(s->counters.releases_exported == 1);
  CHECK(s->devices[0].free_bytes == 44 * kMiB);
  CHECK(live_grants(*s) == 0);
}

TEST_CASE("daemon: memory changes tenant only after a scrub, the same tenant reuses it as is", "[daemon]") {
  DaemonProcess d("scrub", kConfig);
  REQUIRE(d.start({"--handle-reuse", "node"}));  // another tenant reusing a handle: node mode only
  Helper a(d.node, 4242, 0);
  Helper b(d.node, 4243, 0);
  REQUIRE(a.ok("connect " + d.socket).at("name") == "user:4242");
  REQUIRE(b.ok("connect " + d.socket).at("name") == "user:4243");

  auto g = a.ok("grant " + std::to_string(4 * kMiB));
  REQUIRE(num(g, "status") == 0);
  const std::string id1 = g.at("id");
  a.ok("fill " + id1 + " 171");
  CHECK(a.ok("check " + id1 + " 171").at("match") == "1");
  a.ok("release " + id1);
  auto s = snapshot(d.state);
  CHECK(s->counters.scrubs == 1);  // a new handle is scrubbed before its first grant
  CHECK(s->devices[0].free_handles == 1);

  // Same tenant: the same handle comes back unscrubbed (it still holds A's pattern).
  g = a.ok("grant " + std::to_string(4 * kMiB));
  REQUIRE(num(g, "status") == 0);
  const std::string id2 = g.at("id");
  CHECK(a.ok("check " + id2 + " 171").at("match") == "1");
  s = snapshot(d.state);
  CHECK(s->counters.scrubs == 1);
  CHECK(s->counters.reuses == 1);
  a.ok("fill " + id2 + " 205");
  a.ok("release " + id2);

  // Another tenant: same handle (reuse), zeroed first.
  g = b.ok("grant " + std::to_string(4 * kMiB));
  REQUIRE(num(g, "status") == 0);
  CHECK(b.ok("check " + g.at("id") + " 0").at("match") == "1");
  s = snapshot(d.state);
  CHECK(s->counters.scrubs == 2);
  CHECK(s->counters.reuses == 2);
  CHECK(s->devices[0].pool_bytes == 4 * kMiB);  // no new memory was created
}

namespace {

// Tenant A (uid 4242) is granted 8 MiB, keeps a copy of the descriptor and releases the grant;
// tenant B (uid 4243) is granted 8 MiB and checks it holds zeros; A imports its kept descriptor
// again and fills what it reaches with 90. Returns whether B's memory changed.
bool kept_descriptor_reaches_next_tenant(const std::string& tag, const std::vector<std::string>& extra) {
  DaemonProcess d(tag, kConfig);
  REQUIRE(d.start(extra));
  Helper a(d.node, 4242, 0);
  Helper b(d.node, 4243, 0);
  a.ok("connect " + d.socket);
  b.ok("connect " + d.socket);
  auto ga = a.ok("grant " + std::to_string(8 * kMiB) + " alloc keep");
  REQUIRE(num(ga, "status") == 0);
  a.ok("fill " + ga.at("id") + " 171");
  a.ok("release " + ga.at("id"));
  auto gb = b.ok("grant " + std::to_string(8 * kMiB));
  REQUIRE(num(gb, "status") == 0);
  CHECK(b.ok("check " + gb.at("id") + " 0").at("match") == "1");  // scrubbed or new: zeros
  a.ok("kept " + ga.at("id") + " 90");
  return b.ok("check " + gb.at("id") + " 0").at("match") == "0";
}

}  // namespace

TEST_CASE("daemon: a descriptor kept after release reaches the next tenant only with --handle-reuse node",
          "[daemon][binding]") {
  CHECK_FALSE(kept_descriptor_reaches_next_tenant("keep-tenant", {}));
  CHECK(kept_descriptor_reaches_next_tenant("keep-node", {"--handle-reuse", "node"}));
}

TEST_CASE("daemon: an exported release stays charged while the tenant keeps the descriptor", "[daemon][binding]") {
  DaemonProcess d("keep-exported", kConfig);
  REQUIRE(d.start());
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  auto g = a.ok("grant " + std::to_string(16 * kMiB) + " alloc keep");
  REQUIRE(num(g, "status") == 0);
  // Exported release (flags 1) while the tenant process still holds the descriptor.
  auto r = a.ok("release " + g.at("id") + " 1");
  CHECK(num(r, "status") == 0);
  CHECK(num(r, "used") == 16 * kMiB);
  auto s = snapshot(d.state);
  const st::TenantRecord* t = tenant(*s, "user:4242");
  REQUIRE(t != nullptr);
  CHECK(t->granted[0] == 0);
  CHECK(t->retained[0] == 16 * kMiB);
  CHECK(s->devices[0].held_fd_bytes == 16 * kMiB);
  CHECK(s->devices[0].retained_bytes == 16 * kMiB);
  CHECK(s->counters.handles_retired_held == 1);
  // 64 MiB limit: 48 MiB fit, 50 do not.
  CHECK(num(a.ok("grant " + std::to_string(50 * kMiB)), "status") == static_cast<int>(proto::Status::over_limit));
  // The descriptor closes: a sampling tick later nothing is charged and the memory is back.
  a.ok("unkeep " + g.at("id"));
  CHECK(eventually(
      [&] {
        s = snapshot(d.state);
        const st::TenantRecord* x = tenant(*s, "user:4242");
        return x != nullptr && x->retained[0] == 0 && s->devices[0].held_fd_bytes == 0;
      },
      2000));
  CHECK(sim_used(d.node) == 0);
  CHECK(num(a.ok("grant " + std::to_string(64 * kMiB)), "status") == 0);
}

TEST_CASE("daemon: a SIGKILLed tenant's last process takes nothing with it: its handles are retired",
          "[daemon][binding]") {
  DaemonProcess d("kill-tenant", kConfig);
  REQUIRE(d.start());
  auto h = std::make_unique<Helper>(d.node, 4242, 0);
  h->ok("connect " + d.socket);
  for (int i = 0; i < 3; ++i) REQUIRE(num(h->ok("grant " + std::to_string(8 * kMiB)), "status") == 0);
  REQUIRE(snapshot(d.state)->devices[0].pool_bytes == 24 * kMiB);
  h->kill9();
  std::shared_ptr<const st::State> s;
  CHECK(eventually(
      [&] {
        s = snapshot(d.state);
        return live_sessions(*s) == 0 && granted(*s, "user:4242") == 0 && s->devices[0].pool_bytes == 0;
      },
      1000));
  const st::TenantRecord* t = tenant(*s, "user:4242");
  CHECK((t == nullptr || t->retained[0] == 0));
  CHECK(s->devices[0].free_handles == 0);
  CHECK(s->devices[0].held_fd_bytes == 0);
  CHECK(sim_used(d.node) == 0);  // back to the GPU, not kept for a tenant that is gone
}

TEST_CASE("daemon: a SIGKILLed client's grants return to the pool within a second", "[daemon]") {
  DaemonProcess d("kill", kConfig);
  REQUIRE(d.start({"--handle-reuse", "node"}));  // another tenant reusing them below: node mode only
  auto h = std::make_unique<Helper>(d.node, 4242, 0);
  h->ok("connect " + d.socket);
  for (int i = 0; i < 3; ++i) REQUIRE(num(h->ok("grant " + std::to_string(8 * kMiB)), "status") == 0);
  REQUIRE(num(h->ok("grant " + std::to_string(6 * kMiB) + " counted"), "status") == 0);
  auto s = snapshot(d.state);
  REQUIRE(granted(*s, "user:4242") == 30 * kMiB);
  REQUIRE(live_grants(*s) == 4);
  REQUIRE(s->devices[0].free_bytes == 0);

  h->kill9();
  const auto t0 = std::chrono::steady_clock::now();
  const bool back = eventually(
      [&] {
        s = snapshot(d.state);
        return granted(*s, "user:4242") == 0 && live_grants(*s) == 0 && s->devices[0].free_bytes == 24 * kMiB;
      },
      1000);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(back);
  CHECK(took < std::chrono::seconds(1));
  CHECK(live_sessions(*s) == 0);
  CHECK(s->counters.process_exits == 1);
  CHECK(s->devices[0].free_handles == 3);
  CHECK(s->devices[0].granted_bytes == 0);
  CHECK(s->devices[0].counted_bytes == 0);
  // Physically, the memory is the daemon's free pool: nothing leaked with the dead client.
  CHECK(sim_used(d.node) == s->devices[0].pool_bytes);
  CHECK(s->devices[0].pool_bytes == 24 * kMiB);

  // Another tenant gets it (scrubbed) without the GPU creating anything new.
  Helper b(d.node, 4243, 0);
  b.ok("connect " + d.socket);
  auto g = b.ok("grant " + std::to_string(8 * kMiB));
  REQUIRE(num(g, "status") == 0);
  CHECK(b.ok("check " + g.at("id") + " 0").at("match") == "1");
  s = snapshot(d.state);
  CHECK(s->devices[0].pool_bytes == 24 * kMiB);
  CHECK(s->counters.reuses == 1);
  CHECK(sim_used(d.node) == 24 * kMiB);
}

TEST_CASE("daemon: concurrent clients never exceed the tenant limit", "[daemon]") {
  // All helpers run as root: one tenant (user:0, 64 MiB) shared by 4 processes × 4 threads.
  DaemonProcess d("concurrent", kConfig);
  REQUIRE(d.start());
  constexpr int kProcs = 4;
  std::vector<std::unique_ptr<Helper>> hs;
  for (int i = 0; i < kProcs; ++i) hs.push_back(std::make_unique<Helper>(d.node));

  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> samples{0};
  std::atomic<std::uint64_t> violations{0};
  std::atomic<std::uint64_t> peak{0};
  std::thread watcher([&] {
    st::StateReader reader(d.state);
    while (!done.load()) {
      const auto s = reader.snapshot();
      if (const st::TenantRecord* t = tenant(*s, "user:0")) {
        if (t->granted[0] > t->limit[0]) ++violations;
        if (t->granted[0] > peak.load()) peak = t->granted[0];
      }
      if (s->devices[0].granted_bytes > 64 * kMiB) ++violations;
      ++samples;
      // Sampling every 200 us still sees thousands of states per run; a busy loop would take
      // a core from the storm it watches (2-core CI under ThreadSanitizer).
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  // Physical usage seen by a separate simulator process while the storm runs: the daemon
  // never holds more than the limit plus its free pool, which is bounded by the GPU.
  std::vector<std::thread> runners;
  std::vector<std::string> replies(kProcs);  // checked below: Catch2 assertions are not thread-safe
  for (int i = 0; i < kProcs; ++i) {
    runners.emplace_back([&, i] {
      // An exception must not leave the thread (std::terminate): it becomes a failed reply.
      try {
        // 4 × 4 threads × 60 rounds keeps the limit contended (denied > 0 below) and stays
        // well inside the test's time limit under ASan on 2 loaded cores.
        replies[static_cast<std::size_t>(i)] = hs[static_cast<std::size_t>(i)]->cmd(
            "stress " + d.socket + " 4 60 6 " + std::to_string(i + 1), std::chrono::seconds(100));
      } catch (const std::exception& e) {
        replies[static_cast<std::size_t>(i)] = std::string("exception: ") + e.what();
      }
    });
  }
  for (auto& t : runners) t.join();
  done = true;
  watcher.join();

  std::uint64_t grants = 0;
  std::uint64_t denied = 0;
  for (const std::string& reply : replies) {
    INFO(reply);
    REQUIRE(reply.rfind("ok", 0) == 0);
    const auto r = reply_fields(reply);
    INFO((r.count("first_error") != 0 ? r.at("first_error") : std::string()));
    CHECK(num(r, "errors") == 0);
    grants += num(r, "grants");
    denied += num(r, "denied");
  }
  CHECK(violations.load() == 0);
  CHECK(samples.load() > 10);
  CHECK(grants > 100);
  CHECK(denied > 0);  // the limit was actually contended
  CHECK(peak.load() <= 64 * kMiB);
  const auto s = snapshot(d.state);
  CHECK(granted(*s, "user:0") == 0);
  CHECK(s->counters.grants == grants);
  CHECK(s->counters.denials_over_limit == denied);
  CHECK(s->devices[0].granted_bytes == 0);
  CHECK(s->devices[0].free_bytes == s->devices[0].pool_bytes);
  // Physically: only the daemon's pool remains, and never more than the GPU.
  CHECK(sim_used(d.node) == s->devices[0].pool_bytes);
  CHECK(s->devices[0].pool_bytes <= 1024 * kMiB);
}

TEST_CASE("daemon: SIGKILL + restart keeps accounting, mappings and sessions", "[daemon]") {
  DaemonProcess d("restart", kConfig);
  REQUIRE(d.start());
  Helper a(d.node, 4242, 0);
  Helper b(d.node, 4243, 0);
  const auto ca = a.ok("connect " + d.socket);
  b.ok("connect " + d.socket);
  const std::uint64_t a_session = num(ca, "session");
  auto ga1 = a.ok("grant " + std::to_string(4 * kMiB));
  auto ga2 = a.ok("grant " + std::to_string(6 * kMiB));
  auto gb = b.ok("grant " + std::to_string(8 * kMiB));
  REQUIRE(num(ga1, "status") == 0);
  REQUIRE(num(ga2, "status") == 0);
  REQUIRE(num(gb, "status") == 0);
  a.ok("fill " + ga1.at("id") + " 17");
  a.ok("fill " + ga2.at("id") + " 34");
  PoolClient me(d.socket);
  const auto my_ack = me.hello();
  auto counted = me.grant(uuid_of(my_ack), 2 * kMiB, GrantPurpose::counted);
  REQUIRE(counted.reply.status == Status::ok);
  // A client that died before the restart: its grant must not survive it.
  auto c = std::make_unique<Helper>(d.node);
  c->ok("connect " + d.socket);
  REQUIRE(num(c->ok("grant " + std::to_string(2 * kMiB)), "status") == 0);

  const auto before = snapshot(d.state);
  d.signal(SIGKILL);
  REQUIRE(d.wait_exit() >= 0);
  c->kill9();
  c.reset();

  REQUIRE(d.start());
  const auto after = snapshot(d.state);
  CHECK(after->header.starts == 2);
  CHECK(after->header.daemon_pid == static_cast<std::uint32_t>(d.pid()));
  // Per-tenant usage is what it was (minus the dead client's).
  CHECK(granted(*after, "user:4242") == granted(*before, "user:4242"));
  CHECK(granted(*after, "user:4243") == granted(*before, "user:4243"));
  CHECK(granted(*after, "user:4242") == 10 * kMiB);
  CHECK(granted(*after, "user:0") == 2 * kMiB);
  CHECK(granted(*before, "user:0") == 4 * kMiB);
  // The grant table: identical except the dead client's grant.
  std::map<std::uint64_t, st::GrantRecord> gbefore;
  std::map<std::uint64_t, st::GrantRecord> gafter;
  for (const auto& g : before->grants) {
    if (g.state != st::kGrantFree) gbefore[g.id] = g;
  }
  for (const auto& g : after->grants) {
    if (g.state != st::kGrantFree) gafter[g.id] = g;
  }
  CHECK(gbefore.size() == 5);
  CHECK(gafter.size() == 4);
  for (const auto& [id, g] : gafter) {
    INFO("grant " << id);
    REQUIRE(gbefore.count(id) == 1);
    const auto& o = gbefore.at(id);
    CHECK(g.session == o.session);
    CHECK(g.bytes == o.bytes);
    CHECK(g.purpose == o.purpose);
    CHECK(g.handle_count == o.handle_count);
    CHECK(g.device == o.device);
    CHECK(tenant_name(*after, g.tenant) == tenant_name(*before, o.tenant));
    CHECK(g.state ==
          (g.purpose == static_cast<std::uint32_t>(GrantPurpose::counted) ? st::kGrantLive : st::kGrantOrphaned));
  }
  CHECK(after->devices[0].orphaned_bytes == 18 * kMiB);
  CHECK(after->devices[0].counted_bytes == 2 * kMiB);
  CHECK(after->devices[0].free_bytes == 0);
  CHECK(after->devices[0].pool_bytes == 0);
  CHECK(live_sessions(*after) == 3);
  for (const auto& r : after->sessions) {
    if (r.state != st::kSessionFree) CHECK(r.state == st::kSessionDetached);
  }

  // The tenants' mappings survived the daemon.
  CHECK(a.ok("check " + ga1.at("id") + " 17").at("match") == "1");
  CHECK(a.ok("check " + ga2.at("id") + " 34").at("match") == "1");

  // A re-binds its session, releases an old grant (just uncharged) and gets new memory.
  const auto ra = a.ok("connect " + d.socket + " " + std::to_string(a_session));
  CHECK(num(ra, "session") == a_session);
  CHECK(num(ra, "used") == 10 * kMiB);
  auto rel = a.ok("release " + ga1.at("id"));
  CHECK(num(rel, "status") == 0);
  CHECK(num(rel, "used") == 6 * kMiB);
  auto g3 = a.ok("grant " + std::to_string(4 * kMiB));
  CHECK(num(g3, "status") == 0);
  CHECK(num(g3, "used") == 10 * kMiB);
  CHECK(a.ok("check " + g3.at("id") + " 0").at("match") == "1");
  // This test process re-binds too and releases its counted grant.
  PoolClient me2(d.socket);
  CHECK(me2.hello(my_ack.session_id).session_id == my_ack.session_id);
  CHECK(me2.release(counted.reply.grant_id).status == Status::ok);
  // A session id of another process is not re-bound: a new session is opened.
  PoolClient thief(d.socket);
  CHECK(thief.hello(a_session).session_id != a_session);

  // B dies: its orphaned grant is dropped (uncharged).
  b.kill9();
  CHECK(eventually([&] { return granted(*snapshot(d.state), "user:4243") == 0; }, 1000));
  const auto s = snapshot(d.state);
  CHECK(s->devices[0].orphaned_bytes == 6 * kMiB);
  CHECK(granted(*s, "user:4242") == 10 * kMiB);
  CHECK(s->counters.sessions_rebound == 2);
}

TEST_CASE("daemon: malformed messages close only their connection", "[daemon]") {
  DaemonProcess d("malformed", kConfig);
  REQUIRE(d.start());
  PoolClient good(d.socket);
  const Uuid dev = uuid_of(good.hello());
  auto keep = good.grant(dev, 2 * kMiB);
  REQUIRE(keep.reply.status == Status::ok);

  auto hello_msg = [] {
    proto::Hello m{};
    m.h = proto::make_header<proto::Hello>(proto::MsgType::hello, 1);
    m.pid = static_cast<std::uint32_t>(::getpid());
    return m;
  };
  auto grant_msg = [&](std::uint64_t bytes) {
    proto::GrantRequest m{};
    m.h = proto::make_header<proto::GrantRequest>(proto::MsgType::grant_request, 2);
    std::memcpy(m.device_uuid, dev.data(), 16);
    m.bytes = bytes;
    m.purpose = GrantPurpose::alloc;
    return m;
  };

  // A Hello or a 1 MiB GrantRequest changed by `edit`, sent; a GrantRequest in a `size`-byte datagram.
  auto hello_edited = [&](std::function<void(proto::Hello&)> edit) {
    return [=](PoolClient& c) {
      auto m = hello_msg();
      edit(m);
      c.send(m);
    };
  };
  auto grant_edited = [&](std::function<void(proto::GrantRequest&)> edit) {
    return [=](PoolClient& c) {
      auto m = grant_msg(kMiB);
      edit(m);
      c.send(m);
    };
  };
  auto grant_in = [&](std::size_t size) {
    return [=](PoolClient& c) {
      std::vector<std::byte> b(size);
      auto m = grant_msg(kMiB);
      std::memcpy(b.data(), &m, sizeof m);
      c.send_bytes(b.data(), b.size());
    };
  };

  struct Case {
    const char* name;
    bool hello_first;
    std::function<void(PoolClient&)> send;
    const char* log;  // expected in the daemon's log line
  };
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(devnull >= 0);
  const std::vector<Case> cases = {
      {"short", false,
       [](PoolClient& c) {
         const char b[10] = {};
         c.send_bytes(b, sizeof b);
       },
       "shorter than a header"},
      {"wrong magic", false, hello_edited([](proto::Hello& m) { m.h.magic = 0x12345678; }), "bad magic"},
      {"wrong size field", false, hello_edited([](proto::Hello& m) { m.h.size = 71; }), "size does not match"},
      {"datagram longer than its type", true, grant_in(sizeof(proto::GrantRequest) + 8), "size does not match"},
      {"oversized datagram", true, grant_in(8000), "larger than"},
      {"unknown type", true, hello_edited([](proto::Hello& m) { m.h.type = static_cast<proto::MsgType>(99); }),
       "unknown message type"},
      {"reply type from a client", true,
       [&](PoolClient& c) {
         proto::ReleaseAck m{};
         m.h = proto::make_header<proto::ReleaseAck>(proto::MsgType::release_ack, 3);
         c.send(m);
       },
       "not a client request"},
      {"descriptors attached", true,
       [&](PoolClient& c) {
         proto::UsageQuery m{};
         m.h = proto::make_header<proto::UsageQuery>(proto::MsgType::usage_query, 3);
         std::memcpy(m.device_uuid, dev.data(), 16);
         const int fds[] = {devnull};
         c.send(m, fds);
       },
       "descriptors attached"},
      {"huge bytes", true, [&](PoolClient& c) { c.send(grant_msg(1ULL << 62)); }, "more than the GPU"},
      {"zero bytes", true, [&](PoolClient& c) { c.send(grant_msg(0)); }, "for 0 bytes"},
      {"bad purpose", true, grant_edited([](proto::GrantRequest& m) { m.purpose = static_cast<GrantPurpose>(7); }),
       "purpose 7 out of range"},
      {"unknown flags", true, grant_edited([](proto::GrantRequest& m) { m.flags = 1u << 9; }),
       "GrantRequest has unknown flags"},
      {"grant before hello", false, [&](PoolClient& c) { c.send(grant_msg(kMiB)); }, "request before Hello"},
      // CUDA IPC (docs/ipc.md): the same framing rules.
      {"IpcOpen before hello", false, [&](PoolClient& c) { c.send(proto::make<proto::IpcOpen>(3)); },
       "request before Hello"},
      {"IpcOpen with descriptors", true,
       [&](PoolClient& c) {
         const int fds[] = {devnull};
         c.send(proto::make<proto::IpcOpen>(3), fds);
       },
       "descriptors attached"},
      {"IpcOpenReply from a client", true, [&](PoolClient& c) { c.send(proto::make<proto::IpcOpenReply>(3)); },
       "not a client request"},
      {"second hello", true, [&](PoolClient& c) { c.send(hello_msg()); }, "second Hello"},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    PoolClient bad(d.socket);
    if (k.hello_first) bad.hello();
    k.send(bad);
    CHECK(bad.wait_closed(5000));
    // The daemon still serves the well-behaved client.
    CHECK(good.usage(dev).used == 2 * kMiB);
    CHECK_THAT(d.log(), Catch::Contains(k.log));
  }
  ::close(devnull);

  // A Hello of another protocol version: Error{version_mismatch}, then close.
  PoolClient old(d.socket);
  auto m = hello_msg();
  m.h.version = 7;
  old.send(m);
  auto reply = old.recv();
  REQUIRE(reply);
  REQUIRE_FALSE(reply->closed);
  REQUIRE(reply->type() == proto::MsgType::error);
  CHECK(reply->as<proto::Error>().status == Status::version_mismatch);
  CHECK(reply->as<proto::Error>().h.request_id == 1);
  CHECK(old.wait_closed());

  const auto s = snapshot(d.state);
  CHECK(s->counters.malformed == cases.size());
  CHECK(granted(*s, "user:0") == 2 * kMiB);  // nothing else was charged
  CHECK(good.grant(dev, 2 * kMiB).reply.status == Status::ok);
  CHECK(::kill(d.pid(), 0) == 0);
}

// The codec conformance corpus (tests/contracts/corpus.hpp) against the real daemon: every
// client message the codec refuses for its body, vlaked refuses with the same reason (its
// Error reply) and closes only that connection.
TEST_CASE("daemon: refuses the codec corpus' malformed client messages with the codec's reasons", "[daemon]") {
  DaemonProcess d("corpus", kConfig);
  REQUIRE(d.start());
  PoolClient good(d.socket);
  const Uuid dev = uuid_of(good.hello());
  std::size_t sent = 0;
  for (const contracts_test::Rejection& r : contracts_test::field_rejections()) {
    if (!r.from_client) continue;
    INFO(r.name);
    PoolClient bad(d.socket);
    if (r.type != proto::MsgType::hello) bad.hello();
    bad.send_bytes(r.bytes.data(), r.bytes.size());
    ++sent;
    auto reply = bad.recv();
    REQUIRE(reply);
    REQUIRE_FALSE(reply->closed);
    const auto e = reply->as<proto::Error>();
    CHECK(e.status == Status::bad_request);
    CHECK(std::string(e.message) == r.reason);
    CHECK(bad.wait_closed());
    // One uid's malformed-message lines are rate-limited (burst 20, docs/daemon.md "Limits").
    if (sent <= 20) CHECK_THAT(d.log(), Catch::Contains("malformed message: " + r.reason));
  }
  CHECK(sent >= 15);
  CHECK(snapshot(d.state)->counters.malformed == sent);
  CHECK(good.usage(dev).status == Status::ok);
}

TEST_CASE("daemon: one instance per socket, SIGTERM and SIGINT stop it cleanly", "[daemon]") {
  DaemonProcess d("single", kConfig);
  REQUIRE(d.start());
  // The socket directory was created 0755, the socket is 0666.
  struct stat sb {};
  REQUIRE(::stat((d.dir + "/run").c_str(), &sb) == 0);
  CHECK((sb.st_mode & 0777) == 0755);
  REQUIRE(::stat(d.socket.c_str(), &sb) == 0);
  CHECK((sb.st_mode & 0777) == 0666);

  const int second = d.run_second();
  REQUIRE(second >= 0);
  CHECK(WIFEXITED(second));
  CHECK(WEXITSTATUS(second) == 1);
  CHECK_THAT(d.log(), Catch::Contains("another vlaked (pid " + std::to_string(d.pid()) + ") owns " + d.socket));
  // A daemon on another socket with the same --state is refused too: one writer per segment.
  {
    DaemonProcess other("second-state");
    CHECK_FALSE(other.start({"--state", d.state}));
    CHECK_THAT(other.log(), Catch::Contains("is in use by another vlaked (pid " + std::to_string(d.pid()) + ")"));
    CHECK(snapshot(d.state)->header.daemon_pid == static_cast<std::uint32_t>(d.pid()));
  }
  // The first one is unharmed.
  PoolClient c(d.socket);
  const auto ack = c.hello();
  CHECK(ack.status == Status::ok);

  // With a grant held by a live process, SIGTERM keeps the segment for the next daemon.
  REQUIRE(c.grant(uuid_of(ack), 2 * kMiB).reply.status == Status::ok);
  d.signal(SIGTERM);
  int status = d.wait_exit();
  REQUIRE(status >= 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(::access(d.socket.c_str(), F_OK) != 0);
  CHECK(::access(st::segment_path(d.state).c_str(), F_OK) == 0);
  CHECK_THAT(d.log(), Catch::Contains("keeping"));

  // A stale socket file does not stop the next start; with nothing held, SIGTERM removes
  // the segment.
  { std::ofstream(d.socket) << "stale"; }
  REQUIRE(d.start());
  CHECK(snapshot(d.state)->header.clean == 0);
  CHECK(snapshot(d.state)->header.starts == 2);
  {
    // A new session cannot release the old session's grant.
    PoolClient again(d.socket);
    CHECK(again.hello().status == Status::ok);
    const auto snap = snapshot(d.state);
    for (const auto& r : snap->grants) {
      if (r.state != st::kGrantFree) CHECK(again.release(r.id).status == Status::unknown_grant);
    }
  }
  // This process still holds its old (detached) session's grant: it re-binds and releases.
  {
    PoolClient again(d.socket);
    std::uint64_t old_session = 0;
    std::uint64_t old_grant = 0;
    const auto snap = snapshot(d.state);
    for (const auto& r : snap->grants) {
      if (r.state != st::kGrantFree) {
        old_session = r.session;
        old_grant = r.id;
      }
    }
    REQUIRE(old_grant != 0);
    CHECK(again.hello(old_session).session_id == old_session);
    CHECK(again.release(old_grant).status == Status::ok);
  }
  d.signal(SIGINT);
  status = d.wait_exit();
  REQUIRE(status >= 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(::access(st::segment_path(d.state).c_str(), F_OK) != 0);
  CHECK_THAT(d.log(), Catch::Contains("state segment removed"));
}

TEST_CASE("daemon: bad start-up input fails with one clear line", "[daemon]") {
  DaemonProcess d("badcfg", "version: 1\ndefault:\n  limit: 8GB\n");
  CHECK_FALSE(d.start());
  CHECK_THAT(d.log(), Catch::Contains("bad quota file: " + d.config + ":3:10: bad limit \"8GB\": decimal units"));
  DaemonProcess e("baddriver", kConfig);
  CHECK_FALSE(e.start({"--driver", "/nonexistent/libcuda.so.1"}));
  // No library there: what to check, not a bare CUresult (303).
  CHECK_THAT(e.log(), Catch::Contains("cannot load the CUDA driver /nonexistent/libcuda.so.1 ("));
  CHECK_THAT(e.log(), Catch::Contains("Is the NVIDIA driver installed (nvidia-smi)?"));
  CHECK_THAT(e.log(), Catch::Contains("--driver PATH/sim/libcuda.so.1"));
  CHECK_THAT(e.log(), !Catch::Contains("failed: 303"));
}

TEST_CASE("daemon: NVML per-process usage counts against the quota", "[daemon]") {
  DaemonProcess d("nvml", kConfig);
  const std::string file = d.dir + "/nvml.txt";
  ::setenv("VLAKE_FAKE_NVML_FILE", file.c_str(), 1);
  REQUIRE(d.start({"--nvml", VLAKE_FAKE_NVML_LIB}));
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  const Uuid dev = Uuid::from_bytes(snapshot(d.state)->devices[0].uuid);
  auto write_usage = [&](std::uint64_t helper_bytes) {
    std::ofstream out(file + ".tmp");
    out << dev.to_string() << "\n"
        << d.pid() << " " << 500 * kMiB << "\n"  // the daemon: never attributed
        << a.pid() << " " << helper_bytes << "\n"
        << 999999 << " " << 7 * kMiB << "\n";  // no session: nobody's
    out.close();
    ::rename((file + ".tmp").c_str(), file.c_str());
  };
  write_usage(10 * kMiB);
  REQUIRE(eventually([&] { return tenant_gpu0(d.state, "user:4242", &st::TenantRecord::nonpool) == 10 * kMiB; }, 3000));
  auto s = snapshot(d.state);
  CHECK(s->devices[0].nonpool_bytes == 10 * kMiB);
  CHECK(s->counters.nvml_samples > 0);
  CHECK(num(a.ok("usage"), "used") == 10 * kMiB);
  // 10 MiB of the 64 MiB limit are used outside the pool.
  CHECK(num(a.ok("grant " + std::to_string(56 * kMiB)), "status") == static_cast<int>(Status::over_limit));
  auto g = a.ok("grant " + std::to_string(54 * kMiB));
  CHECK(num(g, "status") == 0);
  CHECK(num(g, "used") == 64 * kMiB);
  write_usage(0);
  CHECK(eventually(
      [&] {
        const auto snap = snapshot(d.state);
        return tenant(*snap, "user:4242")->nonpool[0] == 0;
      },
      3000));
  CHECK(num(a.ok("usage"), "used") == 54 * kMiB);
  CHECK_THAT(d.log(), !Catch::Contains("NVML unavailable"));
}

#ifdef VLAKE_SIM_NVML_LIB
TEST_CASE("daemon: with the simulator's NVML, pool memory is not a tenant's non-pool usage", "[daemon]") {
  DaemonProcess d("simnvml", kConfig);
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB}));
  Helper a(d.node, 4242, 0);
  a.ok("connect " + d.socket);
  auto g = a.ok("grant " + std::to_string(8 * kMiB));
  REQUIRE(num(g, "status") == 0);
  a.ok("meminfo");                          // a context: NVML lists the helper
  a.ok("own " + std::to_string(6 * kMiB));  // NVML charges this to the helper
  auto nonpool = [&] { return tenant_gpu0(d.state, "user:4242", &st::TenantRecord::nonpool); };
  // The pool handle is charged to the daemon (it holds it), not to the tenant that maps it.
  CHECK(eventually([&] { return nonpool() == 6 * kMiB; }, 3000));
  CHECK(num(a.ok("usage"), "used") == 14 * kMiB);

  // After a daemon crash the 8 MiB's charge moves to the tenant (its only holder): the new
  // daemon subtracts the orphaned grant, so non-pool usage stays 6 MiB, not 14.
  const std::uint64_t samples_before = snapshot(d.state)->counters.nvml_samples;
  d.signal(SIGKILL);
  REQUIRE(d.wait_exit() >= 0);
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB}));
  CHECK(eventually([&] { return snapshot(d.state)->counters.nvml_samples > samples_before + 2; }, 3000));
  CHECK(nonpool() == 6 * kMiB);
  const auto snap = snapshot(d.state);
  CHECK(tenant(*snap, "user:4242")->granted[0] == 8 * kMiB);
  CHECK(snap->devices[0].orphaned_bytes == 8 * kMiB);
}
#endif

TEST_CASE("daemon: --state-mode and --state-group set who may read the state", "[daemon]") {
  DaemonProcess d("state-mode");
  REQUIRE(d.start({"--state-mode", "0640", "--state-group", "4242"}));
  struct stat sb {};
  REQUIRE(::stat(st::segment_path(d.state).c_str(), &sb) == 0);
  CHECK((sb.st_mode & 0777) == 0640);
  CHECK(sb.st_gid == 4242);
}

// Sends `n` UsageQuery messages without reading a reply.
static void flood_queries(PoolClient& c, const Uuid& dev, int n) {
  for (int i = 0; i < n; ++i) {
    auto m = proto::make<proto::UsageQuery>(c.next_request_id());
    dev.copy_to(m.device_uuid);
    c.send(m);
  }
}

// Sends `n` GrantRequests of 2 MiB without reading the replies; returns their request ids.
static std::vector<std::uint64_t> flood_grants(PoolClient& c, const Uuid& dev, int n) {
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(c.next_request_id());
    auto m = proto::make<proto::GrantRequest>(ids.back());
    dev.copy_to(m.device_uuid);
    m.bytes = 2 * kMiB;
    m.purpose = GrantPurpose::alloc;
    c.send(m);
  }
  return ids;
}

// How many UsageReply messages the kernel queues to a connection of this daemon that does not
// read: a probe client floods it until the daemon closes it, then counts what it can still read.
static int kernel_queue_capacity(const DaemonProcess& d) {
  PoolClient probe(d.socket);
  const Uuid dev = uuid_of(probe.hello());
  try {
    flood_queries(probe, dev, 5000);
  } catch (const std::exception&) {
    // closed by the daemon already
  }
  int n = 0;
  while (auto msg = probe.recv(5000)) {
    if (msg->closed) return n;
    ++n;
  }
  FAIL("the daemon did not close a client that never reads");
  return n;
}

TEST_CASE("daemon: a client that stops reading gets every reply later and stalls no one", "[daemon][outbox]") {
  DaemonProcess d("outbox", "version: 1\ndefault:\n  limit: 512MiB\n");
  REQUIRE(d.start());
  const int queued_by_kernel = kernel_queue_capacity(d);
  PoolClient slow(d.socket);
  const Uuid dev = uuid_of(slow.hello());
  // Replies the kernel queues, then 20 grants and 20 queries more: those wait in the daemon's
  // outbox (Outbox::kMaxMessages is 64) until the client reads.
  flood_queries(slow, dev, queued_by_kernel);
  const std::vector<std::uint64_t> grant_ids = flood_grants(slow, dev, 20);
  flood_queries(slow, dev, 20);
  // Meanwhile another client is served at once.
  PoolClient other(d.socket);
  other.hello();
  const auto t0 = std::chrono::steady_clock::now();
  const PoolClient::Granted g = other.grant(dev, 2 * kMiB);
  CHECK(g.reply.status == Status::ok);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  // The slow client reads now: every reply, in order, each grant with its descriptor.
  int usage = 0;
  std::size_t grants = 0;
  for (int i = 0; i < queued_by_kernel + 40; ++i) {
    const auto msg = slow.recv(5000);
    REQUIRE(msg.has_value());
    REQUIRE_FALSE(msg->closed);
    if (msg->type() == proto::MsgType::usage_reply) {
      ++usage;
      continue;
    }
    const auto reply = msg->as<proto::GrantReply>();
    REQUIRE(grants < grant_ids.size());
    CHECK(reply.h.request_id == grant_ids[grants++]);
    CHECK(reply.status == Status::ok);
    CHECK(msg->fds.size() == 1);
  }
  CHECK(usage == queued_by_kernel + 20);
  CHECK(grants == grant_ids.size());
  CHECK(live_grants(*snapshot(d.state)) == grant_ids.size() + 1);
}

TEST_CASE("daemon: a client over its outbox bound is closed and its undelivered grants are undone",
          "[daemon][outbox]") {
  DaemonProcess d("outboxfull", "version: 1\ndefault:\n  limit: 512MiB\n");
  REQUIRE(d.start());
  const int queued_by_kernel = kernel_queue_capacity(d);
  PoolClient slow(d.socket);
  const Uuid dev = uuid_of(slow.hello());
  // Replies the kernel queues (and 16 more: this socket may take a few more than the probe's
  // did), then grants (their replies wait in the outbox, which holds 64), then far more queries
  // than the outbox holds: the daemon closes the connection.
  try {
    flood_queries(slow, dev, queued_by_kernel + 16);
    flood_grants(slow, dev, 20);  // their replies wait in the outbox
    flood_queries(slow, dev, 2000);
  } catch (const std::exception&) {
    // closed by the daemon already
  }
  // What reached the socket before the close can still be read; the grants never did.
  int delivered = 0;
  bool closed = false;
  while (auto msg = slow.recv(5000)) {
    if (msg->closed) {
      closed = true;
      break;
    }
    if (msg->type() == proto::MsgType::grant_reply) ++delivered;
  }
  CHECK(closed);
  CHECK(delivered < 20);  // the socket's buffer may take a reply or two more than the probe's did
  // Exactly the grants whose replies reached the socket stay charged (the process is alive: its
  // session is detached); those still in the outbox were undone.
  CHECK(eventually([&] { return live_grants(*snapshot(d.state)) == static_cast<std::size_t>(delivered); }, 5000));
  CHECK(snapshot(d.state)->devices[0].granted_bytes == static_cast<std::uint64_t>(delivered) * 2 * kMiB);
  CHECK_THAT(d.log(), Catch::Contains("replies") && Catch::Contains("closing it"));
}
