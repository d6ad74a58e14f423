// vlake::pool::Node and its device pools: handle binding, memory NVML lists under no process,
// idle release (docs/pool.md, docs/daemon.md).
#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

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
    TestSegment test_segment("vlake-node-test-");
    st::StateSegment& seg = test_segment.seg;
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
  CHECK(w.observe_gpus(sample, {who(600, 5000)}, w.t, users).empty());
  CHECK(w.node->devices().front().unlisted == 256_MiB);
  const Node::Tenant* t = tenant_named(*w.node, "user:4000");
  REQUIRE(t != nullptr);
  CHECK(w.node->rooms().unhooked.of(t->id).bytes[0] == 256 * kMiB);
  REQUIRE(w.node->rooms().unhooked.of(t->id).procs.size() == 1);
  CHECK(w.node->rooms().unhooked.of(t->id).procs[0].pid == 500);
  CHECK(w.node->rooms().unhooked.of(t->id).procs[0].bytes == 256_MiB);
  CHECK(w.node->accounting().usage(t->id, DeviceOrdinal{0}).unhooked == 256_MiB);  // refuse: charged
  const Node::Tenant* listed = tenant_named(*w.node, "uid:5000");
  REQUIRE(listed != nullptr);
  CHECK(w.node->rooms().unhooked.of(listed->id).bytes[0] == 10 * kMiB);  // its NVML figure only
  const Node::Tenant* root = tenant_named(*w.node, "uid:0");
  CHECK((root == nullptr || w.node->rooms().unhooked.of(root->id).bytes[0] == 0));  // the daemon is nobody's
  {
    TestSegment test_segment("vlake-node-unlisted-");
    st::StateSegment& seg = test_segment.seg;
    StatePublisher pub(seg, 1, 2, 1000);
    pub.publish_all(*w.node, w.t.unix_ns);
    CHECK(seg.state().devices[0].unlisted_bytes == 256 * kMiB);
    CHECK(seg.state().tenants[t->slot].unhooked[0] == 256 * kMiB);
  }

  // It exits (no longer a user, memory gone): nothing is left unattributed or charged.
  CHECK(
      w.observe_gpus({gpu0(110_MiB, {{1, 100_MiB}, {600, 10_MiB}})}, {who(600, 5000)}, w.t, {who(600, 5000)}).empty());
  CHECK(w.node->devices().front().unlisted == 0_B);
  t = tenant_named(*w.node, "user:4000");
  CHECK((t == nullptr || w.node->rooms().unhooked.of(t->id).bytes[0] == 0));
}

TEST_CASE("node: unlisted memory is split equally among the GPU users NVML does not list", "[node][unhooked]") {
  World w("version: 1\ndefault: {limit: 1GiB}\n");
  const auto s = w.hello(1, 100, 1000);  // a session whose process may create memory without a context
  // Without a session: pids 500 and 501; with one: pid 100. 300 MiB unlisted, 100 MiB each.
  const std::vector<GpuSample> sample = {gpu0(400_MiB, {{1, 100_MiB}})};
  const std::vector<ProcessIdentity> users = {who(100, 1000), who(500, 2000), who(501, 2000)};
  CHECK(w.observe_gpus(sample, {}, w.t, users).empty());
  const Node::Tenant* two = tenant_named(*w.node, "uid:2000");
  REQUIRE(two != nullptr);
  CHECK(w.node->rooms().unhooked.of(two->id).bytes[0] == 200 * kMiB);
  CHECK(w.node->rooms().unhooked.of(two->id).procs.size() == 2);
  const Node::Tenant* mine = w.node->tenant(w.node->session(s)->tenant);
  REQUIRE(mine != nullptr);
  CHECK(w.node->rooms().unhooked.of(mine->id).bytes[0] == 100 * kMiB);  // the session's tenant
  CHECK(w.node->rooms().unhooked.of(mine->id).procs.empty());           // a session's process is never killed
  CHECK(w.node->accounting().usage(mine->id, DeviceOrdinal{0}).unhooked == 100_MiB);
}

TEST_CASE("node: unlisted memory up to the tolerance, or with nobody to charge, stays unattributed",
          "[node][unhooked]") {
  World w("version: 1\ndefault: {limit: 1GiB}\n");
  const std::vector<ProcessIdentity> users = {who(500, 2000)};
  CHECK(w.observe_gpus({gpu0(100_MiB + kUnlistedTolerance, {{1, 100_MiB}})}, {}, w.t, users).empty());
  CHECK(w.node->devices().front().unlisted == kUnlistedTolerance);
  const Node::Tenant* t = tenant_named(*w.node, "uid:2000");
  CHECK((t == nullptr || w.node->rooms().unhooked.of(t->id).bytes[0] == 0));
  // Above it, but no process without NVML's listing has the device files open: nobody's.
  CHECK(w.observe_gpus({gpu0(400_MiB, {{1, 100_MiB}})}, {}, w.t, {}).empty());
  CHECK(w.node->devices().front().unlisted == 300_MiB);
  for (const auto& [id, x] : w.node->tenants()) CHECK(w.node->rooms().unhooked.of(x.id).bytes[0] == 0);
  // One byte over the tolerance is charged.
  CHECK(w.observe_gpus({gpu0(100_MiB + kUnlistedTolerance + 1_MiB, {{1, 100_MiB}})}, {}, w.t, users).empty());
  t = tenant_named(*w.node, "uid:2000");
  REQUIRE(t != nullptr);
  CHECK(w.node->rooms().unhooked.of(t->id).bytes[0] == kUnlistedTolerance.value() + kMiB);
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
  CHECK(w.observe_gpus({gpu0(20_MiB + 64_MiB + 100_MiB, {{1, 20_MiB}})}, {}, w.t, users).empty());
  CHECK(d.unlisted == 100_MiB);
  const Node::Tenant* t = tenant_named(*w.node, "uid:2000");
  REQUIRE(t != nullptr);
  CHECK(w.node->rooms().unhooked.of(t->id).bytes[0] == 100 * kMiB);

  // The daemon not listed (no context yet): its pool is in used under no process, and is not
  // anybody else's.
  const Bytes pool = d.pool->pool_bytes();
  CHECK(w.observe_gpus({gpu0(pool + 64_MiB + 100_MiB, {})}, {}, w.t, users).empty());
  CHECK(d.unlisted == 100_MiB);
  t = tenant_named(*w.node, "uid:2000");
  REQUIRE(t != nullptr);
  CHECK(w.node->rooms().unhooked.of(t->id).bytes[0] == 100 * kMiB);
  holder.end();
}

// ---- idle release (docs/pool.md, "Idle release")

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
