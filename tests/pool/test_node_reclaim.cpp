// Claims and measurements through the Node (docs/pool.md, "Pressure protocol"): sessions that
// say they can give memory back and give nothing lose their turn, and a grant still short after
// its first asks asks every other session at once (ReclaimTrust, reclaim_trust.hpp).
#include <set>

#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

namespace {

// Says the session has a reclaim callback (and no reserve) on GPU 0.
void report_reclaim(World& w, std::uint64_t session) {
  proto::ReserveReport report = proto::make<proto::ReserveReport>(0);
  w.node->devices().front().uuid.copy_to(report.device_uuid);
  report.flags = proto::kReportReclaim;
  REQUIRE_FALSE(w.node->reserve_report(session, report).has_value());
}

std::set<ConnId> conns_of(const std::vector<PressureNote>& notes) {
  std::set<ConnId> out;
  for (const PressureNote& n : notes) out.insert(n.conn);
  return out;
}

}  // namespace

TEST_CASE("node: reclaim: 16 lying sessions of 8 uids lose their turn, the honest one is asked at the first re-ask",
          "[node][pressure][reclaim]") {
  NodeSettings settings;
  settings.pressure_wait = std::chrono::milliseconds(30000);
  settings.reclaim_deadline = std::chrono::milliseconds(250);
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  // 16 liars, two per uid 60001..60008, each holding 32 MiB and saying a framework gives it back.
  std::vector<std::uint64_t> liars;
  for (int i = 0; i < 16; ++i) {
    const auto conn = static_cast<ConnId>(100 + i);
    const auto s = w.hello(conn, static_cast<std::uint32_t>(1000 + i), static_cast<std::uint32_t>(60001 + i / 2), true);
    w.granted(conn, s, 32 * kMiB);
    report_reclaim(w, s);
    liars.push_back(s);
    w.advance(std::chrono::milliseconds(1));
  }
  // The honest session (the least idle) holds 256 MiB of cache.
  const ConnId honest_conn = 7;
  const auto honest = w.hello(honest_conn, 2000, 60009, true);
  const std::uint64_t cache = w.granted(honest_conn, honest, 256 * kMiB);
  report_reclaim(w, honest);
  const auto req = w.hello(9, 3000, 60010, true);
  w.take_outside(Bytes{(1024 - 512 - 256) * kMiB});  // the rest of the GPU

  // 128 MiB: parked; the first asks believe the claims (the four most idle liars cover it).
  const auto start = w.t.steady;
  GrantOut out = w.grant(9, req, 128 * kMiB);
  const auto* parked = std::get_if<Parked>(&out);
  REQUIRE(parked != nullptr);
  CHECK(parked->pressure.size() == 4);
  CHECK(conns_of(parked->pressure).count(honest_conn) == 0);

  // They give nothing within the deadline: every other session is asked at once, the honest one too.
  w.advance(settings.reclaim_deadline);
  std::vector<Completion> done = w.retry_due_parked();
  REQUIRE(done.size() == 1);
  parked = std::get_if<Parked>(&done[0].out);
  REQUIRE(parked != nullptr);
  CHECK(conns_of(parked->pressure).count(honest_conn) == 1);
  CHECK(parked->pressure.size() == 13);  // the 12 other liars and the honest one
  // The four that gave nothing lost their turn.
  for (int i = 0; i < 4; ++i)
    CHECK_FALSE(w.node->rooms().reclaim.askable(liars[static_cast<std::size_t>(i)], w.t.steady));

  // The honest framework empties its cache: the grant is served within two deadlines.
  w.advance(std::chrono::milliseconds(20));
  w.release(honest, cache);
  done = w.retry_due_parked();
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  CHECK(w.t.steady - start <= 2 * settings.reclaim_deadline);

  // The next time memory is short, no liar is asked: only the honest one, which gave.
  w.advance(settings.reclaim_deadline);
  (void)w.node->settle(w.t);
  for (const auto s : liars) CHECK_FALSE(w.node->rooms().reclaim.askable(s, w.t.steady));
  CHECK(w.node->rooms().reclaim.credible(honest, 1_GiB, true) == 256_MiB);
  const std::uint64_t cache2 = w.granted(honest_conn, honest, 128 * kMiB);
  out = w.grant(9, req, 128 * kMiB);
  parked = std::get_if<Parked>(&out);
  REQUIRE(parked != nullptr);
  REQUIRE(parked->pressure.size() == 1);
  CHECK(parked->pressure[0].conn == honest_conn);
  w.release(honest, cache2);
  done = w.retry_due_parked();
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));
}
