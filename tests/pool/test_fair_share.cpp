// Admission to a bounded table shared by tenants (pool/include/vlake/pool/fair_share.hpp):
// first come in the shared part, fair shares in the reserve, and what colluding owners, each at
// its own cap, leave to an owner that holds little.
#include <catch2/catch.hpp>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "vlake/pool/fair_share.hpp"

using namespace vlake::pool;
using Verdict = FairShare::Verdict;

namespace {

// Owners taking entries one at a time under the rule, each up to `cap`; `interleaved`: in turn,
// else each owner all it can before the next. Returns what each holds.
std::vector<std::size_t> fill(const FairShare& f, std::size_t owners, std::size_t cap, bool interleaved,
                              std::vector<std::size_t> held = {}) {
  held.resize(owners, 0);
  auto used = [&] {
    std::size_t n = 0;
    for (std::size_t h : held) n += h;
    return n;
  };
  auto holders = [&] {
    return static_cast<std::size_t>(std::count_if(held.begin(), held.end(), [](std::size_t h) { return h > 0; }));
  };
  auto take = [&](std::size_t i) {
    if (held[i] >= cap) return false;
    if (f.decide({used(), holders()}, held[i]) != Verdict::admit) return false;
    ++held[i];
    return true;
  };
  if (interleaved) {
    for (bool any = true; any;) {
      any = false;
      for (std::size_t i = 0; i < owners; ++i) any = take(i) || any;
    }
  } else {
    for (std::size_t i = 0; i < owners; ++i) {
      while (take(i)) {
      }
    }
  }
  return held;
}

std::size_t sum(const std::vector<std::size_t>& v) {
  std::size_t n = 0;
  for (std::size_t x : v) n += x;
  return n;
}

}  // namespace

TEST_CASE("fair share: the shared part is first come, a full table refuses everyone", "[fair_share]") {
  const FairShare f(1024);
  CHECK(f.reserve() == 512);
  CHECK(f.floor() == 64);
  // Outside the reserve, what an owner holds does not matter.
  CHECK(f.decide({0, 0}, 0) == Verdict::admit);
  CHECK(f.decide({511, 1}, 511) == Verdict::admit);
  CHECK_FALSE(f.contended(511));
  CHECK(f.contended(512));
  // Full: even an owner holding nothing is refused.
  CHECK(f.decide({1024, 9}, 0) == Verdict::table_full);
  CHECK(f.describe(Verdict::table_full, "session", "tenant a", {1024, 9}, 0) ==
        "session table full: 1024 of 1024 sessions in use");
}

TEST_CASE("fair share: in the reserve an owner at its share is refused, one holding little admitted", "[fair_share]") {
  const FairShare f(1024);
  // 8 owners hold 768: the share is min(64, 1024 / 9) = 64.
  CHECK(f.fair_share(8) == 64);
  CHECK(f.decide({768, 8}, 128) == Verdict::over_fair_share);
  CHECK(f.decide({768, 8}, 64) == Verdict::over_fair_share);
  CHECK(f.decide({768, 8}, 63) == Verdict::admit);
  // A newcomer counts itself: 9 holders.
  CHECK(f.decide({768, 8}, 0) == Verdict::admit);
  // Many owners: the share shrinks below the floor (1024 / 301 = 3).
  CHECK(f.fair_share(300) == 3);
  CHECK(f.decide({1000, 300}, 3) == Verdict::over_fair_share);
  CHECK(f.decide({1000, 300}, 2) == Verdict::admit);
  CHECK(f.describe(Verdict::over_fair_share, "session", "tenant uid:60001", {768, 8}, 128) ==
        "session table nearly full: tenant uid:60001 holds 128, its fair share (64) of the last 512 entries of 1024 "
        "shared by 8 holders; 256 left for tenants holding less");
}

TEST_CASE("fair share: 8 colluding owners at their caps leave an honest owner its share", "[fair_share]") {
  // The session table (1024, per-tenant cap 128) and the grant table (16384, cap 2048): whether
  // the colluders come one after the other (the worst order) or in turn.
  for (const std::size_t capacity : {std::size_t{1024}, std::size_t{16384}}) {
    const FairShare f(capacity);
    const std::size_t cap = capacity / 8;
    for (const bool interleaved : {false, true}) {
      CAPTURE(capacity, interleaved);
      std::vector<std::size_t> held = fill(f, 8, cap, interleaved);
      CHECK(sum(held) < capacity);
      // The honest owner comes last and gets its whole share (64 sessions / 1024 grants).
      held.push_back(0);
      held = fill(f, 9, cap, false, held);
      CHECK(held[8] == f.floor());
      CHECK(held[8] >= 40);
    }
  }
  // Without the reserve (first come only), the same colluders leave nothing.
  const FairShare none(1024, 0, 1);
  const std::vector<std::size_t> held = fill(none, 9, 128, false);
  CHECK(held[8] == 0);
}

TEST_CASE("fair share: filling the table takes many owners, each at its cap or share", "[fair_share]") {
  const FairShare f(1024);
  // One after the other, each owner up to the per-tenant cap (128): 4 fill the shared part, 8
  // more the reserve at 64 each.
  std::vector<std::size_t> held = fill(f, 11, 128, false);
  CHECK(sum(held) < 1024);
  held = fill(f, 12, 128, false, held);
  CHECK(sum(held) == 1024);
  for (std::size_t h : held) CHECK(h >= 64);
  // An owner alone may use the whole shared part, not the reserve.
  CHECK(fill(f, 1, 1024, false)[0] == 512);
}

TEST_CASE("fair share: bad sizes are refused", "[fair_share]") {
  CHECK_THROWS_AS(FairShare(0), std::invalid_argument);
  CHECK_THROWS_AS(FairShare(10, 11, 1), std::invalid_argument);
  // A tiny table still admits (floor at least 1).
  const FairShare tiny(4);
  CHECK(tiny.floor() == 1);
  CHECK(tiny.decide({0, 0}, 0) == Verdict::admit);
}
