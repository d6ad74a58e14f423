// Counted grants measured against NVML through the Node (node_swap.cpp, docs/swap.md "Counted
// grants are measured"): a grant its process never allocates is revoked, the idle process moved
// out for it comes back without being asked, and its session's next grant moves nobody out.
#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

namespace {

const char* kCountedOvercommit =
    "version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: nb, overcommit: true, users: [1001, 1002]}\n";

}  // namespace

TEST_CASE("node: overcommit: a counted grant never allocated is revoked and its victim comes back unasked",
          "[node][swap][counted]") {
  NodeSettings settings;
  settings.swap_idle = std::chrono::milliseconds(1000);
  settings.swap_margin = Bytes{0};
  settings.counted_realize = std::chrono::milliseconds(2000);
  World w(kCountedOvercommit, settings);
  REQUIRE(sim_gpu().driver().checkpoint_supported());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  REQUIRE(std::holds_alternative<Granted>(counted_grant(w, 1, a, 512 * kMiB)));
  // A's driver holds its 512 MiB (taken outside the pool, as A's own allocation would be).
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{128 * kMiB});
  w.advance(std::chrono::milliseconds(2000));  // A idle

  // B asks for 256 MiB it will never allocate: A goes to the host for it.
  REQUIRE(std::holds_alternative<Parked>(counted_grant(w, 2, b, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.retry_parked(w.t);
  std::vector<SwapNoticeOut> notes = w.take(&Effects::swap_notices);
  REQUIRE(notes.size() == 1);
  proto::SwapReady ready = proto::make<proto::SwapReady>();
  ready.swap_id = notes[0].msg.swap_id;
  CHECK_FALSE(w.node->swap_ready(a, ready).has_value());
  std::vector<SwapJob> jobs = w.take(&Effects::swap_jobs);
  REQUIRE(jobs.size() == 1);
  sim_gpu().driver().release(w.outside);
  w.outside = PhysicalHandle{};
  w.node->swap_done(jobs[0], true, Bytes{512 * kMiB}, std::chrono::milliseconds(400), "", w.t);
  (void)w.take(&Effects::swap_notices);
  w.retry_grants_one(2);
  CHECK(w.used(b) == 256_MiB);
  CHECK(w.node->rooms().swaps.get(a).moved_for == b);

  // NVML's readings: A is on the host (not judged), B's process holds nothing.
  const auto reading = [&] {
    (void)w.observe_gpus({gpu0(Bytes{0}, {})}, {}, w.t);
    return w.node->settle(w.t);
  };
  (void)reading();
  w.advance(std::chrono::milliseconds(1200));
  (void)reading();
  CHECK(w.used(b) == 256_MiB);                                                         // not before the window
  CHECK_FALSE(w.node->rooms().counted.may_displace(b, DeviceOrdinal{0}, w.t.steady));  // but it moves nobody
  w.advance(std::chrono::milliseconds(900));
  Effects fx = reading();
  // Revoked: B is charged nothing, and A's restore is queued without A asking.
  CHECK(w.used(b) == 0_B);
  CHECK(w.node->session(b)->grants.empty());
  REQUIRE(fx.swap_jobs.size() == 1);
  CHECK(fx.swap_jobs[0].session == a);
  CHECK(fx.swap_jobs[0].restore);
  w.node->swap_done(fx.swap_jobs[0], true, Bytes{0}, std::chrono::milliseconds(100), "", w.t);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::none);
  notes = w.take(&Effects::swap_notices);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 1);
  CHECK(notes[0].msg.phase == proto::SwapPhase::back);  // its hook's gate opens
  CHECK(w.take(&Effects::swap_replies).empty());

  // B's next counted grant finds no room: it moves nobody out, its driver decides.
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{128 * kMiB});
  w.advance(std::chrono::milliseconds(2000));  // A idle again
  CHECK(std::holds_alternative<Granted>(counted_grant(w, 2, b, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.node->settle(w.t);
  CHECK(w.take(&Effects::swap_notices).empty());
  CHECK(w.node->rooms().swaps.state(a) == SwapState::none);
}
