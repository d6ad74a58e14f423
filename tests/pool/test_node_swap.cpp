// vlake::pool::Node: swapping idle processes to host memory (node_swap.cpp, docs/swap.md), and
// the refusal log.
#include "node_world.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;
using namespace vlake::nodetest;

// ---- swapping idle processes to host memory (node_swap.cpp, docs/swap.md) ----------------------

namespace {

const char* kOvercommit =
    "version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: nb, overcommit: true, users: [1001, 1002, 1003]}\n";

void report_active(World& w, std::uint64_t session) {
  proto::ReserveReport r = proto::make<proto::ReserveReport>(0);
  w.node->devices().front().uuid.copy_to(r.device_uuid);
  r.flags = proto::kReportActive;
  CHECK_FALSE(w.node->reserve_report(session, r).has_value());
}

NodeSettings swap_settings() {
  NodeSettings s;
  s.swap_idle = std::chrono::milliseconds(1000);
  s.swap_margin = Bytes{0};
  return s;
}

}  // namespace

TEST_CASE("node: overcommit: a counted grant the GPU has no room for swaps out an idle process", "[node][swap]") {
  World w(kOvercommit, swap_settings());
  REQUIRE(sim_gpu().driver().checkpoint_supported());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  REQUIRE(std::holds_alternative<Granted>(counted_grant(w, 1, a, 512 * kMiB)));
  // A's driver holds its 512 MiB (taken here outside the pool, as A's own allocation would be).
  const Bytes free = sim_gpu().driver().memory_info(DeviceOrdinal{0}).free;
  w.take_outside(free - Bytes{128 * kMiB});
  w.advance(std::chrono::milliseconds(2000));  // A idle
  report_active(w, b);

  // B's 256 MiB do not fit: parked; caches first (nobody to ask here), no swap yet.
  GrantOut out = counted_grant(w, 2, b, 256 * kMiB);
  REQUIRE(std::holds_alternative<Parked>(out));
  CHECK(w.take(&Effects::swap_notices).empty());
  // At the first retry (250 ms) A, idle for 2 s, is told to get ready.
  w.advance(std::chrono::milliseconds(300));
  REQUIRE(w.node->retry_due(w.t));
  CHECK(w.retry_parked(w.t).empty());
  std::vector<SwapNoticeOut> notes = w.take(&Effects::swap_notices);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 1);
  CHECK(notes[0].msg.phase == proto::SwapPhase::out);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::notified);
  // Who waits for whom: B's grant waits for A, which goes out for it.
  {
    const Node::Wait bw = w.node->wait_of_session(*w.node->session(b));
    CHECK(bw.kind == st::kWaitMemory);
    CHECK(bw.bytes == 256_MiB);
    CHECK(bw.waits_for == std::vector<std::uint64_t>{a});
    CHECK(w.node->rooms().swaps.get(a).for_session == b);
    CHECK(w.node->wait_of_session(*w.node->session(a)).kind == st::kWaitNone);
    CHECK(w.node->changes_to_publish().sessions.count(w.node->session(b)->slot) == 1);  // published while it waits
  }
  // A retry while A is on its way out swaps nobody else (B is not idle anyway).
  w.advance(std::chrono::milliseconds(300));
  (void)w.retry_parked(w.t);
  CHECK(w.take(&Effects::swap_notices).empty());

  // A says ready: its checkpoint is queued for the swap thread.
  proto::SwapReady ready = proto::make<proto::SwapReady>();
  ready.swap_id = notes[0].msg.swap_id + 1;  // another swap's: ignored
  CHECK_FALSE(w.node->swap_ready(a, ready).has_value());
  CHECK(w.take(&Effects::swap_jobs).empty());
  ready.swap_id = notes[0].msg.swap_id;
  CHECK_FALSE(w.node->swap_ready(a, ready).has_value());
  std::vector<SwapJob> jobs = w.take(&Effects::swap_jobs);
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].pid == 101);
  CHECK_FALSE(jobs[0].restore);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::checkpointing);

  // The checkpoint frees A's memory: B's grant is served.
  sim_gpu().driver().release(w.outside);
  w.outside = PhysicalHandle{};
  w.node->swap_done(jobs[0], true, Bytes{512 * kMiB}, std::chrono::milliseconds(400), "", w.t);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::swapped);
  notes = w.take(&Effects::swap_notices);  // A hears it is on the host (it asks as soon as it computes)
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].msg.phase == proto::SwapPhase::host);
  CHECK(w.node->counters().swap_outs == 1);
  CHECK(w.node->rooms().swaps.on_host(DeviceOrdinal{0}).value() == 512 * kMiB);
  w.retry_grants_one(2);
  // A's quota still holds its 512 MiB: it is overcommitted, not its GPU.
  CHECK(w.used(a) == 512_MiB);

  // A's next CUDA call asks to come back: there is room, the restore is queued at once.
  proto::SwapIn in = proto::make<proto::SwapIn>(41);
  CHECK_FALSE(w.node->swap_in(1, a, in, w.t).has_value());
  jobs = w.take(&Effects::swap_jobs);
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].restore);
  w.advance(std::chrono::milliseconds(150));
  w.node->swap_done(jobs[0], true, Bytes{0}, std::chrono::milliseconds(150), "", w.t);
  std::vector<SwapInOut> replies = w.take(&Effects::swap_replies);
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].conn == 1);
  CHECK(replies[0].reply.status == proto::Status::ok);
  CHECK(replies[0].reply.h.request_id == 41);
  CHECK(replies[0].reply.waited_ms == 150);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::none);
  CHECK(w.node->counters().swap_ins == 1);
  CHECK(w.node->rooms().swaps.on_host(DeviceOrdinal{0}).value() == 0);
  CHECK(w.node->rooms().swaps.get(a).outs == 1);
  CHECK(w.node->rooms().swaps.get(a).ins == 1);
  CHECK(w.node->rooms().swaps.get(a).for_session == 0);
  CHECK(w.node->counters().swap_out_bytes == 512 * kMiB);
  CHECK(w.node->counters().swap_in_ns == 150'000'000);
  CHECK(w.node->wait_of_session(*w.node->session(b)).kind == st::kWaitNone);  // served
}

TEST_CASE("node: overcommit: a restore waits for room and swaps out others or times out clearly", "[node][swap]") {
  World w(kOvercommit, swap_settings());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  const auto c = w.hello(3, 103, 1003, true);
  REQUIRE(std::holds_alternative<Granted>(counted_grant(w, 1, a, 512 * kMiB)));
  REQUIRE(std::holds_alternative<Granted>(counted_grant(w, 3, c, 512 * kMiB)));
  // A is swapped out (as above, without the grant that asked for it).
  w.advance(std::chrono::milliseconds(2000));
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  REQUIRE(std::holds_alternative<Parked>(counted_grant(w, 2, b, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.retry_parked(w.t);
  std::vector<SwapNoticeOut> notes = w.take(&Effects::swap_notices);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 1);  // A and C idle as long: the lower session id
  proto::SwapReady ready = proto::make<proto::SwapReady>();
  ready.swap_id = notes[0].msg.swap_id;
  (void)w.node->swap_ready(a, ready);
  SwapJob job = w.take(&Effects::swap_jobs).at(0);
  w.node->swap_done(job, true, Bytes{512 * kMiB}, std::chrono::milliseconds(400), "", w.t);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::swapped);
  (void)w.take(&Effects::swap_notices);  // A's SwapNotice{host}

  // The GPU stays full: A's SwapIn waits, and C (idle) is told to make room for it.
  w.advance(std::chrono::milliseconds(2000));
  report_active(w, b);
  proto::SwapIn in = proto::make<proto::SwapIn>(5);
  CHECK_FALSE(w.node->swap_in(1, a, in, w.t).has_value());
  CHECK(w.take(&Effects::swap_jobs).empty());
  notes = w.take(&Effects::swap_notices);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].conn == 3);
  // C never answers: after 2 s it is left alone (and told so).
  w.advance(std::chrono::milliseconds(2100));
  w.node->swap_tick(w.t);
  notes = w.take(&Effects::swap_notices);
  REQUIRE_FALSE(notes.empty());
  CHECK(notes.back().conn == 3);
  CHECK(notes.back().msg.phase == proto::SwapPhase::back);
  CHECK(w.node->rooms().swaps.state(c) == SwapState::none);
  // A waits up to the overcommit wait (2 minutes), then hears out_of_memory and stays on the host.
  w.advance(std::chrono::milliseconds(120000));
  w.node->swap_tick(w.t);
  std::vector<SwapInOut> replies = w.take(&Effects::swap_replies);
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].reply.status == proto::Status::out_of_memory);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::swapped);
  CHECK(w.node->counters().swap_timeouts == 1);
}

TEST_CASE("node: overcommit: a SwapIn before the checkpoint calls the swap off and failures are reported",
          "[node][swap]") {
  World w(kOvercommit, swap_settings());
  const auto a = w.hello(1, 101, 1001, true);
  const auto b = w.hello(2, 102, 1002, true);
  REQUIRE(std::holds_alternative<Granted>(counted_grant(w, 1, a, 512 * kMiB)));
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  w.advance(std::chrono::milliseconds(2000));
  REQUIRE(std::holds_alternative<Parked>(counted_grant(w, 2, b, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.retry_parked(w.t);
  REQUIRE(w.take(&Effects::swap_notices).size() == 1);
  // A wakes up first: called off, answered at once.
  proto::SwapIn in = proto::make<proto::SwapIn>(3);
  const auto r = w.node->swap_in(1, a, in, w.t);
  REQUIRE(r.has_value());
  CHECK(r->status == proto::Status::ok);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::none);

  // Next time the checkpoint itself fails: A is told to go on, and counted as a failure.
  w.advance(std::chrono::milliseconds(2000));
  (void)w.retry_parked(w.t);
  std::vector<SwapNoticeOut> notes = w.take(&Effects::swap_notices);
  REQUIRE(notes.size() == 1);
  proto::SwapReady ready = proto::make<proto::SwapReady>();
  ready.swap_id = notes[0].msg.swap_id;
  (void)w.node->swap_ready(a, ready);
  const SwapJob job = w.take(&Effects::swap_jobs).at(0);
  w.node->swap_done(job, false, Bytes{0}, std::chrono::milliseconds(1), "cuCheckpointProcessLock failed", w.t);
  CHECK(w.node->rooms().swaps.state(a) == SwapState::none);
  CHECK(w.node->counters().swap_failures == 1);
  notes = w.take(&Effects::swap_notices);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].msg.phase == proto::SwapPhase::back);
}

TEST_CASE("node: overcommit: tenants without it are never swapped and their grants never wait for room",
          "[node][swap]") {
  World w(
      "version: 1\ndefault: {limit: 100%}\nnamespaces:\n  - {name: nb, overcommit: true, users: [1001]}\n"
      "  - {name: plain, users: [1002]}\n",
      swap_settings());
  const auto a = w.hello(1, 101, 1001, true);                                    // overcommit
  const auto p = w.hello(2, 102, 1002, true);                                    // plain
  REQUIRE(std::holds_alternative<Granted>(counted_grant(w, 2, p, 256 * kMiB)));  // e.g. managed memory
  w.take_outside(sim_gpu().driver().memory_info(DeviceOrdinal{0}).free - Bytes{64 * kMiB});
  w.advance(std::chrono::milliseconds(5000));
  // A needs room; P is idle but not in an overcommit namespace: nobody is swapped, and after the
  // wait the grant goes on (A's driver decides).
  REQUIRE(std::holds_alternative<Parked>(counted_grant(w, 1, a, 256 * kMiB)));
  w.advance(std::chrono::milliseconds(300));
  (void)w.retry_parked(w.t);
  CHECK(w.take(&Effects::swap_notices).empty());
  w.advance(std::chrono::milliseconds(120000));
  std::vector<Completion> done = w.retry_parked(w.t);
  REQUIRE(done.size() == 1);
  CHECK(std::holds_alternative<Granted>(done[0].out));
  // P's counted grants never wait for room (only overcommit tenants' do).
  CHECK(std::holds_alternative<Granted>(counted_grant(w, 2, p, 64 * kMiB)));
}

TEST_CASE("node: refusals are logged with their reason, and per tenant", "[node][refusals][state]") {
  NodeSettings settings;
  settings.max_sessions_per_tenant = 1;
  World w("version: 1\ndefault: {limit: 4MiB}\n", settings);
  const auto s1 = w.hello(1, 101, 1001);
  w.t.unix_ns = 5'000'000'000ULL;
  CHECK(w.refused(1, s1, 8 * kMiB) == proto::Status::over_limit);
  // A second session of the same tenant is over the session cap.
  proto::Hello m = proto::make<proto::Hello>(1);
  HelloOut out = w.node->open_session(Peer{2, 102, 1001, 1001, 1102, ""}, m);
  REQUIRE(std::holds_alternative<Fatal>(out.answer));
  const st::RefusalLog& log = w.node->rooms().refusals.log();
  REQUIRE(log.next_seq == 3);
  const st::RefusalRecord& r1 = log.refusals[0];
  CHECK(r1.seq == 1);
  CHECK(r1.reason == st::kRefusalTenantLimit);
  CHECK(r1.pid == 101);
  CHECK(r1.device == 0);
  CHECK(r1.bytes == 8 * kMiB);
  CHECK(r1.limit == 4 * kMiB);
  CHECK(r1.time_unix_ns == 5'000'000'000ULL);
  CHECK(std::string(r1.tenant_name) == "uid:1001");
  const st::RefusalRecord& r2 = log.refusals[1];
  CHECK(r2.reason == st::kRefusalLimitReached);
  CHECK(r2.pid == 102);
  CHECK(r2.device == st::kGuardNoDevice);
  CHECK(r2.used == 1);
  CHECK(r2.limit == 1);
  const Node::Session* s = w.node->session(s1);
  REQUIRE(s != nullptr);
  const Node::Tenant* t = w.node->tenant(s->tenant);
  REQUIRE(t != nullptr);
  CHECK(t->denials[st::kRefusalTenantLimit - 1] == 1);
  CHECK(t->denials[st::kRefusalLimitReached - 1] == 1);
  CHECK(w.node->counters().refusals_recorded == 2);
  CHECK(w.node->changes_to_publish().refusals);

  // Published: the ring, the tenant's denials, and a session's activity.
  TestSegment test_segment("vlake-node-test-rf-");
  st::StateSegment& seg = test_segment.seg;
  StatePublisher pub(seg, 1, 2, 1000);
  pub.publish_all(*w.node, w.t.unix_ns);
  CHECK(seg.state().refusals.next_seq == 3);
  CHECK(seg.state().refusals.refusals[0].reason == st::kRefusalTenantLimit);
  bool found = false;
  for (const st::TenantRecord& r : seg.state().tenants) {
    if (r.in_use == 0 || std::string(r.name) != "uid:1001") continue;
    found = true;
    CHECK(r.denials[st::kRefusalTenantLimit - 1] == 1);
  }
  CHECK(found);
  const st::SessionRecord& sr = seg.state().sessions[s->slot];
  CHECK(sr.id == s1);
  CHECK(sr.last_active_unix_ns == 5'000'000'000ULL);  // its grant (refused) was its last activity
  CHECK(sr.swap == st::kSwapNone);
  CHECK(sr.wait == st::kWaitNone);
}
