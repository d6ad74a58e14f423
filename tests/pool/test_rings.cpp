// Rings per tenant (docs/security.md, "Rings per tenant"): FairRing's choice of the slot a new
// entry takes, without a Node; then the Node's guard event ring and refusal ring under a flood
// (node_world.hpp: the simulated GPU in this process, time as a value).
#include <catch2/catch.hpp>

#include <cstdint>
#include <set>
#include <vector>

#include "node_world.hpp"
#include "vlake/pool/features/rings/fair_ring.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::nodetest;
namespace st = vlake::state;

namespace {

std::string name(std::uint32_t tenant) { return "t" + std::to_string(tenant); }

// The seqs `tenant` holds in `r`'s slots as a test copy keeps them.
struct Model {
  explicit Model(std::uint32_t cap) : ring(cap), slots(cap) {}
  FairRing ring;
  std::vector<FairRing::Entry> slots;
  std::uint64_t next = 1;

  FairRing::Placement add(std::uint32_t tenant) { return add_as(name(tenant)); }
  FairRing::Placement add_as(const std::string& tenant) {
    const std::uint64_t seq = next++;
    const FairRing::Placement p = ring.place(tenant, seq);
    REQUIRE(p.slot < slots.size());
    if (p.evicted) {
      CHECK(p.evicted->seq == slots[p.slot].seq);
      CHECK(p.evicted->tenant == slots[p.slot].tenant);
    } else {
      CHECK(slots[p.slot].seq == 0);
    }
    slots[p.slot] = FairRing::Entry{seq, tenant};
    return p;
  }
  std::set<std::uint64_t> seqs_of(std::uint32_t tenant) const {
    std::set<std::uint64_t> out;
    for (const auto& e : slots) {
      if (e.seq != 0 && e.tenant == name(tenant)) out.insert(e.seq);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("fair ring: free slots first, then one tenant alone is a plain FIFO", "[pool][rings]") {
  Model m(4);
  for (std::uint32_t i = 0; i < 4; ++i) {
    const auto p = m.add(1);
    CHECK(p.slot == i);
    CHECK_FALSE(p.evicted.has_value());
  }
  CHECK(m.ring.size() == 4);
  const auto p = m.add(1);
  REQUIRE(p.evicted.has_value());
  CHECK(p.evicted->seq == 1);  // the oldest
  CHECK(m.add(1).evicted->seq == 2);
  CHECK(m.seqs_of(1) == std::set<std::uint64_t>{3, 4, 5, 6});
  CHECK(m.ring.evicted(name(1)) == 2);
  CHECK(m.ring.held(name(1)) == 4);
}

TEST_CASE("fair ring: a flooder never pushes out another tenant's entry", "[pool][rings]") {
  Model m(256);
  m.add(7);  // the victim's one event, the oldest in the ring
  for (int i = 0; i < 100'000; ++i) {
    const auto p = m.add(9);
    if (p.evicted) CHECK(p.evicted->tenant == name(9));
  }
  CHECK(m.seqs_of(7) == std::set<std::uint64_t>{1});
  CHECK(m.ring.held(name(9)) == 255);
  CHECK(m.ring.evicted(name(7)) == 0);
  CHECK(m.ring.evicted(name(9)) == 100'000 - 255);
  // The victim's next entry pushes out the flooder's oldest, not its own.
  const auto p = m.add(7);
  REQUIRE(p.evicted.has_value());
  CHECK(p.evicted->tenant == name(9));
  CHECK(m.seqs_of(7).size() == 2);
}

TEST_CASE("fair ring: 8 colluding flooders share the ring, the victim keeps its entries", "[pool][rings]") {
  Model m(256);
  for (int i = 0; i < 5; ++i) m.add(100);  // the victim: 5 entries
  for (int round = 0; round < 2000; ++round) {
    for (std::uint32_t t = 1; t <= 8; ++t) m.add(t);
  }
  CHECK(m.seqs_of(100) == std::set<std::uint64_t>{1, 2, 3, 4, 5});
  CHECK(m.ring.evicted(name(100)) == 0);
  // The rest is shared evenly: (256 - 5) / 8 = 31.4, so 31 or 32 each, their newest.
  for (std::uint32_t t = 1; t <= 8; ++t) {
    const auto mine = m.seqs_of(t);
    CHECK(mine.size() >= 31);
    CHECK(mine.size() <= 32);
    CHECK(*mine.rbegin() >= m.next - 8);  // its newest is kept
  }
}

TEST_CASE("fair ring: a tenant holding most entries loses its oldest, ties go to the oldest entry", "[pool][rings]") {
  Model m(6);
  m.add(1);  // seq 1
  m.add(2);  // 2
  m.add(1);  // 3
  m.add(2);  // 4
  m.add(3);  // 5
  m.add(3);  // 6: 1, 2, 3 hold 2 each
  // Tenant 4's first entry: a three-way tie at 2; the oldest entry among them is tenant 1's seq 1.
  auto p = m.add(4);
  REQUIRE(p.evicted.has_value());
  CHECK(p.evicted->seq == 1);
  CHECK(p.evicted->tenant == name(1));
  // Tenant 1 (now 1 entry, 2 with the new one) ties with 2 and 3: the oldest is tenant 2's seq 2.
  p = m.add(1);
  CHECK(p.evicted->seq == 2);
  // Tenant 3 counted with its new entry holds 3, the most: its own oldest (seq 5) goes.
  p = m.add(3);
  CHECK(p.evicted->seq == 5);
  CHECK(p.evicted->tenant == name(3));
  // No tenant known ("") is a tenant of its own.
  p = m.add_as("");
  REQUIRE(p.evicted.has_value());
  CHECK(p.evicted->tenant != "");
}

TEST_CASE("fair ring: assign resumes a published ring, forget drops the eviction count", "[pool][rings]") {
  Model m(8);
  for (int i = 0; i < 3; ++i) m.add(5);
  for (int i = 0; i < 20; ++i) m.add(6);
  FairRing next(8);
  next.assign(m.slots);
  CHECK(next.size() == 8);
  CHECK(next.held(name(5)) == 3);
  CHECK(next.held(name(6)) == 5);
  const auto p = next.place(name(6), m.next);
  REQUIRE(p.evicted.has_value());
  CHECK(p.evicted->tenant == name(6));
  CHECK(next.evicted(name(6)) == 1);
  next.forget(name(6));
  CHECK(next.evicted(name(6)) == 0);
  CHECK(next.held(name(6)) == 5);  // its entries stay
  // A partly filled ring: free slots are taken first.
  FairRing part(8);
  part.assign({FairRing::Entry{3, name(1)}, FairRing::Entry{}, FairRing::Entry{4, name(2)}});
  CHECK(part.size() == 2);
  const auto q = part.place(name(1), 5);
  CHECK(q.slot == 1);
  CHECK_FALSE(q.evicted.has_value());
  CHECK_THROWS_AS(part.assign(std::vector<FairRing::Entry>(9)), std::invalid_argument);
  FairRing none(0);
  CHECK_THROWS_AS(none.place(name(1), 1), std::invalid_argument);
}

namespace {

// The kept events of `tenant`, oldest first.
template <typename Log>
std::vector<std::uint64_t> kept_of(const Log& log, std::uint32_t tenant) {
  std::vector<std::uint64_t> out;
  for (const auto* r : st::ring_order(log)) {
    if (r->tenant == tenant) out.push_back(r->seq);
  }
  return out;
}

}  // namespace

TEST_CASE("rings: valid guard events of flooders for 60 s do not push out a victim's kernel fault",
          "[node][rings][guard]") {
  NodeSettings settings;
  settings.guard_event_rate = 10;  // the default rate and burst
  settings.guard_event_burst = 20;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  const auto victim = w.hello(1, 100, 1000);
  w.granted(1, victim, 2 * kMiB);
  // The victim's one real fault, first in the ring.
  CHECK_FALSE(w.node->guard_event(victim, fault_event(w, 8192), w.t).has_value());
  const std::uint32_t vt = w.node->session(victim)->tenant.value();
  REQUIRE(kept_of(w.node->rooms().guard.log(), vt).size() == 1);
  const std::uint64_t victim_seq = kept_of(w.node->rooms().guard.log(), vt).front();

  // One flooder, then 8 colluding uids: each sends events naming its own grant as fast as its
  // rate allows (10 per second), for 60 simulated seconds.
  const std::uint32_t flooders = GENERATE(1u, 8u);
  std::vector<std::uint64_t> sessions;
  for (std::uint32_t i = 0; i < flooders; ++i) {
    sessions.push_back(w.hello(10 + i, 200 + i, 60001 + i));
    w.granted(10 + i, sessions.back(), 2 * kMiB);
  }
  for (int step = 0; step < 600; ++step) {
    w.advance(std::chrono::milliseconds(100));
    for (std::uint64_t s : sessions) {
      for (int k = 0; k < 3; ++k) CHECK_FALSE(w.node->guard_event(s, fault_event(w), w.t).has_value());
    }
  }
  const st::GuardLog& g = w.node->rooms().guard.log();
  INFO(flooders << " flooder(s), " << g.next_seq - 1 << " events recorded");
  REQUIRE(g.next_seq - 1 > 2 * st::kGuardEvents);  // the ring was filled more than twice over
  CHECK(g.evicted == g.next_seq - 1 - st::kGuardEvents);
  // The victim's fault is still there, with what it said.
  const auto mine = kept_of(g, vt);
  REQUIRE(mine == std::vector<std::uint64_t>{victim_seq});
  for (const st::GuardEventRecord* e : st::ring_order(g)) {
    if (e->seq != victim_seq) continue;
    CHECK(e->requested_bytes == 8192);
    CHECK(std::string(e->tenant_name) == "uid:1000");
  }
  CHECK(w.node->rooms().guard.guard_events_evicted("uid:1000") == 0);
  // The flooders share the rest, each keeping its newest events; only theirs were pushed out.
  std::uint64_t flooders_evicted = 0;
  for (std::uint64_t s : sessions) {
    const TenantId t = w.node->session(s)->tenant;
    const auto theirs = kept_of(g, t.value());
    CHECK(theirs.size() >= (st::kGuardEvents - 1) / flooders);
    CHECK(theirs.size() <= (st::kGuardEvents - 1) / flooders + 1);
    flooders_evicted += w.node->rooms().guard.guard_events_evicted(w.tenant_of(s));
  }
  CHECK(flooders_evicted == g.evicted);
  // The victim's next fault pushes out a flooder's event, not its own first one.
  CHECK_FALSE(w.node->guard_event(victim, fault_event(w, 8192), w.t).has_value());
  CHECK(kept_of(w.node->rooms().guard.log(), vt).size() == 2);
}

TEST_CASE("rings: a tenant's thousands of refusals do not push out another tenant's refusal", "[node][rings]") {
  World w("version: 1\ndefault: {limit: 64MiB}\n");
  const auto victim = w.hello(1, 100, 1000);
  CHECK(w.refused(1, victim, 128 * kMiB) == proto::Status::over_limit);
  const std::uint32_t vt = w.node->session(victim)->tenant.value();
  REQUIRE(kept_of(w.node->rooms().refusals.log(), vt).size() == 1);
  const std::uint64_t before = w.node->counters().log_suppressed;
  // 8 colluding uids, 4,000 refusals at 4,000 per second.
  std::vector<std::uint64_t> sessions;
  for (std::uint32_t i = 0; i < 8; ++i) sessions.push_back(w.hello(10 + i, 200 + i, 60001 + i));
  for (int step = 0; step < 500; ++step) {
    w.advance(std::chrono::milliseconds(2));
    for (std::uint32_t i = 0; i < 8; ++i)
      CHECK(w.refused(10 + i, sessions[i], 128 * kMiB) == proto::Status::over_limit);
  }
  const st::RefusalLog& r = w.node->rooms().refusals.log();
  CHECK(r.next_seq == 4002);
  CHECK(r.evicted == 4001 - st::kRefusalEvents);
  CHECK(kept_of(r, vt).size() == 1);
  CHECK(w.node->rooms().refusals.evicted("uid:1000") == 0);
  for (std::uint32_t i = 0; i < 8; ++i) {
    CHECK(kept_of(r, w.node->session(sessions[i])->tenant.value()).size() >= (st::kRefusalEvents - 1) / 8);
  }
  // Their log lines are rate-limited per tenant: most of theirs were suppressed ...
  CHECK(w.node->counters().log_suppressed - before > 3000);
  // ... and the victim's next refusal is both kept and logged.
  const std::uint64_t suppressed = w.node->counters().log_suppressed;
  CHECK(w.refused(1, victim, 128 * kMiB) == proto::Status::over_limit);
  CHECK(w.node->counters().log_suppressed == suppressed);
  CHECK(kept_of(w.node->rooms().refusals.log(), vt).size() == 2);
}

TEST_CASE("rings: refusal log lines of a full session table are rate-limited per tenant", "[node][rings][limits]") {
  NodeSettings settings;
  settings.max_sessions_per_tenant = st::kMaxSessions;
  World w("version: 1\ndefault: {limit: 100%}\n", settings);
  // Filled as fair shares allow (fair_share.hpp): 4 uids × 128 take the first half, 8 uids × 64
  // (their share of the last half) the rest.
  for (std::uint32_t i = 0; i < st::kMaxSessions; ++i)
    w.hello(i + 1, 1000 + i, i < 512 ? 1000 + i / 128 : 1004 + (i - 512) / 64);
  // One uid's refused Hellos: its burst is logged, the rest suppressed.
  const std::uint64_t before = w.node->counters().log_suppressed;  // the sessions' own lines
  for (std::uint32_t i = 0; i < 200; ++i) (void)refused_hello(w, 5000 + i, 5000 + i, 60001);
  const std::uint64_t suppressed = w.node->counters().log_suppressed;
  CHECK(suppressed - before >= 180);
  // Another uid's refusal is logged all the same.
  const Fatal f = refused_hello(w, 9000, 9000, 60002);
  CHECK(f.text == "session table full: 1024 of 1024 sessions in use");
  CHECK(w.node->counters().log_suppressed == suppressed);
  // Both are kept in the refusal ring.
  std::set<std::string> names;
  for (const st::RefusalRecord* r : st::ring_order(w.node->rooms().refusals.log())) names.insert(r->tenant_name);
  CHECK(names.count("uid:60002") == 1);
}
