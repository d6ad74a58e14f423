// Parked grants (docs/pool.md, "Pressure protocol"): ParkingLot's rules of when a retry is due,
// without a Node.
#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

#include "unit_ids.hpp"
#include "vlake/contracts/codec.hpp"
#include "vlake/pool/features/parking/parking_lot.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace std::chrono_literals;

namespace {

using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

proto::GrantRequest request(std::uint64_t bytes) {
  proto::GrantRequest m = proto::make<proto::GrantRequest>(7);
  m.bytes = bytes;
  return m;
}

}  // namespace

TEST_CASE("parking: nothing parked is never due, whatever came back", "[pool][parking]") {
  ParkingLot lot;
  lot.memory_returned();
  CHECK_FALSE(lot.due(kT0 + 1h));
  CHECK_FALSE(lot.next_wakeup().has_value());
  lot.park(1, 10, request(1 << 20), kT0, 500ms, {}, false);
  // memory_returned() before anything was parked does not count.
  CHECK_FALSE(lot.due(kT0));
}

TEST_CASE("parking: a retry is due at the next ask, the deadline, or once memory came back", "[pool][parking]") {
  ParkingLot lot;
  lot.park(1, 10, request(1 << 20), kT0, 2000ms, {20, 21}, false);
  const ParkedGrant& p = lot.grants().front();
  CHECK(p.deadline == kT0 + 2000ms);
  CHECK(p.next_ask == kT0 + ParkingLot::kAskAgain);
  CHECK(p.round_at == kT0);
  CHECK(p.asked == std::vector<std::uint64_t>{20, 21});
  CHECK(lot.next_wakeup() == kT0 + ParkingLot::kAskAgain);
  CHECK_FALSE(lot.due(kT0 + ParkingLot::kAskAgain - 1ms));
  CHECK(lot.due(kT0 + ParkingLot::kAskAgain));
  lot.memory_returned();
  CHECK(lot.due(kT0));
  // A retry takes every grant and clears the flag; one that still waits comes back.
  std::vector<ParkedGrant> todo = lot.begin_retry();
  REQUIRE(todo.size() == 1);
  CHECK(lot.empty());
  ParkedGrant again = todo.front();
  again.next_ask = kT0 + 5000ms;  // later than the deadline: the deadline wakes it
  lot.park_again(again);
  CHECK_FALSE(lot.due(kT0 + 1000ms));
  CHECK(lot.next_wakeup() == kT0 + 2000ms);
  CHECK(lot.due(kT0 + 2000ms));
}

TEST_CASE("parking: retry_soon makes the next retry due even for the grant parking now", "[pool][parking]") {
  ParkingLot lot;
  lot.retry_soon();
  lot.park(1, 10, request(1 << 20), kT0, 500ms, {}, false);
  CHECK(lot.due(kT0));
  (void)lot.begin_retry();
  lot.park(1, 10, request(1 << 20), kT0, 500ms, {}, false);
  CHECK_FALSE(lot.due(kT0));
}

TEST_CASE("parking: grants are kept oldest first and found by session", "[pool][parking]") {
  ParkingLot lot;
  lot.park(1, 10, request(1), kT0, 500ms, {}, false);
  lot.park(2, 11, request(2), kT0 + 1ms, 500ms, {}, true);
  lot.park(1, 10, request(3), kT0 + 2ms, 500ms, {}, false);
  CHECK(lot.size() == 3);
  REQUIRE(lot.of_session(10) != nullptr);
  CHECK(lot.of_session(10)->req.bytes == 1);  // the oldest
  REQUIRE(lot.of_session(11) != nullptr);
  CHECK(lot.of_session(11)->same_namespace);
  CHECK(lot.of_session(12) == nullptr);
  const std::vector<ParkedGrant> todo = lot.begin_retry();
  REQUIRE(todo.size() == 3);
  CHECK(todo[0].req.bytes == 1);
  CHECK(todo[1].req.bytes == 2);
  CHECK(todo[2].req.bytes == 3);
}

TEST_CASE("parking: asks again after kAskAgain, a new round once everyone was asked", "[pool][parking]") {
  ParkingLot lot;
  lot.park(1, 10, request(1), kT0, 5000ms, {}, false);
  const ParkedGrant& p = lot.grants().front();
  CHECK_FALSE(ParkingLot::ask_due(p, kT0 + ParkingLot::kAskAgain - 1ms));
  CHECK(ParkingLot::ask_due(p, kT0 + ParkingLot::kAskAgain));
  // Nobody was asked yet: no round to renew.
  CHECK_FALSE(ParkingLot::new_round_due(p, kT0 + ParkingLot::kNewRound));
  ParkedGrant asked = p;
  asked.asked = {20};
  CHECK_FALSE(ParkingLot::new_round_due(asked, kT0 + ParkingLot::kNewRound - 1ms));
  CHECK(ParkingLot::new_round_due(asked, kT0 + ParkingLot::kNewRound));
  std::vector<PressureNote> notes(2);
  notes[0].session = 20;
  notes[1].session = 21;
  CHECK(asked_of(notes) == std::vector<std::uint64_t>{20, 21});
}

TEST_CASE("parking: a release retries only the grants the memory it frees could serve", "[pool][parking]") {
  ParkingLot lot;
  // GPU 0: 64 MiB grants of tenants 1..8 (8 each), one of 2 MiB; GPU 1: one of 4 MiB.
  for (std::uint32_t t = 1; t <= 8; ++t) {
    for (int i = 0; i < 8; ++i) {
      lot.park(t, t, request(64 << 20), kT0, 600000ms, {}, false, TenantId{t}, DeviceOrdinal{0}, Bytes{64 << 20});
    }
  }
  lot.park(20, 20, request(2 << 20), kT0, 600000ms, {}, false, TenantId{20}, DeviceOrdinal{0}, Bytes{2 << 20});
  lot.park(21, 21, request(4 << 20), kT0, 600000ms, {}, false, TenantId{21}, DeviceOrdinal{1}, Bytes{4 << 20});
  CHECK(lot.size() == 66);
  CHECK(lot.parked_of(TenantId{3}) == 8);
  CHECK(lot.parked_of(TenantId{9}) == 0);
  // 8 MiB came back on GPU 0: only the 2 MiB grant fits; GPU 1 has nothing.
  lot.memory_returned();
  std::vector<ParkedGrant> todo = lot.begin_retry(kT0 + 1ms, {Bytes{8 << 20}, Bytes{0}});
  REQUIRE(todo.size() == 1);
  CHECK(todo[0].session == 20);
  CHECK(lot.examined() == 1);
  CHECK(lot.size() == 65);
  CHECK(lot.of_session(20) == nullptr);
  lot.park_again(todo[0]);
  // 130 MiB: the 2 MiB and two 64 MiB grants (smallest first, while they add up), oldest first.
  lot.memory_returned();
  todo = lot.begin_retry(kT0 + 2ms, {Bytes{130 << 20}, Bytes{0}});
  REQUIRE(todo.size() == 3);
  CHECK(todo[0].session == 1);
  CHECK(todo[1].session == 1);
  CHECK(todo[2].session == 20);
  CHECK(lot.examined() == 4);
  for (ParkedGrant& p : todo) lot.park_again(std::move(p));
  // Without memory coming back nothing is retried before the first ask is due; then all are.
  CHECK_FALSE(lot.due(kT0 + 3ms));
  CHECK(lot.begin_retry(kT0 + 3ms, {Bytes{1ull << 40}, Bytes{1ull << 40}}).empty());
  CHECK(lot.next_wakeup() == kT0 + ParkingLot::kAskAgain);
  CHECK(lot.begin_retry(kT0 + ParkingLot::kAskAgain, {Bytes{0}, Bytes{0}}).size() == 66);
  CHECK(lot.empty());
  CHECK(lot.parked_of(TenantId{3}) == 0);
}
