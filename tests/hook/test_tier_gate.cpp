// The host tier's entry gate (hook/src/tier/gate.hpp): threads inside a hooked call hold a move
// off until they leave, threads entering while it is closed wait until it opens, nested calls
// never wait, and a thread that stays inside turns the move down.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "gate.hpp"
#include "swap.hpp"

using namespace std::chrono_literals;
namespace tier = vlake::hook::tier;

TEST_CASE("tier gate: a move waits for the threads inside a call, and threads entering wait for it", "[hook][tier]") {
  REQUIRE_FALSE(tier::closed());
  std::atomic<bool> inside{false};
  std::atomic<bool> leave{false};
  std::thread in_call([&] {
    const tier::EntryMark mark;
    inside = true;
    while (!leave) std::this_thread::sleep_for(1ms);
  });
  while (!inside) std::this_thread::sleep_for(1ms);
  // It stays inside: the drain gives up after its timeout and the gate is open again.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(tier::close_and_drain(100ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
  CHECK_FALSE(tier::closed());
  // It leaves while the drain waits: the drain succeeds with the gate closed.
  std::thread leaver([&] {
    std::this_thread::sleep_for(50ms);
    leave = true;
  });
  CHECK(tier::close_and_drain(5000ms));
  CHECK(tier::closed());
  leaver.join();
  in_call.join();
  // A thread entering now waits at the outermost call until the gate opens.
  std::atomic<bool> entered{false};
  std::thread late([&] {
    const tier::EntryMark mark;
    entered = true;
  });
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(entered);
  // The worker (exempt) never waits at its own gate, nested calls included.
  vlake::hook::t_gate_exempt = true;
  {
    const tier::EntryMark outer;
    const tier::EntryMark nested;
  }
  vlake::hook::t_gate_exempt = false;
  tier::open();
  late.join();
  CHECK(entered);
  CHECK_FALSE(tier::closed());
}

TEST_CASE("tier gate: a thread waiting at the closed gate does not hold a move off", "[hook][tier]") {
  REQUIRE(tier::close_and_drain(1000ms));
  std::atomic<int> through{0};
  std::thread a([&] {
    const tier::EntryMark mark;
    ++through;
  });
  std::thread b([&] {
    const tier::EntryMark mark;
    ++through;
  });
  std::this_thread::sleep_for(50ms);
  tier::open();
  // Closed again while they may be entering: whoever got in first leaves, nobody is stuck inside.
  CHECK(tier::close_and_drain(2000ms));
  tier::open();
  a.join();
  b.join();
  CHECK(through == 2);
}
