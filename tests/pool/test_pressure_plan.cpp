// plan_pressure (pool/include/vlake/pool/pressure_plan.hpp): who a grant that cannot be served
// asks to give memory back, in which order.
#include <catch2/catch.hpp>

#include "units.hpp"
#include "vlake/pool/pressure_plan.hpp"

using vlake::Bytes;
using vlake::pool::plan_pressure;
using vlake::pool::plan_swap;
using vlake::pool::PressureCandidate;
using vlake::pool::SwapCandidate;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);

PressureCandidate cand(std::uint64_t session, std::uint64_t reserve_mib, std::uint64_t held_mib, bool reclaim,
                       std::int32_t priority, int idle_s) {
  PressureCandidate c;
  c.session = session;
  c.reserve = Bytes{reserve_mib * MiB};
  c.held = Bytes{held_mib * MiB};
  c.reclaim = reclaim;
  c.priority = priority;
  c.last_active = t0 - std::chrono::seconds(idle_s);
  return c;
}

}  // namespace

TEST_CASE("pressure plan: lowest priority first, then the most idle, until the shortfall is covered") {
  const std::vector<PressureCandidate> s = {
      cand(1, 100, 100, false, 0, 5),   // 0: priority 0, idle 5 s
      cand(2, 100, 100, false, -5, 1),  // 1: lowest priority
      cand(3, 100, 100, false, 0, 60),  // 2: priority 0, idle 60 s
      cand(4, 100, 100, false, 0, 30),  // 3: priority 0, idle 30 s
  };
  CHECK(plan_pressure(s, 0, Bytes{50 * MiB}) == std::vector<std::size_t>{1});
  CHECK(plan_pressure(s, 0, Bytes{150 * MiB}) == std::vector<std::size_t>{1, 2});
  CHECK(plan_pressure(s, 0, Bytes{250 * MiB}) == std::vector<std::size_t>{1, 2, 3});
  // More than everyone has: everyone is asked.
  CHECK(plan_pressure(s, 0, Bytes{10000 * MiB}) == std::vector<std::size_t>{1, 2, 3, 0});
}

TEST_CASE("pressure plan: a tenant never takes memory from a higher-priority one") {
  const std::vector<PressureCandidate> s = {
      cand(1, 100, 100, false, 10, 60),  // higher than the requester
      cand(2, 100, 100, false, 0, 1),    // equal
      cand(3, 100, 100, false, -1, 1),   // lower
  };
  CHECK(plan_pressure(s, 0, Bytes{10000 * MiB}) == std::vector<std::size_t>{2, 1});
  CHECK(plan_pressure(s, -1, Bytes{10000 * MiB}) == std::vector<std::size_t>{2});
  CHECK(plan_pressure(s, -2, Bytes{10000 * MiB}).empty());
  CHECK(plan_pressure(s, 10, Bytes{10000 * MiB}) == std::vector<std::size_t>{2, 1, 0});
}

TEST_CASE("pressure plan: a reclaim callback offers what the session holds and nothing to give is never asked") {
  const std::vector<PressureCandidate> s = {
      cand(1, 0, 500, false, 0, 60),  // holds memory, no reserve, no callback: nothing to give
      cand(2, 0, 0, true, 0, 50),     // a callback but holds nothing here
      cand(3, 0, 400, true, 0, 40),   // a framework cache of up to 400 MiB
      cand(4, 64, 64, false, 0, 30),  // a reserve
  };
  CHECK(plan_pressure(s, 0, Bytes{300 * MiB}) == std::vector<std::size_t>{2});
  CHECK(plan_pressure(s, 0, Bytes{450 * MiB}) == std::vector<std::size_t>{2, 3});
  CHECK(plan_pressure(s, 0, Bytes{0}).empty());
  CHECK(plan_pressure({}, 0, Bytes{MiB}).empty());
}

namespace {
SwapCandidate swap_cand(std::uint64_t session, std::uint64_t mib, std::int32_t priority, int idle_s) {
  SwapCandidate c;
  c.session = session;
  c.bytes = Bytes{mib * MiB};
  c.priority = priority;
  c.last_active = std::chrono::steady_clock::time_point(std::chrono::hours(1)) - std::chrono::seconds(idle_s);
  return c;
}
const auto kNow = std::chrono::steady_clock::time_point(std::chrono::hours(1));
}  // namespace

TEST_CASE("swap plan: idle processes only, lowest priority then most idle, until the need is covered") {
  const std::vector<SwapCandidate> s = {
      swap_cand(1, 400, 0, 5),                               // idle 5 s: too recent for a 30 s idle rule
      swap_cand(2, 300, 0, 100),                             // the most idle
      swap_cand(3, 300, 0, 60),  swap_cand(4, 300, -1, 40),  // lower priority: first
      swap_cand(5, 0, -5, 500),                              // holds nothing here
  };
  const std::chrono::milliseconds idle{30000};
  CHECK(plan_swap(s, 0, Bytes{200 * MiB}, kNow, idle) == std::vector<std::size_t>{3});
  CHECK(plan_swap(s, 0, Bytes{500 * MiB}, kNow, idle) == std::vector<std::size_t>{3, 1});
  CHECK(plan_swap(s, 0, Bytes{900 * MiB}, kNow, idle) == std::vector<std::size_t>{3, 1, 2});
  // All the idle ones together cannot cover it: nobody is disturbed.
  CHECK(plan_swap(s, 0, Bytes{1000 * MiB}, kNow, idle).empty());
  // With a 1 s idle rule the fifth-second one counts too.
  CHECK(plan_swap(s, 0, Bytes{1000 * MiB}, kNow, std::chrono::milliseconds(1000)) ==
        std::vector<std::size_t>{3, 1, 2, 0});
  CHECK(plan_swap(s, 0, Bytes{0}, kNow, idle).empty());
}

TEST_CASE("swap plan: a process is never swapped out for a lower-priority one") {
  const std::vector<SwapCandidate> s = {swap_cand(1, 300, 5, 100), swap_cand(2, 300, 0, 100)};
  const std::chrono::milliseconds idle{1000};
  CHECK(plan_swap(s, 0, Bytes{200 * MiB}, kNow, idle) == std::vector<std::size_t>{1});
  CHECK(plan_swap(s, 0, Bytes{500 * MiB}, kNow, idle).empty());  // only the equal one counts
  CHECK(plan_swap(s, 5, Bytes{500 * MiB}, kNow, idle) == std::vector<std::size_t>{1, 0});
  CHECK(plan_swap(s, -1, Bytes{200 * MiB}, kNow, idle).empty());
}
