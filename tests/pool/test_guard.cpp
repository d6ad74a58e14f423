// Out-of-bounds guards, daemon side (docs/guard.md), vlaked as a process on the simulator:
// guard modes in HelloAck, canary fill/check at release and by the periodic sweep, the
// events ring, counters and log line, and GuardEvent handling.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "harness.hpp"
#include "pool_client.hpp"
#include "units.hpp"
#include "vlake/contracts/protocol.hpp"

using namespace vlake;
using namespace vlake::pooltest;
namespace st = vlake::state;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

// root (the test process, root helpers): canary; uid 4242: fault; 4243: off; others: canary.
const char* const kGuardConfig = R"(version: 1
default:
  limit: 64MiB
  guard: canary
users:
  - uid: 4242
    guard: fault
  - uid: 4243
    guard: off
)";

const st::GuardEventRecord* newest(const st::State& s) {
  const auto kept = st::ring_order(s.guard);  // oldest first
  return kept.empty() ? nullptr : kept.back();
}

}  // namespace

TEST_CASE("guard: HelloAck carries the tenant's mode from the quota file", "[guard]") {
  DaemonProcess d("gmode", kGuardConfig);
  REQUIRE(d.start());
  PoolClient c(d.socket);
  CHECK(c.hello().guard_mode == proto::GuardMode::canary);
  Helper fault(d.node, 4242, 0);
  CHECK(fault.ok("connect " + d.socket).at("guard") == "2");
  Helper off(d.node, 4243, 0);
  CHECK(off.ok("connect " + d.socket).at("guard") == "0");
}

TEST_CASE("guard: a write into a canary grant's slack raises an alarm at release", "[guard]") {
  DaemonProcess d("gcanary", kGuardConfig);
  REQUIRE(d.start({"--canary-interval-ms", "0"}));
  Helper h(d.node);
  REQUIRE(h.ok("connect " + d.socket).at("guard") == "1");
  const std::uint64_t size = kMiB + 100;
  const auto g = h.ok("grant " + std::to_string(size));
  REQUIRE(num(g, "status") == 0);
  const std::uint64_t id = num(g, "id");
  REQUIRE(num(g, "bytes") == 2 * kMiB);
  h.ok("fill " + std::to_string(id) + " 0");  // whole grant, then restore: not a slack test
  h.ok("release " + std::to_string(id));
  CHECK(snapshot(d.state)->counters.guard_violations_canary == 1);  // fill wrote the slack

  const auto g2 = h.ok("grant " + std::to_string(size));
  const std::uint64_t id2 = num(g2, "id");
  h.ok("poke " + std::to_string(id2) + " 0 " + std::to_string(size) + " 7");      // inside: fine
  h.ok("poke " + std::to_string(id2) + " " + std::to_string(size + 4) + " 3 9");  // 4 bytes past the end
  auto before = snapshot(d.state);
  CHECK(before->counters.guard_violations_canary == 1);  // no sweep: nothing until release
  h.ok("release " + std::to_string(id2));
  auto s = snapshot(d.state);
  CHECK(s->counters.guard_violations_canary == 2);
  CHECK(s->counters.guard_violations_fault == 0);
  const st::GuardEventRecord* e = newest(*s);
  REQUIRE(e != nullptr);
  CHECK(e->seq == 2);
  CHECK(e->kind == static_cast<std::uint32_t>(proto::GuardKind::canary));
  CHECK(e->grant_id == id2);
  CHECK(e->requested_bytes == size);
  CHECK(e->first_bad_offset == size + 4);
  CHECK(std::string(e->tenant_name) == "uid:0");
  CHECK(e->device == 0);
  CHECK(e->pid == static_cast<std::uint32_t>(h.pid()));
  CHECK(e->allocated_unix_ns > 0);
  CHECK(e->allocated_unix_ns <= e->time_unix_ns);
  CHECK(std::string(e->call) == "release");
  CHECK_THAT(d.log(), Catch::Contains("warn: guard event kind=canary tenant=uid:0 gpu=0 grant=" + std::to_string(id2) +
                                      " size=1048676 first_bad_offset=1048680 allocated_at="));
}

TEST_CASE("guard: the periodic sweep finds a slack write without a release, once", "[guard]") {
  DaemonProcess d("gsweep", kGuardConfig);
  REQUIRE(d.start({"--canary-interval-ms", "50", "--sample-interval-ms", "20"}));
  Helper h(d.node);
  h.ok("connect " + d.socket);
  const std::uint64_t size = 3 * kMiB + 1;
  const auto g = h.ok("grant " + std::to_string(size));
  const std::uint64_t id = num(g, "id");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(snapshot(d.state)->counters.guard_violations_canary == 0);
  h.ok("poke " + std::to_string(id) + " " + std::to_string(4 * kMiB - 1) + " 1 0");  // the last byte
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.guard_violations_canary == 1; }, 3000));
  auto s = snapshot(d.state);
  const st::GuardEventRecord* e = newest(*s);
  REQUIRE(e != nullptr);
  CHECK(e->first_bad_offset == 4 * kMiB - 1);
  CHECK(e->requested_bytes == size);
  CHECK(std::string(e->call) == "sweep");
  // Re-armed: neither later sweeps nor the release report the same write again.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  h.ok("release " + std::to_string(id));
  CHECK(snapshot(d.state)->counters.guard_violations_canary == 1);
}

TEST_CASE("guard: no false alarm over random grants written inside, and none in mode off", "[guard]") {
  DaemonProcess d("gquiet", kGuardConfig);
  REQUIRE(d.start({"--canary-interval-ms", "20", "--sample-interval-ms", "10"}));
  Helper h(d.node);
  h.ok("connect " + d.socket);
  std::mt19937_64 rng(12345);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;  // id, size
  for (int i = 0; i < 150; ++i) {
    if (live.size() < 6 && (live.empty() || rng() % 2 == 0)) {
      // Up to 2 MiB: sizes off every boundary, and pokes that a sanitizer build writes in time.
      const std::uint64_t size = 1 + rng() % (2 * kMiB);
      const auto g = h.ok("grant " + std::to_string(size));
      REQUIRE(num(g, "status") == 0);
      const std::uint64_t id = num(g, "id");
      h.ok("poke " + std::to_string(id) + " 0 " + std::to_string(size) + " " + std::to_string(rng() % 256));
      live.emplace_back(id, size);
    } else {
      const std::size_t k = rng() % live.size();
      const auto [id, size] = live[k];
      const std::uint64_t off = rng() % size;
      h.ok("poke " + std::to_string(id) + " " + std::to_string(off) + " " + std::to_string(size - off) + " 203");
      h.ok("release " + std::to_string(id));
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
  for (const auto& [id, size] : live) h.ok("release " + std::to_string(id));
  auto s = snapshot(d.state);
  CHECK(s->counters.guard_violations_canary == 0);
  CHECK(s->guard.next_seq <= 1);
  CHECK(s->counters.grants > 50);

  Helper off(d.node, 4243, 0);
  off.ok("connect " + d.socket);
  const auto g = off.ok("grant " + std::to_string(kMiB + 100));
  off.ok("fill " + std::to_string(num(g, "id")) + " 1");
  off.ok("release " + std::to_string(num(g, "id")));
  CHECK(snapshot(d.state)->counters.guard_violations_canary == 0);
}

TEST_CASE("guard: a valid GuardEvent is recorded, a malformed one closes the connection", "[guard]") {
  DaemonProcess d("gevent", kGuardConfig);
  REQUIRE(d.start());
  PoolClient c(d.socket);
  const auto ack = c.hello();
  // A guard event must name memory the session holds (docs/daemon.md, "Limits").
  REQUIRE(c.grant(Uuid::from_bytes(ack.devices[0].uuid), 8 << 20).reply.status == proto::Status::ok);
  proto::GuardEvent ev{};
  ev.h = proto::make_header<proto::GuardEvent>(proto::MsgType::guard_event, c.next_request_id());
  ev.kind = proto::GuardKind::fault;
  ev.suspect_count = 2;
  std::memcpy(ev.device_uuid, ack.devices[0].uuid, 16);
  ev.cuda_status = 700;
  ev.live_allocations = 5;
  std::strcpy(ev.call, "cuStreamSynchronize");
  ev.suspects[0] = proto::GuardSuspect{0x7f0000200000ULL, 4096, 1'000'000};
  ev.suspects[1] = proto::GuardSuspect{0x7f0000000000ULL, 100, 2'000'000};
  c.send(ev);
  // A kernel fault (root's mode is canary: not guarded), not a guard violation.
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.kernel_faults[0] == 1; }));
  auto s = snapshot(d.state);
  CHECK(s->counters.guard_violations_fault == 0);
  const st::GuardEventRecord* e = newest(*s);
  REQUIRE(e != nullptr);
  CHECK(e->kind == static_cast<std::uint32_t>(proto::GuardKind::fault));
  CHECK(e->flags == 0);
  CHECK(e->address == 0x7f0000200000ULL);
  CHECK(e->requested_bytes == 4096);
  CHECK(e->suspect_count == 2);
  CHECK(e->suspects[1].bytes == 100);
  CHECK(e->cuda_status == 700);
  CHECK(e->live_allocations == 5);
  CHECK(e->device == 0);
  CHECK(e->tenant == ack.tenant_id);
  CHECK(std::string(e->call) == "cuStreamSynchronize");
  CHECK(s->counters.malformed == 0);
  CHECK_THAT(d.log(), Catch::Contains("kernel fault kind=fault tenant=uid:0 gpu=0 guarded=false maps_shared=false "
                                      "call=cuStreamSynchronize"));
  // The connection still works: no reply to a GuardEvent, the next request is answered.
  CHECK(c.usage(Uuid{}).status == proto::Status::unknown_device);
  // The hook's kind fault_maps_shared (older hooks: `readonly`): recorded as a fault with the
  // maps_shared attribute, in the tenant's counters too.
  proto::GuardEvent shared = ev;
  shared.kind = proto::GuardKind::fault_maps_shared;
  shared.h.request_id = c.next_request_id();
  c.send(shared);
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.kernel_faults[st::kFaultMapsShared] == 1; }));
  s = snapshot(d.state);
  e = newest(*s);
  REQUIRE(e != nullptr);
  CHECK(e->kind == static_cast<std::uint32_t>(proto::GuardKind::fault));
  CHECK(e->flags == st::kFaultMapsShared);
  CHECK(s->counters.guard_violations_readonly == 0);
  const st::TenantRecord& tr = s->tenants[ack.tenant_id - 1];
  CHECK(tr.kernel_faults[0] == 1);
  CHECK(tr.kernel_faults[st::kFaultMapsShared] == 1);

  struct Bad {
    const char* what;
    void (*spoil)(proto::GuardEvent&);
  };
  const Bad bad[] = {
      {"kind", [](proto::GuardEvent& m) { m.kind = static_cast<proto::GuardKind>(9); }},
      {"canary from a client", [](proto::GuardEvent& m) { m.kind = proto::GuardKind::canary; }},
      {"suspects", [](proto::GuardEvent& m) { m.suspect_count = proto::kMaxGuardSuspects + 1; }},
      {"call", [](proto::GuardEvent& m) { std::memset(m.call, 'x', sizeof m.call); }},
  };
  std::uint64_t malformed = 0;
  for (const Bad& b : bad) {
    INFO(b.what);
    PoolClient m(d.socket);
    m.hello();
    proto::GuardEvent x = ev;
    b.spoil(x);
    m.send(x);
    CHECK(m.wait_closed());
    ++malformed;
    CHECK(snapshot(d.state)->counters.malformed == malformed);
  }
  CHECK(snapshot(d.state)->counters.kernel_faults[0] == 1);
}

TEST_CASE("guard: a ReadOnlyWrite must name a shared grant of the sender, a malformed one closes", "[guard]") {
  DaemonProcess d("growrite", kGuardConfig);
  REQUIRE(d.start());
  PoolClient c(d.socket);
  const auto ack = c.hello();
  const auto g = c.grant(Uuid::from_bytes(ack.devices[0].uuid), 8 << 20);
  REQUIRE(g.reply.status == proto::Status::ok);
  proto::ReadOnlyWrite w = proto::make<proto::ReadOnlyWrite>(c.next_request_id());
  std::memcpy(w.device_uuid, ack.devices[0].uuid, 16);
  w.grant_id = g.reply.grant_id;
  w.alloc_address = 0x7f0000000000ULL;
  w.alloc_bytes = 8 << 20;
  w.address = w.alloc_address + 2 * kMiB;
  w.bytes = 4096;
  w.shared_offset = 2 * kMiB;
  w.shared_bytes = 4096;
  w.cuda_status = 1;
  std::strcpy(w.call, "cuMemsetD8");
  // The grant is the sender's but holds no shared chunks: rejected (counted), nothing recorded.
  c.send(w);
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.guard_events_rejected == 1; }));
  // A grant the sender does not hold.
  proto::ReadOnlyWrite other = w;
  other.grant_id = g.reply.grant_id + 100;
  other.h.request_id = c.next_request_id();
  c.send(other);
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.guard_events_rejected == 2; }));
  auto s = snapshot(d.state);
  CHECK(s->counters.guard_violations_readonly_write == 0);
  CHECK(s->guard.next_seq <= 1);
  CHECK(s->counters.malformed == 0);
  CHECK_THAT(d.log(), Catch::Contains("readonly_write event rejected: it names grant " +
                                      std::to_string(g.reply.grant_id) + ", which holds no shared chunks"));
  CHECK(c.usage(Uuid{}).status == proto::Status::unknown_device);  // the connection still works
  // Malformed (a shared range outside the destination): the connection is closed.
  PoolClient m(d.socket);
  m.hello();
  proto::ReadOnlyWrite bad = w;
  bad.shared_bytes = 8192;
  m.send(bad);
  CHECK(m.wait_closed());
  CHECK(snapshot(d.state)->counters.malformed == 1);
}
