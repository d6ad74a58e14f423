// ReclaimTrust (pool/include/vlake/pool/features/reclaim/reclaim_trust.hpp): what a session sent
// Pressure gave back, and what a planner may count on from it next time.
#include <catch2/catch.hpp>

#include <chrono>

#include "unit_ids.hpp"
#include "vlake/pool/features/reclaim/reclaim_trust.hpp"
#include "vlake/pool/pressure_plan.hpp"

using namespace vlake;
using namespace vlake::literals;
using vlake::pool::ReclaimTrust;
using namespace std::chrono_literals;

using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

TEST_CASE("reclaim trust: a session asked that gives nothing by its deadline loses its turn for the skip",
          "[pool][reclaim]") {
  ReclaimTrust t(250ms, 60s);
  // Never asked: its claim is believed on a grant's first asks, not on the later ones.
  CHECK(t.askable(1, kT0));
  CHECK(t.credible(1, 512_MiB, true) == 512_MiB);
  CHECK(t.credible(1, 512_MiB, false) == 0_B);

  t.asked(1, kGpu0, kT0);
  t.asked(2, kGpu0, kT0 + 10ms);
  CHECK(t.open(1));
  CHECK(t.next_deadline() == kT0 + 250ms);
  // A second Pressure while the ask is open does not move its deadline.
  t.asked(1, kGpu0, kT0 + 200ms);
  CHECK(t.expire(kT0 + 249ms).empty());
  t.gave(2, kGpu0, 64_MiB, kT0 + 100ms);
  t.gave(2, kGpu1, 64_MiB, kT0 + 100ms);  // another GPU: not what it was asked for

  auto v = t.expire(kT0 + 250ms);
  REQUIRE(v.size() == 1);
  CHECK(v[0].session == 1);
  CHECK(v[0].skipped);
  CHECK(v[0].gave == 0_B);
  CHECK_FALSE(t.open(1));
  CHECK_FALSE(t.askable(1, kT0 + 250ms));
  CHECK_FALSE(t.askable(1, kT0 + 250ms + 59s));
  // Once the skip is over it may be asked, but nothing it claims is counted on.
  CHECK(t.askable(1, kT0 + 250ms + 60s));
  CHECK(t.credible(1, 512_MiB, true) == 0_B);

  v = t.expire(kT0 + 260ms);
  REQUIRE(v.size() == 1);
  CHECK(v[0].session == 2);
  CHECK_FALSE(v[0].skipped);
  CHECK(v[0].gave == 64_MiB);
  // It gave 64 MiB: counted on for at most that much, whatever it claims.
  CHECK(t.askable(2, kT0 + 260ms));
  CHECK(t.credible(2, 512_MiB, true) == 64_MiB);
  CHECK(t.credible(2, 512_MiB, false) == 64_MiB);
  CHECK(t.credible(2, 32_MiB, true) == 32_MiB);
  CHECK_FALSE(t.next_deadline().has_value());

  // Its next answer replaces the record.
  t.asked(2, kGpu0, kT0 + 1s);
  t.gave(2, kGpu0, 256_MiB, kT0 + 1s + 50ms);
  v = t.expire(kT0 + 2s);
  REQUIRE(v.size() == 1);
  CHECK(t.credible(2, 512_MiB, true) == 256_MiB);

  t.forget(2);
  CHECK(t.credible(2, 512_MiB, true) == 512_MiB);
}

TEST_CASE("reclaim trust: a session that gives back after its deadline is asked again at once", "[pool][reclaim]") {
  ReclaimTrust t(250ms, 60s);
  t.asked(7, kGpu0, kT0);
  REQUIRE(t.expire(kT0 + 300ms).size() == 1);
  CHECK_FALSE(t.askable(7, kT0 + 300ms));
  t.gave(7, kGpu0, 128_MiB, kT0 + 400ms);  // a slow framework
  CHECK(t.askable(7, kT0 + 400ms));
  CHECK(t.credible(7, 1_GiB, true) == 128_MiB);
  // Memory released by a session never asked changes nothing.
  t.gave(8, kGpu0, 128_MiB, kT0);
  CHECK(t.credible(8, 1_GiB, true) == 1_GiB);
}

TEST_CASE("pressure plan: a credible figure replaces the claim in the cover, not in who may be asked",
          "[pool][reclaim]") {
  using vlake::pool::plan_pressure;
  using vlake::pool::PressureCandidate;
  auto cand = [](std::uint64_t session, Bytes held, int idle_rank, std::optional<Bytes> credible) {
    PressureCandidate c;
    c.session = session;
    c.held = held;
    c.reclaim = true;
    c.last_active = kT0 + std::chrono::milliseconds(idle_rank);
    c.credible = credible;
    return c;
  };
  // Three liars (most idle) claim 1 GiB each; the honest one is the least idle.
  std::vector<PressureCandidate> s = {cand(1, 1_GiB, 1, std::nullopt), cand(2, 1_GiB, 2, std::nullopt),
                                      cand(3, 1_GiB, 3, std::nullopt), cand(4, 1_GiB, 4, std::nullopt)};
  CHECK(plan_pressure(s, 0, 1_GiB) == std::vector<std::size_t>{0});  // claims: the first covers it
  // Not counted on (a grant's later asks): everybody is asked at once.
  for (auto& c : s) c.credible = 0_B;
  CHECK(plan_pressure(s, 0, 1_GiB) == std::vector<std::size_t>{0, 1, 2, 3});
  // One that gave 1 GiB lately covers it after those counted for nothing before it.
  s[1].credible = 1_GiB;
  CHECK(plan_pressure(s, 0, 1_GiB) == std::vector<std::size_t>{0, 1});
  CHECK(vlake::pool::pressure_claim(s[0]) == 1_GiB);
}
