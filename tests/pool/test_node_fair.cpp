// vlake::pool::Node against colluding tenants, each within its own caps (docs/security.md,
// "Fair tables" and "Parked grants"): 9 uids importing their own IPC handles leave the import
// table room for an honest tenant; 8 uids parking grants for 10 minutes are held to the
// per-tenant parked cap, and a release only retries the parked grants it could serve.
#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

namespace {

proto::Status ipc_open(World& w, std::uint64_t session, const proto::IpcExportReply& e) {
  proto::IpcOpen m = proto::make<proto::IpcOpen>(12);
  m.token = e.token;
  m.secret = e.secret;
  auto out = w.node->ipc_open(session, m, w.t);
  REQUIRE(std::holds_alternative<Node::IpcOpened>(out));
  return std::get<Node::IpcOpened>(out).reply.status;
}

}  // namespace

TEST_CASE("node: 9 uids importing their own IPC handles leave an honest tenant its open", "[node][ipc][fair]") {
  World w("version: 1\ndefault: {limit: 100%}\n");  // 2048 grants and imports per tenant
  std::size_t imported = 0;
  std::size_t refused = 0;
  for (std::uint32_t u = 0; u < 9; ++u) {
    const auto s = w.hello(10 + u, 100 + u, 60001 + u);
    const auto e = ipc_export(w, s, w.granted(10 + u, s, 2 * kMiB));
    REQUIRE(e.status == proto::Status::ok);
    // Up to the tenant's cap (its grant and 2047 imports); 9 × 2047 would overflow the table.
    for (int i = 0; i < 2047; ++i) {
      const proto::Status st = ipc_open(w, s, e);
      if (st == proto::Status::ok) ++imported;
      else if (st == proto::Status::limit_reached) ++refused;
      else FAIL("unexpected status");
    }
  }
  CHECK(imported + refused == 9 * 2047);
  CHECK(imported < state::kMaxGrants);
  CHECK(w.node->rooms().ipc.imports().size() == imported);
  // The honest tenant opens its own handle.
  const auto h = w.hello(30, 300, 4200);
  const auto e = ipc_export(w, h, w.granted(30, h, 2 * kMiB));
  CHECK(ipc_open(w, h, e) == proto::Status::ok);
  CHECK(ipc_open(w, h, e) == proto::Status::ok);
}

TEST_CASE("node: 8 uids parking grants for 10 minutes: capped per tenant, releases retry only what they can serve",
          "[node][pressure][fair]") {
  World w("version: 1\ndefault: {limit: 100%, wait: 10m}\n");  // --max-parked-per-tenant 32
  const auto honest = w.hello(1, 100, 4200);
  w.take_outside(Bytes{1008 * kMiB});  // 16 MiB of the GPU left
  std::size_t parked = 0;
  std::size_t capped = 0;
  for (std::uint32_t u = 0; u < 8; ++u) {
    const auto s = w.hello(10 + u, 110 + u, 60001 + u);
    for (int i = 0; i < 120; ++i) {
      GrantOut out = w.grant(10 + u, s, 64 * kMiB);
      if (std::holds_alternative<Parked>(out)) {
        ++parked;
      } else {
        const auto* r = std::get_if<Refused>(&out);
        REQUIRE(r != nullptr);
        CHECK(r->reply.status == proto::Status::limit_reached);
        CHECK(r->reply.used == 32);
        CHECK(r->reply.limit == 32);
        ++capped;
      }
    }
  }
  CHECK(parked == 8 * 32);
  CHECK(capped == 8 * (120 - 32));
  CHECK(w.node->rooms().parking.size() == 8 * 32);
  // The honest tenant allocates and frees 2 MiB 200 times: each release retries the parked grants
  // that the GPU's free memory could serve (none of the 64 MiB ones), not all 256.
  const std::uint64_t before = w.node->rooms().parking.examined();
  for (int i = 0; i < 200; ++i) {
    w.release(honest, w.granted(1, honest, 2 * kMiB));
    if (w.node->retry_due(w.t)) CHECK(w.retry_parked(w.t).empty());
  }
  CHECK(w.node->rooms().parking.examined() - before == 0);
  CHECK(w.node->rooms().parking.size() == 8 * 32);
  // Once memory that serves some comes back, exactly those are served (smallest first).
  w.advance(std::chrono::milliseconds(1));
  sim_gpu().driver().release(w.outside);
  w.outside = PhysicalHandle{};
  w.take_outside(Bytes{(1008 - 128) * kMiB});  // 144 MiB free: two of the parked grants
  w.release(honest, w.granted(1, honest, 2 * kMiB));
  REQUIRE(w.node->retry_due(w.t));
  std::size_t served = 0;
  for (const Completion& c : w.retry_parked(w.t)) served += std::holds_alternative<Granted>(c.out) ? 1 : 0;
  CHECK(served == 2);
  CHECK(w.node->rooms().parking.examined() - before == 2);
  CHECK(w.node->rooms().parking.size() == 8 * 32 - 2);
}
