// Unit tests of vlaked's decision model (vlake::pool::Node) without a process: the simulated
// driver is loaded into this test process, time is a value, identities are plain numbers.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <variant>

#include "fd_holder.hpp"
#include "sim_gpu.hpp"
#include "vlake/contracts/codec.hpp"
#include "vlake/pool/holder_scan.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/publisher.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;

namespace {

constexpr std::uint64_t kMiB = 1ULL << 20;

using pooltest::SimGpu;

SimGpu& sim_gpu() {
  static SimGpu gpu;
  return gpu;
}

quota::QuotaConfig config(const std::string& yaml) { return quota::QuotaConfig::parse(yaml, "test.yaml"); }

// A Node on the simulated GPU with a controllable clock.
struct World {
  explicit World(const std::string& yaml, NodeSettings settings = {}, HolderScan holders = {}) {
    settings.daemon_pid = 1;
    node = std::make_unique<Node>(
        sim_gpu().driver(), log, settings,
        NodeEnv{[](uid_t, gid_t gid) { return std::vector<gid_t>{gid}; }, [this] { return t; }, std::move(holders)});
    quota::QuotaConfig cfg = config(yaml);
    node->validate(cfg);
    node->apply(std::move(cfg), "test.yaml", true, t, "");
  }
  ~World() {
    node->shutdown();
    if (outside.value() != 0) sim_gpu().driver().release(outside);
  }
  // Takes `bytes` of the GPU outside the pool (another program's memory).
  void take_outside(Bytes bytes) { outside = sim_gpu().driver().create(DeviceOrdinal{0}, bytes); }

  // Opens a session for (pid, uid) on connection `conn`; returns its id.
  std::uint64_t hello(ConnId conn, std::uint32_t pid, std::uint32_t uid, bool pressure = false,
                      const std::string& alloc_id = "") {
    proto::Hello m = proto::make<proto::Hello>(1);
    m.flags = pressure ? std::uint32_t{proto::kHelloPressure} : 0u;
    HelloOut out = node->open_session(Peer{conn, pid, uid, uid, 1000 + pid, alloc_id}, m);
    REQUIRE(std::holds_alternative<proto::HelloAck>(out.answer));
    return out.session;
  }
  proto::GrantRequest request(std::uint64_t bytes) const {
    proto::GrantRequest m = proto::make<proto::GrantRequest>(7);
    node->devices().front().uuid.copy_to(m.device_uuid);
    m.bytes = bytes;
    m.purpose = proto::GrantPurpose::alloc;
    return m;
  }
  GrantOut grant(ConnId conn, std::uint64_t session, std::uint64_t bytes) {
    return node->grant(conn, session, request(bytes), t);
  }
  // A grant that must succeed; returns its id.
  std::uint64_t granted(ConnId conn, std::uint64_t session, std::uint64_t bytes) {
    GrantOut out = grant(conn, session, bytes);
    const auto* g = std::get_if<Granted>(&out);
    REQUIRE(g != nullptr);
    CHECK(g->reply.status == proto::Status::ok);
    CHECK(g->fds.size() == g->reply.handle_count);
    return g->grant;
  }
  proto::Status refused(ConnId conn, std::uint64_t session, std::uint64_t bytes) {
    GrantOut out = grant(conn, session, bytes);
    const auto* r = std::get_if<Refused>(&out);
    REQUIRE(r != nullptr);
    return r->reply.status;
  }
  void release(std::uint64_t session, std::uint64_t grant) {
    proto::Release m = proto::make<proto::Release>(9);
    m.grant_id = grant;
    auto out = node->release(session, m);
    REQUIRE(std::get<proto::ReleaseAck>(out).status == proto::Status::ok);
  }
  Bytes used(std::uint64_t session) const {
    const Node::Session* s = node->session(session);
    REQUIRE(s != nullptr);
    return node->accounting().usage(s->tenant, DeviceOrdinal{0}).used();
  }
  std::string tenant_of(std::uint64_t session) const { return node->tenant(node->session(session)->tenant)->name; }
  void advance(std::chrono::milliseconds d) {
    t.steady += d;
    t.unix_ns += static_cast<std::uint64_t>(std::chrono::nanoseconds(d).count());
  }

  Logger log{LogLevel::error};
  Now t{std::chrono::steady_clock::time_point(std::chrono::hours(1)), 1'700'000'000'000'000'000ULL};
  std::unique_ptr<Node> node;
  PhysicalHandle outside{};
};

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
  CHECK(w.node->parked() == 1);
  CHECK_FALSE(w.node->retry_due(w.t));

  w.release(a, held);  // A returns its reserve
  REQUIRE(w.node->retry_due(w.t));
  std::vector<Completion> done = w.node->retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(done[0].conn == 2);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  CHECK(w.used(b) == 2_MiB);
  CHECK(w.node->parked() == 0);
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
  REQUIRE(w.node->retry_due(w.t));
  std::vector<Completion> done = w.node->retry_parked(w.t);
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
  REQUIRE(w.node->retry_due(w.t));
  std::vector<Completion> done = w.node->retry_parked(w.t);
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
  REQUIRE(w.node->retry_due(w.t));
  std::vector<Completion> done = w.node->retry_parked(w.t);
  REQUIRE(done.size() == 1);
  parked = std::get_if<Parked>(&done[0].out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == 3);  // then C
  CHECK(w.node->parked() == 1);

  // Everyone was asked: nobody is asked again until a new round starts, 1 s after the first;
  // it starts again from the most idle (A may have cached memory since).
  w.advance(std::chrono::milliseconds(300));
  CHECK(w.node->retry_parked(w.t).empty());
  w.advance(std::chrono::milliseconds(500));
  done = w.node->retry_parked(w.t);
  REQUIRE(done.size() == 1);
  parked = std::get_if<Parked>(&done[0].out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == 1);

  w.release(c, gc);  // C's cache comes back
  done = w.node->retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  CHECK(w.node->counters().pressure_sent == 3);
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
  w.node->retry_parked(w.t);  // still short, still waiting (3 s)
  CHECK(w.node->parked() == 1);
  w.release(a, ga);  // A frees: B is served
  std::vector<Completion> done = w.node->retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));

  // C (2 s from its namespace) gives up after 2 s when nothing comes back.
  w.granted(1, a, 1024 * kMiB - 192 * kMiB);
  REQUIRE(std::holds_alternative<Parked>(w.grant(3, hc.session, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(1900));
  CHECK(w.node->retry_parked(w.t).empty());
  w.advance(std::chrono::milliseconds(200));
  done = w.node->retry_parked(w.t);
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
  CHECK(w.node->retry_parked(w.t).empty());
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
  AllocationInfo a;
  a.id = "0123456789abcdef";
  a.device = DeviceOrdinal{0};
  a.bytes = 128_MiB;
  w.node->allocation_added(a);
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
  const std::string name = "vlake-node-test-" + std::to_string(::getpid());
  struct Cleanup {
    std::string n;
    ~Cleanup() { ::unlink(("/dev/shm/" + n).c_str()); }
  } cleanup{name};
  st::StateSegment seg(name);
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

namespace {

// A Hello that must be refused: returns the Fatal.
Fatal refused_hello(World& w, ConnId conn, std::uint32_t pid, std::uint32_t uid) {
  proto::Hello m = proto::make<proto::Hello>(1);
  HelloOut out = w.node->open_session(Peer{conn, pid, uid, uid, 1000 + pid, ""}, m);
  REQUIRE(std::holds_alternative<Fatal>(out.answer));
  return std::get<Fatal>(out.answer);
}

bool has_tenant(const Node& n, const std::string& name) {
  for (const auto& [id, t] : n.tenants()) {
    if (t.name == name) return true;
  }
  return false;
}

}  // namespace

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
  const std::string name = "vlake-node-test-rs-" + std::to_string(::getpid());
  struct Cleanup {
    std::string n;
    ~Cleanup() { ::unlink(("/dev/shm/" + n).c_str()); }
  } cleanup{name};
  st::StateSegment seg(name);
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
  auto event = [&](std::uint64_t bytes) {
    proto::GuardEvent m = proto::make<proto::GuardEvent>(3);
    m.kind = proto::GuardKind::fault;
    w.node->devices().front().uuid.copy_to(m.device_uuid);
    m.cuda_status = 700;
    m.live_allocations = 1;
    m.suspect_count = 1;
    m.suspects[0] = proto::GuardSuspect{0x7f0000000000ULL, bytes, 1000};
    return m;
  };
  // No grant on that GPU: nothing of the sender's can have faulted.
  CHECK_FALSE(w.node->guard_event(forger, event(4096), w.t).has_value());
  CHECK(w.node->counters().guard_events_rejected == 1);
  CHECK(w.node->guard_log().next_seq <= 1);
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
  const st::GuardLog& g = w.node->guard_log();
  const st::GuardEventRecord& newest = g.events[(g.next_seq - 2) % st::kGuardEvents];
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
  for (std::uint32_t i = 0; i < st::kMaxSessions; ++i) w.hello(i + 1, 1000 + i, 1000 + i % 8);
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
  AllocationInfo a;
  a.id = "00000000000000aa";
  a.device = DeviceOrdinal{0};
  a.bytes = 64_MiB;
  w.node->allocation_added(a);
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

namespace {

ProcessIdentity who(std::uint32_t pid, std::uint32_t uid, std::vector<std::string> allocs = {}) {
  ProcessIdentity p;
  p.pid = pid;
  p.start_time = 5000 + pid;
  p.uid = uid;
  p.gid = uid;
  p.alloc_ids = std::move(allocs);
  return p;
}

GpuSample gpu0(Bytes used, std::vector<ProcessUsage> procs) {
  GpuSample g;
  g.device = DeviceOrdinal{0};
  g.used = used;
  g.processes = std::move(procs);
  return g;
}

const Node::Tenant* tenant_named(const Node& n, const std::string& name) {
  for (const auto& [id, t] : n.tenants()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace

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
  CHECK(w.node->observe_gpus(sample, ids, w.t).empty());
  const Node::Tenant* mine = w.node->tenant(w.node->session(s)->tenant);
  REQUIRE(mine != nullptr);
  CHECK(mine->name == "uid:1000");
  // The session's pid keeps the non-pool path; the two pids without a session are unhooked.
  const Accounting::Usage u = w.node->accounting().usage(mine->id, DeviceOrdinal{0});
  CHECK(u.nonpool == 10_MiB);
  CHECK(mine->unhooked[0] == 22 * kMiB);
  CHECK(mine->unhooked_procs.size() == 2);
  CHECK(u.unhooked == 22_MiB);  // enforce defaults to refuse: charged
  CHECK(u.used() == 32_MiB);
  // A uid the quota file does not name: the built-in default rule, as a session would resolve.
  const Node::Tenant* other = tenant_named(*w.node, "uid:2000");
  REQUIRE(other != nullptr);
  CHECK(other->unhooked[0] == 8 * kMiB);
  CHECK(other->enforce == quota::Enforce::refuse);
  // A named user goes to its namespace's tenant.
  const Node::Tenant* lab = tenant_named(*w.node, "lab/user:3000");
  REQUIRE(lab != nullptr);
  CHECK(lab->unhooked[0] == 6 * kMiB);
  CHECK(w.node->accounting().namespace_usage(lab->ns, DeviceOrdinal{0}).unhooked == 6_MiB);
  // The daemon's own pid is nobody's; NVML's device figure is recorded.
  std::uint64_t total = 0;
  for (const auto& [id, t] : w.node->tenants()) total += t.unhooked[0];
  CHECK(total == 36 * kMiB);
  CHECK(w.node->devices().front().nvml_used == 700_MiB);

  // The unhooked process exits: its memory is no longer anyone's.
  CHECK(w.node->observe_gpus({gpu0(610_MiB, {{1, 600_MiB}, {100, 10_MiB}})}, {who(100, 1000)}, w.t).empty());
  CHECK(mine->unhooked[0] == 0);
  CHECK(mine->unhooked_procs.empty());
  CHECK(w.node->accounting().usage(mine->id, DeviceOrdinal{0}).used() == 10_MiB);
}

TEST_CASE("node: enforce refuse counts unhooked memory at admission and account only shows it", "[node][unhooked]") {
  const std::string mode = GENERATE(std::string("refuse"), std::string("account"));
  World w("version: 1\ndefault: {limit: 64MiB, enforce: " + mode + "}\n");
  const auto s = w.hello(1, 100, 1000);
  w.granted(1, s, 16 * kMiB);
  CHECK(w.node->observe_gpus({gpu0(40_MiB, {{200, 24_MiB}})}, {who(200, 1000)}, w.t).empty());
  const Node::Tenant* t = w.node->tenant(w.node->session(s)->tenant);
  CHECK(t->unhooked[0] == 24 * kMiB);  // shown either way
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
  CHECK(w.node->observe_gpus(over, ids, w.t).empty());  // the grace starts
  w.advance(std::chrono::milliseconds(900));
  CHECK(w.node->observe_gpus(over, ids, w.t).empty());
  w.advance(std::chrono::milliseconds(200));
  std::vector<KillOrder> kills = w.node->observe_gpus(over, ids, w.t);
  REQUIRE(kills.size() == 2);
  CHECK(kills[0].pid == 200);
  CHECK(kills[0].start_time == 5200);
  CHECK(kills[0].tenant_name == "uid:1000");
  CHECK(kills[1].pid == 201);
  CHECK(kills[1].bytes == 4_MiB);
  for (const KillOrder& k : kills) w.node->unhooked_killed(k, true);
  CHECK(w.node->counters().unhooked_kills == 2);
  // Back under the limit before the grace ends: nothing is killed and the grace starts again.
  CHECK(w.node->observe_gpus({gpu0(8_MiB, {{200, 8_MiB}})}, ids, w.t).empty());
  CHECK(w.node->observe_gpus(over, ids, w.t).empty());
  w.advance(std::chrono::milliseconds(600));
  CHECK(w.node->observe_gpus({gpu0(8_MiB, {{200, 8_MiB}})}, ids, w.t).empty());
  w.advance(std::chrono::milliseconds(600));
  CHECK(w.node->observe_gpus(over, ids, w.t).empty());
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
  AllocationInfo a;
  a.id = "0123456789abcdef";
  a.device = DeviceOrdinal{0};
  a.bytes = 32_MiB;
  w.node->allocation_added(a);
  w.node->allocation_owner(a.id, alloc::Owner{"team", "trainer-0", "main"});
  CHECK(w.node
            ->observe_gpus({gpu0(50_MiB, {{200, 40_MiB}, {201, 6_MiB}})},
                           {who(200, 0, {"ffffffffffffffff", a.id}), who(201, 0)}, w.t)
            .empty());
  const Node::Tenant* pod = tenant_named(*w.node, "pod:team/trainer-0/main");
  REQUIRE(pod != nullptr);
  CHECK(pod->unhooked[0] == 40 * kMiB);
  const Node::Tenant* root = tenant_named(*w.node, "uid:0");
  REQUIRE(root != nullptr);
  CHECK(root->unhooked[0] == 6 * kMiB);
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
  const std::vector<KillOrder> kills = w.node->observe_gpus({gpu0(24_MiB, {{200, 24_MiB}})}, {who(200, 1000)}, w.t);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].pid == 200);
  CHECK(kills[0].tenant_name == "team/user:1000");
  // The hooked tenant of the namespace is refused meanwhile, and the refusal is the unhooked memory's doing.
  CHECK(w.refused(1, s, 8 * kMiB) == proto::Status::namespace_over_limit);
  CHECK(w.node->counters().denials_unhooked == 1);
}

// ---- handle binding (docs/pool.md, "Handle binding")

namespace {

// The bytes of a simulated handle's descriptor (a memfd), mapped shared in this process.
struct FdView {
  FdView(int fd, std::size_t bytes) : n(bytes) {
    p = static_cast<std::uint8_t*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    REQUIRE(p != MAP_FAILED);
  }
  ~FdView() { ::munmap(p, n); }
  FdView(const FdView&) = delete;
  FdView& operator=(const FdView&) = delete;
  std::uint8_t* p = nullptr;
  std::size_t n = 0;
};

// Tenant A is granted 64 MiB, keeps a copy of the descriptor and releases the grant; tenant B is
// granted 64 MiB. A writes through its kept descriptor. Returns true if B's memory changed.
bool a_reaches_b(bool bind_handles) {
  NodeSettings settings;
  settings.bind_handles = bind_handles;
  World w("version: 1\ndefault: {limit: 100%}\n", settings,
          [](const std::vector<int>& fds) { return scan_holders(fds); });
  const auto a = w.hello(1, 101, 1001);
  const auto b = w.hello(2, 102, 1002);
  GrantOut ga = w.grant(1, a, 64 * kMiB);
  REQUIRE(std::holds_alternative<Granted>(ga));
  REQUIRE(std::get<Granted>(ga).fds.size() == 1);
  const int kept = ::dup(std::get<Granted>(ga).fds[0]);  // what a hostile tenant keeps
  REQUIRE(kept >= 0);
  w.release(a, std::get<Granted>(ga).grant);

  GrantOut gb = w.grant(2, b, 64 * kMiB);
  REQUIRE(std::holds_alternative<Granted>(gb));
  const Granted& g = std::get<Granted>(gb);
  REQUIRE(g.fds.size() == 1);
  bool changed = false;
  {
    FdView theirs(g.fds[0], 64 * kMiB);
    FdView mine(kept, 64 * kMiB);
    // B's memory starts zeroed either way (scrubbed or new).
    CHECK(theirs.p[0] == 0);
    CHECK(theirs.p[64 * kMiB - 1] == 0);
    std::memset(mine.p, 0xA5, 64 * kMiB);
    changed = theirs.p[0] == 0xA5 || theirs.p[64 * kMiB - 1] == 0xA5;
  }
  ::close(kept);
  return changed;
}

}  // namespace

TEST_CASE("node: with --handle-reuse tenant a released handle never reaches another tenant", "[node][binding]") {
  CHECK_FALSE(a_reaches_b(true));
}

TEST_CASE("node: with --handle-reuse node a kept descriptor reaches the next tenant's memory", "[node][binding]") {
  // The risk `node` mode documents; also proves the test above can fail.
  CHECK(a_reaches_b(false));
}

TEST_CASE("node: a tenant's released handles are retained, served back to it only, retired at its last exit",
          "[node][binding]") {
  World w("version: 1\ndefault: {limit: 100%}\n", {}, [](const std::vector<int>& fds) { return scan_holders(fds); });
  const auto a = w.hello(1, 101, 1001);
  const auto b = w.hello(2, 102, 1002);
  const Node::Device& d = w.node->devices().front();
  const TenantId ta = w.node->session(a)->tenant;
  w.release(a, w.granted(1, a, 32 * kMiB));
  CHECK(w.node->accounting().usage(ta, DeviceOrdinal{0}).retained == 32_MiB);
  CHECK(w.used(a) == 32_MiB);  // retained counts as used
  CHECK(d.pool->bound_free_bytes(ta) == 32_MiB);
  // B does not get it: a new handle.
  const std::uint64_t created = d.pool->handles_created();
  w.granted(2, b, 32 * kMiB);
  CHECK(d.pool->handles_created() == created + 1);
  CHECK(w.node->counters().stitched_cross_tenant == 0);
  // A does, without a scrub (it held that memory).
  const std::uint64_t scrubs = w.node->counters().scrubs;
  const std::uint64_t g = w.granted(1, a, 32 * kMiB);
  CHECK(w.node->counters().scrubs == scrubs);
  CHECK(w.node->accounting().usage(ta, DeviceOrdinal{0}).retained == 0_B);
  CHECK(w.used(a) == 32_MiB);
  w.release(a, g);
  // A's last process exits: its bound handle is retired, nothing stays charged.
  w.node->end_session(a, "process exited");
  CHECK(d.pool->bound_free_bytes(ta) == 0_B);
  CHECK(w.node->accounting().usage(ta, DeviceOrdinal{0}).retained == 0_B);
  CHECK(d.pool->held_fd_bytes() == 0_B);
  CHECK(d.pool->pool_bytes() == 32_MiB);  // B's grant only
}

TEST_CASE("node: an exported release stays charged while another process holds the descriptor", "[node][binding]") {
  World w("version: 1\ndefault: {limit: 128MiB}\n", {}, [](const std::vector<int>& fds) { return scan_holders(fds); });
  const auto s = w.hello(1, 101, 1001);
  const TenantId t = w.node->session(s)->tenant;
  const Node::Device& d = w.node->devices().front();
  GrantOut out = w.grant(1, s, 64 * kMiB);
  REQUIRE(std::holds_alternative<Granted>(out));
  const Granted& g = std::get<Granted>(out);
  REQUIRE(g.fds.size() == 1);
  auto holder = std::make_unique<vlake::pooltest::FdHolder>(g.fds[0]);  // another process keeps it

  proto::Release m = proto::make<proto::Release>(9);
  m.grant_id = g.grant;
  m.flags = proto::kReleaseExported;
  REQUIRE(std::get<proto::ReleaseAck>(w.node->release(s, m)).status == proto::Status::ok);
  const Accounting::Usage u = w.node->accounting().usage(t, DeviceOrdinal{0});
  CHECK(u.granted == 0_B);
  CHECK(u.retained == 64_MiB);
  CHECK(d.pool->held_fd_bytes() == 64_MiB);
  CHECK(w.node->counters().handles_retired_held == 1);
  CHECK(w.node->counters().releases_exported == 1);
  // Charged like granted: 64 MiB more fits, 128 MiB does not.
  CHECK(w.refused(1, s, 128 * kMiB) == proto::Status::over_limit);
  // Published: the tenant's retained[] and the GPU's held_fd_bytes.
  {
    const std::string name = "vlake-node-test-" + std::to_string(::getpid());
    struct Cleanup {
      std::string n;
      ~Cleanup() { ::unlink(("/dev/shm/" + n).c_str()); }
    } cleanup{name};
    st::StateSegment seg(name);
    StatePublisher pub(seg, 1, 2, 1000);
    pub.publish_all(*w.node, w.t.unix_ns);
    const st::State& state = seg.state();
    const Node::Tenant* tn = w.node->tenant(t);
    CHECK(state.tenants[tn->slot].retained[0] == 64 * kMiB);
    CHECK(state.devices[0].held_fd_bytes == 64 * kMiB);
    CHECK(state.devices[0].retained_bytes == 64 * kMiB);
    CHECK(state.counters.handles_retired_held == 1);
  }

  // The holder goes; the next tick finds nobody and closes the descriptor.
  holder->end();
  w.advance(std::chrono::milliseconds(1000));
  w.node->tick(w.t);
  CHECK(w.node->accounting().usage(t, DeviceOrdinal{0}).retained == 0_B);
  CHECK(d.pool->held_fd_bytes() == 0_B);
  CHECK(w.used(s) == 0_B);
  w.granted(1, s, 128 * kMiB);
}

TEST_CASE("node: an honest tenant at its limit with released handles is served (they are retired first)",
          "[node][binding]") {
  World w("version: 1\ndefault: {limit: 128MiB}\n", {}, [](const std::vector<int>& fds) { return scan_holders(fds); });
  const auto s = w.hello(1, 101, 1001);
  const TenantId t = w.node->session(s)->tenant;
  const Node::Device& d = w.node->devices().front();
  const std::uint64_t g1 = w.granted(1, s, 64 * kMiB);
  const std::uint64_t g2 = w.granted(1, s, 64 * kMiB);
  w.release(s, g1);
  w.release(s, g2);
  CHECK(w.used(s) == 128_MiB);  // both retained
  CHECK(w.node->accounting().usage(t, DeviceOrdinal{0}).retained == 128_MiB);
  // 64 MiB: one bound handle is retired (least recently freed), the other is reused.
  const std::uint64_t reuses = w.node->counters().reuses;
  const std::uint64_t g = w.granted(1, s, 64 * kMiB);
  CHECK(w.node->counters().reuses == reuses + 1);
  CHECK(w.node->accounting().usage(t, DeviceOrdinal{0}).retained == 0_B);
  CHECK(w.used(s) == 64_MiB);
  w.release(s, g);
  // The whole limit in one grant: every bound handle goes first.
  w.granted(1, s, 128 * kMiB);
  CHECK(w.used(s) == 128_MiB);
  CHECK(d.pool->bound_free_bytes(t) == 0_B);
  CHECK(w.node->counters().denials_tenant_limit == 0);
}

// ---- memory NVML lists under no process (docs/daemon.md, "Memory outside vlake") ----------

TEST_CASE("node: memory NVML lists under no process goes to the one GPU user it does not list", "[node][unhooked]") {
  World w("version: 1\ndefault: {limit: 1GiB}\nusers: [{uid: 4000, limit: 128MiB}]\n");
  // The daemon (pid 1) is listed with its 100 MiB; pid 600 is listed with 10 MiB and has the
  // device files open too; pid 500 (uid 4000) has them open and is not listed: 256 MiB used on
  // the GPU is nobody's in NVML's list, so it is pid 500's.
  const std::vector<GpuSample> sample = {gpu0(366_MiB, {{1, 100_MiB}, {600, 10_MiB}})};
  const std::vector<ProcessIdentity> users = {who(1, 0), who(500, 4000), who(600, 5000)};
  CHECK(w.node->observe_gpus(sample, {who(600, 5000)}, w.t, users).empty());
  CHECK(w.node->devices().front().unlisted == 256_MiB);
  const Node::Tenant* t = tenant_named(*w.node, "user:4000");
  REQUIRE(t != nullptr);
  CHECK(t->unhooked[0] == 256 * kMiB);
  REQUIRE(t->unhooked_procs.size() == 1);
  CHECK(t->unhooked_procs[0].pid == 500);
  CHECK(t->unhooked_procs[0].bytes == 256_MiB);
  CHECK(w.node->accounting().usage(t->id, DeviceOrdinal{0}).unhooked == 256_MiB);  // refuse: charged
  const Node::Tenant* listed = tenant_named(*w.node, "uid:5000");
  REQUIRE(listed != nullptr);
  CHECK(listed->unhooked[0] == 10 * kMiB);  // its NVML figure only
  const Node::Tenant* root = tenant_named(*w.node, "uid:0");
  CHECK((root == nullptr || root->unhooked[0] == 0));  // the daemon is nobody's
  {
    const std::string name = "vlake-node-unlisted-" + std::to_string(::getpid());
    struct Cleanup {
      std::string n;
      ~Cleanup() { ::unlink(("/dev/shm/" + n).c_str()); }
    } cleanup{name};
    st::StateSegment seg(name);
    StatePublisher pub(seg, 1, 2, 1000);
    pub.publish_all(*w.node, w.t.unix_ns);
    CHECK(seg.state().devices[0].unlisted_bytes == 256 * kMiB);
    CHECK(seg.state().tenants[t->slot].unhooked[0] == 256 * kMiB);
  }

  // It exits (no longer a user, memory gone): nothing is left unattributed or charged.
  CHECK(w.node->observe_gpus({gpu0(110_MiB, {{1, 100_MiB}, {600, 10_MiB}})}, {who(600, 5000)}, w.t, {who(600, 5000)})
            .empty());
  CHECK(w.node->devices().front().unlisted == 0_B);
  t = tenant_named(*w.node, "user:4000");
  CHECK((t == nullptr || t->unhooked[0] == 0));
}

TEST_CASE("node: unlisted memory is split equally among the GPU users NVML does not list", "[node][unhooked]") {
  World w("version: 1\ndefault: {limit: 1GiB}\n");
  const auto s = w.hello(1, 100, 1000);  // a session whose process may create memory without a context
  // Without a session: pids 500 and 501; with one: pid 100. 300 MiB unlisted, 100 MiB each.
  const std::vector<GpuSample> sample = {gpu0(400_MiB, {{1, 100_MiB}})};
  const std::vector<ProcessIdentity> users = {who(100, 1000), who(500, 2000), who(501, 2000)};
  CHECK(w.node->observe_gpus(sample, {}, w.t, users).empty());
  const Node::Tenant* two = tenant_named(*w.node, "uid:2000");
  REQUIRE(two != nullptr);
  CHECK(two->unhooked[0] == 200 * kMiB);
  CHECK(two->unhooked_procs.size() == 2);
  const Node::Tenant* mine = w.node->tenant(w.node->session(s)->tenant);
  REQUIRE(mine != nullptr);
  CHECK(mine->unhooked[0] == 100 * kMiB);  // the session's tenant
  CHECK(mine->unhooked_procs.empty());     // a session's process is never killed
  CHECK(w.node->accounting().usage(mine->id, DeviceOrdinal{0}).unhooked == 100_MiB);
}

TEST_CASE("node: unlisted memory up to the tolerance, or with nobody to charge, stays unattributed",
          "[node][unhooked]") {
  World w("version: 1\ndefault: {limit: 1GiB}\n");
  const std::vector<ProcessIdentity> users = {who(500, 2000)};
  CHECK(w.node->observe_gpus({gpu0(100_MiB + kUnlistedTolerance, {{1, 100_MiB}})}, {}, w.t, users).empty());
  CHECK(w.node->devices().front().unlisted == kUnlistedTolerance);
  const Node::Tenant* t = tenant_named(*w.node, "uid:2000");
  CHECK((t == nullptr || t->unhooked[0] == 0));
  // Above it, but no process without NVML's listing has the device files open: nobody's.
  CHECK(w.node->observe_gpus({gpu0(400_MiB, {{1, 100_MiB}})}, {}, w.t, {}).empty());
  CHECK(w.node->devices().front().unlisted == 300_MiB);
  for (const auto& [id, x] : w.node->tenants()) CHECK(x.unhooked[0] == 0);
  // One byte over the tolerance is charged.
  CHECK(w.node->observe_gpus({gpu0(100_MiB + kUnlistedTolerance + 1_MiB, {{1, 100_MiB}})}, {}, w.t, users).empty());
  t = tenant_named(*w.node, "uid:2000");
  REQUIRE(t != nullptr);
  CHECK(t->unhooked[0] == kUnlistedTolerance.value() + kMiB);
}

TEST_CASE("node: unlisted memory leaves out retired handles held by a descriptor and an unlisted daemon's pool",
          "[node][unhooked]") {
  World w("version: 1\ndefault: {limit: 1GiB}\n", {}, [](const std::vector<int>& fds) { return scan_holders(fds); });
  const auto s = w.hello(1, 101, 1001);
  const Node::Device& d = w.node->devices().front();
  GrantOut out = w.grant(1, s, 64 * kMiB);
  REQUIRE(std::holds_alternative<Granted>(out));
  const Granted& g = std::get<Granted>(out);
  REQUIRE(g.fds.size() == 1);
  vlake::pooltest::FdHolder holder(g.fds[0]);  // another process keeps the descriptor
  proto::Release m = proto::make<proto::Release>(9);
  m.grant_id = g.grant;
  m.flags = proto::kReleaseExported;
  REQUIRE(std::get<proto::ReleaseAck>(w.node->release(s, m)).status == proto::Status::ok);
  REQUIRE(d.pool->held_fd_bytes() == 64_MiB);
  const std::vector<ProcessIdentity> users = {who(500, 2000)};

  // The daemon listed (its pool in its figure): used = daemon + held 64 MiB + 100 MiB unlisted.
  CHECK(w.node->observe_gpus({gpu0(20_MiB + 64_MiB + 100_MiB, {{1, 20_MiB}})}, {}, w.t, users).empty());
  CHECK(d.unlisted == 100_MiB);
  const Node::Tenant* t = tenant_named(*w.node, "uid:2000");
  REQUIRE(t != nullptr);
  CHECK(t->unhooked[0] == 100 * kMiB);

  // The daemon not listed (no context yet): its pool is in used under no process, and is not
  // anybody else's.
  const Bytes pool = d.pool->pool_bytes();
  CHECK(w.node->observe_gpus({gpu0(pool + 64_MiB + 100_MiB, {})}, {}, w.t, users).empty());
  CHECK(d.unlisted == 100_MiB);
  t = tenant_named(*w.node, "uid:2000");
  REQUIRE(t != nullptr);
  CHECK(t->unhooked[0] == 100 * kMiB);
  holder.end();
}

// ---- CUDA IPC of alloc grants (node_ipc.cpp, docs/ipc.md) -----------------------------------

namespace {

proto::IpcExportReply ipc_export(World& w, std::uint64_t session, std::uint64_t grant) {
  proto::IpcExport m = proto::make<proto::IpcExport>(11);
  m.grant_id = grant;
  auto out = w.node->ipc_export(session, m);
  REQUIRE(std::holds_alternative<proto::IpcExportReply>(out));
  return std::get<proto::IpcExportReply>(out);
}

Node::IpcOpened ipc_open(World& w, std::uint64_t session, std::uint64_t token, std::uint64_t secret) {
  proto::IpcOpen m = proto::make<proto::IpcOpen>(12);
  m.token = token;
  m.secret = secret;
  auto out = w.node->ipc_open(session, m, w.t);
  REQUIRE(std::holds_alternative<Node::IpcOpened>(out));
  return std::get<Node::IpcOpened>(out);
}

proto::Status ipc_close(World& w, std::uint64_t session, std::uint64_t import_id) {
  proto::IpcClose m = proto::make<proto::IpcClose>(13);
  m.import_id = import_id;
  auto out = w.node->ipc_close(session, m);
  REQUIRE(std::holds_alternative<proto::IpcCloseAck>(out));
  return std::get<proto::IpcCloseAck>(out).status;
}

}  // namespace

TEST_CASE("node: an IPC export has a stable token and a secret and opens only for its tenant", "[node][ipc]") {
  NodeSettings settings;
  settings.max_grants_per_tenant = 3;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const auto owner = w.hello(1, 100, 1000);
  const auto sibling = w.hello(2, 101, 1000);  // another process of the same tenant
  const auto stranger = w.hello(3, 102, 2000);
  const std::uint64_t g = w.granted(1, owner, 6 * kMiB);
  const auto e = ipc_export(w, owner, g);
  REQUIRE(e.status == proto::Status::ok);
  CHECK(e.token != 0);
  CHECK(e.secret != 0);
  CHECK(e.bytes == 6 * kMiB);
  const auto again = ipc_export(w, owner, g);
  CHECK(again.token == e.token);
  CHECK(again.secret == e.secret);
  CHECK(w.node->counters().ipc_exports == 1);
  CHECK(ipc_export(w, sibling, g).status == proto::Status::unknown_grant);  // not its grant

  // Wrong secret, unknown token, another tenant: refused and counted.
  CHECK(ipc_open(w, sibling, e.token, e.secret ^ 1).reply.status == proto::Status::unknown_handle);
  CHECK(ipc_open(w, sibling, e.token + 1, e.secret).reply.status == proto::Status::unknown_handle);
  const auto denied = ipc_open(w, stranger, e.token, e.secret);
  CHECK(denied.reply.status == proto::Status::ipc_denied);
  CHECK(denied.fds.empty());
  CHECK(w.node->counters().ipc_refused == 3);

  // The tenant's other process gets the grant's handles, in VA order.
  const auto ok = ipc_open(w, sibling, e.token, e.secret);
  REQUIRE(ok.reply.status == proto::Status::ok);
  CHECK(ok.reply.bytes == 6 * kMiB);
  CHECK(ok.reply.owner_tenant == w.node->session(owner)->tenant.value());
  REQUIRE(ok.reply.piece_count >= 1);
  CHECK(ok.fds.size() == ok.reply.piece_count);
  std::uint64_t off = 0;
  for (std::uint32_t i = 0; i < ok.reply.piece_count; ++i) {
    CHECK(ok.reply.pieces[i].offset == off);
    CHECK(ok.reply.pieces[i].flags == 0);
    off += ok.reply.pieces[i].size;
  }
  CHECK(off == 6 * kMiB);
  CHECK(w.node->counters().ipc_opens == 1);
  // Charged once, to the owner (the importer is the same tenant: one figure).
  CHECK(w.used(owner) == 6_MiB);

  // An import counts against the importer's grant cap (3): 1 grant + 1 import + 1 more grant.
  const auto second = ipc_open(w, sibling, e.token, e.secret);
  CHECK(second.reply.status == proto::Status::ok);
  CHECK(w.refused(1, owner, 2 * kMiB) == proto::Status::limit_reached);
  CHECK(ipc_open(w, sibling, e.token, e.secret).reply.status == proto::Status::limit_reached);

  // A share (dedup) of an imported grant would change the layout under the importer.
  proto::ShareRequest sr = proto::make<proto::ShareRequest>(14);
  sr.grant_id = g;
  sr.offset = 0;
  sr.bytes = 2 * kMiB;
  auto share = w.node->share_request(owner, sr);
  REQUIRE(std::holds_alternative<ShareOut>(share));
  CHECK(std::get<ShareOut>(share).reply.status == proto::Status::bad_request);

  // Only the importing session closes its import.
  CHECK(ipc_close(w, owner, ok.reply.import_id) == proto::Status::unknown_handle);
  CHECK(ipc_close(w, sibling, ok.reply.import_id) == proto::Status::ok);
  CHECK(ipc_close(w, sibling, ok.reply.import_id) == proto::Status::unknown_handle);
  CHECK(ipc_close(w, sibling, second.reply.import_id) == proto::Status::ok);
  CHECK(w.node->imports().empty());
}

TEST_CASE("node: a released grant with IPC imports stays charged to its owner until the last import goes",
          "[node][ipc]") {
  World w(
      "version: 1\nnamespaces:\n  - name: a\n    users: [1000]\n    ipc_domain: team\n  - name: b\n"
      "    users: [2000]\n    ipc_domain: team\n");
  const auto owner = w.hello(1, 100, 1000);
  const auto importer = w.hello(2, 101, 2000);  // another tenant of the owner's ipc_domain
  const auto closer = w.hello(3, 102, 2000);
  const std::uint64_t g = w.granted(1, owner, 8 * kMiB);
  const auto e = ipc_export(w, owner, g);
  const auto i1 = ipc_open(w, importer, e.token, e.secret);
  REQUIRE(i1.reply.status == proto::Status::ok);
  const auto i2 = ipc_open(w, closer, e.token, e.secret);
  REQUIRE(i2.reply.status == proto::Status::ok);
  CHECK(w.used(importer) == 0_MiB);  // never charged to the importer's tenant

  // The owner releases: held (still charged), out of its session's list.
  w.release(owner, g);
  CHECK(w.used(owner) == 8_MiB);
  CHECK(w.node->session(owner)->grants.empty());
  REQUIRE(w.node->grants().count(g) == 1);
  CHECK(w.node->grants().at(g).released);
  // Freed memory opens no more (the imports already open stay).
  const std::uint64_t refused_before = w.node->counters().ipc_refused;
  CHECK(ipc_open(w, closer, e.token, e.secret).reply.status == proto::Status::unknown_handle);
  CHECK(w.node->counters().ipc_refused == refused_before + 1);
  // The owner's process exits: still held for the imports.
  w.node->end_session(owner, "test");
  REQUIRE(w.node->grants().count(g) == 1);
  CHECK(w.node->accounting().usage(w.node->grants().at(g).tenant, DeviceOrdinal{0}).used() == 8_MiB);
  // One import closes, the other importer's session ends: the grant goes, retired.
  CHECK(ipc_close(w, closer, i2.reply.import_id) == proto::Status::ok);
  CHECK(w.node->grants().count(g) == 1);
  const std::uint64_t exported_before = w.node->counters().releases_exported;
  w.node->end_session(importer, "killed");
  CHECK(w.node->grants().count(g) == 0);
  CHECK(w.node->imports().empty());
  CHECK(w.node->counters().releases_exported == exported_before + 1);
  CHECK(w.node->devices().front().granted == 0_MiB);
  // The token died with the grant.
  CHECK(ipc_open(w, closer, e.token, e.secret).reply.status == proto::Status::unknown_handle);
}

TEST_CASE("node: IPC imports and tokens do not survive a daemon restart", "[node][ipc][state]") {
  const std::string name = "vlake-node-ipc-" + std::to_string(::getpid());
  struct Cleanup {
    std::string n;
    ~Cleanup() { ::unlink(("/dev/shm/" + n).c_str()); }
  } cleanup{name};
  st::StateSegment seg(name);
  std::uint64_t owner = 0;
  std::uint64_t importer = 0;
  std::uint64_t g = 0;
  proto::IpcExportReply e{};
  {
    World w("version: 1\ndefault: {limit: 100%}\n");
    StatePublisher pub(seg, 1, 2, 1000);
    pub.publish_all(*w.node, w.t.unix_ns);
    owner = w.hello(1, 101, 1001);
    importer = w.hello(2, 102, 1001);
    g = w.granted(1, owner, 4 * kMiB);
    e = ipc_export(w, owner, g);
    REQUIRE(ipc_open(w, importer, e.token, e.secret).reply.status == proto::Status::ok);
    pub.publish(*w.node);
    w.node->shutdown();
    pub.publish(*w.node);
  }
  World w2("version: 1\ndefault: {limit: 100%}\n");
  w2.node->resume(seg.state(), {owner, importer});
  CHECK(w2.node->imports().empty());
  CHECK(w2.used(owner) == 4_MiB);  // the orphaned grant stays charged to its owner
  CHECK(ipc_open(w2, importer, e.token, e.secret).reply.status == proto::Status::unknown_handle);
  // An orphaned grant (its handles died with the previous daemon) cannot be exported again.
  CHECK(ipc_export(w2, owner, g).status == proto::Status::bad_request);
  w2.release(owner, g);
  CHECK(w2.used(owner) == 0_MiB);
}

TEST_CASE("node: free pool memory idle past the idle period goes back to the driver and a quick reuse stays warm",
          "[node][idle]") {
  using std::chrono::milliseconds;
  NodeSettings ns;
  ns.pool_idle_release = milliseconds(200);
  World w("version: 1\ndefault: {limit: 100%}\n", ns);
  const auto s = w.hello(1, 100, 1000);
  const TenantId t = w.node->session(s)->tenant;
  const DevicePool& pool = *w.node->devices().front().pool;
  const Bytes free_before = sim_gpu().driver().memory_info(DeviceOrdinal{0}).free;

  w.release(s, w.granted(1, s, 64 * kMiB));
  CHECK(pool.free_bytes() == 64_MiB);
  CHECK(w.node->accounting().usage(t, DeviceOrdinal{0}).retained == 64_MiB);  // bound to it
  w.advance(milliseconds(150));
  w.node->tick(w.t);
  CHECK(pool.free_bytes() == 64_MiB);  // not idle long enough

  // Allocated again before the period: the warm path (no handle created), and its idle time
  // starts again when it is freed.
  const std::uint64_t created = pool.handles_created();
  w.release(s, w.granted(1, s, 64 * kMiB));
  CHECK(pool.handles_created() == created);
  w.advance(milliseconds(150));
  w.node->tick(w.t);
  CHECK(pool.free_bytes() == 64_MiB);
  CHECK(pool.idle_released_bytes() == 0_B);

  w.advance(milliseconds(60));
  w.node->tick(w.t);
  CHECK(pool.free_bytes() == 0_B);
  CHECK(pool.pool_bytes() == 0_B);
  CHECK(pool.idle_released_bytes() == 64_MiB);
  CHECK(w.node->accounting().usage(t, DeviceOrdinal{0}).retained == 0_B);  // its charge went with it
  CHECK(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free == free_before);
}

TEST_CASE("node: an idle bound handle another process still holds stays charged until the holder goes",
          "[node][idle][binding]") {
  using std::chrono::milliseconds;
  NodeSettings ns;
  ns.pool_idle_release = milliseconds(200);
  bool held = true;
  World w("version: 1\ndefault: {limit: 100%}\n", ns,
          [&held](const std::vector<int>& fds) { return std::vector<std::uint32_t>(fds.size(), held ? 1u : 0u); });
  const auto s = w.hello(1, 100, 1000);
  const TenantId t = w.node->session(s)->tenant;
  const DevicePool& pool = *w.node->devices().front().pool;

  w.release(s, w.granted(1, s, 32 * kMiB));
  w.advance(milliseconds(250));
  w.node->tick(w.t);
  // Retired (docs/security.md): out of the free pool, its descriptor held and charged.
  CHECK(pool.free_bytes() == 0_B);
  CHECK(pool.idle_released_bytes() == 32_MiB);
  CHECK(pool.held_fd_bytes() == 32_MiB);
  CHECK(w.node->accounting().usage(t, DeviceOrdinal{0}).retained == 32_MiB);

  held = false;
  w.advance(milliseconds(1000));
  w.node->tick(w.t);
  CHECK(pool.held_fd_bytes() == 0_B);
  CHECK(w.node->accounting().usage(t, DeviceOrdinal{0}).retained == 0_B);
}

TEST_CASE("node: idle release off keeps the free pool as before", "[node][idle]") {
  World w("version: 1\ndefault: {limit: 100%}\n");  // NodeSettings default: off
  const auto s = w.hello(1, 100, 1000);
  const DevicePool& pool = *w.node->devices().front().pool;
  w.release(s, w.granted(1, s, 16 * kMiB));
  w.advance(std::chrono::milliseconds(3'600'000));
  w.node->tick(w.t);
  CHECK(pool.free_bytes() == 16_MiB);
  CHECK(pool.idle_released_bytes() == 0_B);
}

namespace {

// Writes "weights" into grant `g` through the daemon's mappings: chunk k (2 MiB) holds byte
// k + 1, so no two chunks of the grant are alike and every grant filled so is.
void fill_weights(World& w, std::uint64_t g) {
  std::uint64_t k = 0;
  for (const auto& h : w.node->grants().at(g).handles) {
    for (std::uint64_t off = 0; off < h->size.value(); off += 2 * kMiB, ++k) {
      REQUIRE(k < 255);
      sim_gpu().driver().fill_u8(DevicePtr{h->va.value() + off}, static_cast<std::uint8_t>(k + 1), 2_MiB);
    }
  }
}

// Shares [0, bytes) of grant `g` of `session` and commits it (as the hook does once mapped).
void share_whole(World& w, std::uint64_t session, std::uint64_t g, std::uint64_t bytes) {
  proto::ShareRequest sr = proto::make<proto::ShareRequest>(21);
  sr.grant_id = g;
  sr.offset = 0;
  sr.bytes = bytes;
  auto out = w.node->share_request(session, sr);
  REQUIRE(std::holds_alternative<ShareOut>(out));
  REQUIRE(std::get<ShareOut>(out).reply.status == proto::Status::ok);
  proto::ShareCommit c = proto::make<proto::ShareCommit>(22);
  c.grant_id = g;
  c.commit = 1;
  auto ack = w.node->share_commit(session, c);
  REQUIRE(std::holds_alternative<proto::ShareAck>(ack));
  REQUIRE(std::get<proto::ShareAck>(ack).status == proto::Status::ok);
}

}  // namespace

TEST_CASE("node: a fifth tenant is granted what four sharing tenants saved and their exits return the books to zero",
          "[node][quota][dedup]") {
  // 1 GiB GPU: `serve` (guaranteed 256 MiB) runs four replicas of 192 MiB; `batch` has no
  // guarantee, so it may borrow the 768 unguaranteed MiB less what serve borrows.
  World w(R"(version: 1
default: {limit: 100%}
namespaces:
  - {name: serve, guaranteed: 256MiB, dedup_domain: weights, users: [1001, 1002, 1003, 1004]}
  - {name: batch, users: [1005]}
)");
  constexpr std::uint64_t kReplica = 192 * kMiB;
  const DeviceOrdinal d0{0};
  const Node::Device& dev = w.node->devices().front();
  const NamespaceId serve = w.node->namespaces().at("serve").id;
  const NamespaceId batch = w.node->namespaces().at("batch").id;
  std::vector<std::uint64_t> replicas;
  for (std::uint32_t i = 0; i < 4; ++i) {
    const auto s = w.hello(10 + i, 200 + i, 1001 + i);
    const std::uint64_t g = w.granted(10 + i, s, kReplica);
    fill_weights(w, g);
    share_whole(w, s, g, kReplica);
    replicas.push_back(s);
  }
  const auto b = w.hello(20, 300, 1005);
  auto du = w.node->accounting().device_usage(d0);
  CHECK(du.dedup_logical == Bytes{4 * kReplica});
  CHECK(du.dedup_physical == Bytes{kReplica});
  CHECK(du.dedup_saved == Bytes{3 * kReplica});
  CHECK(du.dedup_logical == w.node->dedup_logical(d0));
  CHECK(du.dedup_physical == w.node->dedup_physical(d0));
  CHECK(du.borrowed == 0_B);  // serve's one physical replica is within its guarantee
  // Each replica and the namespace stay charged what they map.
  for (auto s : replicas) CHECK(w.used(s) == Bytes{kReplica});
  CHECK(w.node->accounting().namespace_usage(serve, d0).used() == Bytes{4 * kReplica});

  // The fifth tenant gets what the sharing saved (576 MiB), and the rest nobody is guaranteed.
  w.granted(20, b, 3 * kReplica);
  w.granted(20, b, 192 * kMiB);  // all 768 unguaranteed MiB
  CHECK(w.refused(20, b, 2 * kMiB) == proto::Status::guarantee);
  // ... and the device really holds it: one replica + batch's 768 MiB (+ vlaked's hash scratch).
  const MemoryInfo mi = sim_gpu().driver().memory_info(d0);
  CHECK(mi.total.value() - mi.free.value() >= kReplica + 768 * kMiB);
  CHECK(w.node->accounting().namespace_usage(batch, d0).used() == 768_MiB);
  CHECK(w.node->counters().denials_guarantee == 1);

  // The replicas exit one by one: their charge and their savings go together; physical use
  // never rises, so batch's grants stay covered.
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    w.node->end_session(replicas[i], "process exited");
    du = w.node->accounting().device_usage(d0);
    INFO("after " << i + 1 << " exits");
    const std::uint64_t left = replicas.size() - i - 1;
    CHECK(du.dedup_logical == Bytes{left * kReplica});
    CHECK(du.dedup_logical == w.node->dedup_logical(d0));
    CHECK(du.dedup_physical == w.node->dedup_physical(d0));
    CHECK(du.dedup_saved == Bytes{(left > 0 ? left - 1 : 0) * kReplica});
    CHECK(du.borrowed == 768_MiB);
  }
  // Exactly zero: no shared chunk, no saving, serve holds nothing and gets its guarantee back.
  const auto ns = w.node->accounting().namespace_usage(serve, d0);
  CHECK(ns.held() == 0_B);
  CHECK(ns.dedup_saved == 0_B);
  CHECK(du.dedup_physical == 0_B);
  CHECK(du.unguaranteed_saved == 0_B);
  CHECK(dev.granted == 768_MiB);
  // (240 of its 256 MiB: the rest of the simulated GPU holds vlaked's hash scratch.)
  const auto again = w.hello(30, 400, 1001);
  w.granted(30, again, 240 * kMiB);
  CHECK(w.node->accounting().device_usage(d0).borrowed == 768_MiB);
}

TEST_CASE("node: a sharing session moved by a reload takes its references along", "[node][quota][dedup]") {
  // Two tenants of `a` share 64 MiB; a reload moves one of them to `b` (its own guarantee):
  // the chunk then counts once in each namespace, and nothing is saved any more.
  const std::string before = R"(version: 1
default: {limit: 100%, dedup_domain: weights}
namespaces:
  - {name: a, guaranteed: 128MiB, users: [1001, 1002]}
  - {name: b, guaranteed: 128MiB}
)";
  World w(before);
  const DeviceOrdinal d0{0};
  const auto s1 = w.hello(1, 101, 1001);
  const auto s2 = w.hello(2, 102, 1002);
  for (auto s : {s1, s2}) {
    const std::uint64_t g = w.granted(s == s1 ? 1 : 2, s, 64 * kMiB);
    fill_weights(w, g);
    share_whole(w, s, g, 64 * kMiB);
  }
  const NamespaceId a = w.node->namespaces().at("a").id;
  CHECK(w.node->accounting().namespace_usage(a, d0).dedup_saved == 64_MiB);

  std::string after = before;
  after.replace(after.find("users: [1001, 1002]"), 19, "users: [1001]");
  after.replace(after.find("guaranteed: 128MiB}"), 19, "guaranteed: 128MiB, users: [1002]}");
  quota::QuotaConfig cfg = config(after);
  w.node->validate(cfg);
  w.node->apply(std::move(cfg), "test.yaml", true, w.t, "test");
  REQUIRE(w.tenant_of(s2) == "b/user:1002");
  const NamespaceId b = w.node->namespaces().at("b").id;
  CHECK(w.node->accounting().namespace_usage(a, d0).dedup_saved == 0_B);
  CHECK(w.node->accounting().namespace_usage(b, d0).dedup_saved == 0_B);
  CHECK(w.node->accounting().namespace_usage(b, d0).used() == 64_MiB);
  CHECK(w.node->accounting().device_usage(d0).dedup_logical == 128_MiB);
  // Its release drops the references it took along (a wrong owner would log an accounting error).
  w.node->end_session(s2, "process exited");
  w.node->end_session(s1, "process exited");
  const auto du = w.node->accounting().device_usage(d0);
  CHECK(du.dedup_logical == 0_B);
  CHECK(du.dedup_physical == 0_B);
  CHECK(w.node->accounting().namespace_usage(a, d0).held() == 0_B);
  CHECK(w.node->accounting().namespace_usage(b, d0).held() == 0_B);
}

// ---------------------------------------------------------------------------------------------
// kept mappings (docs/hook.md, "Kept mappings")

namespace {
proto::Release keep_release(std::uint64_t grant) {
  proto::Release m = proto::make<proto::Release>(9);
  m.grant_id = grant;
  m.flags = proto::kReleaseKeepMapped;
  return m;
}
std::uint64_t key_of(const GrantOut& out) {
  const auto* g = std::get_if<Granted>(&out);
  REQUIRE(g != nullptr);
  REQUIRE(g->reply.handle_count == 1);
  return g->reply.handles[0].key;
}
}  // namespace

TEST_CASE("node: a kept handle comes back to its session with its key and another process gets it only after a Drop",
          "[node][kept]") {
  World w("version: 1\ndefault:\n  limit: 512MiB\n");
  const std::uint64_t a = w.hello(1, 100, 1000);
  const std::uint64_t a2 = w.hello(2, 101, 1000);  // the same tenant, another process
  GrantOut first = w.grant(1, a, 32 * kMiB);
  const std::uint64_t key = key_of(first);
  CHECK(key != 0);
  REQUIRE(std::holds_alternative<proto::ReleaseAck>(w.node->release(a, keep_release(std::get<Granted>(first).grant))));
  CHECK(w.node->devices().front().pool->kept_by(a) == 32_MiB);
  CHECK(w.used(a) == 32_MiB);  // kept memory is the tenant's (retained)
  CHECK(w.node->take_drops().empty());
  // Its own session: the same handle, same key, no Drop.
  GrantOut again = w.grant(1, a, 32 * kMiB);
  CHECK(key_of(again) == key);
  CHECK(w.node->take_drops().empty());
  REQUIRE(std::holds_alternative<proto::ReleaseAck>(w.node->release(a, keep_release(std::get<Granted>(again).grant))));
  // Another process of the tenant: the handle moves, and the keeper is told to drop it.
  GrantOut other = w.grant(2, a2, 32 * kMiB);
  CHECK(key_of(other) == key);
  const std::vector<DropOut> drops = w.node->take_drops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].conn == 1);
  CHECK(drops[0].session == a);
  CHECK(drops[0].msg.count == 1);
  CHECK(drops[0].msg.keys[0] == key);
  CHECK(proto::decode(proto::encode(drops[0].msg), 0).ok());
  CHECK(w.node->devices().front().pool->kept_by(a) == 0_B);
  CHECK(w.node->kept_drops() == 1);
}

TEST_CASE("node: a retired kept handle stays charged until its keeper says Dropped", "[node][kept]") {
  World w("version: 1\ndefault:\n  limit: 64MiB\n");
  const std::uint64_t a = w.hello(1, 100, 1000);
  GrantOut first = w.grant(1, a, 48 * kMiB);
  const std::uint64_t key = key_of(first);
  REQUIRE(std::holds_alternative<proto::ReleaseAck>(w.node->release(a, keep_release(std::get<Granted>(first).grant))));
  // A grant that needs the tenant's own kept memory: not a refusal, "drop yours and ask again".
  CHECK(w.refused(1, a, 32 * kMiB) == proto::Status::drop_kept);
  CHECK(w.node->counters().denials_over_limit == 0);
  // The self-limit path retired the kept handle: its memory is pinned (the process maps it).
  DevicePool& pool = *w.node->devices().front().pool;
  CHECK(pool.pinned_bytes() == 48_MiB);
  CHECK(w.used(a) == 48_MiB);
  const std::vector<DropOut> drops = w.node->take_drops();
  REQUIRE(drops.size() == 1);
  CHECK(drops[0].msg.keys[0] == key);
  // A Dropped from another session changes nothing; the keeper's does.
  const std::uint64_t b = w.hello(2, 200, 2000);
  proto::Dropped d = proto::make<proto::Dropped>();
  d.count = 1;
  d.keys[0] = key;
  CHECK_FALSE(w.node->dropped(b, d).has_value());
  CHECK(pool.pinned_bytes() == 48_MiB);
  CHECK_FALSE(w.node->dropped(a, d).has_value());
  CHECK(pool.pinned_bytes() == 0_B);
  CHECK(w.used(a) == 0_B);
  w.granted(1, a, 32 * kMiB);
  CHECK(w.node->counters().denials_over_limit == 0);
}

TEST_CASE("node: a keeper that exits unpins its kept memory", "[node][kept]") {
  World w("version: 1\ndefault:\n  limit: 512MiB\n");
  const std::uint64_t a = w.hello(1, 100, 1000);
  const std::uint64_t b = w.hello(2, 101, 1000);  // keeps the tenant alive after a ends
  GrantOut g1 = w.grant(1, a, 16 * kMiB);
  REQUIRE(std::holds_alternative<proto::ReleaseAck>(w.node->release(a, keep_release(std::get<Granted>(g1).grant))));
  DevicePool& pool = *w.node->devices().front().pool;
  CHECK(pool.retire_bound(w.node->session(a)->tenant, Bytes{~0ULL}) == 16_MiB);
  CHECK(pool.pinned_bytes() == 16_MiB);
  w.node->end_session(a, "test");
  CHECK(pool.pinned_bytes() == 0_B);
  CHECK(w.used(b) == 0_B);
}

TEST_CASE("node: the warm stock queues a clean handle of a size in demand and the next grant of it needs no new handle",
          "[node][warm]") {
  NodeSettings settings;
  settings.warm_stock = Bytes{64 * kMiB};
  settings.background_builds = true;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const Node::Device& d = w.node->devices().front();
  const auto a = w.hello(1, 101, 1001);
  const auto b = w.hello(2, 102, 1002);
  CHECK(w.node->take_builds().empty());
  w.granted(1, a, 8 * kMiB);  // a new handle; 8 MiB asked for once: not worth a build yet
  CHECK(w.node->take_builds().empty());
  w.granted(1, a, 8 * kMiB);  // twice: in demand
  std::vector<BuildOut> builds = w.node->take_builds();
  REQUIRE(builds.size() == 1);
  CHECK(builds[0].size == Bytes{8 * kMiB});
  CHECK(w.node->take_builds().empty());
  // Still building: nothing more is queued for it.
  w.node->tick(w.t);
  CHECK(w.node->take_builds().empty());
  // Built (here, inline; in vlaked on the HandleBuilder's worker) and adopted.
  Driver& drv = sim_gpu().driver();
  w.node->adopt(builds[0].device, build_handle(drv, builds[0].device, builds[0].size, d.granularity, true));
  CHECK(d.pool->clean_stock() == WarmStock::Counts{{8 * kMiB, 1}});
  const std::uint64_t created = d.pool->handles_created();
  const std::uint64_t scrubs = w.node->counters().scrubs;
  // Another tenant's grant of that size takes the clean handle: no creation, no scrub.
  w.granted(2, b, 8 * kMiB);
  CHECK(w.node->counters().grants_exact == 1);
  CHECK(w.node->counters().scrubs == scrubs);
  CHECK(d.pool->handles_created() == created);
  CHECK(d.pool->clean_stock().empty());
  // And its replacement is queued at once (demand 3: two handles).
  builds = w.node->take_builds();
  REQUIRE(builds.size() == 2);
  CHECK(builds[0].size == Bytes{8 * kMiB});
  // A failed build is forgotten; with no room builds pause for a second.
  w.node->build_failed(builds[0].device, builds[0].size, true);
  w.node->tick(w.t);
  CHECK(w.node->take_builds().empty());
  w.advance(std::chrono::milliseconds(1100));
  w.node->tick(w.t);
  CHECK(w.node->take_builds().size() == 1);
}

TEST_CASE("node: without background builds the warm stock is built in tick and the idle release keeps it",
          "[node][warm]") {
  NodeSettings settings;
  settings.warm_stock = Bytes{64 * kMiB};
  settings.pool_idle_release = std::chrono::milliseconds(1000);
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const Node::Device& d = w.node->devices().front();
  const auto a = w.hello(1, 101, 1001);
  for (int i = 0; i < 4; ++i) w.granted(1, a, 4 * kMiB);  // demand 4: two handles wanted
  CHECK(w.node->take_builds().empty());                   // nothing queued
  w.node->tick(w.t);
  CHECK(d.pool->clean_stock() == WarmStock::Counts{{4 * kMiB, 2}});
  // Idle for longer than the idle period while still wanted: kept.
  w.advance(std::chrono::milliseconds(1500));
  w.node->tick(w.t);
  CHECK(d.pool->clean_stock() == WarmStock::Counts{{4 * kMiB, 2}});
  // Demand gone (half-life 10 s): the idle release gives them back.
  w.advance(std::chrono::seconds(60));
  w.node->tick(w.t);
  w.advance(std::chrono::milliseconds(1500));
  w.node->tick(w.t);
  CHECK(d.pool->clean_stock().empty());
}

// ---- swapping idle processes to host memory (node_swap.cpp, docs/swap.md) ----------------------

namespace {

const char* kOvercommit =
    "version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: nb, overcommit: true, users: [1001, 1002, 1003]}\n";

GrantOut counted(World& w, ConnId conn, std::uint64_t session, std::uint64_t bytes) {
  proto::GrantRequest m = w.request(bytes);
  m.purpose = proto::GrantPurpose::counted;
  return w.node->grant(conn, session, m, w.t);
}

void report_active(World& w, std::uint64_t session) {
  proto::ReserveReport r = proto::make<proto::ReserveReport>(0);
  w.node->devices().front().uuid.copy_to(r.device_uuid);
  r.flags = proto::kReportActive;
  CHECK_FALSE(w.node->reserve_report(session, r).has_value());
}

NodeSettings swap_settings() {
  NodeSettings s;
  s.swap_idle = std::chrono::milliseconds(1000);
  s.swap_margin = Bytes{0};
  return s;
}

}  // namespace

TEST_CASE("node: overcommit: a counted grant the GPU has no room for swaps out an idle process", "[node][swap]") {
  World w(kOvercommit, swap_settings());
  REQUIRE(sim_gpu().driver().checkpoint_supported());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  REQUIRE(std::holds_alternative<Granted>(counted(w, 1, a, 512 * kMiB)));
  // A's driver holds its 512 MiB (taken here outside the pool, as A's own allocation would be).
  const Bytes free = sim_gpu().driver().memory_info(DeviceOrdinal{0}).free;
  w.take_outside(free - Bytes{128 * kMiB});
  w.advance(std::chrono::milliseconds(2000));  // A idle
  report_active(w, b);

  // B's 256 MiB do not fit: parked; caches first (nobody to ask here), no swap yet.
  GrantOut out = counted(w, 2, b, 256 * kMiB);
  REQUIRE(std::holds_alternative<Parked>(out));
  CHECK(w.node->take_swap_notices().empty());
  // At the first retry (250 ms) A, idle for 2 s, is told to get ready.
  w.advance(std::chrono::milliseconds(300));
  REQUIRE(w.node->retry_due(w.t));
  CHECK(w.node->retry_parked(w.t).empty());
  std::vector<SwapNoticeOut> notes = w.node->take_swap_notices();
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 1);
  CHECK(notes[0].msg.phase == proto::SwapPhase::out);
  CHECK(w.node->session(a)->swap == SwapState::notified);
  // Who waits for whom: B's grant waits for A, which goes out for it.
  {
    const Node::Wait bw = w.node->wait_of_session(*w.node->session(b));
    CHECK(bw.kind == st::kWaitMemory);
    CHECK(bw.bytes == 256_MiB);
    CHECK(bw.waits_for == std::vector<std::uint64_t>{a});
    CHECK(w.node->session(a)->swap_for == b);
    CHECK(w.node->wait_of_session(*w.node->session(a)).kind == st::kWaitNone);
    CHECK(w.node->take_changes().sessions.count(w.node->session(b)->slot) == 1);  // published while it waits
  }
  // A retry while A is on its way out swaps nobody else (B is not idle anyway).
  w.advance(std::chrono::milliseconds(300));
  (void)w.node->retry_parked(w.t);
  CHECK(w.node->take_swap_notices().empty());

  // A says ready: its checkpoint is queued for the swap thread.
  proto::SwapReady ready = proto::make<proto::SwapReady>();
  ready.swap_id = notes[0].msg.swap_id + 1;  // another swap's: ignored
  CHECK_FALSE(w.node->swap_ready(a, ready).has_value());
  CHECK(w.node->take_swap_jobs().empty());
  ready.swap_id = notes[0].msg.swap_id;
  CHECK_FALSE(w.node->swap_ready(a, ready).has_value());
  std::vector<SwapJob> jobs = w.node->take_swap_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].pid == 101);
  CHECK_FALSE(jobs[0].restore);
  CHECK(w.node->session(a)->swap == SwapState::checkpointing);

  // The checkpoint frees A's memory: B's grant is served.
  sim_gpu().driver().release(w.outside);
  w.outside = PhysicalHandle{};
  w.node->swap_done(jobs[0], true, Bytes{512 * kMiB}, std::chrono::milliseconds(400), "", w.t);
  CHECK(w.node->session(a)->swap == SwapState::swapped);
  notes = w.node->take_swap_notices();  // A hears it is on the host (it asks as soon as it computes)
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].msg.phase == proto::SwapPhase::host);
  CHECK(w.node->counters().swap_outs == 1);
  CHECK(w.node->swapped_bytes(DeviceOrdinal{0}).value() == 512 * kMiB);
  REQUIRE(w.node->retry_due(w.t));
  std::vector<Completion> done = w.node->retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(done[0].conn == 2);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  // A's quota still holds its 512 MiB: it is overcommitted, not its GPU.
  CHECK(w.used(a) == 512_MiB);

  // A's next CUDA call asks to come back: there is room, the restore is queued at once.
  proto::SwapIn in = proto::make<proto::SwapIn>(41);
  CHECK_FALSE(w.node->swap_in(1, a, in, w.t).has_value());
  jobs = w.node->take_swap_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].restore);
  w.advance(std::chrono::milliseconds(150));
  w.node->swap_done(jobs[0], true, Bytes{0}, std::chrono::milliseconds(150), "", w.t);
  std::vector<SwapInOut> replies = w.node->take_swap_replies();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].conn == 1);
  CHECK(replies[0].reply.status == proto::Status::ok);
  CHECK(replies[0].reply.h.request_id == 41);
  CHECK(replies[0].reply.waited_ms == 150);
  CHECK(w.node->session(a)->swap == SwapState::none);
  CHECK(w.node->counters().swap_ins == 1);
  CHECK(w.node->swapped_bytes(DeviceOrdinal{0}).value() == 0);
  CHECK(w.node->session(a)->swap_outs == 1);
  CHECK(w.node->session(a)->swap_ins == 1);
  CHECK(w.node->session(a)->swap_for == 0);
  CHECK(w.node->counters().swap_out_bytes == 512 * kMiB);
  CHECK(w.node->counters().swap_in_ns == 150'000'000);
  CHECK(w.node->wait_of_session(*w.node->session(b)).kind == st::kWaitNone);  // served
}

TEST_CASE("node: overcommit: a restore waits for room and swaps out others or times out clearly", "[node][swap]") {
  World w(kOvercommit, swap_settings());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  const auto c = w.hello(3, 103, 1003, true);
  REQUIRE(std::holds_alternative<Granted>(counted(w, 1, a, 512 * kMiB)));
  REQUIRE(std::holds_alternative<Granted>(counted(w, 3, c, 512 * kMiB)));
  // A is swapped out (as above, without the grant that asked for it).
  w.advance(std::chrono::milliseconds(2000));
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  REQUIRE(std::holds_alternative<Parked>(counted(w, 2, b, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.node->retry_parked(w.t);
  std::vector<SwapNoticeOut> notes = w.node->take_swap_notices();
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 1);  // A and C idle as long: the lower session id
  proto::SwapReady ready = proto::make<proto::SwapReady>();
  ready.swap_id = notes[0].msg.swap_id;
  (void)w.node->swap_ready(a, ready);
  SwapJob job = w.node->take_swap_jobs().at(0);
  w.node->swap_done(job, true, Bytes{512 * kMiB}, std::chrono::milliseconds(400), "", w.t);
  CHECK(w.node->session(a)->swap == SwapState::swapped);
  (void)w.node->take_swap_notices();  // A's SwapNotice{host}

  // The GPU stays full: A's SwapIn waits, and C (idle) is told to make room for it.
  w.advance(std::chrono::milliseconds(2000));
  report_active(w, b);
  proto::SwapIn in = proto::make<proto::SwapIn>(5);
  CHECK_FALSE(w.node->swap_in(1, a, in, w.t).has_value());
  CHECK(w.node->take_swap_jobs().empty());
  notes = w.node->take_swap_notices();
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 3);
  // C never answers: after 2 s it is left alone (and told so).
  w.advance(std::chrono::milliseconds(2100));
  w.node->swap_tick(w.t);
  notes = w.node->take_swap_notices();
  REQUIRE_FALSE(notes.empty());
  CHECK(notes.back().conn == 3);
  CHECK(notes.back().msg.phase == proto::SwapPhase::back);
  CHECK(w.node->session(c)->swap == SwapState::none);
  // A waits up to the overcommit wait (2 minutes), then hears out_of_memory and stays on the host.
  w.advance(std::chrono::milliseconds(120000));
  w.node->swap_tick(w.t);
  std::vector<SwapInOut> replies = w.node->take_swap_replies();
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].reply.status == proto::Status::out_of_memory);
  CHECK(w.node->session(a)->swap == SwapState::swapped);
  CHECK(w.node->counters().swap_timeouts == 1);
}

TEST_CASE("node: overcommit: a SwapIn before the checkpoint calls the swap off and failures are reported",
          "[node][swap]") {
  World w(kOvercommit, swap_settings());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  REQUIRE(std::holds_alternative<Granted>(counted(w, 1, a, 512 * kMiB)));
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  w.advance(std::chrono::milliseconds(2000));
  REQUIRE(std::holds_alternative<Parked>(counted(w, 2, b, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.node->retry_parked(w.t);
  REQUIRE(w.node->take_swap_notices().size() == 1);
  // A wakes up first: called off, answered at once.
  proto::SwapIn in = proto::make<proto::SwapIn>(3);
  const auto r = w.node->swap_in(1, a, in, w.t);
  REQUIRE(r.has_value());
  CHECK(r->status == proto::Status::ok);
  CHECK(w.node->session(a)->swap == SwapState::none);

  // Next time the checkpoint itself fails: A is told to go on, and counted as a failure.
  w.advance(std::chrono::milliseconds(2000));
  (void)w.node->retry_parked(w.t);
  std::vector<SwapNoticeOut> notes = w.node->take_swap_notices();
  REQUIRE(notes.size() == 1);
  proto::SwapReady ready = proto::make<proto::SwapReady>();
  ready.swap_id = notes[0].msg.swap_id;
  (void)w.node->swap_ready(a, ready);
  const SwapJob job = w.node->take_swap_jobs().at(0);
  w.node->swap_done(job, false, Bytes{0}, std::chrono::milliseconds(1), "cuCheckpointProcessLock failed", w.t);
  CHECK(w.node->session(a)->swap == SwapState::none);
  CHECK(w.node->counters().swap_failures == 1);
  notes = w.node->take_swap_notices();
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].msg.phase == proto::SwapPhase::back);
}

TEST_CASE("node: overcommit: tenants without it are never swapped and their grants never wait for room",
          "[node][swap]") {
  World w(
      "version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: nb, overcommit: true, users: [1001]}\n"
      "  - {name: plain, users: [1002]}\n",
      swap_settings());
  const auto a = w.hello(1, 101, 1001, true);                              // overcommit
  const auto p = w.hello(2, 102, 1002, true);                              // plain
  REQUIRE(std::holds_alternative<Granted>(counted(w, 2, p, 256 * kMiB)));  // e.g. managed memory
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  w.advance(std::chrono::milliseconds(5000));
  // A needs room; P is idle but not in an overcommit namespace: nobody is swapped, and after the
  // wait the grant goes on (A's driver decides).
  REQUIRE(std::holds_alternative<Parked>(counted(w, 1, a, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.node->retry_parked(w.t);
  CHECK(w.node->take_swap_notices().empty());
  w.advance(std::chrono::milliseconds(120000));
  std::vector<Completion> done = w.node->retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  // P's counted grants never wait for room (only overcommit tenants' do).
  CHECK(std::holds_alternative<Granted>(counted(w, 2, p, 64 * kMiB)));
}

TEST_CASE("node: refusals are logged with their reason, and per tenant", "[node][refusals][state]") {
  NodeSettings settings;
  settings.max_sessions_per_tenant = 1;
  World w("version: 1\ndefault: {limit: 4MiB}\n", settings);
  const auto s1 = w.hello(1, 101, 1001);
  w.t.unix_ns = 5'000'000'000ULL;
  CHECK(w.refused(1, s1, 8 * kMiB) == proto::Status::over_limit);
  // A second session of the same tenant is over the session cap.
  proto::Hello m = proto::make<proto::Hello>(1);
  HelloOut out = w.node->open_session(Peer{2, 102, 1001, 1001, 1102, ""}, m);
  REQUIRE(std::holds_alternative<Fatal>(out.answer));
  const st::RefusalLog& log = w.node->refusal_log();
  REQUIRE(log.next_seq == 3);
  const st::RefusalRecord& r1 = log.refusals[0];
  CHECK(r1.seq == 1);
  CHECK(r1.reason == st::kRefusalTenantLimit);
  CHECK(r1.pid == 101);
  CHECK(r1.device == 0);
  CHECK(r1.bytes == 8 * kMiB);
  CHECK(r1.limit == 4 * kMiB);
  CHECK(r1.time_unix_ns == 5'000'000'000ULL);
  CHECK(std::string(r1.tenant_name) == "uid:1001");
  const st::RefusalRecord& r2 = log.refusals[1];
  CHECK(r2.reason == st::kRefusalLimitReached);
  CHECK(r2.pid == 102);
  CHECK(r2.device == st::kGuardNoDevice);
  CHECK(r2.used == 1);
  CHECK(r2.limit == 1);
  const Node::Session* s = w.node->session(s1);
  REQUIRE(s != nullptr);
  const Node::Tenant* t = w.node->tenant(s->tenant);
  REQUIRE(t != nullptr);
  CHECK(t->denials[st::kRefusalTenantLimit - 1] == 1);
  CHECK(t->denials[st::kRefusalLimitReached - 1] == 1);
  CHECK(w.node->counters().refusals_recorded == 2);
  CHECK(w.node->take_changes().refusals);

  // Published: the ring, the tenant's denials, and a session's activity.
  const std::string name = "vlake-node-test-rf-" + std::to_string(::getpid());
  struct Cleanup {
    std::string n;
    ~Cleanup() { ::unlink(("/dev/shm/" + n).c_str()); }
  } cleanup{name};
  st::StateSegment seg(name);
  StatePublisher pub(seg, 1, 2, 1000);
  pub.publish_all(*w.node, w.t.unix_ns);
  CHECK(seg.state().refusals.next_seq == 3);
  CHECK(seg.state().refusals.refusals[0].reason == st::kRefusalTenantLimit);
  bool found = false;
  for (const st::TenantRecord& r : seg.state().tenants) {
    if (r.in_use == 0 || std::string(r.name) != "uid:1001") continue;
    found = true;
    CHECK(r.denials[st::kRefusalTenantLimit - 1] == 1);
  }
  CHECK(found);
  const st::SessionRecord& sr = seg.state().sessions[s->slot];
  CHECK(sr.id == s1);
  CHECK(sr.last_active_unix_ns == 5'000'000'000ULL);  // its grant (refused) was its last activity
  CHECK(sr.swap == st::kSwapNone);
  CHECK(sr.wait == st::kWaitNone);
}
