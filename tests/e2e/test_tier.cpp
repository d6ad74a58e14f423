// The host tier end to end on the simulated driver (docs/swap.md, "Host tier"): an idle
// process's allocation moves to pinned host memory at the same address while the process runs
// on (its reads and kernels reach it there), another tenant gets the GPU memory, and the
// allocation comes back when that tenant frees. What vlaked publishes of the host bytes is
// compared with the simulator's own record of who holds host-located memory.
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "node.hpp"
#include "tenant_process.hpp"

using vlake::e2e::TenantProcess;
using vlake::pooltest::DaemonProcess;

namespace {

const char* kTierYaml =
    "version: 1\n"
    "default: {limit: 100%}\n"
    "namespaces:\n"
    "  - {name: nb, overcommit: true, users: [4401, 4402]}\n";

constexpr std::uint64_t kMiB = 1ull << 20;

// vlaked's figure: bytes of `pid`'s grants on the host tier (its published grant records).
std::uint64_t published_host_bytes(const DaemonProcess& d, pid_t pid) {
  auto s = vlake::pooltest::snapshot(d.state);
  if (!s) return ~0ull;
  std::uint64_t session = 0;
  for (const auto& r : s->sessions) {
    if (r.state != vlake::state::kSessionFree && r.pid == static_cast<std::uint32_t>(pid)) session = r.id;
  }
  std::uint64_t bytes = 0;
  for (const auto& g : s->grants) {
    if (g.state != vlake::state::kGrantFree && g.session == session && g.location == vlake::state::kGrantOnHost) {
      bytes += g.bytes;
    }
  }
  return bytes;
}

// The simulator's figure: host-located memory `pid` holds (imported handles and mappings).
std::uint64_t sim_host_bytes(const DaemonProcess& d, pid_t pid) {
  vlake::sim::NodeObserver observer(d.node);
  vlake::sim::NodeSnapshot snap;
  if (!observer.read(snap)) return ~0ull;
  for (const auto& h : snap.host_holders) {
    if (h.pid == pid) return h.bytes;
  }
  return 0;
}

// Polls `f` until it returns `want` (up to `timeout`); returns its last value.
template <class F>
std::uint64_t poll_until(F f, std::uint64_t want, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::uint64_t v = f();
  while (v != want && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v = f();
  }
  return v;
}

}  // namespace

TEST_CASE("host tier: an idle process's allocation moves to host memory, runs on there, and comes back",
          "[e2e][tier]") {
  DaemonProcess d("tier", kTierYaml);
  REQUIRE(
      d.start({"--swap-idle", "500ms", "--swap-margin", "0", "--host-tier", "1GiB", "--host-tier-piece", "256MiB"}));
  const std::string b_freed = d.dir + "/b-freed";
  // A: 600 MiB of the 1 GiB GPU with a pattern, idle; then, while on the host tier, a read-back
  // and a kernel over the first 64 MiB (16 Mi words); after B frees, the same checks on the GPU.
  TenantProcess a(d,
                  {"init", "alloc:a:600M", "upload:a:7:600M", "sleep:4000", "verify:a:7:600M",
                   "kfill:a:0:16M:0x01010101", "sync", "check:a:64M:1", "verify:a:7:536M:64M", "waitfile:" + b_freed,
                   "sleep:2500", "verify:a:7:500M:100M", "check:a:32M:1", "free:a"},
                  4401, "0", {"VLAKE_LOG=info"});
  REQUIRE(a.wait_line("upload:a:7:600M", 90000)["rc"] == "0");
  // B: 600 MiB as well, which the GPU cannot hold next to A's: A's allocation moves out.
  TenantProcess b(d,
                  {"init", "sleep:1500", "alloc:b:600M", "upload:b:3:600M", "verify:b:3:600M", "waitfile:" + b_freed,
                   "free:b", "sleep:60000"},
                  4402);
  auto balloc = b.wait_line("alloc:b:600M", 30000);
  if (balloc["rc"] != "0") {
    FAIL("B's allocation failed\nA:\n"
         << a.out() << a.err() << "\nB:\n"
         << b.out() << b.err() << "\nvlaked:\n"
         << d.log());
  }
  CHECK(b.wait_line("verify:b:3:600M", 60000)["ok"] == "1");
  // A's 600 MiB are on the host tier: vlaked's figure is exact and the simulator agrees.
  CHECK(poll_until([&] { return published_host_bytes(d, a.pid()); }, 600 * kMiB, std::chrono::seconds(5)) ==
        600 * kMiB);
  CHECK(sim_host_bytes(d, a.pid()) == 600 * kMiB);
  // A runs on while demoted: its data reads back intact, a kernel writes it.
  auto av = a.wait_line("verify:a:7:600M", 30000);
  CHECK(av["rc"] == "0");
  CHECK(av["ok"] == "1");
  CHECK(a.wait_line("check:a:64M:1", 30000)["ok"] == "1");
  CHECK(a.wait_line("verify:a:7:536M:64M", 30000)["ok"] == "1");
  CHECK(published_host_bytes(d, a.pid()) == 600 * kMiB);  // still there: nothing came back meanwhile
  // B frees: A's allocation comes back to the GPU, its contents as A left them.
  { std::ofstream(b_freed).put('1'); }
  CHECK(b.wait_line("free:b", 30000)["rc"] == "0");
  CHECK(poll_until([&] { return published_host_bytes(d, a.pid()); }, 0, std::chrono::seconds(10)) == 0);
  CHECK(poll_until([&] { return sim_host_bytes(d, a.pid()); }, 0, std::chrono::seconds(5)) == 0);
  CHECK(a.wait_line("verify:a:7:500M:100M", 30000)["ok"] == "1");
  CHECK(a.wait_line("check:a:32M:1", 30000)["ok"] == "1");
  CHECK(a.finish() == 0);
  const std::string log = d.log();
  INFO("A at the end:\n" << a.out() << a.err() << "\nvlaked at the end:\n" << log);
  CHECK(log.find("to host memory for session") != std::string::npos);
  CHECK(log.find("moved to host memory on GPU 0") != std::string::npos);
  CHECK(log.find("moved to GPU memory on GPU 0") != std::string::npos);
  CHECK(log.find("swapping out session") == std::string::npos);  // nothing was checkpointed
  CHECK(a.err().find("to host memory in") != std::string::npos);
  CHECK(a.err().find("to GPU memory in") != std::string::npos);
}

TEST_CASE("host tier: an overcommit namespace keeps the pool, its dedup shares and its guard faults", "[e2e][tier]") {
  DaemonProcess d("tierpool",
                  "version: 1\n"
                  "default: {limit: 100%}\n"
                  "namespaces:\n"
                  "  - name: nb\n"
                  "    overcommit: true\n"
                  "    guard: fault\n"
                  "    dedup_domain: nb\n"
                  "    users: [4411, 4412, 4413]\n");
  REQUIRE(d.start({"--host-tier", "256MiB", "--host-tier-piece", "64MiB"}));
  // Two tenants of the namespace upload the same 20 MiB and share its whole chunks: the second
  // merges with the first (pool memory: with the host tier their allocations are not their own
  // driver's, as they would be without it).
  const std::vector<std::string> share = {"init",           "alloc:w:20M",    "upload:w:7:20M",
                                          "share:w:1M:18M", "verify:w:7:20M", "sleep:3000"};
  TenantProcess first(d, share, 4411);
  REQUIRE(first.wait_line("verify:w:7:20M", 60000)["ok"] == "1");
  TenantProcess second(d, share, 4412);
  auto sh = second.wait_line("share:w:1M:18M", 60000);
  INFO("first:\n"
       << first.out() << first.err() << "\nsecond:\n"
       << second.out() << second.err() << "\nvlaked:\n"
       << d.log());
  CHECK(sh["rc"] == "0");
  CHECK(sh["merged"] == std::to_string(16 * kMiB));
  CHECK(second.wait_line("verify:w:7:20M", 60000)["ok"] == "1");
  // A third one overruns its allocation by one element: guard fault mode's layout (the
  // allocation ends at its chunk's end, guard VA after it) makes the kernel fault.
  TenantProcess t(d, {"init", "alloc:a:1M", "layout:a", "kfill:a:0:262145#overrun", "sync", "free:a"}, 4413);
  CHECK(t.finish() == 0);
  INFO("faulting tenant:\n" << t.out() << t.err());
  CHECK(t.line("layout:a")["tail"] == "0");
  CHECK(t.line("sync")["rc"] == "700");  // CUDA_ERROR_ILLEGAL_ADDRESS
  CHECK(t.err().find("reported to vlaked as a kernel fault") != std::string::npos);
  auto s = vlake::pooltest::snapshot(d.state);
  REQUIRE(s);
  CHECK(s->devices[0].dedup_physical_bytes == 16 * kMiB);
  CHECK(s->counters.kernel_faults[vlake::state::kFaultGuarded] == 1);
  CHECK(s->devices[0].counted_bytes == 0);  // nothing went to the processes' own drivers
  CHECK(first.finish() == 0);
  CHECK(second.finish() == 0);
}

TEST_CASE("host tier: vlaked killed in the middle of a move leaves the process's memory mapped and intact",
          "[e2e][tier]") {
  DaemonProcess d("tierkill", kTierYaml);
  const std::vector<std::string> flags = {"--swap-idle", "500ms", "--swap-margin",     "0",
                                          "--host-tier", "1GiB",  "--host-tier-piece", "128MiB"};
  REQUIRE(d.start(flags));
  const std::string restarted = d.dir + "/restarted";
  // A: four 150 MiB allocations with patterns, idle until vlaked was killed and restarted. Its
  // link to host memory runs at 100 MiB/s, so that each allocation's copy lasts 1.5 s and the
  // kill lands between two of them.
  std::vector<std::string> steps = {"init"};
  for (const char* n : {"a", "b", "c", "d"}) {
    steps.push_back(std::string("alloc:") + n + ":150M");
    steps.push_back(std::string("upload:") + n + ":" + std::to_string(n[0]) + ":150M");
  }
  steps.push_back("waitfile:" + restarted);
  steps.push_back("sleep:500");
  for (const char* n : {"a", "b", "c", "d"}) {
    steps.push_back(std::string("verify:") + n + ":" + std::to_string(n[0]) + ":150M");
  }
  for (const char* s : {"kfill:a:0:1M:0x02020202", "sync", "check:a:4M:2", "free:a", "free:b", "free:c", "free:d",
                        "sleep:1000", "alloc:e:64M", "upload:e:5:64M", "verify:e:5:64M", "free:e"}) {
    steps.push_back(s);
  }
  TenantProcess a(d, steps, 4401, "0", {"VLAKE_LOG=info", "VLAKE_SIM_LINK_BANDWIDTH=100MiB"});
  REQUIRE(a.wait_line("upload:d:100:150M", 90000)["rc"] == "0");
  // B asks for 750 MiB after A idled: about three of A's allocations must go.
  TenantProcess b(d, {"init", "sleep:1500", "alloc:b:750M", "sleep:500"}, 4402);
  const auto demoting = [&] { return d.log().find("to host memory for session") != std::string::npos ? 1u : 0u; };
  REQUIRE(poll_until(demoting, 1, std::chrono::seconds(30)) == 1);
  // The first allocation is on the host, the second on its way: vlaked goes.
  std::this_thread::sleep_for(std::chrono::milliseconds(2250));
  const std::string before = d.log();
  d.signal(SIGKILL);
  REQUIRE(d.wait_exit() >= 0);
  REQUIRE(d.start(flags));
  { std::ofstream(restarted).put('1'); }
  INFO("A:\n" << a.out() << a.err() << "\nB:\n" << b.out() << b.err() << "\nvlaked:\n" << d.log());
  CHECK(before.find("moved to host memory on GPU 0") == std::string::npos);  // the kill was mid-move
  // Every allocation reads back as A wrote it, moved or not, and a kernel writes through the
  // same pointer.
  for (const char* n : {"a", "b", "c", "d"}) {
    auto v = a.wait_line(std::string("verify:") + n + ":" + std::to_string(n[0]) + ":150M", 60000);
    CHECK(v["rc"] == "0");
    CHECK(v["ok"] == "1");
  }
  CHECK(a.wait_line("check:a:4M:2", 30000)["ok"] == "1");
  // Some of it was on the host when vlaked went: the hook moved at least one allocation first.
  CHECK(a.err().find("to host memory in") != std::string::npos);
  // Freed, its host memory is gone from the process (the simulator's record), and the new vlaked
  // serves it.
  CHECK(a.wait_line("free:d", 30000)["rc"] == "0");
  CHECK(sim_host_bytes(d, a.pid()) == 0);
  CHECK(a.wait_line("verify:e:5:64M", 30000)["ok"] == "1");
  CHECK(a.finish() == 0);
  CHECK(b.finish() == 0);
}

TEST_CASE("host tier: two processes waiting for memory at once: one is moved while it waits, both are served",
          "[e2e][tier]") {
  DaemonProcess d("tierwait", kTierYaml);
  REQUIRE(d.start({"--swap-idle", "3s", "--swap-margin", "0", "--host-tier", "1GiB", "--host-tier-piece", "256MiB"}));
  const std::string go = d.dir + "/go";
  // Each holds 400 MiB of the 1 GiB GPU with a pattern, then both ask for 400 MiB more at the
  // same moment: neither fits, both wait inside their allocation call, and neither has been
  // idle for --swap-idle when it asks. Once they have waited that long, one is moved while it
  // waits (its waiting thread is outside its hook's gate) and the other is served.
  const std::vector<std::string> env = {"VLAKE_LOG=info", "VLAKE_WAIT=60s"};
  TenantProcess a(d,
                  {"init", "alloc:a:400M", "upload:a:5:400M", "waitfile:" + go, "alloc:a2:400M", "upload:a2:6:400M",
                   "verify:a:5:400M", "verify:a2:6:400M", "free:a2", "free:a"},
                  4401, "0", env);
  REQUIRE(a.wait_line("upload:a:5:400M", 90000)["rc"] == "0");
  TenantProcess b(d,
                  {"init", "alloc:b:400M", "upload:b:3:400M", "waitfile:" + go, "alloc:b2:400M", "upload:b2:4:400M",
                   "verify:b:3:400M", "verify:b2:4:400M", "free:b2", "free:b"},
                  4402, "0", env);
  REQUIRE(b.wait_line("upload:b:3:400M", 90000)["rc"] == "0");
  { std::ofstream(go).put('1'); }
  auto a2 = a.wait_line("alloc:a2:400M", 60000);
  auto b2 = b.wait_line("alloc:b2:400M", 60000);
  INFO("A:\n" << a.out() << a.err() << "\nB:\n" << b.out() << b.err() << "\nvlaked:\n" << d.log());
  CHECK(a2["rc"] == "0");
  CHECK(b2["rc"] == "0");
  // Nothing was lost, wherever each allocation is now.
  CHECK(a.wait_line("verify:a:5:400M", 30000)["ok"] == "1");
  CHECK(a.wait_line("verify:a2:6:400M", 30000)["ok"] == "1");
  CHECK(b.wait_line("verify:b:3:400M", 30000)["ok"] == "1");
  CHECK(b.wait_line("verify:b2:4:400M", 30000)["ok"] == "1");
  CHECK(a.finish() == 0);
  CHECK(b.finish() == 0);
  const std::string log = d.log();
  CHECK(log.find("to host memory for session") != std::string::npos);
  CHECK(log.find("moved to host memory on GPU 0") != std::string::npos);
  CHECK(log.find("got no answer in time") == std::string::npos);  // the waiting process answered
  CHECK(log.find("swapping out session") == std::string::npos);
  CHECK(log.find("out of memory") == std::string::npos);
  CHECK((a.err() + b.err()).find("to host memory in") != std::string::npos);
}

TEST_CASE("a thread frees memory while another waits for memory: the free does not wait, and it serves the wait",
          "[e2e][tier]") {
  DaemonProcess d("waitfree", kTierYaml);
  REQUIRE(d.start({}));
  // B holds 300 MiB and A 400 MiB (x, y) of the 1 GiB GPU; A's z (500 MiB) waits inside its
  // allocation call, holding the connection to vlaked; meanwhile another thread of A frees x (no
  // local reserve: released at once). The Release goes out beside the waiting request: it takes
  // milliseconds, not the wait, and the memory it returns is what z was waiting for.
  TenantProcess b(d, {"init", "alloc:b:300M", "sleep:60000"}, 4406);
  REQUIRE(b.wait_line("alloc:b:300M", 30000)["rc"] == "0");
  TenantProcess a(
      d, {"init", "alloc:x:300M", "alloc:y:100M", "laterfree:x:1500", "alloc:z:500M", "sleep:500", "free:z", "free:y"},
      4405, "0", {"VLAKE_WAIT=60s", "VLAKE_RESERVE=0"});
  auto z = a.wait_line("alloc:z:500M", 30000);
  auto x = a.wait_line("laterfree:x:1500", 30000);
  INFO("A:\n" << a.out() << a.err() << "\nvlaked:\n" << d.log());
  CHECK(x["rc"] == "0");
  CHECK(std::stoi(x["ms"].empty() ? "999999" : x["ms"]) < 1000);
  CHECK(z["rc"] == "0");
  CHECK(a.finish() == 0);
}
