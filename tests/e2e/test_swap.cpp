// Swapping an idle process to host memory and back (docs/swap.md), end to end on the simulated
// driver: vlaked checkpoints it with the driver's checkpoint API (the simulator's), another
// tenant gets the memory, and the idle one's next CUDA call restores it with its data intact.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <string>

#include "harness.hpp"
#include "tenant_process.hpp"

using vlake::e2e::TenantProcess;
using vlake::pooltest::DaemonProcess;

namespace {

const char* kSwapYaml =
    "version: 1\n"
    "default: {limit: 100%}\n"
    "namespaces:\n"
    "  - {name: nb, overcommit: true, users: [4301, 4302]}\n";

}  // namespace

TEST_CASE("overcommit: an idle process is swapped out for another and comes back intact on its next call",
          "[e2e][swap]") {
  DaemonProcess d("swap", kSwapYaml);
  REQUIRE(d.start({"--swap-idle", "500ms", "--swap-margin", "0"}));
  // A: 600 MiB of the 1 GiB GPU with a pattern, then idle (no CUDA call) for a while.
  TenantProcess a(d, {"init", "alloc:a:600M", "upload:a:7:600M", "sleep:6000", "verify:a:7:600M", "free:a"}, 4301, "0",
                  {"VLAKE_LOG=info"});
  REQUIRE(a.wait_line("upload:a:7:600M", 90000)["rc"] == "0");  // 600 MiB: slow under ASan
  // B: 600 MiB as well, which the GPU cannot hold next to A's: vlaked moves A to the host. B
  // frees and stays until A is back: were B's process to end first, vlaked would bring A back
  // unasked (what A was moved out for is gone), and A's call would find it back already.
  const std::string a_back = d.dir + "/a-back";
  TenantProcess b(
      d, {"init", "sleep:1500", "alloc:b:600M", "upload:b:3:600M", "verify:b:3:600M", "free:b", "waitfile:" + a_back},
      4302);
  auto balloc = b.wait_line("alloc:b:600M", 30000);
  INFO("A:\n" << a.out() << a.err() << "\nB:\n" << b.out() << b.err() << "\nvlaked:\n" << d.log());
  CHECK(balloc["rc"] == "0");
  CHECK(b.wait_line("verify:b:3:600M", 60000)["ok"] == "1");
  CHECK(b.wait_line("free:b", 30000)["rc"] == "0");
  // A wakes up: its first call (the read-back) brings it back, its 600 MiB intact.
  auto averify = a.wait_line("verify:a:7:600M", 30000);
  CHECK(averify["rc"] == "0");
  CHECK(averify["ok"] == "1");
  CHECK(a.finish() == 0);
  { std::ofstream(a_back).put('1'); }  // B may go
  CHECK(b.finish() == 0);
  const std::string log = d.log();
  INFO("A at the end:\n" << a.out() << a.err() << "\nvlaked at the end:\n" << log);
  CHECK(log.find("swapping out session") != std::string::npos);
  CHECK(log.find("is on the host") != std::string::npos);
  CHECK(log.find("is back on GPU 0") != std::string::npos);
  CHECK(a.err().find("moving this idle process to host memory") != std::string::npos);
  CHECK(a.err().find("back on the GPU after") != std::string::npos);
}

TEST_CASE("overcommit: with nobody idle nobody is swapped and an allocation waits for memory", "[e2e][swap]") {
  DaemonProcess d("swapbusy", kSwapYaml);
  // Idle means no CUDA call started for this long: 10 minutes, so that A's upload (one call that
  // a sanitizer build can stretch past 30 s) never makes it idle.
  REQUIRE(d.start({"--swap-idle", "10m", "--swap-margin", "0"}));
  TenantProcess a(d, {"init", "alloc:a:600M", "upload:a:7:600M", "sleep:3000", "verify:a:7:600M", "free:a"}, 4301);
  REQUIRE(a.wait_line("upload:a:7:600M", 90000)["rc"] == "0");  // 600 MiB: slow under ASan
  // 424 MiB free and A not idle: B's 600 MiB wait (an overcommit tenant waits at least 2 minutes)
  // until A frees its memory.
  const auto start = std::chrono::steady_clock::now();
  TenantProcess b(d, {"init", "alloc:b:600M", "upload:b:3:600M", "verify:b:3:600M"}, 4302);
  auto balloc = b.wait_line("alloc:b:600M", 60000);
  const auto waited = std::chrono::steady_clock::now() - start;
  INFO("B:\n" << b.out() << b.err() << "\nvlaked:\n" << d.log());
  CHECK(balloc["rc"] == "0");
  CHECK(waited >= std::chrono::milliseconds(2000));
  CHECK(a.wait_line("verify:a:7:600M", 30000)["ok"] == "1");
  CHECK(b.wait_line("verify:b:3:600M", 60000)["ok"] == "1");
  CHECK(d.log().find("swapping out session") == std::string::npos);
  CHECK(d.log().find("wait for room") != std::string::npos);
}
