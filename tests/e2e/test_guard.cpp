// Out-of-bounds guards end to end, on the simulated driver: vlaked with `guard:` in the quota
// file, tenant programs under LD_PRELOAD=libvlake-hook.so (fault mode: right-aligned pointers
// and guard VA in the hook, faults reported as kernel faults of a guarded process; canary mode: the daemon's pattern
// in the slack, checked at release).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tenant_process.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace std::chrono_literals;
using namespace vlake::e2e;
using pooltest::DaemonProcess;

namespace {

std::vector<state::GuardEventRecord> events(const state::State& s) {
  std::vector<state::GuardEventRecord> out;
  for (const state::GuardEventRecord* e : state::ring_order(s.guard)) out.push_back(*e);
  return out;
}

std::uint64_t granted_total(const state::State& s) {
  std::uint64_t sum = 0;
  for (const auto& t : s.tenants) {
    if (t.in_use != 0) sum += t.granted[0];
  }
  return sum;
}

std::uint64_t kernel_faults(const state::State& s) {
  std::uint64_t n = 0;
  for (std::uint64_t v : s.counters.kernel_faults) n += v;
  return n;
}

// The tenant's kernel fault count with attribute bits `i` (~0ull: no such tenant).
std::uint64_t tenant_faults(const state::State& s, const std::string& name, std::uint32_t i) {
  for (const auto& t : s.tenants) {
    if (t.in_use != 0 && name == t.name) return t.kernel_faults[i];
  }
  return ~0ull;
}

std::string quota(const std::string& users) { return "version: 1\ndefault:\n  limit: 256MiB\nusers:\n" + users; }

std::string user(int uid, const std::string& guard) {
  return "  - uid: " + std::to_string(uid) + "\n    limit: 256MiB\n    guard: " + guard + "\n";
}

}  // namespace

TEST_CASE("guard fault: a kernel overrun by one element faults, is reported, and spares others", "[e2e]") {
  DaemonProcess d("gfault", quota(user(4301, "fault") + user(4302, "fault")));
  REQUIRE(d.start());
  // The neighbour runs at the same time: allocates, writes with the kernel, waits past the
  // other tenant's fault, and checks its memory and context.
  TenantProcess other(d,
                      {"init", "alloc:b:4M", "fill:b:4M:5", "sleep:800", "kfill:b:0:1048576:0x05050505", "check:b:4M:5",
                       "sync", "free:b"},
                      4302);
  REQUIRE_FALSE(other.wait_line("fill:b:4M:5").empty());
  TenantProcess t(d, {"init", "alloc:a:1M", "layout:a", "kfill:a:0:262145#overrun", "sync", "free:a"}, 4301);
  const int st = t.finish();
  const int other_st = other.finish();
  INFO("faulting tenant:\n"
       << t.out() << t.err() << "\nneighbour:\n"
       << other.out() << other.err() << "\ndaemon log:\n"
       << d.log());
  REQUIRE(exited_ok(st));
  REQUIRE(exited_ok(other_st));
  CHECK(t.line("layout:a")["tail"] == "0");  // ends at its chunk's end: guard VA follows
  CHECK(t.line("kfill:a:0:262145#overrun")["rc"] == "0");
  CHECK(t.line("sync")["rc"] == std::to_string(kIllegalAddress));
  CHECK(t.err().find("vlake: GPU fault (CUDA_ERROR_ILLEGAL_ADDRESS) on GPU 0 in cuCtxSynchronize; "
                     "reported to vlaked as a kernel fault; the newest allocations were: ") != std::string::npos);
  // The neighbour is unaffected.
  CHECK(other.line("check:b:4M:5")["ok"] == "1");
  CHECK(other.line("sync")["rc"] == "0");
  CHECK(other.line("free:b")["rc"] == "0");
  CHECK(other.err().find("GPU fault") == std::string::npos);

  // A kernel fault with guards on: counted as a fault of a guarded process, not as a guard
  // violation (the driver does not say that the guard VA was what the kernel touched).
  const auto s = wait_state(d, [](const state::State& x) { return kernel_faults(x) >= 1; });
  CHECK(s->counters.kernel_faults[state::kFaultGuarded] == 1);
  CHECK(kernel_faults(*s) == 1);
  CHECK(s->counters.guard_violations_fault == 0);
  CHECK(s->counters.guard_violations_canary == 0);
  const auto ev = events(*s);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == static_cast<std::uint32_t>(proto::GuardKind::fault));
  CHECK(ev[0].flags == state::kFaultGuarded);
  CHECK(std::string(ev[0].tenant_name) == "user:4301");
  CHECK(ev[0].device == 0);
  CHECK(ev[0].cuda_status == kIllegalAddress);
  CHECK(std::string(ev[0].call) == "cuCtxSynchronize");
  CHECK(ev[0].suspect_count == 1);
  CHECK(ev[0].requested_bytes == (1u << 20));
  CHECK(ev[0].address == std::strtoull(t.line("alloc:a:1M")["ptr"].c_str(), nullptr, 16));
}

TEST_CASE("kernel fault: a fault in a tenant without guards is a kernel fault and no guard violation", "[e2e]") {
  DaemonProcess d("kfault", quota(user(4305, "off")));
  REQUIRE(d.start());
  // Past the end of a 2 MiB allocation: its mapping ends there (guard off: no guard VA, but the
  // next reserved VA is not mapped), so the kernel's write faults.
  TenantProcess t(d, {"init", "alloc:a:2M", "kfill:a:2097152:1024#past", "sync", "sleep:3000"}, 4305);
  REQUIRE_FALSE(t.wait_line("sync").empty());
  // While the process lives its tenant record (and its per-tenant count) is there.
  const auto s = wait_state(d, [](const state::State& x) { return kernel_faults(x) >= 1; });
  CHECK(tenant_faults(*s, "user:4305", 0) == 1);
  for (std::uint32_t i : {1u, 2u, 3u}) CHECK(tenant_faults(*s, "user:4305", i) == 0);
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  CHECK(t.line("sync")["rc"] == std::to_string(kIllegalAddress));
  CHECK(t.err().find("reported to vlaked as a kernel fault") != std::string::npos);
  CHECK(s->counters.kernel_faults[0] == 1);  // not guarded, maps no shared chunks
  CHECK(kernel_faults(*s) == 1);
  CHECK(s->counters.guard_violations_fault == 0);
  CHECK(s->counters.guard_violations_readonly == 0);
  CHECK(s->counters.guard_violations_canary == 0);
  CHECK(s->counters.guard_violations_readonly_write == 0);
  const auto ev = events(*s);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == static_cast<std::uint32_t>(proto::GuardKind::fault));
  CHECK(ev[0].flags == 0);
  CHECK(ev[0].cuda_status == kIllegalAddress);
  CHECK(std::string(ev[0].call) == "cuCtxSynchronize");
}

TEST_CASE("guard canary: a write into the slack is reported at free with size and offset", "[e2e]") {
  DaemonProcess d("gcanary", quota(user(4311, "canary")));
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "alloc:a:1000", "layout:a", "fill:a:1000:3", "memset:a:1000:8:7", "free:a"}, 4311);
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  CHECK(t.line("layout:a")["tail"] == std::to_string((2u << 20) - 1000));  // chunk start
  CHECK(t.line("memset:a:1000:8:7")["rc"] == "0");
  CHECK(t.line("free:a")["rc"] == "0");
  const auto s = wait_state(d, [](const state::State& x) { return x.counters.guard_violations_canary >= 1; });
  CHECK(s->counters.guard_violations_canary == 1);
  CHECK(s->counters.guard_violations_fault == 0);
  const auto ev = events(*s);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == static_cast<std::uint32_t>(proto::GuardKind::canary));
  CHECK(std::string(ev[0].tenant_name) == "user:4311");
  CHECK(ev[0].requested_bytes == 1000);
  CHECK(ev[0].first_bad_offset == 1000);
}

TEST_CASE("guards: no false alarm in a long random alloc/write-inside/free run", "[e2e]") {
  const std::string mode = GENERATE(std::string("canary"), std::string("fault"));
  INFO("guard: " << mode);
  DaemonProcess d("gnoise-" + mode, quota(user(4321, mode)));
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "kstress:300:600K", "alloc:x:3000", "fill:x:3000:9", "free:x"}, 4321);
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  auto k = t.line("kstress:300:600K");
  CHECK(k["rc"] == "0");
  CHECK(k["errors"] == "0");
  CHECK(k["mismatches"] == "0");
  CHECK(k["sync"] == "0");
  CHECK(t.line("fill:x:3000:9")["ok"] == "1");
  CHECK(t.err().find("GPU fault") == std::string::npos);
  // Every release has been checked once nothing is granted any more.
  const auto s = wait_state(d, [](const state::State& x) { return granted_total(x) == 0; });
  CHECK(granted_total(*s) == 0);
  CHECK(s->counters.guard_violations_fault == 0);
  CHECK(s->counters.guard_violations_canary == 0);
  CHECK(kernel_faults(*s) == 0);
  CHECK(events(*s).empty());
}
