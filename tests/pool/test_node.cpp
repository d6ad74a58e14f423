// Unit tests of vlaked's decision model (vlake::pool::Node) without a process: sessions, grants,
// pressure and parked grants, quota reloads, state, limits and memory outside vlake. The other
// test_node_*.cpp files test its feature rooms through the Node.
#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

namespace {

// A Kubernetes allocation of `bytes` on GPU 0, added to the node.
AllocationInfo add_allocation(World& w, const std::string& id, Bytes bytes) {
  AllocationInfo a;
  a.id = id;
  a.device = DeviceOrdinal{0};
  a.bytes = bytes;
  w.node->allocation_added(a);
  return a;
}

}  // namespace

TEST_CASE("node: grants within the tenant limit, a refusal names the limit and charges nothing", "[node]") {
  World w("version: 1\ndefault: {limit: 8MiB}\n");
  const auto s = w.hello(1, 100, 1000);
  CHECK(w.tenant_of(s) == "uid:1000");
  w.granted(1, s, 3 * kMiB);  // rounded up to the 2 MiB granularity
  CHECK(w.used(s) == 4_MiB);
  w.granted(1, s, 4 * kMiB);
  CHECK(w.refused(1, s, 2 * kMiB) == proto::Status::over_limit);
  CHECK(w.used(s) == 8_MiB);
  CHECK(w.node->counters().denials_tenant_limit == 1);
  CHECK(w.node->counters().grants == 2);
  // More than the GPU has is a malformed request, not a refusal.
  CHECK(std::holds_alternative<Malformed>(w.grant(1, s, 2ULL << 30)));
  // A session that is gone cannot ask.
  CHECK(std::holds_alternative<Malformed>(w.grant(1, s + 100, 2 * kMiB)));
}

TEST_CASE("node: a guarantee refuses borrowing, a reload lowers it and the grant is served", "[node][quota]") {
  const std::string before = R"(version: 1
default: {limit: 100%}
namespaces:
  - {name: research, guaranteed: 768MiB, users: [1001]}
  - {name: batch, users: [1002]}
)";
  World w(before);
  const auto a = w.hello(1, 101, 1001);
  const auto b = w.hello(2, 102, 1002);
  CHECK(w.tenant_of(a) == "research/user:1001");
  CHECK(w.tenant_of(b) == "batch/user:1002");
  // batch borrows what nobody is guaranteed (256 MiB), then hits research's guarantee.
  w.granted(2, b, 256 * kMiB);
  CHECK(w.refused(2, b, 2 * kMiB) == proto::Status::guarantee);
  CHECK(w.node->counters().denials_guarantee == 1);
  // research gets its guarantee whatever batch holds.
  w.granted(1, a, 512 * kMiB);

  std::string after = before;
  after.replace(after.find("768MiB"), 6, "512MiB");
  quota::QuotaConfig cfg = config(after);
  w.node->validate(cfg);
  w.node->apply(std::move(cfg), "test.yaml", true, w.t, "test");
  CHECK(w.node->config_record().generation == 2);
  CHECK(w.node->counters().config_reloads == 1);
  w.granted(2, b, 2 * kMiB);
  CHECK(w.used(b) == 258_MiB);

  // A file that does not fit the GPU is refused by validate() and changes nothing.
  std::string bad = before;
  bad.replace(bad.find("768MiB"), 6, "2GiB");
  CHECK_THROWS_AS(w.node->validate(config(bad)), quota::ConfigError);
}

TEST_CASE("node: a reload moves a live session to its new tenant with its grants", "[node][quota]") {
  World w("version: 1\ndefault: {limit: 64MiB}\n");
  const auto s = w.hello(1, 100, 1000);
  w.granted(1, s, 16 * kMiB);
  quota::QuotaConfig cfg = config(R"(version: 1
default: {limit: 64MiB}
namespaces:
  - {name: team, limit: 32MiB}
users:
  - {uid: 1000, limit: 64MiB, namespace: team}
)");
  w.node->apply(std::move(cfg), "test.yaml", true, w.t, "test");
  CHECK(w.tenant_of(s) == "team/user:1000");
  CHECK(w.used(s) == 16_MiB);
  // The old tenant holds nothing now; the namespace counts the moved grant.
  const Node::Namespace& team = w.node->namespaces().at("team");
  CHECK(w.node->accounting().namespace_usage(team.id, DeviceOrdinal{0}).granted == 16_MiB);
  CHECK(w.refused(1, s, 18 * kMiB) == proto::Status::namespace_over_limit);
  w.granted(1, s, 16 * kMiB);
}

TEST_CASE("node: a process exit returns every grant, another tenant gets the memory scrubbed", "[node]") {
  // Cross-tenant reuse is `--handle-reuse node` (the default binds handles to their tenant).
  NodeSettings settings;
  settings.bind_handles = false;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const auto a = w.hello(1, 101, 1001);
  w.granted(1, a, 8 * kMiB);
  w.granted(1, a, 8 * kMiB);
  const Node::Device& d = w.node->devices().front();
  const Bytes pool = d.pool->pool_bytes();
  CHECK(w.node->end_session(a, "process exited") == 1);  // its connection, for the loop to close
  CHECK(w.node->sessions().empty());
  CHECK(w.node->grants().empty());
  CHECK(d.pool->free_bytes() == pool);
  CHECK(d.granted == 0_B);
  CHECK(w.node->counters().process_exits == 1);

  const auto b = w.hello(2, 102, 1002);
  // A's tenant record was freed with its session: B gets its id, and still A's memory is zeroed.
  CHECK(w.node->counters().tenants_freed == 1);
  CHECK(w.node->session(b)->tenant == TenantId{1});
  const std::uint64_t scrubs = w.node->counters().scrubs;
  w.granted(2, b, 8 * kMiB);
  CHECK(w.node->counters().grants_exact == 1);
  CHECK(w.node->counters().scrubs == scrubs + 1);  // A's memory is zeroed before B gets it
  CHECK(d.pool->pool_bytes() == pool);             // no new memory
}

TEST_CASE("node: a grant the pool cannot serve is parked, pressured, served when memory returns", "[node][pressure]") {
  NodeSettings settings;
  settings.pressure_wait = std::chrono::milliseconds(500);
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const auto a = w.hello(1, 101, 1001, /*pressure=*/true);
  const auto b = w.hello(2, 102, 1002);
  const std::uint64_t held = w.granted(1, a, 512 * kMiB);
  w.take_outside(512_MiB);  // the rest of the GPU
  proto::ReserveReport report = proto::make<proto::ReserveReport>(0);
  w.node->devices().front().uuid.copy_to(report.device_uuid);
  report.bytes = 512 * kMiB;
  report.blocks = 1;
  CHECK_FALSE(w.node->reserve_report(a, report).has_value());

  GrantOut out = w.grant(2, b, 2 * kMiB);
  const auto* parked = std::get_if<Parked>(&out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == 1);  // A is asked, B is not
  CHECK(parked->pressure[0].msg.bytes >= 2 * kMiB);
  CHECK(w.node->rooms().parking.size() == 1);
  CHECK_FALSE(w.node->retry_due(w.t));

  w.release(a, held);  // A returns its reserve
  w.retry_grants_one(2);
  CHECK(w.used(b) == 2_MiB);
  CHECK(w.node->rooms().parking.size() == 0);
  CHECK(w.node->counters().grants_parked == 1);
}

TEST_CASE("node: a parked grant times out as out_of_memory, without flagged reserves none is parked",
          "[node][pressure]") {
  World w("version: 1\ndefault: {limit: 100%}\n");
  const auto a = w.hello(1, 101, 1001, /*pressure=*/true);
  const auto b = w.hello(2, 102, 1002);
  w.granted(1, a, 512 * kMiB);
  w.take_outside(512_MiB);
  // A reported no reserve: nobody can give memory back.
  CHECK(w.refused(2, b, 2 * kMiB) == proto::Status::out_of_memory);
  CHECK(w.node->counters().denials_out_of_memory == 1);

  proto::ReserveReport report = proto::make<proto::ReserveReport>(0);
  w.node->devices().front().uuid.copy_to(report.device_uuid);
  report.bytes = 64 * kMiB;
  CHECK_FALSE(w.node->reserve_report(a, report).has_value());
  REQUIRE(std::holds_alternative<Parked>(w.grant(2, b, 2 * kMiB)));
  REQUIRE(w.node->next_deadline().has_value());
  w.advance(std::chrono::milliseconds(100));
  CHECK_FALSE(w.node->retry_due(w.t));
  w.advance(std::chrono::milliseconds(400));
  std::vector<Completion> done = w.retry_due_parked();
  REQUIRE(done.size() == 1);
  const auto* r = std::get_if<Refused>(&done[0].out);
  REQUIRE(r != nullptr);
  CHECK(r->reply.status == proto::Status::out_of_memory);
  CHECK(w.node->counters().parked_timeouts == 1);
  CHECK(w.used(b) == 0_B);
}

TEST_CASE("node: reclaim: a GPU held in full parks the grant: lower priorities first, never a waiting session",
          "[node][pressure]") {
  NodeSettings settings;
  settings.pressure_wait = std::chrono::milliseconds(500);
  World w(
      "version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: low, priority: 0, users: [1001, 1003]}\n"
      "  - {name: high, priority: 10, users: [1002]}\n",
      settings);
  const auto a = w.hello(1, 101, 1001, true);  // low
  const auto c = w.hello(3, 103, 1003, true);  // low
  const auto b = w.hello(2, 102, 1002, true);  // high
  const std::uint64_t ga = w.granted(1, a, 384 * kMiB);
  w.advance(std::chrono::milliseconds(10));  // c was active after a: a is the more idle
  w.granted(3, c, 384 * kMiB);
  w.granted(2, b, 128 * kMiB);
  // No reserve anywhere; every session reports a reclaim callback.
  for (const auto s : {a, b, c}) {
    proto::ReserveReport report = proto::make<proto::ReserveReport>(0);
    w.node->devices().front().uuid.copy_to(report.device_uuid);
    report.flags = proto::kReportReclaim;
    CHECK_FALSE(w.node->reserve_report(s, report).has_value());
  }

  // B (high) needs 256 MiB: the GPU is held in full (the accounting refuses), B's grant is parked
  // and one low session is asked, the more idle one: A, whose 384 MiB cover the shortfall.
  GrantOut out = w.grant(2, b, 256 * kMiB);
  const auto* parked = std::get_if<Parked>(&out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == 1);

  // A (low) now needs 256 MiB as well: B is of a higher priority, C... is asked; B never is.
  out = w.grant(1, a, 256 * kMiB);
  parked = std::get_if<Parked>(&out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == 3);

  // C needs memory too: A and B wait for grants of their own (and B is of a higher priority):
  // nobody is asked, C is refused at once.
  CHECK(std::holds_alternative<Refused>(w.grant(3, c, 256 * kMiB)));

  // A's framework gives back its 384 MiB: B's parked grant is served.
  w.release(a, ga);
  std::vector<Completion> done = w.retry_due_parked();
  REQUIRE_FALSE(done.empty());
  CHECK(done[0].conn == 2);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  CHECK(w.used(b) == 384_MiB);
}

TEST_CASE("node: reclaim: a parked grant still short after 250 ms asks the next session", "[node][pressure]") {
  NodeSettings settings;
  settings.pressure_wait = std::chrono::milliseconds(2000);
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const auto a = w.hello(1, 101, 1001, true);
  const auto c = w.hello(3, 103, 1003, true);
  const auto b = w.hello(2, 102, 1002, true);
  w.granted(1, a, 384 * kMiB);
  w.advance(std::chrono::milliseconds(10));
  const std::uint64_t gc = w.granted(3, c, 384 * kMiB);
  w.granted(2, b, 128 * kMiB);
  for (const auto s : {a, c}) {
    proto::ReserveReport report = proto::make<proto::ReserveReport>(0);
    w.node->devices().front().uuid.copy_to(report.device_uuid);
    report.flags = proto::kReportReclaim;
    CHECK_FALSE(w.node->reserve_report(s, report).has_value());
  }
  GrantOut out = w.grant(2, b, 256 * kMiB);
  INFO("outcome " << out.index() << " status "
                  << (std::holds_alternative<Refused>(out) ? static_cast<int>(std::get<Refused>(out).reply.status)
                                                           : -1));
  const auto* parked = std::get_if<Parked>(&out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == 1);  // A, the more idle

  // A's framework had nothing cached (everything it holds is in use): nothing comes back.
  w.advance(std::chrono::milliseconds(100));
  CHECK_FALSE(w.node->retry_due(w.t));
  REQUIRE(w.node->next_deadline().has_value());
  CHECK(*w.node->next_deadline() <= w.t.steady + std::chrono::milliseconds(150));
  w.advance(std::chrono::milliseconds(150));
  std::vector<Completion> done = w.retry_due_parked();
  REQUIRE(done.size() == 1);
  parked = std::get_if<Parked>(&done[0].out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == 3);  // then C
  CHECK(w.node->rooms().parking.size() == 1);

  // Everyone was asked: nobody is asked again until a new round starts, 1 s after the first;
  // but A and C gave nothing within their deadline: they lost their turn (docs/pool.md, "Claims
  // and measurements"), and the new round asks nobody.
  w.advance(std::chrono::milliseconds(300));
  CHECK(w.retry_parked(w.t).empty());
  CHECK_FALSE(w.node->rooms().reclaim.askable(a, w.t.steady));
  CHECK_FALSE(w.node->rooms().reclaim.askable(c, w.t.steady));
  w.advance(std::chrono::milliseconds(500));
  CHECK(w.retry_parked(w.t).empty());

  w.release(c, gc);  // C's cache comes back after all: it may be asked again
  CHECK(w.node->rooms().reclaim.askable(c, w.t.steady));
  done = w.retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  CHECK(w.node->counters().pressure_sent == 2);
}

TEST_CASE("node: a session that waits for memory is parked with nobody to ask, served when memory returns",
          "[node][pressure]") {
  World w("version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: nb, wait: 2s, users: [1003]}\n");
  const auto a = w.hello(1, 101, 1001);
  // B asks for its own wait in Hello (VLAKE_WAIT=3s); C has its namespace's 2 s.
  proto::Hello m = proto::make<proto::Hello>(1);
  m.flags = proto::kHelloWait;
  m.wait_ms = 3000;
  HelloOut hb = w.node->open_session(Peer{2, 102, 1002, 1002, 1102, ""}, m);
  REQUIRE(std::holds_alternative<proto::HelloAck>(hb.answer));
  CHECK(std::get<proto::HelloAck>(hb.answer).wait_ms == 3000);
  const auto b = hb.session;
  HelloOut hc = w.node->open_session(Peer{3, 103, 1003, 1003, 1103, ""}, proto::make<proto::Hello>(1));
  REQUIRE(std::holds_alternative<proto::HelloAck>(hc.answer));
  CHECK(std::get<proto::HelloAck>(hc.answer).wait_ms == 2000);
  CHECK(std::get<proto::HelloAck>(
            w.node->open_session(Peer{4, 104, 1004, 1004, 1104, ""}, proto::make<proto::Hello>(1)).answer)
            .wait_ms == 0);
  const std::uint64_t ga = w.granted(1, a, 1024 * kMiB - 64 * kMiB);

  // Nobody can be asked (A has no reserve and no reclaim callback): B waits all the same.
  GrantOut out = w.grant(2, b, 128 * kMiB);
  const auto* parked = std::get_if<Parked>(&out);
  REQUIRE(parked != nullptr);
  CHECK(parked->pressure.empty());
  w.advance(std::chrono::milliseconds(2500));
  w.retry_parked(w.t);  // still short, still waiting (3 s)
  CHECK(w.node->rooms().parking.size() == 1);
  w.release(a, ga);  // A frees: B is served
  std::vector<Completion> done = w.retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));

  // C (2 s from its namespace) gives up after 2 s when nothing comes back.
  w.granted(1, a, 1024 * kMiB - 192 * kMiB);
  REQUIRE(std::holds_alternative<Parked>(w.grant(3, hc.session, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(1900));
  CHECK(w.retry_parked(w.t).empty());
  w.advance(std::chrono::milliseconds(200));
  done = w.retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Refused>(done[0].out));
}

TEST_CASE("node: a parked grant of a connection that closed is dropped", "[node][pressure]") {
  World w("version: 1\ndefault: {limit: 100%}\n");
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002);
  const std::uint64_t held = w.granted(1, a, 512 * kMiB);
  w.take_outside(512_MiB);
  proto::ReserveReport report = proto::make<proto::ReserveReport>(0);
  w.node->devices().front().uuid.copy_to(report.device_uuid);
  report.bytes = 512 * kMiB;
  (void)w.node->reserve_report(a, report);
  REQUIRE(std::holds_alternative<Parked>(w.grant(2, b, 2 * kMiB)));
  w.node->connection_closed(2, b, /*exited=*/false);  // B detached, alive
  w.release(a, held);
  CHECK(w.retry_parked(w.t).empty());
  CHECK(w.node->session(b) != nullptr);
}

TEST_CASE("node: a reconnecting process re-binds its session, another process cannot", "[node]") {
  World w("version: 1\ndefault: {limit: 100%}\n");
  const auto s = w.hello(1, 100, 1000);
  w.granted(1, s, 2 * kMiB);
  proto::Hello again = proto::make<proto::Hello>(2);
  again.old_session = s;
  HelloOut out = w.node->open_session(Peer{5, 100, 1000, 1000, 1100, ""}, again);
  CHECK(out.session == s);
  CHECK_FALSE(out.opened);
  CHECK(out.close == 1);  // the old connection
  CHECK(w.node->counters().sessions_rebound == 1);
  // Same pid number, another process (start time differs): a new session.
  HelloOut other = w.node->open_session(Peer{6, 100, 1000, 1000, 999, ""}, again);
  CHECK(other.session != s);
  CHECK(other.opened);
  // A process that is gone cannot open one.
  HelloOut gone = w.node->open_session(Peer{7, 200, 1000, 1000, 0, ""}, again);
  CHECK(std::holds_alternative<Malformed>(gone.answer));
}

TEST_CASE("node: a Kubernetes allocation's tenant is resolved through the quota file", "[node][k8s]") {
  World w(R"(version: 1
default: {limit: 100%}
namespaces:
  - {name: team, pod_limit: 96MiB, guard: canary}
)");
  const AllocationInfo a = add_allocation(w, "0123456789abcdef", 128_MiB);
  const auto s = w.hello(1, 100, 0, false, a.id);
  CHECK(w.tenant_of(s) == "alloc:0123456789abcdef");
  CHECK(w.node->accounting().usage(w.node->session(s)->tenant, DeviceOrdinal{0}).limit == 128_MiB);
  w.granted(1, s, 32 * kMiB);
  // The device plugin names the pod: the session moves, grants and all; pod_limit caps it.
  w.node->allocation_owner(a.id, alloc::Owner{"team", "trainer-0", "main"});
  CHECK(w.tenant_of(s) == "pod:team/trainer-0/main");
  const Node::Tenant* t = w.node->tenant(w.node->session(s)->tenant);
  CHECK(w.node->accounting().usage(t->id, DeviceOrdinal{0}).limit == 96_MiB);
  CHECK(t->guard == quota::GuardMode::canary);
  CHECK(w.used(s) == 32_MiB);
  CHECK(w.refused(1, s, 66 * kMiB) == proto::Status::over_limit);
  // A connection through an allocation that is gone is refused.
  w.node->allocation_removed(a.id);
  proto::Hello m = proto::make<proto::Hello>(1);
  HelloOut out = w.node->open_session(Peer{2, 101, 0, 0, 5, a.id}, m);
  CHECK(std::holds_alternative<Fatal>(out.answer));
}

TEST_CASE("node: the publisher writes what changed, a resumed node keeps live sessions' grants", "[node][state]") {
  TestSegment test_segment("vlake-node-test-");
  st::StateSegment& seg = test_segment.seg;
  std::uint64_t live = 0;
  std::uint64_t dead = 0;
  {
    World w("version: 1\ndefault: {limit: 100%}\n");
    StatePublisher pub(seg, 1, 2, 1000);
    pub.publish_all(*w.node, w.t.unix_ns);
    live = w.hello(1, 101, 1001);
    dead = w.hello(2, 102, 1002);
    const std::uint64_t g = w.granted(1, live, 6 * kMiB);
    w.granted(2, dead, 4 * kMiB);
    const Changes& c = w.node->pending_changes();
    CHECK_FALSE(c.all);
    CHECK(c.grants.size() == 2);
    CHECK(c.sessions.size() == 2);
    pub.publish(*w.node);
    CHECK(w.node->pending_changes().empty());
    CHECK(seg.state().counters.grants == 2);
    w.node->end_session(dead, "test");  // ...and its grant returns
    w.granted(1, live, 2 * kMiB);
    pub.publish(*w.node);
    const st::State& s = seg.state();
    CHECK(s.counters.grants == 3);
    CHECK(s.header.next_grant_id == 4);
    std::uint64_t bytes = 0;
    int records = 0;
    for (const st::GrantRecord& r : s.grants) {
      if (r.state == st::kGrantFree) continue;
      ++records;
      bytes += r.bytes;
      CHECK(r.session == live);
    }
    CHECK(records == 2);
    CHECK(bytes == 8 * kMiB);
    CHECK(s.devices[0].granted_bytes == 8 * kMiB);
    CHECK(s.tenants[w.node->session(live)->tenant.value() - 1].granted[0] == 8 * kMiB);
    w.release(live, g);
    pub.publish(*w.node);
    CHECK(s.devices[0].granted_bytes == 2 * kMiB);
    w.node->shutdown();
    pub.publish(*w.node);
  }
  World w2("version: 1\ndefault: {limit: 100%}\n");
  const std::vector<std::uint64_t> kept = w2.node->resume(seg.state(), {live});
  REQUIRE(kept == std::vector<std::uint64_t>{live});
  CHECK(w2.used(live) == 2_MiB);
  REQUIRE(w2.node->grants().size() == 1);
  CHECK(w2.node->grants().begin()->second.orphaned);
  CHECK(w2.node->devices().front().orphaned == 2_MiB);
  CHECK(w2.node->starts() == 2);
  CHECK(w2.node->counters().grants == 3);  // counters carry on
  CHECK(w2.node->next_grant_id() == 4);
  // New grants and sessions do not reuse ids or slots.
  const auto s = w2.hello(3, 103, 1003);
  CHECK(s > live);
  CHECK(w2.granted(3, s, 2 * kMiB) == 4);
  w2.node->end_session(live, "test");
  CHECK(w2.node->devices().front().orphaned == 0_B);
}

// ---- limits against hostile tenants (docs/daemon.md, "Limits")

TEST_CASE("node: a tenant at its session cap is refused with limit_reached, others are served", "[node][limits]") {
  NodeSettings settings;
  settings.max_sessions_per_tenant = 3;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  std::vector<std::uint64_t> mine;
  for (std::uint32_t i = 0; i < 3; ++i) mine.push_back(w.hello(10 + i, 100 + i, 1000));
  const Fatal f = refused_hello(w, 20, 110, 1000);
  CHECK(f.status == proto::Status::limit_reached);
  CHECK(f.text == "session cap: tenant uid:1000 holds 3 of 3 sessions (vlaked --max-sessions-per-tenant)");
  CHECK(w.node->counters().denials_session_cap == 1);
  CHECK(w.node->sessions().size() == 3);
  // Another tenant is served; the capped one again once a session ends.
  w.hello(21, 111, 1001);
  w.node->end_session(mine[0], "test");
  w.hello(22, 112, 1000);
  CHECK(w.node->counters().denials_session_cap == 1);
}

TEST_CASE("node: a tenant at its grant cap is refused with limit_reached, others are served", "[node][limits]") {
  NodeSettings settings;
  settings.max_grants_per_tenant = 4;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const auto a = w.hello(1, 100, 1000);
  const auto a2 = w.hello(2, 101, 1000);  // the cap is the tenant's, over its sessions
  const auto b = w.hello(3, 102, 1001);
  std::vector<std::uint64_t> grants;
  for (int i = 0; i < 2; ++i) grants.push_back(w.granted(1, a, 2 * kMiB));
  for (int i = 0; i < 2; ++i) grants.push_back(w.granted(2, a2, 2 * kMiB));
  GrantOut out = w.grant(1, a, 2 * kMiB);
  const auto* r = std::get_if<Refused>(&out);
  REQUIRE(r != nullptr);
  CHECK(r->reply.status == proto::Status::limit_reached);
  CHECK(r->reply.used == 4);
  CHECK(r->reply.limit == 4);
  CHECK(w.refused(2, a2, 2 * kMiB) == proto::Status::limit_reached);
  CHECK(w.node->counters().denials_grant_cap == 2);
  CHECK(w.used(a) == 8_MiB);  // nothing charged by the refusals
  w.granted(3, b, 2 * kMiB);
  w.release(a, grants[0]);
  w.granted(1, a, 2 * kMiB);
}

TEST_CASE("node: tenant records are freed when they hold nothing, 300 uids in turn, then a full table",
          "[node][limits]") {
  World w("version: 1\ndefault: {limit: 100%}\n");
  // 300 distinct uids, one after the other: each tenant is freed when its session ends.
  for (std::uint32_t i = 0; i < 300; ++i) {
    const auto s = w.hello(i + 1, 1000 + i, 5000 + i);
    if (i % 2 == 0) w.granted(i + 1, s, 2 * kMiB);  // its grant returns at the end
    w.node->end_session(s, "test");
  }
  CHECK(w.node->counters().sessions_opened == 300);
  CHECK(w.node->counters().tenants_freed == 300);
  CHECK(w.node->counters().denials_tenant_table == 0);
  CHECK(w.node->tenants().empty());
  // A detached session keeps its tenant; the table fills with 256 live uids.
  std::vector<std::uint64_t> live;
  for (std::uint32_t i = 0; i < st::kMaxTenants; ++i) live.push_back(w.hello(1000 + i, 2000 + i, 7000 + i));
  w.node->connection_closed(1000, live[0], false);
  CHECK(has_tenant(*w.node, "uid:7000"));
  const Fatal f = refused_hello(w, 5000, 9000, 9999);
  CHECK(f.status == proto::Status::limit_reached);
  CHECK(f.text == "tenant table full: 256 of 256 tenants in use; tenant uid:9999 cannot be added");
  CHECK(w.node->counters().denials_tenant_table == 1);
  // A uid already in the table is still served.
  w.hello(5001, 9001, 7001);
  // One tenant goes: the next uid is served in its slot.
  w.node->end_session(live[5], "test");
  CHECK_FALSE(has_tenant(*w.node, "uid:7005"));
  w.hello(5002, 9002, 9999);
  CHECK(has_tenant(*w.node, "uid:9999"));
}

TEST_CASE("node: a resumed node does not resurrect the tenants of dead processes", "[node][limits][state]") {
  TestSegment test_segment("vlake-node-test-rs-");
  st::StateSegment& seg = test_segment.seg;
  std::uint64_t live = 0;
  {
    World w("version: 1\ndefault: {limit: 100%}\n");
    StatePublisher pub(seg, 1, 2, 1000);
    live = w.hello(1, 101, 1001);
    const auto dead = w.hello(2, 102, 1002);
    w.granted(1, live, 2 * kMiB);
    w.granted(2, dead, 2 * kMiB);
    pub.publish_all(*w.node, w.t.unix_ns);
    w.node->shutdown();
    pub.publish(*w.node);
  }
  World w2("version: 1\ndefault: {limit: 100%}\n");
  const std::uint64_t freed_before = seg.state().counters.tenants_freed;
  w2.node->resume(seg.state(), {live});
  CHECK(has_tenant(*w2.node, "uid:1001"));
  CHECK_FALSE(has_tenant(*w2.node, "uid:1002"));
  CHECK(w2.node->counters().tenants_freed == freed_before + 1);
  StatePublisher pub(seg, 1, 2, 1000);
  pub.publish_all(*w2.node, w2.t.unix_ns);
  std::size_t records = 0;
  for (const st::TenantRecord& r : seg.state().tenants) {
    if (r.in_use == 0) continue;
    ++records;
    CHECK(std::string(r.name) == "uid:1001");
  }
  CHECK(records == 1);
  w2.node->end_session(live, "test");
  CHECK(w2.node->tenants().empty());
}

TEST_CASE("node: guard events must name the sender's grants and are rate-limited per tenant", "[node][limits][guard]") {
  NodeSettings settings;
  settings.guard_event_rate = 10;
  settings.guard_event_burst = 20;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const auto forger = w.hello(1, 100, 1000);
  const auto victim = w.hello(2, 101, 1001);
  auto event = [&](std::uint64_t bytes) { return fault_event(w, bytes); };
  // No grant on that GPU: nothing of the sender's can have faulted.
  CHECK_FALSE(w.node->guard_event(forger, event(4096), w.t).has_value());
  CHECK(w.node->counters().guard_events_rejected == 1);
  CHECK(w.node->rooms().guard.log().next_seq <= 1);
  w.granted(1, forger, 2 * kMiB);
  // Suspects larger than what the session holds, or none at all.
  CHECK_FALSE(w.node->guard_event(forger, event(4 * kMiB), w.t).has_value());
  proto::GuardEvent none = event(4096);
  none.suspect_count = 0;
  CHECK_FALSE(w.node->guard_event(forger, none, w.t).has_value());
  proto::GuardEvent unknown_gpu = event(4096);
  std::memset(unknown_gpu.device_uuid, 0x5a, sizeof unknown_gpu.device_uuid);
  CHECK_FALSE(w.node->guard_event(forger, unknown_gpu, w.t).has_value());
  CHECK(w.node->counters().guard_events_rejected == 4);
  CHECK(w.node->counters().kernel_faults[0] == 0);
  // A flood of plausible events: the burst is recorded (some of the ring, not all of it), the
  // rest counted.
  for (int i = 0; i < 1000; ++i) CHECK_FALSE(w.node->guard_event(forger, event(4096), w.t).has_value());
  CHECK(w.node->counters().kernel_faults[0] == 20);
  CHECK(w.node->counters().guard_events_limited == 980);
  // Another tenant's real alarm is recorded, and is the newest event.
  w.granted(2, victim, 2 * kMiB);
  CHECK_FALSE(w.node->guard_event(victim, event(4096), w.t).has_value());
  CHECK(w.node->counters().kernel_faults[0] == 21);
  const st::GuardLog& g = w.node->rooms().guard.log();
  const st::GuardEventRecord& newest = *st::ring_order(g).back();
  CHECK(newest.tenant == w.node->session(victim)->tenant.value());
  // The rate refills: one more second, ten more events.
  w.advance(std::chrono::milliseconds(1000));
  for (int i = 0; i < 30; ++i) (void)w.node->guard_event(forger, event(4096), w.t);
  CHECK(w.node->counters().kernel_faults[0] == 31);
}

TEST_CASE("node: log lines a tenant triggers are rate-limited and counted", "[node][limits]") {
  NodeSettings settings;
  settings.max_sessions_per_tenant = 1;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  w.hello(1, 100, 1000);
  for (std::uint32_t i = 0; i < 200; ++i) (void)refused_hello(w, 10 + i, 200 + i, 1000);
  CHECK(w.node->counters().denials_session_cap == 200);
  // 20 lines in a row (the burst) at one instant; the other 180 are suppressed and counted.
  CHECK(w.node->counters().log_suppressed == 180);
}

TEST_CASE("node: a full session table refuses with limit_reached and a clear text", "[node][limits]") {
  NodeSettings settings;
  settings.max_sessions_per_tenant = st::kMaxSessions;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  // Filled as fair shares allow (fair_share.hpp): 4 uids × 128 take the first half, 8 uids × 64
  // (their share of the last half) the rest.
  for (std::uint32_t i = 0; i < st::kMaxSessions; ++i)
    w.hello(i + 1, 1000 + i, i < 512 ? 1000 + i / 128 : 1004 + (i - 512) / 64);
  const Fatal f = refused_hello(w, 9000, 9000, 1001);
  CHECK(f.status == proto::Status::limit_reached);
  CHECK(f.text == "session table full: 1024 of 1024 sessions in use");
  CHECK(w.node->counters().denials_other == 1);
  // A new uid refused for the table does not keep a tenant record.
  const Fatal g = refused_hello(w, 9001, 9001, 5555);
  CHECK(g.text == "session table full: 1024 of 1024 sessions in use");
  CHECK_FALSE(has_tenant(*w.node, "uid:5555"));
}

TEST_CASE("node: an allocation's tenant lives while its allocation or a session does", "[node][limits][k8s]") {
  World w("version: 1\ndefault: {limit: 100%}\n");
  const AllocationInfo a = add_allocation(w, "00000000000000aa", 64_MiB);
  const auto s = w.hello(1, 100, 0, false, a.id);
  CHECK(w.tenant_of(s) == "alloc:00000000000000aa");
  w.granted(1, s, 2 * kMiB);
  w.node->end_session(s, "test");
  // The allocation is still there: its tenant stays (a pod's next process gets it back).
  CHECK(has_tenant(*w.node, "alloc:00000000000000aa"));
  CHECK(w.node->free_idle_tenants() == 0);
  const auto s2 = w.hello(2, 101, 0, false, a.id);
  // The allocation goes while a session lives: the tenant goes with the session's end.
  w.node->allocation_removed(a.id);
  CHECK(has_tenant(*w.node, "alloc:00000000000000aa"));
  const std::uint64_t freed = w.node->counters().tenants_freed;
  w.node->end_session(s2, "test");
  CHECK_FALSE(has_tenant(*w.node, "alloc:00000000000000aa"));
  CHECK(w.node->counters().tenants_freed == freed + 1);
}

// ---- memory outside vlake (docs/daemon.md, "Memory outside vlake") ------------------------

TEST_CASE("node: every process on a GPU is attributed and one without a session is its uid's unhooked memory",
          "[node][unhooked]") {
  World w(
      "version: 1\ndefault: {limit: 64MiB}\nusers: [{uid: 3000, limit: 8MiB, namespace: lab}]\n"
      "namespaces: [{name: lab}]\n");
  const auto s = w.hello(1, 100, 1000);
  const std::vector<GpuSample> sample = {gpu0(
      700_MiB, {{1, 600_MiB}, {100, 10_MiB}, {200, 20_MiB}, {201, 2_MiB}, {300, 8_MiB}, {301, 6_MiB}, {400, 4_MiB}})};
  // pid 1 is the daemon (World's daemon_pid); pid 400 has no identity (gone before /proc was read).
  const std::vector<ProcessIdentity> ids = {who(1, 0),      who(100, 1000), who(200, 1000),
                                            who(201, 1000), who(300, 2000), who(301, 3000)};
  CHECK(w.observe_gpus(sample, ids, w.t).empty());
  const Node::Tenant* mine = w.node->tenant(w.node->session(s)->tenant);
  REQUIRE(mine != nullptr);
  CHECK(mine->name == "uid:1000");
  // The session's pid keeps the non-pool path; the two pids without a session are unhooked.
  const Accounting::Usage u = w.node->accounting().usage(mine->id, DeviceOrdinal{0});
  CHECK(u.nonpool == 10_MiB);
  CHECK(w.node->rooms().unhooked.of(mine->id).bytes[0] == 22 * kMiB);
  CHECK(w.node->rooms().unhooked.of(mine->id).procs.size() == 2);
  CHECK(u.unhooked == 22_MiB);  // enforce defaults to kill: charged
  CHECK(u.used() == 32_MiB);
  // A uid the quota file does not name: the built-in default rule, as a session would resolve.
  const Node::Tenant* other = tenant_named(*w.node, "uid:2000");
  REQUIRE(other != nullptr);
  CHECK(w.node->rooms().unhooked.of(other->id).bytes[0] == 8 * kMiB);
  CHECK(other->enforce == quota::Enforce::kill);
  // A named user goes to its namespace's tenant.
  const Node::Tenant* lab = tenant_named(*w.node, "lab/user:3000");
  REQUIRE(lab != nullptr);
  CHECK(w.node->rooms().unhooked.of(lab->id).bytes[0] == 6 * kMiB);
  CHECK(w.node->accounting().namespace_usage(lab->ns, DeviceOrdinal{0}).unhooked == 6_MiB);
  // The daemon's own pid is nobody's; NVML's device figure is recorded.
  std::uint64_t total = 0;
  for (const auto& [id, t] : w.node->tenants()) total += w.node->rooms().unhooked.of(t.id).bytes[0];
  CHECK(total == 36 * kMiB);
  CHECK(w.node->devices().front().nvml_used == 700_MiB);

  // The unhooked process exits: its memory is no longer anyone's.
  CHECK(w.observe_gpus({gpu0(610_MiB, {{1, 600_MiB}, {100, 10_MiB}})}, {who(100, 1000)}, w.t).empty());
  CHECK(w.node->rooms().unhooked.of(mine->id).bytes[0] == 0);
  CHECK(w.node->rooms().unhooked.of(mine->id).procs.empty());
  CHECK(w.node->accounting().usage(mine->id, DeviceOrdinal{0}).used() == 10_MiB);
}

TEST_CASE("node: enforce refuse counts unhooked memory at admission and account only shows it", "[node][unhooked]") {
  const std::string mode = GENERATE(std::string("refuse"), std::string("account"));
  World w("version: 1\ndefault: {limit: 64MiB, enforce: " + mode + "}\n");
  const auto s = w.hello(1, 100, 1000);
  w.granted(1, s, 16 * kMiB);
  CHECK(w.observe_gpus({gpu0(40_MiB, {{200, 24_MiB}})}, {who(200, 1000)}, w.t).empty());
  const Node::Tenant* t = w.node->tenant(w.node->session(s)->tenant);
  CHECK(w.node->rooms().unhooked.of(t->id).bytes[0] == 24 * kMiB);  // shown either way
  if (mode == "refuse") {
    // 16 granted + 24 outside + 32 asked > 64: refused, and it is the unhooked memory's doing.
    CHECK(w.refused(1, s, 32 * kMiB) == proto::Status::over_limit);
    CHECK(w.node->counters().denials_unhooked == 1);
    CHECK(w.node->counters().denials_tenant_limit == 1);
    w.granted(1, s, 24 * kMiB);
    CHECK(w.used(s) == 64_MiB);
  } else {
    w.granted(1, s, 32 * kMiB);
    CHECK(w.node->counters().denials_unhooked == 0);
    CHECK(w.used(s) == 48_MiB);
  }
}

TEST_CASE("node: enforce kill orders the unhooked processes of a tenant still over its limit after the grace",
          "[node][unhooked]") {
  World w(R"(version: 1
default: {limit: 16MiB, enforce: kill, kill_grace: 1s}
namespaces: [{name: calm, enforce: account}]
users: [{uid: 2000, namespace: calm}]
)");
  const std::vector<GpuSample> over = {gpu0(60_MiB, {{200, 20_MiB}, {201, 4_MiB}, {300, 30_MiB}, {400, 2_MiB}})};
  // uid 1000: 24 MiB outside vlake, over 16; uid 2000 is over too but its namespace only
  // accounts; uid 4000 is under its limit.
  const std::vector<ProcessIdentity> ids = {who(200, 1000), who(201, 1000), who(300, 2000), who(400, 4000)};
  CHECK(w.observe_gpus(over, ids, w.t).empty());  // the grace starts
  w.advance(std::chrono::milliseconds(900));
  CHECK(w.observe_gpus(over, ids, w.t).empty());
  w.advance(std::chrono::milliseconds(200));
  std::vector<KillOrder> kills = w.observe_gpus(over, ids, w.t);
  REQUIRE(kills.size() == 2);
  CHECK(kills[0].pid == 200);
  CHECK(kills[0].start_time == 5200);
  CHECK(kills[0].tenant_name == "uid:1000");
  CHECK(kills[1].pid == 201);
  CHECK(kills[1].bytes == 4_MiB);
  for (const KillOrder& k : kills) w.node->unhooked_killed(k, true);
  CHECK(w.node->counters().unhooked_kills == 2);
  // Back under the limit before the grace ends: nothing is killed and the grace starts again.
  CHECK(w.observe_gpus({gpu0(8_MiB, {{200, 8_MiB}})}, ids, w.t).empty());
  CHECK(w.observe_gpus(over, ids, w.t).empty());
  w.advance(std::chrono::milliseconds(600));
  CHECK(w.observe_gpus({gpu0(8_MiB, {{200, 8_MiB}})}, ids, w.t).empty());
  w.advance(std::chrono::milliseconds(600));
  CHECK(w.observe_gpus(over, ids, w.t).empty());
}

TEST_CASE("node: VLAKE_DISABLE passes through only where the quota file allows it", "[node][unhooked]") {
  World w(
      "version: 1\ndefault: {limit: 64MiB}\nnamespaces: [{name: free, allow_disable: true}]\n"
      "users: [{uid: 2000, namespace: free}]\n");
  proto::Hello m = proto::make<proto::Hello>(1);
  m.flags = proto::kHelloPassthrough;
  HelloOut allowed = w.node->open_session(Peer{1, 100, 2000, 2000, 7, ""}, m);
  const auto* ack = std::get_if<proto::HelloAck>(&allowed.answer);
  REQUIRE(ack != nullptr);
  CHECK(ack->status == proto::Status::passthrough);
  CHECK(allowed.session == 0);
  CHECK_FALSE(allowed.opened);
  CHECK(w.node->sessions().empty());
  HelloOut refused = w.node->open_session(Peer{2, 101, 1000, 1000, 8, ""}, m);
  ack = std::get_if<proto::HelloAck>(&refused.answer);
  REQUIRE(ack != nullptr);
  CHECK(ack->status == proto::Status::ok);
  CHECK(refused.opened);
  CHECK(w.node->counters().passthrough_refused == 1);
}

TEST_CASE("node: on Kubernetes an unhooked process is charged to the allocation mounted into it",
          "[node][unhooked][k8s]") {
  World w("version: 1\ndefault: {limit: 100%}\n");
  const AllocationInfo a = add_allocation(w, "0123456789abcdef", 32_MiB);
  w.node->allocation_owner(a.id, alloc::Owner{"team", "trainer-0", "main"});
  CHECK(w.observe_gpus({gpu0(50_MiB, {{200, 40_MiB}, {201, 6_MiB}})},
                       {who(200, 0, {"ffffffffffffffff", a.id}), who(201, 0)}, w.t)
            .empty());
  const Node::Tenant* pod = tenant_named(*w.node, "pod:team/trainer-0/main");
  REQUIRE(pod != nullptr);
  CHECK(w.node->rooms().unhooked.of(pod->id).bytes[0] == 40 * kMiB);
  const Node::Tenant* root = tenant_named(*w.node, "uid:0");
  REQUIRE(root != nullptr);
  CHECK(w.node->rooms().unhooked.of(root->id).bytes[0] == 6 * kMiB);
}

TEST_CASE("node: enforce kill also acts on a namespace that memory outside vlake put over its limit",
          "[node][unhooked]") {
  World w(R"(version: 1
default: {enforce: kill, kill_grace: 0s}
namespaces: [{name: team, limit: 32MiB, pod_limit: 64MiB, users: [1000, 2000]}]
)");
  const auto s = w.hello(1, 100, 2000);
  w.granted(1, s, 16 * kMiB);
  // uid 1000 holds 24 MiB outside vlake: within its own 64 MiB, but the namespace holds 40 of 32.
  const std::vector<KillOrder> kills = w.observe_gpus({gpu0(24_MiB, {{200, 24_MiB}})}, {who(200, 1000)}, w.t);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].pid == 200);
  CHECK(kills[0].tenant_name == "team/user:1000");
  // The hooked tenant of the namespace is refused meanwhile, and the refusal is the unhooked memory's doing.
  CHECK(w.refused(1, s, 8 * kMiB) == proto::Status::namespace_over_limit);
  CHECK(w.node->counters().denials_unhooked == 1);
}
