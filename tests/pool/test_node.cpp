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
#include "vlake/contracts/codec.hpp"
#include "vlake/pool/holder_scan.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/publisher.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;

namespace {

constexpr std::uint64_t kMiB = 1ULL << 20;

// One simulated 1 GiB GPU for this test process (ctest runs each test case in its own process);
// its node file goes when the process exits.
class SimGpu {
 public:
  SimGpu() : node_("node-" + std::to_string(::getpid())) {
    ::setenv("VLAKE_SIM_NODE", node_.c_str(), 1);
    ::setenv("VLAKE_SIM_DEVICE_MEMORY", "1GiB", 1);
    ::setenv("VLAKE_SIM_DEVICE_COUNT", "1", 1);
    driver_ = open_driver(VLAKE_SIM_LIB);
  }
  ~SimGpu() { ::unlink(("/dev/shm/vlake-sim-" + node_).c_str()); }
  Driver& driver() { return *driver_; }

 private:
  std::string node_;
  std::unique_ptr<Driver> driver_;
};

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
