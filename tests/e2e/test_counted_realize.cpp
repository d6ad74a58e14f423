// Counted grants are measured (docs/swap.md, "Counted grants are measured"), end to end on the
// simulated driver and its NVML: a counted grant its process never allocates is revoked, the
// idle process moved to host memory for it comes back without waiting for its next call, and
// the same session's next counted grants move nobody out.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "harness.hpp"
#include "tenant_process.hpp"

using vlake::e2e::TenantProcess;
using vlake::pooltest::DaemonProcess;
using vlake::pooltest::Helper;
using vlake::pooltest::mib;
using vlake::pooltest::num;
namespace st = vlake::state;

#ifdef VLAKE_SIM_NVML_LIB
namespace {

const char* kRealizeYaml =
    "version: 1\n"
    "default: {limit: 100%}\n"
    "namespaces:\n"
    "  - {name: nb, overcommit: true, users: [4311, 4312]}\n";

// The swap state of the session of `pid` (kSwapNone when it has none).
std::uint32_t swap_of(const st::State& s, pid_t pid) {
  for (const st::SessionRecord& r : s.sessions) {
    if (r.state != st::kSessionFree && r.pid == static_cast<std::uint32_t>(pid)) return r.swap;
  }
  return st::kSwapNone;
}

std::uint64_t used_of(const st::State& s, const std::string& tenant) {
  const st::TenantRecord* t = vlake::pooltest::tenant(s, tenant);
  return t == nullptr ? 0 : t->granted[0];
}

}  // namespace

TEST_CASE("overcommit: a counted grant never used is revoked and the idle process moved out for it comes back",
          "[e2e][swap][counted]") {
  DaemonProcess d("countedrealize", kRealizeYaml);
  const auto window = std::chrono::seconds(2);
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50", "--swap-idle", "500ms", "--swap-margin",
                   "0", "--counted-realize", "2s"}));
  const std::string go = d.dir + "/victim-go";
  // The victim: 600 MiB of the 1 GiB GPU with a pattern, then idle until the test says. The
  // attacker asks only once the victim has slept a second: its hook answers a swap-out only when
  // its threads used under a fifth of a CPU over the last 500 ms (docs/swap.md), and the upload's
  // CPU time may still be inside that window when vlaked (which judges idleness by CUDA calls)
  // already finds it idle.
  TenantProcess victim(
      d, {"init", "alloc:a:600M", "upload:a:7:64M", "sleep:1000", "waitfile:" + go, "verify:a:7:64M", "free:a"}, 4311);
  const bool uploaded = victim.wait_line("upload:a:7:64M")["rc"] == "0";
  const bool slept = victim.wait_line("sleep:1000")["rc"] == "0";
  INFO("victim:\n" << victim.out() << victim.err() << "\nvlaked:\n" << d.log());
  REQUIRE(uploaded);
  REQUIRE(slept);
  // The attacker speaks the protocol itself: counted grants it never allocates.
  Helper attacker(d.node, 4312, 0);
  attacker.ok("connect " + d.socket);
  // Served once the victim is on the host: its checkpoint copies 600 MiB, which takes seconds
  // under a sanitizer on 2 loaded cores.
  attacker.ok("replytimeout 120000");
  auto g = attacker.ok("grant " + mib(600) + " counted", std::chrono::seconds(150));
  const auto served = std::chrono::steady_clock::now();
  INFO("vlaked:\n" << d.log() << "\nvictim:\n" << victim.out() << victim.err());
  REQUIRE(num(g, "status") == 0);
  // vlaked made room for it: the idle victim went to host memory.
  CHECK(d.log().find("swapping out session") != std::string::npos);
  CHECK(st::swapped_out(swap_of(*vlake::e2e::snapshot(d), victim.pid())));

  // Never allocated: revoked within the window (and a generous margin), the attacker's tenant
  // no longer charged, and the victim back on the GPU while it still sleeps.
  const auto revoked = vlake::e2e::wait_state(d, [&](const st::State& s) { return used_of(s, "nb/user:4312") == 0; });
  const auto took = std::chrono::steady_clock::now() - served;
  CHECK(used_of(*revoked, "nb/user:4312") == 0);
  CHECK(took < window + std::chrono::seconds(10));
  CHECK(d.log().find("revoked: NVML shows its process holding 0 MiB of the 600 MiB") != std::string::npos);
  CHECK(vlake::pooltest::eventually([&] { return swap_of(*vlake::e2e::snapshot(d), victim.pid()) == st::kSwapNone; },
                                    30000));
  CHECK(d.log().find("what it was moved out for is gone") != std::string::npos);

  // Its next counted grant moves nobody out: it is served at once, its driver decides.
  g = attacker.ok("grant " + mib(600) + " counted", std::chrono::seconds(150));
  CHECK(num(g, "status") == 0);
  CHECK(d.log().find("nobody is moved out for it") != std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(swap_of(*vlake::e2e::snapshot(d), victim.pid()) == st::kSwapNone);

  // The victim wakes up: its data is intact, it never waited for a restore.
  std::ofstream(go).put('\n');
  auto verify = victim.wait_line("verify:a:7:64M", 30000);
  CHECK(verify["rc"] == "0");
  CHECK(verify["ok"] == "1");
  CHECK(victim.finish() == 0);
}
#endif
