// The guards' memory (docs/guard.md): GuardBook's event numbering, per-tenant rate, kernel
// faults and canary sweep order, without a Node.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <vector>

#include "unit_ids.hpp"
#include "vlake/pool/features/guard/guard_book.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace std::chrono_literals;
namespace st = vlake::state;

using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

TEST_CASE("guard book: events are numbered from 1 and the ring keeps the newest", "[pool][guard]") {
  GuardBook book(10, 20);
  st::GuardEventRecord e{};
  e.pid = 7;
  std::strcpy(e.tenant_name, "uid:3");
  CHECK(book.record(e).record.seq == 1);
  CHECK_FALSE(book.record(e).evicted.has_value());  // seq 2: the ring has room
  for (std::uint32_t i = 0; i < st::kGuardEvents; ++i) (void)book.record(e);
  const std::uint64_t last = st::kGuardEvents + 2;
  CHECK(book.log().next_seq == last + 1);
  CHECK(book.log().evicted == 2);
  CHECK(book.guard_events_evicted("uid:3") == 2);
  const auto kept = st::ring_order(book.log());
  REQUIRE(kept.size() == st::kGuardEvents);
  CHECK(kept.front()->seq == 3);  // one tenant alone: its oldest went first
  CHECK(kept.back()->seq == last);
  CHECK(kept.back()->pid == 7);
  // A previous daemon's log: numbering and the kept events carry on; another tenant's event
  // pushes out tenant 3's oldest.
  GuardBook next(10, 20);
  next.resume(book.log());
  std::strcpy(e.tenant_name, "uid:4");
  const auto k = next.record(e);
  CHECK(k.record.seq == last + 1);
  REQUIRE(k.evicted.has_value());
  CHECK(*k.evicted == "uid:3");
  CHECK(st::ring_order(next.log()).front()->seq == 4);
  // A freed tenant's eviction count is forgotten.
  next.set_evicted("uid:3", 9);
  CHECK(next.guard_events_evicted("uid:3") == 9);
  next.forget(TenantId{3}, "uid:3");
  CHECK(next.guard_events_evicted("uid:3") == 0);
}

TEST_CASE("guard book: each tenant has its own bucket, refilled at the rate up to the burst", "[pool][guard]") {
  GuardBook book(10, 3);  // 10 per second, 3 at once
  const TenantId a{1};
  const TenantId b{2};
  CHECK(book.admit(a, kT0));
  CHECK(book.admit(a, kT0));
  CHECK(book.admit(a, kT0));
  CHECK_FALSE(book.admit(a, kT0));         // empty
  CHECK(book.admit(b, kT0));               // another tenant is unaffected
  CHECK_FALSE(book.admit(a, kT0 + 50ms));  // half a token
  CHECK(book.admit(a, kT0 + 100ms));       // one token came back
  CHECK_FALSE(book.admit(a, kT0 + 100ms));
  // A long quiet refills to the burst, not beyond.
  for (int i = 0; i < 3; ++i) CHECK(book.admit(a, kT0 + 1h));
  CHECK_FALSE(book.admit(a, kT0 + 1h));
  // A freed tenant's id starts afresh.
  book.forget(a, "uid:1");
  CHECK(book.admit(a, kT0 + 1h));
}

TEST_CASE("guard book: kernel faults per tenant and attributes, forgotten with the tenant", "[pool][guard]") {
  GuardBook book(10, 20);
  const TenantId a{1};
  book.count_fault(a, 0);
  book.count_fault(a, st::kFaultMapsShared);
  book.count_fault(a, st::kFaultMapsShared | st::kFaultGuarded);
  book.count_fault(a, st::kFaultMapsShared);
  const GuardBook::Faults f = book.kernel_faults(a);
  CHECK(f[0] == 1);
  CHECK(f[st::kFaultGuarded] == 0);
  CHECK(f[st::kFaultMapsShared] == 2);
  CHECK(f[st::kFaultMapsShared | st::kFaultGuarded] == 1);
  CHECK(book.kernel_faults(TenantId{2}) == GuardBook::Faults{});
  book.set_faults(TenantId{2}, GuardBook::Faults{1, 2, 3, 4});
  CHECK(book.kernel_faults(TenantId{2})[3] == 4);
  book.forget(a, "uid:1");
  CHECK(book.kernel_faults(a) == GuardBook::Faults{});
}

TEST_CASE("guard book: the canary sweep is due per interval and resumes after the last grant", "[pool][guard]") {
  GuardBook book(10, 20);
  CHECK_FALSE(book.sweep_due(kT0, 0ms));  // 0: at release only
  CHECK(book.sweep_due(kT0, 10s));
  CHECK_FALSE(book.sweep_due(kT0 + 9s, 10s));
  CHECK(book.sweep_due(kT0 + 10s, 10s));
  CHECK(book.sweep_order({30, 10, 20}) == std::vector<std::uint64_t>{10, 20, 30});
  book.swept(20);
  CHECK(book.sweep_order({30, 10, 20}) == std::vector<std::uint64_t>{30, 10, 20});
  book.swept(30);
  CHECK(book.sweep_order({30, 10, 20}) == std::vector<std::uint64_t>{10, 20, 30});  // wraps around
  book.swept(25);  // that grant is gone: the next one after it
  CHECK(book.sweep_order({30, 10, 20}) == std::vector<std::uint64_t>{30, 10, 20});
  CHECK(book.sweep_order({}).empty());
}
