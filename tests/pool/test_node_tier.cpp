// vlake::pool: the host tier (features/tier/host_tier.hpp, node_tier.cpp; docs/swap.md "Host tier"):
// the room's decisions alone, then the Node demoting an idle overcommit session's grant for a
// parked one and promoting it back, with what it tells the process and what it charges.
#include "node_world.hpp"

#include "vlake/pool/host_builder.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

namespace {

const char* kTierYaml =
    "version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: nb, overcommit: true, users: [1001, 1002, 1003]}\n";

NodeSettings tier_settings(Bytes bound = Bytes{1 * kGiB}) {
  NodeSettings s;
  s.swap_idle = std::chrono::milliseconds(1000);
  s.swap_margin = Bytes{0};
  s.host_tier = bound;
  s.host_tier_piece = Bytes{256 * kMiB};
  return s;
}

void tier_active(World& w, std::uint64_t session) {
  proto::ReserveReport r = proto::make<proto::ReserveReport>(0);
  w.node->devices().front().uuid.copy_to(r.device_uuid);
  r.flags = proto::kReportActive;
  CHECK_FALSE(w.node->reserve_report(session, r).has_value());
}

// Makes the pieces the Node queued (as vlaked's HostBuilder would) and hands them back.
std::size_t tier_stock(World& w) {
  w.fx.append(w.node->settle(w.t));
  std::vector<Bytes> sizes = std::exchange(w.fx.host_builds, {});
  for (Bytes b : sizes) w.node->host_built(make_host_piece(sim_gpu().driver(), b, Bytes{2 * kMiB}));
  return sizes.size();
}

void tier_release(World& w) {
  w.fx.append(w.node->hand_over());
  for (HostPiece& p : std::exchange(w.fx.host_releases, {})) sim_gpu().driver().release(p.handle);
}

proto::TierStep tier_step(std::uint64_t move, std::uint64_t grant = 0, proto::TierResult r = proto::TierResult::none,
                          std::uint32_t first = 0) {
  proto::TierStep m = proto::make<proto::TierStep>(21);
  m.move_id = move;
  m.grant_id = grant;
  m.result = r;
  m.first_piece = first;
  return m;
}

TierOut tier_plan(World& w, std::uint64_t session, const proto::TierStep& m) {
  auto out = w.node->tier_step(session, m, w.t);
  REQUIRE(std::holds_alternative<TierOut>(out));
  return std::get<TierOut>(std::move(out));
}

// Sessions A (idle, `a_bytes` granted) and B on a GPU with `spare` bytes left free; B asks for
// `a_bytes` and parks; the notices that follow (A told to move).
struct Demoting {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  std::uint64_t ga = 0;
  std::vector<TierNoticeOut> notes;
};
Demoting tier_demoting(World& w, std::uint64_t a_bytes, std::uint64_t spare) {
  Demoting d;
  d.a = w.hello(1, 101, 1001, true);
  d.b = w.hello(2, 102, 1002, true);
  (void)tier_stock(w);
  d.ga = w.granted(1, d.a, a_bytes);
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{spare});
  w.advance(std::chrono::milliseconds(2000));
  REQUIRE(std::holds_alternative<Parked>(w.grant(2, d.b, a_bytes)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.retry_parked(w.t);
  d.notes = w.take(&Effects::tier_notices);
  return d;
}

}  // namespace

TEST_CASE("host tier: a grant is cut into whole pieces and distinct smaller powers", "[tier]") {
  HostTier t(Bytes{4 * kGiB}, Bytes{300 * kMiB}, Bytes{2 * kMiB});
  CHECK(t.piece() == 256_MiB);  // a power of two of the granularity
  const std::vector<Bytes> p = t.pieces_for(Bytes{(2 * 256 + 128 + 6) * kMiB});
  CHECK(p == std::vector<Bytes>{256_MiB, 256_MiB, 128_MiB, 4_MiB, 2_MiB});
  CHECK(t.pieces_for(Bytes{1 * kMiB}) == std::vector<Bytes>{2_MiB});  // rounded up to the granularity
}

TEST_CASE("host tier: the stock is made ahead up to the bound, never past it", "[tier]") {
  const auto now = std::chrono::steady_clock::time_point(std::chrono::hours(1));
  HostTier t(Bytes{1 * kGiB}, Bytes{256 * kMiB}, Bytes{64 * kMiB});
  std::vector<Bytes> want = t.to_build(now);
  // Two of each smaller size (128, 64 MiB: 384 MiB), then whole pieces while they fit (2 x 256).
  CHECK(want == std::vector<Bytes>{128_MiB, 128_MiB, 64_MiB, 64_MiB, 256_MiB, 256_MiB});
  CHECK(t.to_build(now).empty());  // being built counts
  CHECK(t.building_bytes() == 896_MiB);
  t.build_failed(Bytes{256 * kMiB}, now);
  CHECK(t.to_build(now).empty());                                                 // paused after a failure
  CHECK(t.to_build(now + HostTier::kBuildPause) == std::vector<Bytes>{256_MiB});  // then tried again
  CHECK_FALSE(t.fits(Bytes{256 * kMiB}));
  CHECK_FALSE(t.take(Bytes{128 * kMiB}).has_value());  // nothing made yet
  HostTier off(Bytes{0}, Bytes{256 * kMiB}, Bytes{2 * kMiB});
  CHECK_FALSE(off.enabled());
  CHECK(off.to_build(now).empty());
}

TEST_CASE("host tier: a stock of whole pieces gives way to a smaller piece the grant needs", "[tier]") {
  const auto now = std::chrono::steady_clock::time_point(std::chrono::hours(1));
  HostTier t(Bytes{896 * kMiB}, Bytes{256 * kMiB}, Bytes{64 * kMiB});
  std::uint64_t next = 1;
  for (Bytes b : t.to_build(now)) t.built(HostPiece{PhysicalHandle{next++}, UniqueFd{}, b});
  CHECK(t.stock_bytes() == 896_MiB);  // 2 x 128, 2 x 64, 2 x 256 MiB: the bound
  // Both 64 MiB pieces go to grants; a third grant of 64 MiB finds none and no room: the largest
  // unused piece is released for it (to be made on the spot), and only as much as it needs.
  CHECK(t.take(Bytes{64 * kMiB}).has_value());
  CHECK(t.take(Bytes{64 * kMiB}).has_value());
  CHECK_FALSE(t.take(Bytes{64 * kMiB}).has_value());
  CHECK_FALSE(t.fits(Bytes{64 * kMiB}));
  CHECK(t.make_room(Bytes{64 * kMiB}));
  std::vector<HostPiece> out = t.take_released();
  REQUIRE(out.size() == 1);
  CHECK(out[0].size == 256_MiB);
  CHECK(t.stock_bytes() == 512_MiB);
  t.note_made(Bytes{64 * kMiB});
  CHECK(t.used_bytes() == 192_MiB);
  CHECK(t.make_room(Bytes{64 * kMiB}));  // it fits already: nothing released
  CHECK(t.take_released().empty());
  // Held by grants, the bound leaves no room however much stock goes.
  HostTier full(Bytes{128 * kMiB}, Bytes{128 * kMiB}, Bytes{64 * kMiB});
  full.note_made(Bytes{128 * kMiB});
  CHECK_FALSE(full.make_room(Bytes{64 * kMiB}));
}

TEST_CASE("node: host tier: an idle process's grant moves to host memory for a parked grant and comes back",
          "[node][tier]") {
  REQUIRE(sim_gpu().driver().host_memory_supported(DeviceOrdinal{0}));
  World w(kTierYaml, tier_settings());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  CHECK(tier_stock(w) > 0);
  // Two of each size below the piece (2 x 254 MiB), then whole pieces while they fit (2 x 256).
  CHECK(w.node->rooms().tier.stock_bytes() == 1020_MiB);
  const std::uint64_t ga = w.granted(1, a, 384 * kMiB);
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{128 * kMiB});
  w.advance(std::chrono::milliseconds(2000));  // A idle
  tier_active(w, b);

  // B's 384 MiB do not fit: parked; at the first retry A is told to move (no checkpoint).
  REQUIRE(std::holds_alternative<Parked>(w.grant(2, b, 384 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  CHECK(w.retry_parked(w.t).empty());
  CHECK(w.take(&Effects::swap_notices).empty());
  std::vector<TierNoticeOut> notes = w.take(&Effects::tier_notices);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 1);
  CHECK(notes[0].msg.direction == proto::TierDirection::to_host);
  const std::uint64_t move = notes[0].msg.move_id;
  CHECK(w.node->rooms().tier.demoting(DeviceOrdinal{0}) == 384_MiB);

  // A stops and asks: grant A on two pieces of the stock (256 + 128 MiB), a descriptor each.
  TierOut p = tier_plan(w, a, tier_step(move));
  CHECK(p.reply.status == proto::Status::ok);
  CHECK(p.reply.grant_id == ga);
  CHECK(p.reply.bytes == 384 * kMiB);
  REQUIRE(p.reply.piece_count == 2);
  CHECK(p.reply.total_pieces == 2);
  CHECK(p.reply.pieces[0].size == 256 * kMiB);
  CHECK(p.reply.pieces[1].offset == 256 * kMiB);
  CHECK(p.fds.size() == 2);
  CHECK(w.node->counters().tier_made_on_demand == 0);
  // A step for another grant is malformed.
  CHECK(std::holds_alternative<Malformed>(
      w.node->tier_step(a, tier_step(move, ga + 100, proto::TierResult::moved), w.t)));
  // Moved: the move is over; A's memory is on the host, still charged to A; B is served.
  p = tier_plan(w, a, tier_step(move, ga, proto::TierResult::moved));
  CHECK(p.reply.status == proto::Status::ok);
  CHECK(p.reply.grant_id == 0);
  CHECK(w.node->rooms().tier.moves().empty());
  CHECK(w.node->rooms().tier.session_bytes(a) == 384_MiB);
  CHECK(w.node->grants().at(ga).handles.empty());
  CHECK(w.used(a) == 384_MiB);
  CHECK(w.node->counters().tier_demotes == 1);
  w.retry_grants_one(2);
  const std::uint64_t gb = w.node->session(b)->grants.back();

  // While a grant waits on the GPU nothing comes back; once B frees, A's grant is promoted.
  w.fx.append(w.node->settle(w.t));
  CHECK(std::exchange(w.fx.tier_notices, {}).empty());
  w.release(b, gb);
  w.fx.append(w.node->settle(w.t));
  notes = std::exchange(w.fx.tier_notices, {});
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].msg.direction == proto::TierDirection::to_device);
  p = tier_plan(w, a, tier_step(notes[0].msg.move_id));
  CHECK(p.reply.grant_id == ga);
  CHECK(p.reply.direction == proto::TierDirection::to_device);
  CHECK(p.reply.bytes == 384 * kMiB);
  CHECK(p.fds.size() == p.reply.piece_count);
  p = tier_plan(w, a, tier_step(notes[0].msg.move_id, ga, proto::TierResult::moved));
  CHECK(p.reply.grant_id == 0);
  CHECK(w.node->rooms().tier.session_bytes(a) == 0_MiB);
  CHECK_FALSE(w.node->grants().at(ga).handles.empty());
  CHECK(w.node->counters().tier_promotes == 1);
  CHECK(w.used(a) == 384_MiB);
  // The host pieces go back to the driver (off the loop in vlaked); the stock is made again.
  w.fx.append(w.node->settle(w.t));
  CHECK(w.fx.host_releases.size() == 2);
  tier_release(w);
  CHECK(w.node->rooms().tier.used_bytes() == 0_MiB);
}

TEST_CASE("node: host tier: a busy process is left alone, a process that ends mid-move loses nothing of others",
          "[node][tier]") {
  World w(kTierYaml, tier_settings());
  Demoting d = tier_demoting(w, 256 * kMiB, 64 * kMiB);
  const std::uint64_t a = d.a;
  const std::uint64_t ga = d.ga;
  std::vector<TierNoticeOut> notes = std::move(d.notes);
  REQUIRE(notes.size() == 1);
  // Busy: nothing moves and A is not asked again for a minute.
  TierOut p = tier_plan(w, a, tier_step(notes[0].msg.move_id, 0, proto::TierResult::busy));
  CHECK(p.reply.grant_id == 0);
  CHECK(w.node->counters().tier_busy == 1);
  w.advance(std::chrono::milliseconds(400));
  (void)w.retry_parked(w.t);
  CHECK(w.take(&Effects::tier_notices).empty());
  w.advance(std::chrono::milliseconds(60000));
  (void)w.retry_parked(w.t);
  notes = w.take(&Effects::tier_notices);
  REQUIRE(notes.size() == 1);
  p = tier_plan(w, a, tier_step(notes[0].msg.move_id));
  REQUIRE(p.reply.grant_id == ga);
  const Bytes stock_before = w.node->rooms().tier.stock_bytes();
  // A dies with the pieces in hand: they are released, its grant returns to the pool, B is served.
  (void)w.node->end_session(a, "test");
  CHECK(w.node->rooms().tier.moves().empty());
  CHECK(w.node->rooms().tier.grants().empty());
  tier_release(w);
  CHECK(w.node->rooms().tier.used_bytes() == 0_MiB);
  CHECK(w.node->rooms().tier.stock_bytes() == stock_before);
  w.retry_grants_one(2);
}

TEST_CASE("node: host tier: a step that nobody takes ends the move, grants on the host are released with their session",
          "[node][tier]") {
  World w(kTierYaml, tier_settings());
  Demoting d = tier_demoting(w, 128 * kMiB, 32 * kMiB);
  const std::uint64_t a = d.a;
  const std::uint64_t ga = d.ga;
  std::vector<TierNoticeOut> notes = std::move(d.notes);
  REQUIRE(notes.size() == 1);
  // Nobody answers within kReadyTimeout: the move is over.
  w.advance(HostTier::kReadyTimeout + std::chrono::milliseconds(1));
  w.fx.append(w.node->settle(w.t));
  CHECK(w.node->rooms().tier.moves().empty());
  // A stale step is answered unknown_grant (the hook then opens its gate).
  TierOut p = tier_plan(w, a, tier_step(notes[0].msg.move_id));
  CHECK(p.reply.status == proto::Status::unknown_grant);
  // Released while on the host: uncharged, pieces released.
  w.advance(std::chrono::milliseconds(60000));
  (void)w.retry_parked(w.t);
  notes = w.take(&Effects::tier_notices);
  REQUIRE(notes.size() == 1);
  p = tier_plan(w, a, tier_step(notes[0].msg.move_id));
  REQUIRE(p.reply.grant_id == ga);
  (void)tier_plan(w, a, tier_step(notes[0].msg.move_id, ga, proto::TierResult::moved));
  CHECK(w.node->rooms().tier.session_bytes(a) == 128_MiB);
  w.release(a, ga);
  CHECK(w.used(a) == 0_MiB);
  CHECK(w.node->rooms().tier.grants().empty());
  tier_release(w);
  CHECK(w.node->rooms().tier.used_bytes() == 0_MiB);
}

TEST_CASE("node: host tier: a process waiting for memory itself is moved while it waits", "[node][tier]") {
  World w(kTierYaml, tier_settings());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  (void)tier_stock(w);
  const std::uint64_t ga = w.granted(1, a, 256 * kMiB);
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  // A asks for more than the GPU has and waits. Its waiting thread is outside its hook's gate
  // (protocol version 6) and it made no call for a second: B's grant moves A's memory out.
  REQUIRE(std::holds_alternative<Parked>(w.grant(1, a, 512 * kMiB)));
  w.advance(std::chrono::milliseconds(1500));
  REQUIRE(std::holds_alternative<Parked>(w.grant(2, b, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.retry_parked(w.t);
  std::vector<TierNoticeOut> notes = w.take(&Effects::tier_notices);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].session == a);
  const std::uint64_t move = notes[0].msg.move_id;
  TierOut p = tier_plan(w, a, tier_step(move));
  CHECK(p.reply.grant_id == ga);
  p = tier_plan(w, a, tier_step(move, ga, proto::TierResult::moved));
  CHECK(p.reply.grant_id == 0);
  CHECK(w.node->rooms().tier.session_bytes(a) == 256_MiB);
  // B is served from what A's grant gave back; A still waits (its 512 MiB do not fit yet).
  w.retry_grants_one(2);
  CHECK(w.node->session(b)->grants.size() == 1);
  REQUIRE(w.node->rooms().parking.grants().size() == 1);
  CHECK(w.node->rooms().parking.grants().front().session == a);
  CHECK(w.used(a) == 256_MiB);
}

TEST_CASE("node: a grant that must not wait is refused at once and moves nobody", "[node][tier]") {
  World w(kTierYaml, tier_settings());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  (void)tier_stock(w);
  (void)w.granted(1, a, 256 * kMiB);
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  w.advance(std::chrono::milliseconds(2000));  // A idle
  proto::GrantRequest m = w.request(256 * kMiB);
  m.flags = proto::kGrantNoWait;
  GrantOut out = w.node->grant(2, b, m, w.t);
  REQUIRE(std::holds_alternative<Refused>(out));
  CHECK(std::get<Refused>(out).reply.status == proto::Status::out_of_memory);
  CHECK(w.node->rooms().parking.grants().empty());
  w.fx.append(w.node->settle(w.t));
  CHECK(w.fx.tier_notices.empty());
  CHECK(w.fx.completions.empty());
  // The same request allowed to wait parks and moves A out.
  m.flags = 0;
  CHECK(std::holds_alternative<Parked>(w.node->grant(2, b, m, w.t)));
  w.fx.append(w.node->settle(w.t));
  CHECK(w.fx.tier_notices.size() == 1);
}

TEST_CASE("node: host tier: a grant nobody used is released by the move, and the parked grant is served",
          "[node][tier]") {
  World w(kTierYaml, tier_settings());
  Demoting d = tier_demoting(w, 256 * kMiB, 64 * kMiB);
  REQUIRE(d.notes.size() == 1);
  const std::uint64_t move = d.notes[0].msg.move_id;
  TierOut p = tier_plan(w, d.a, tier_step(move));
  REQUIRE(p.reply.grant_id == d.ga);
  // A's hook found the grant in its local reserve: unmapped and released instead of moved.
  p = tier_plan(w, d.a, tier_step(move, d.ga, proto::TierResult::released));
  CHECK(p.reply.grant_id == 0);
  CHECK(w.node->rooms().tier.moves().empty());
  CHECK_FALSE(w.node->session(d.a)->holds(d.ga));
  CHECK(w.node->grants().count(d.ga) == 0);
  CHECK(w.node->rooms().tier.session_bytes(d.a) == 0_MiB);
  CHECK(w.node->counters().tier_demotes == 0);
  w.retry_grants_one(2);
  CHECK(w.node->session(d.b)->grants.size() == 1);
}
