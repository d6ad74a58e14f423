// vlake::pool::Node: CUDA IPC of alloc grants (node_ipc.cpp, docs/ipc.md).
#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

// ---- CUDA IPC of alloc grants (node_ipc.cpp, docs/ipc.md) -----------------------------------

namespace {

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
  CHECK(w.node->rooms().ipc.imports().empty());
}

TEST_CASE("node: a released grant with IPC imports stays charged to its owner until the last import goes",
          "[node][ipc]") {
  World w(
      "version: 1\nnamespaces:\n  - name: a\n    users: [1000]\n    ipc_domain: team\n  - name: b\n"
      "    users: [2000]\n    ipc_domain: team\n");
  // What vlakectl and the metrics read (state.hpp TenantRecord::ipc_held, ipc_imported).
  TestSegment test_segment("vlake-node-ipc-held-");
  StatePublisher pub(test_segment.seg, 1, 2, 1000);
  pub.publish_all(*w.node, w.t.unix_ns);
  const auto record = [&](TenantId t) -> const st::TenantRecord& {
    pub.publish(*w.node);
    for (const st::TenantRecord& r : test_segment.seg.state().tenants) {
      if (r.in_use != 0 && r.id == t.value()) return r;
    }
    FAIL("no record of tenant " << t.value());
    throw std::logic_error("unreachable");
  };
  const auto owner = w.hello(1, 100, 1000);
  const auto importer = w.hello(2, 101, 2000);  // another tenant of the owner's ipc_domain
  const auto closer = w.hello(3, 102, 2000);
  const TenantId owner_tenant = w.node->session(owner)->tenant;
  const TenantId importer_tenant = w.node->session(importer)->tenant;
  const std::uint64_t g = w.granted(1, owner, 8 * kMiB);
  const auto e = ipc_export(w, owner, g);
  const auto i1 = ipc_open(w, importer, e.token, e.secret);
  REQUIRE(i1.reply.status == proto::Status::ok);
  const auto i2 = ipc_open(w, closer, e.token, e.secret);
  REQUIRE(i2.reply.status == proto::Status::ok);
  CHECK(w.used(importer) == 0_MiB);  // never charged to the importer's tenant
  // Its two processes map the same 8 MiB: imported once, charged to the owner.
  CHECK(record(importer_tenant).ipc_imported[0] == 8 * kMiB);
  CHECK(record(importer_tenant).granted[0] == 0);
  CHECK(record(owner_tenant).ipc_held[0] == 0);

  // The owner releases: held (still charged), out of its session's list.
  w.release(owner, g);
  CHECK(w.used(owner) == 8_MiB);
  // The views say why: of its 8 MiB granted, 8 MiB it freed are kept by the imports.
  CHECK(record(owner_tenant).granted[0] == 8 * kMiB);
  CHECK(record(owner_tenant).ipc_held[0] == 8 * kMiB);
  CHECK(record(importer_tenant).ipc_imported[0] == 8 * kMiB);
  CHECK(w.node->session(owner)->grants.empty());
  REQUIRE(w.node->grants().count(g) == 1);
  CHECK(w.node->rooms().ipc.released(g));
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
  CHECK(w.node->rooms().ipc.imports().empty());
  CHECK(w.node->counters().releases_exported == exported_before + 1);
  CHECK(record(importer_tenant).ipc_imported[0] == 0);
  CHECK(w.node->devices().front().granted == 0_MiB);
  // The token died with the grant.
  CHECK(ipc_open(w, closer, e.token, e.secret).reply.status == proto::Status::unknown_handle);
}

TEST_CASE("node: IPC imports and tokens do not survive a daemon restart", "[node][ipc][state]") {
  TestSegment test_segment("vlake-node-ipc-");
  st::StateSegment& seg = test_segment.seg;
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
  CHECK(w2.node->rooms().ipc.imports().empty());
  CHECK(w2.used(owner) == 4_MiB);  // the orphaned grant stays charged to its owner
  CHECK(ipc_open(w2, importer, e.token, e.secret).reply.status == proto::Status::unknown_handle);
  // An orphaned grant (its handles died with the previous daemon) cannot be exported again.
  CHECK(ipc_export(w2, owner, g).status == proto::Status::bad_request);
  w2.release(owner, g);
  CHECK(w2.used(owner) == 0_MiB);
}
