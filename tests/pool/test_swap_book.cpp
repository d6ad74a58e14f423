// Swapping to host memory (docs/swap.md): SwapBook's per-session records and what they mean for
// a GPU's room, without a Node (the swap protocol itself is tested in test_node.cpp).
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "unit_ids.hpp"
#include "vlake/pool/features/swap/swap_book.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace std::chrono_literals;
using namespace vlake::literals;

using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

TEST_CASE("swap book: a session without a record is on the GPU, records are per session", "[pool][swap]") {
  SwapBook book;
  CHECK(book.state(7) == SwapState::none);
  CHECK(book.records().empty());  // looking creates nothing
  book.of(7).state = SwapState::swapped;
  CHECK(book.state(7) == SwapState::swapped);
  CHECK(book.state(8) == SwapState::none);
  book.forget(7);
  CHECK(book.state(7) == SwapState::none);
  CHECK(book.next_id() == 1);
  CHECK(book.next_id() == 2);
  CHECK(std::string(to_string(SwapState::lost)) == "lost (restore failed)");
}

TEST_CASE("swap book: per GPU, what goes out, what is on the host, what restores take back", "[pool][swap]") {
  SwapBook book;
  auto set = [&](std::uint64_t s, SwapState st, DeviceOrdinal d, Bytes bytes, Bytes extra, std::uint64_t for_s) {
    SwapRecord& r = book.of(s);
    r.state = st;
    r.device = d;
    r.bytes = bytes;
    r.extra = extra;
    r.for_session = for_s;
  };
  set(1, SwapState::notified, kGpu0, 100_MiB, 0_MiB, 9);
  set(2, SwapState::checkpointing, kGpu0, 200_MiB, 0_MiB, 9);
  set(3, SwapState::checkpointing, kGpu1, 400_MiB, 0_MiB, 9);
  set(4, SwapState::swapped, kGpu0, 800_MiB, 0_MiB, 0);
  set(5, SwapState::restoring, kGpu0, 16_MiB, 48_MiB, 0);
  set(6, SwapState::lost, kGpu0, 32_MiB, 0_MiB, 0);
  set(7, SwapState::none, kGpu0, 64_MiB, 0_MiB, 9);  // back on the GPU: counts nowhere
  CHECK(book.swapping_out(kGpu0) == 300_MiB);
  CHECK(book.swapping_out(kGpu1) == 400_MiB);
  CHECK(book.on_host(kGpu0) == 800_MiB + 16_MiB + 32_MiB);
  CHECK(book.on_host(kGpu1) == 0_MiB);
  CHECK(book.restoring(kGpu0) == 48_MiB);
  CHECK(book.restoring(kGpu1) == 0_MiB);
  CHECK(book.swapping_for(9) == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(book.swapping_for(4).empty());
}

TEST_CASE("swap book: counted grants served lately count for kRecentGrant, per GPU", "[pool][swap]") {
  SwapBook book;
  book.note_counted(kGpu0, kT0, 100_MiB);
  book.note_counted(kGpu0, kT0 + 1s, 50_MiB);
  book.note_counted(kGpu1, kT0, 10_MiB);
  CHECK(book.recent_counted(kGpu0, kT0 + 1s) == 150_MiB);
  CHECK(book.recent_counted(kGpu0, kT0 + SwapBook::kRecentGrant) == 150_MiB);
  CHECK(book.recent_counted(kGpu0, kT0 + SwapBook::kRecentGrant + 1ms) == 50_MiB);
  CHECK(book.recent_counted(kGpu0, kT0 + 1s + SwapBook::kRecentGrant + 1ms) == 0_MiB);
  CHECK(book.recent_counted(kGpu1, kT0) == 10_MiB);
}
