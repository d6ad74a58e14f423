// CountedAudit (pool/include/vlake/pool/features/counted/counted_audit.hpp): counted grants
// measured against NVML's figure of their process.
#include <catch2/catch.hpp>

#include <chrono>

#include "unit_ids.hpp"
#include "vlake/pool/features/counted/counted_audit.hpp"

using namespace vlake;
using namespace vlake::literals;
using vlake::pool::CountedAudit;
using namespace std::chrono_literals;

namespace {

using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

CountedAudit::Holding holding(std::uint64_t session, Bytes seen, std::vector<CountedAudit::Grant> grants,
                              bool exempt = false) {
  CountedAudit::Holding h;
  h.session = session;
  h.device = kGpu0;
  h.seen = seen;
  h.grants = std::move(grants);
  h.exempt = exempt;
  return h;
}

}  // namespace

TEST_CASE("counted audit: a grant its process never allocates is revoked after the window, at two readings",
          "[pool][counted]") {
  CountedAudit a(2s, 60s);
  // Session 1 allocated its 600 MiB; session 2 never allocated its 600 MiB.
  const std::vector<CountedAudit::Grant> g1 = {{10, 600_MiB, kT0}};
  const std::vector<CountedAudit::Grant> g2 = {{20, 600_MiB, kT0}};
  CHECK(a.observe({holding(1, 600_MiB, g1), holding(2, 0_B, g2)}, kT0 + 100ms).empty());
  CHECK(a.realized(1, kGpu0) == 600_MiB);
  CHECK(a.realized(2, kGpu0) == 0_B);
  CHECK(a.may_displace(1, kGpu0, kT0 + 100ms));
  CHECK(a.may_displace(2, kGpu0, kT0 + 100ms));  // not settled yet
  CHECK(a.observe({holding(1, 600_MiB, g1), holding(2, 0_B, g2)}, kT0 + 1500ms).empty());
  CHECK(a.may_displace(1, kGpu0, kT0 + 1500ms));
  CHECK_FALSE(a.may_displace(2, kGpu0, kT0 + 1500ms));  // served 1.5 s ago, not in NVML
  auto r = a.observe({holding(1, 600_MiB, g1), holding(2, 0_B, g2)}, kT0 + 2s);
  REQUIRE(r.size() == 1);
  CHECK(r[0].grant == 20);
  CHECK(r[0].session == 2);
  CHECK(r[0].bytes == 600_MiB);
  CHECK(r[0].counted == 600_MiB);
  CHECK(r[0].seen == 0_B);
  a.revoked(2, kT0 + 2s);
  CHECK(a.observe({holding(1, 600_MiB, g1)}, kT0 + 3s).empty());  // session 2 holds nothing now
  // Revoked lately: it makes nobody move out for a while, whatever it allocates.
  CHECK_FALSE(a.may_displace(2, kGpu0, kT0 + 30s));
  CHECK(a.may_displace(2, kGpu0, kT0 + 62s));
  a.forget(2);
  CHECK_FALSE(a.realized(2, kGpu0).has_value());
}

TEST_CASE("counted audit: the slack, partly realized grants, one reading and exempt holdings are not revoked",
          "[pool][counted]") {
  CountedAudit a(1s, 60s);
  // 48 MiB unrealized of 1 GiB: within the slack (small allocations packed by the driver).
  const std::vector<CountedAudit::Grant> small = {{1, 512_MiB, kT0}, {2, 512_MiB, kT0 + 1ms}};
  CHECK(a.observe({holding(1, 976_MiB, small)}, kT0 + 2s).empty());
  CHECK(a.observe({holding(1, 976_MiB, small)}, kT0 + 3s).empty());
  CHECK(a.may_displace(1, kGpu0, kT0 + 3s));
  // Half of the newest grant shows: in use, not revoked; the wholly unrealized older one is.
  const std::vector<CountedAudit::Grant> three = {{3, 256_MiB, kT0}, {4, 256_MiB, kT0 + 1ms}, {5, 256_MiB, kT0 + 2ms}};
  CHECK(a.observe({holding(2, 384_MiB, three)}, kT0 + 2s).empty());
  auto r = a.observe({holding(2, 384_MiB, three)}, kT0 + 3s);
  // 384 MiB unrealized: the newest (5) wholly, the middle one (4) half: only 5 goes.
  REQUIRE(r.size() == 1);
  CHECK(r[0].grant == 5);
  // A grant that shows up between two readings starts afresh.
  const std::vector<CountedAudit::Grant> late = {{6, 256_MiB, kT0}};
  CHECK(a.observe({holding(3, 0_B, late)}, kT0 + 2s).empty());
  CHECK(a.observe({holding(3, 256_MiB, late)}, kT0 + 3s).empty());
  CHECK(a.observe({holding(3, 0_B, late)}, kT0 + 4s).empty());  // freed: its release is on the way
  // On the host: not judged, and its marks go.
  const std::vector<CountedAudit::Grant> away = {{7, 256_MiB, kT0}};
  CHECK(a.observe({holding(4, 0_B, away)}, kT0 + 2s).empty());
  CHECK(a.observe({holding(4, 0_B, away, true)}, kT0 + 3s).empty());
  CHECK_FALSE(a.realized(4, kGpu0).has_value());
  CHECK(a.observe({holding(4, 0_B, away)}, kT0 + 4s).empty());
  CHECK(a.observe({holding(4, 0_B, away)}, kT0 + 5s).size() == 1);
}

TEST_CASE("counted audit: a session whose grants are gone is judged afresh at the next reading", "[pool][counted]") {
  CountedAudit a(1s, 2s);
  const std::vector<CountedAudit::Grant> g = {{1, 600_MiB, kT0}};
  CHECK(a.observe({holding(1, 0_B, g)}, kT0 + 1500ms).empty());
  REQUIRE(a.observe({holding(1, 0_B, g)}, kT0 + 2s).size() == 1);
  a.revoked(1, kT0 + 2s);
  CHECK_FALSE(a.may_displace(1, kGpu0, kT0 + 3s));
  CHECK(a.observe({}, kT0 + 3s).empty());  // it holds nothing now
  CHECK_FALSE(a.realized(1, kGpu0).has_value());
  CHECK(a.may_displace(1, kGpu0, kT0 + 4s));  // the skip is over
}
