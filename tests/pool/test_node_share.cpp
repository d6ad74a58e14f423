// vlake::pool::Node: dedup sharing, kept mappings and the warm stock (docs/dedup.md,
// docs/hook.md, docs/pool.md).
#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

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
  CHECK(w.take(&Effects::drops).empty());
  // Its own session: the same handle, same key, no Drop.
  GrantOut again = w.grant(1, a, 32 * kMiB);
  CHECK(key_of(again) == key);
  CHECK(w.take(&Effects::drops).empty());
  REQUIRE(std::holds_alternative<proto::ReleaseAck>(w.node->release(a, keep_release(std::get<Granted>(again).grant))));
  // Another process of the tenant: the handle moves, and the keeper is told to drop it.
  GrantOut other = w.grant(2, a2, 32 * kMiB);
  CHECK(key_of(other) == key);
  const std::vector<DropOut> drops = w.take(&Effects::drops);
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
  const std::vector<DropOut> drops = w.take(&Effects::drops);
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
  CHECK(w.take(&Effects::builds).empty());
  w.granted(1, a, 8 * kMiB);  // a new handle; 8 MiB asked for once: not worth a build yet
  CHECK(w.take(&Effects::builds).empty());
  w.granted(1, a, 8 * kMiB);  // twice: in demand
  std::vector<BuildOut> builds = w.take(&Effects::builds);
  REQUIRE(builds.size() == 1);
  CHECK(builds[0].size == Bytes{8 * kMiB});
  CHECK(w.take(&Effects::builds).empty());
  // Still building: nothing more is queued for it.
  w.node->tick(w.t);
  CHECK(w.take(&Effects::builds).empty());
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
  builds = w.take(&Effects::builds);
  REQUIRE(builds.size() == 2);
  CHECK(builds[0].size == Bytes{8 * kMiB});
  // A failed build is forgotten; with no room builds pause for a second.
  w.node->build_failed(builds[0].device, builds[0].size, true);
  w.node->tick(w.t);
  CHECK(w.take(&Effects::builds).empty());
  w.advance(std::chrono::milliseconds(1100));
  w.node->tick(w.t);
  CHECK(w.take(&Effects::builds).size() == 1);
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
  CHECK(w.take(&Effects::builds).empty());                // nothing queued
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
