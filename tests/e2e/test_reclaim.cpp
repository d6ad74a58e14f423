// Reclaim that trusts measurements, not claims (docs/pool.md, "Claims and measurements"), end to
// end on the simulated driver: sessions that say a framework gives their memory back and never
// do cannot keep a waiting grant from reaching a session that does.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tenant_process.hpp"

using vlake::e2e::TenantProcess;
using vlake::pooltest::DaemonProcess;
using vlake::pooltest::Helper;
using vlake::pooltest::kWholeGpuConfig;
using vlake::pooltest::mib;
using vlake::pooltest::num;

TEST_CASE("reclaim: 16 lying sessions of 8 uids do not keep a grant from the honest session's cache",
          "[e2e][reclaim]") {
  DaemonProcess d("reclaimliars", kWholeGpuConfig);
  const auto deadline = std::chrono::seconds(1);
  REQUIRE(d.start({"--pressure-wait-ms", "30000", "--reclaim-deadline", "1s"}));
  // 16 liars, two per uid 60001..60008: 32 MiB each, and a reclaim callback they say they have.
  std::vector<std::unique_ptr<Helper>> liars;
  for (int i = 0; i < 16; ++i) {
    auto h = std::make_unique<Helper>(d.node, 60001 + i / 2, 0);
    h->ok("connectp " + d.socket);
    REQUIRE(num(h->ok("grant " + mib(32)), "status") == 0);
    h->ok("reserve 0 0 reclaim");
    liars.push_back(std::move(h));
  }
  // The honest session (hooked, uid 60009): 256 MiB that its framework frees when asked.
  TenantProcess honest(d, {"init", "alloc:a:256M", "reclaim:a", "reclaimwait:60000", "sleep:500"}, 60009);
  REQUIRE(honest.wait_line("reclaim:a")["rc"] == "0");
  // vlaked knows its callback (the hook reports it off the allocation path).
  REQUIRE(vlake::pooltest::eventually(
      [&] {
        auto s = vlake::e2e::snapshot(d);
        for (const auto& r : s->sessions) {
          if (r.pid == static_cast<std::uint32_t>(honest.pid()) && (r.flags & vlake::state::kSessionReclaim) != 0) {
            return true;
          }
        }
        return false;
      },
      20000));
  // The rest of the GPU is taken by a program outside vlake.
  Helper filler(d.node);
  filler.ok("own " + std::to_string((1ULL << 30) - num(filler.ok("meminfo"), "used")));
  Helper req(d.node, 60010, 0);
  req.ok("connect " + d.socket);

  // 128 MiB: the first asks believe the claims (four liars); they give nothing within the
  // deadline, and every other session, the honest one included, is asked at once.
  const auto start = std::chrono::steady_clock::now();
  const auto g = req.ok("grant " + mib(128));
  const auto took = std::chrono::steady_clock::now() - start;
  INFO("vlaked:\n" << d.log() << "\nhonest:\n" << honest.out() << honest.err());
  CHECK(num(g, "status") == 0);
  CHECK(took < 2 * deadline);
  auto asked = honest.wait_line("reclaimwait:60000", 10000);
  CHECK(asked["count"] == "1");
  CHECK(asked["freed_rc"] == "0");
  CHECK(d.log().find("gave nothing back within 1000 ms") != std::string::npos);
  CHECK(honest.finish() == 0);
}
