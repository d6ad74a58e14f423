// Dedup of read-only chunks (docs/dedup.md) end to end on the simulated driver: a real vlaked,
// tenant programs (tests/hook/tenant.cpp) under LD_PRELOAD=libvlake-hook.so as separate uids,
// each uploading "weights" and calling vlake_share_readonly through the hook.
//
// Layout used throughout (G = 2 MiB): an allocation of 20 MiB, shared range [1 MiB, 19 MiB):
// whole chunks [2 MiB, 18 MiB) = 8 chunks are shared; the partial edge chunks [0, 2 MiB) and
// [18 MiB, 20 MiB) stay private (4 MiB copied into private handles).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dedup_quota.hpp"
#include "tenant_process.hpp"
#include "vlake/common/chunk_hash.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/share.h"

using namespace vlake;
using namespace std::chrono_literals;
using namespace vlake::e2e;
using pooltest::DaemonProcess;

namespace {

constexpr std::uint64_t kAlloc = 20 * MiB;
constexpr std::uint64_t kShared = 16 * MiB;  // whole chunks of [1 MiB, 19 MiB)
constexpr std::uint64_t kEdges = 4 * MiB;    // private: [0, 2 MiB) and [18 MiB, 20 MiB)
constexpr int kInvalidValue = 1;

// Physical bytes the pool has out of its free list (grants' private handles + shared chunks).
std::uint64_t physical(const state::State& s) { return s.devices[0].pool_bytes - s.devices[0].free_bytes; }

// Every uid tenant in one dedup trust domain: they share chunks across tenants.
std::string quota() { return "version: 1\ndefault:\n  limit: 256MiB\n  dedup_domain: shared\n"; }

std::vector<std::string> load_and_share(std::uint64_t seed) {
  return {"init", "alloc:w:20M", "upload:w:" + std::to_string(seed) + ":20M", "share:w:1M:18M",
          "verify:w:" + std::to_string(seed) + ":20M"};
}

std::uint64_t field(const std::map<std::string, std::string>& kv, const std::string& k) {
  auto it = kv.find(k);
  return it == kv.end() ? ~0ull : std::strtoull(it->second.c_str(), nullptr, 10);
}

}  // namespace

TEST_CASE("dedup: K tenants upload identical weights and share them", "[dedup]") {
  const int k = GENERATE(2, 4);
  INFO("tenants: " << k);
  DaemonProcess d("dedup-k" + std::to_string(k), quota());
  REQUIRE(d.start());
  std::vector<std::unique_ptr<TenantProcess>> ts;
  const std::string go = d.dir + "/go";
  for (int i = 0; i < k; ++i) {
    auto steps = load_and_share(7);
    // Hold the memory until every tenant has shared and the test has looked (`go`), then check
    // again.
    steps.push_back("waitfile:" + go);
    steps.push_back("verify:w:7:20M#after");
    ts.push_back(std::make_unique<TenantProcess>(d, steps, 4400 + i));
  }
  std::uint64_t merged = 0;
  for (auto& t : ts) {
    const auto kv = t->wait_line("verify:w:7:20M ", 60000);
    INFO(t->out() << t->err() << "\ndaemon log:\n" << d.log());
    const auto sh = t->wait_line("share:w:1M:18M");
    CHECK(sh.at("rc") == "0");
    CHECK(field(sh, "shared") == kShared);
    CHECK(field(sh, "copied") == kEdges);
    CHECK(field(sh, "chunk") == 2 * MiB);
    merged += field(sh, "merged");
    CHECK(kv.at("ok") == "1");
  }
  // The first tenant's chunks became the shared ones; every other tenant merged all of its.
  CHECK(merged == static_cast<std::uint64_t>(k - 1) * kShared);
  const auto s = snapshot(d);
  INFO("daemon log:\n" << d.log());
  const std::uint64_t kk = static_cast<std::uint64_t>(k);
  CHECK(s->devices[0].dedup_physical_bytes == kShared);
  CHECK(s->devices[0].dedup_logical_bytes == kk * kShared);
  // Physical use: K private edge pairs + one copy of the shared chunks, i.e. (K-1) x 16 MiB less
  // than K unshared replicas.
  CHECK(physical(*s) == kk * kEdges + kShared);
  CHECK(kk * kAlloc - physical(*s) == (kk - 1) * kShared);
  // Each tenant is still charged its logical bytes.
  CHECK(s->devices[0].granted_bytes == kk * kAlloc);
  for (int i = 0; i < k; ++i) {
    const auto* t = pooltest::tenant(*s, "uid:" + std::to_string(4400 + i));
    REQUIRE(t != nullptr);
    CHECK(t->granted[0] == kAlloc);
  }
  { std::ofstream{go}; }
  for (auto& t : ts) {
    REQUIRE(exited_ok(t->finish()));
    CHECK(t->line("verify:w:7:20M#after").at("ok") == "1");
  }
  // Every tenant exited: every chunk is back in the pool.
  const auto after =
      wait_state(d, [](const state::State& x) { return x.devices[0].dedup_physical_bytes == 0 && physical(x) == 0; });
  CHECK(after->devices[0].dedup_physical_bytes == 0);
  CHECK(after->devices[0].dedup_logical_bytes == 0);
  CHECK(physical(*after) == 0);
  CHECK(after->devices[0].granted_bytes == 0);
}

TEST_CASE("dedup: tenants share only inside their trust domain", "[dedup]") {
  // team-a's two tenants trust each other; team-b is another domain; `loner` declares none
  // (it dedups only with its own processes).
  DaemonProcess d("dedup-domains",
                  "version: 1\n"
                  "default:\n"
                  "  limit: 256MiB\n"
                  "namespaces:\n"
                  "  - {name: team-a, dedup_domain: a, users: [4470, 4471]}\n"
                  "  - {name: team-b, dedup_domain: b, users: [4472]}\n"
                  "  - {name: loner, users: [4473]}\n");
  REQUIRE(d.start());
  std::vector<std::unique_ptr<TenantProcess>> ts;
  std::vector<std::uint64_t> merged;
  // Every tenant stays alive until the four have shared and the figures are read: `go` is
  // created then (waitfile waits up to 30 s, whatever a sanitizer build makes of the starts).
  const std::string go = d.dir + "/go";
  for (int i = 0; i < 4; ++i) {
    auto steps = load_and_share(13);
    steps.push_back("waitfile:" + go);
    ts.push_back(std::make_unique<TenantProcess>(d, steps, 4470 + i));
    // One after the other: the first of each domain creates the chunks.
    const auto sh = ts.back()->wait_line("share:w:1M:18M", 60000);
    INFO(ts.back()->out() << ts.back()->err() << "\ndaemon log:\n" << d.log());
    REQUIRE(sh.count("rc") == 1);
    CHECK(sh.at("rc") == "0");
    CHECK(field(sh, "shared") == kShared);
    merged.push_back(field(sh, "merged"));
  }
  CHECK(merged == std::vector<std::uint64_t>{0, kShared, 0, 0});
  const auto s = snapshot(d);
  CHECK(s->devices[0].dedup_physical_bytes == 3 * kShared);  // one copy per domain
  CHECK(s->devices[0].dedup_logical_bytes == 4 * kShared);
  { std::ofstream{go}; }
  for (auto& t : ts) REQUIRE(exited_ok(t->finish()));
}

TEST_CASE("dedup: a write into shared chunks fails for the writer only, edges stay writable", "[dedup]") {
  DaemonProcess d("dedup-write", quota());
  REQUIRE(d.start());
  auto steps = load_and_share(11);
  steps.insert(steps.end(), {"sleep:2500", "verify:w:11:20M#after", "kfill:w:0:16", "sync"});
  TenantProcess keeper(d, steps, 4410);
  REQUIRE_FALSE(keeper.wait_line("share:w:1M:18M").empty());
  auto wsteps = load_and_share(11);
  wsteps.insert(wsteps.end(), {
                                  "memset:w:0:16:1",         // private edge chunk: fine
                                  "memset:w:19922944:16:1",  // 19 MiB: private edge chunk
                                  "memset:w:4194304:16:1",   // 4 MiB: shared, copy engine refuses
                                  "kfill:w:4194304:16",      // 4 MiB: shared, the kernel faults
                                  "sync",
                              });
  TenantProcess writer(d, wsteps, 4411);
  REQUIRE(exited_ok(writer.finish()));
  REQUIRE(exited_ok(keeper.finish()));
  INFO("writer:\n"
       << writer.out() << writer.err() << "\nkeeper:\n"
       << keeper.out() << keeper.err() << "\ndaemon log:\n"
       << d.log());
  CHECK(writer.line("share:w:1M:18M").at("rc") == "0");
  CHECK(writer.line("memset:w:0:16:1").at("rc") == "0");
  CHECK(writer.line("memset:w:19922944:16:1").at("rc") == "0");
  CHECK(writer.line("memset:w:4194304:16:1").at("rc") == std::to_string(kInvalidValue));
  CHECK(writer.line("sync").at("rc") == std::to_string(kIllegalAddress));
  // The keeper's data and context are intact.
  CHECK(keeper.line("verify:w:11:20M#after").at("ok") == "1");
  CHECK(keeper.line("sync").at("rc") == "0");
  CHECK(keeper.err().find("GPU fault") == std::string::npos);
  // The kernel's write: a kernel fault of a process that maps shared chunks, never claimed to
  // be a write into them (the driver does not say). The memset: a refused readonly_write.
  const auto s = wait_state(d, [](const state::State& x) {
    return x.counters.kernel_faults[state::kFaultMapsShared] >= 1 && x.counters.guard_violations_readonly_write >= 1;
  });
  CHECK(s->counters.kernel_faults[state::kFaultMapsShared] == 1);
  CHECK(s->counters.kernel_faults[0] + s->counters.kernel_faults[state::kFaultGuarded] +
            s->counters.kernel_faults[state::kFaultGuarded | state::kFaultMapsShared] ==
        0);
  CHECK(s->counters.guard_violations_readonly_write == 1);
  CHECK(s->counters.guard_violations_readonly == 0);
  CHECK(s->counters.guard_violations_fault == 0);
  int faults = 0;
  int writes = 0;
  for (const state::GuardEventRecord* ep : state::ring_order(s->guard)) {
    const auto& e = *ep;
    CHECK(std::string(e.tenant_name) == "uid:4411");
    CHECK(e.kind != static_cast<std::uint32_t>(proto::GuardKind::fault_maps_shared));
    if (e.kind == static_cast<std::uint32_t>(proto::GuardKind::fault)) {
      ++faults;
      CHECK(e.flags == state::kFaultMapsShared);
      CHECK(e.cuda_status == kIllegalAddress);
    } else if (e.kind == static_cast<std::uint32_t>(proto::GuardKind::readonly_write)) {
      ++writes;
      CHECK(std::string(e.call) == "cuMemsetD8");
      CHECK(e.requested_bytes == 16);
      CHECK(e.first_bad_offset == 4 * MiB);
    }
  }
  CHECK(faults == 1);
  CHECK(writes == 1);
}

TEST_CASE("dedup: copies and memsets into shared chunks are refused and reported as readonly writes", "[dedup]") {
  DaemonProcess d("dedup-rowrite", quota());
  REQUIRE(d.start());
  auto steps = load_and_share(17);
  steps.insert(steps.end(), {
                                "alloc:src:1M",
                                "memset:w:0:16:1",                // private edge: fine, no event
                                "memset:w:1048576:2097152:1",     // [1 MiB, 3 MiB): edge + 1 MiB shared
                                "dtod:w:4194304:src:4096",        // 4 MiB: shared
                                "memset32async:w:8388608:16:7",   // 8 MiB: shared, 64 bytes
                                "upload:w:3:8192:16773120",       // [16 MiB - 4 KiB, 16 MiB + 4 KiB)
                                "streamsync",                     // the context keeps working
                                "verify:w:17:1M:2097152#intact",  // the shared data did not change
                                "sleep:300",
                            });
  TenantProcess t(d, steps, 4415);
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  REQUIRE(t.line("share:w:1M:18M").at("rc") == "0");
  const std::uint64_t ptr = std::strtoull(t.line("alloc:w:20M").at("ptr").c_str(), nullptr, 16);
  CHECK(t.line("memset:w:0:16:1").at("rc") == "0");
  CHECK(t.line("memset:w:1048576:2097152:1").at("rc") == std::to_string(kInvalidValue));
  CHECK(t.line("dtod:w:4194304:src:4096").at("rc") == std::to_string(kInvalidValue));
  CHECK(t.line("memset32async:w:8388608:16:7").at("rc") == std::to_string(kInvalidValue));
  CHECK(t.line("upload:w:3:8192:16773120").at("rc") == std::to_string(kInvalidValue));
  CHECK(t.line("streamsync").at("rc") == "0");
  CHECK(t.line("verify:w:17:1M:2097152#intact").at("ok") == "1");
  CHECK(t.err().find("cuMemcpyDtoD into shared read-only memory refused by the driver") != std::string::npos);

  const auto s = wait_state(d, [](const state::State& x) { return x.counters.guard_violations_readonly_write >= 4; });
  CHECK(s->counters.guard_violations_readonly_write == 4);
  CHECK(s->counters.guard_events_rejected == 0);
  for (std::uint64_t v : s->counters.kernel_faults) CHECK(v == 0);
  struct Want {
    const char* call;
    std::uint64_t offset;  // destination, from the allocation's pointer
    std::uint64_t bytes;
    std::uint64_t shared_offset;
  };
  const Want want[] = {{"cuMemsetD8", MiB, 2 * MiB, 2 * MiB},
                       {"cuMemcpyDtoD", 4 * MiB, 4096, 4 * MiB},
                       {"cuMemsetD32Async", 8 * MiB, 64, 8 * MiB},
                       {"cuMemcpyHtoD", 16 * MiB - 4096, 8192, 16 * MiB - 4096}};
  REQUIRE(s->guard.next_seq == 5);
  for (const state::GuardEventRecord* ep : state::ring_order(s->guard)) {
    const auto& e = *ep;
    const std::uint64_t seq = e.seq;
    const Want& w = want[seq - 1];
    INFO("event " << seq << " " << e.call);
    CHECK(e.kind == static_cast<std::uint32_t>(proto::GuardKind::readonly_write));
    CHECK(std::string(e.call) == w.call);
    CHECK(std::string(e.tenant_name) == "uid:4415");
    CHECK(e.device == 0);
    CHECK(e.grant_id != 0);
    CHECK(e.address == ptr + w.offset);
    CHECK(e.requested_bytes == w.bytes);
    CHECK(e.first_bad_offset == w.shared_offset);
    CHECK(e.cuda_status == kInvalidValue);
    CHECK(e.flags == 0);
    REQUIRE(e.suspect_count == 1);
    CHECK(e.suspects[0].address == ptr);
    CHECK(e.suspects[0].bytes == 20 * MiB);
  }
}

TEST_CASE("dedup: chunks return to the pool after the last user frees (local reserve on)", "[dedup]") {
  DaemonProcess d("dedup-free", quota());
  REQUIRE(d.start());
  auto a_steps = load_and_share(5);
  a_steps.insert(a_steps.end(), {"sleep:1000", "free:w", "sleep:1500"});
  auto b_steps = load_and_share(5);
  b_steps.insert(b_steps.end(), {"sleep:2500", "verify:w:5:20M#after", "free:w", "sleep:1500"});
  TenantProcess a(d, a_steps, 4420, "64MiB");
  REQUIRE_FALSE(a.wait_line("share:w:1M:18M").empty());
  TenantProcess b(d, b_steps, 4421, "64MiB");
  REQUIRE_FALSE(b.wait_line("share:w:1M:18M").empty());
  {
    const auto s = snapshot(d);
    CHECK(s->devices[0].dedup_physical_bytes == kShared);
    CHECK(s->devices[0].dedup_logical_bytes == 2 * kShared);
  }
  // A freed: its references are gone (its memory did not go into its local reserve); B still
  // holds the chunks.
  REQUIRE(a.wait_line("free:w").at("rc") == "0");
  {
    const auto s = wait_state(d, [](const state::State& x) { return x.devices[0].dedup_logical_bytes == kShared; });
    INFO("daemon log:\n" << d.log());
    CHECK(s->devices[0].dedup_logical_bytes == kShared);
    CHECK(s->devices[0].dedup_physical_bytes == kShared);
    CHECK(physical(*s) == kEdges + kShared);
  }
  REQUIRE(b.wait_line("free:w").at("rc") == "0");
  CHECK(b.line("verify:w:5:20M#after").at("ok") == "1");
  const auto s = wait_state(d, [](const state::State& x) { return physical(x) == 0; });
  CHECK(s->devices[0].dedup_physical_bytes == 0);
  CHECK(s->devices[0].dedup_logical_bytes == 0);
  CHECK(physical(*s) == 0);
  REQUIRE(exited_ok(a.finish()));
  REQUIRE(exited_ok(b.finish()));
}

TEST_CASE("dedup: one differing byte keeps that chunk apart", "[dedup]") {
  DaemonProcess d("dedup-near", quota());
  REQUIRE(d.start());
  auto a_steps = load_and_share(9);
  a_steps.push_back("sleep:2000");
  a_steps.push_back("verify:w:9:20M#after");
  TenantProcess a(d, a_steps, 4430);
  REQUIRE_FALSE(a.wait_line("share:w:1M:18M").empty());
  // B's copy differs in one byte of the chunk [4 MiB, 6 MiB).
  TenantProcess b(
      d, {"init", "alloc:w:20M", "upload:w:9:20M", "poke:w:5000000", "share:w:1M:18M", "verify:w:9:20M", "sleep:1000"},
      4431);
  REQUIRE(exited_ok(b.finish()));
  REQUIRE(exited_ok(a.finish()));
  INFO("a:\n" << a.out() << a.err() << "\nb:\n" << b.out() << b.err() << "\ndaemon log:\n" << d.log());
  const auto sh = b.line("share:w:1M:18M");
  CHECK(sh.at("rc") == "0");
  CHECK(field(sh, "shared") == kShared);
  CHECK(field(sh, "merged") == kShared - 2 * MiB);  // 7 of 8 chunks
  // B sees its own data (exactly the poked byte differs from the pattern); A sees A's.
  CHECK(b.line("verify:w:9:20M").at("bad") == "1");
  CHECK(a.line("verify:w:9:20M#after").at("ok") == "1");
}

TEST_CASE("dedup: a range without a whole chunk shares nothing, a second share is refused", "[dedup]") {
  DaemonProcess d("dedup-edge", quota());
  REQUIRE(d.start());
  TenantProcess t(d,
                  {"init", "alloc:w:20M", "upload:w:3:20M", "share:w:1M:2M#small", "share:w:0:20M",
                   "share:w:0:20M#again", "verify:w:3:20M", "alloc:x:3M", "share:x:0:3M"},
                  4440);
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  const auto small = t.line("share:w:1M:2M#small");
  CHECK(small.at("rc") == "0");
  CHECK(small.at("shared") == "0");
  const auto all = t.line("share:w:0:20M");
  CHECK(all.at("rc") == "0");
  CHECK(field(all, "shared") == kAlloc);
  CHECK(field(all, "copied") == 0);
  CHECK(t.line("share:w:0:20M#again").at("rc") == std::to_string(VLAKE_SHARE_REFUSED));
  CHECK(t.line("verify:w:3:20M").at("ok") == "1");
  // A 3 MiB allocation (grant of 4 MiB): its first chunk is shared, the rest is private.
  const auto x = t.line("share:x:0:3M");
  CHECK(x.at("rc") == "0");
  CHECK(field(x, "shared") == 2 * MiB);
}

// ---- transparent mode (docs/dedup.md "Transparent mode") ----------------------------------

namespace {

// Namespace `infer` (uids 4450-4453) shares uploads transparently; everyone else is in `default`.
std::string transparent_quota() { return deduptest::transparent_quota("4450, 4451, 4452, 4453"); }

// Occurrences of `needle` in `hay`.
std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("dedup transparent: whole-allocation uploads are shared without an API call", "[dedup]") {
  DaemonProcess d("dedup-tr", transparent_quota());
  REQUIRE(d.start());
  // A keeps its data; B later writes into it (copy and kernel); C uploads with cuMemcpyHtoDAsync.
  const std::vector<std::string> common = {"init", "alloc:w:20M"};
  auto a_steps = common;
  a_steps.insert(a_steps.end(), {"upload:w:7:20M", "verify:w:7:20M", "sleep:2500", "verify:w:7:20M#after", "sync"});
  auto b_steps = common;
  b_steps.insert(b_steps.end(), {"upload:w:7:20M", "verify:w:7:20M", "sleep:2500",
                                 "upload:w:7:4M#write",  // a copy into the shared chunks: refused
                                 "kfill:w:0:16",         // a kernel write: faults
                                 "sync"});
  auto c_steps = common;
  c_steps.insert(c_steps.end(), {"uploadasync:w:7:20M", "verify:w:7:20M", "sleep:2500", "verify:w:7:20M#after"});
  TenantProcess a(d, a_steps, 4450);
  REQUIRE(a.wait_line("verify:w:7:20M ").at("ok") == "1");
  TenantProcess b(d, b_steps, 4451);
  TenantProcess c(d, c_steps, 4452);
  CHECK(b.wait_line("verify:w:7:20M ").at("ok") == "1");
  CHECK(c.wait_line("verify:w:7:20M ").at("ok") == "1");
  {
    const auto s = wait_state(d, [](const state::State& x) { return x.devices[0].dedup_logical_bytes == 3 * kAlloc; });
    INFO("daemon log:\n" << d.log());
    // 20 MiB = 10 whole chunks, all shared: one physical copy for three tenants.
    CHECK(s->devices[0].dedup_physical_bytes == kAlloc);
    CHECK(s->devices[0].dedup_logical_bytes == 3 * kAlloc);
    CHECK(physical(*s) == kAlloc);
    CHECK(s->devices[0].granted_bytes == 3 * kAlloc);  // each still charged its logical bytes
    const auto* t = pooltest::tenant(*s, "infer/user:4451");
    REQUIRE(t != nullptr);
    CHECK(t->granted[0] == kAlloc);
  }
  REQUIRE(exited_ok(a.finish()));
  REQUIRE(exited_ok(b.finish()));
  REQUIRE(exited_ok(c.finish()));
  INFO("a:\n"
       << a.out() << a.err() << "\nb:\n"
       << b.out() << b.err() << "\nc:\n"
       << c.out() << c.err() << "\ndaemon log:\n"
       << d.log());
  CHECK(a.line("upload:w:7:20M").at("rc") == "0");
  CHECK(c.line("uploadasync:w:7:20M").at("rc") == "0");
  // The writer: its copy fails (the context survives), its kernel faults (its context only).
  CHECK(b.line("upload:w:7:4M#write").at("rc") == std::to_string(kInvalidValue));
  CHECK(b.line("sync").at("rc") == std::to_string(kIllegalAddress));
  // The others' data and contexts are intact.
  CHECK(a.line("verify:w:7:20M#after").at("ok") == "1");
  CHECK(a.line("sync").at("rc") == "0");
  CHECK(c.line("verify:w:7:20M#after").at("ok") == "1");
  const auto s = wait_state(d, [](const state::State& x) {
    return x.counters.kernel_faults[state::kFaultMapsShared] >= 1 && x.counters.guard_violations_readonly_write >= 1 &&
           physical(x) == 0;
  });
  CHECK(s->counters.kernel_faults[state::kFaultMapsShared] == 1);  // the kernel's write: a fault
  CHECK(s->counters.guard_violations_readonly_write == 1);         // the copy: a refused write
  CHECK(s->counters.guard_violations_readonly == 0);
  CHECK(physical(*s) == 0);
  CHECK(s->devices[0].dedup_physical_bytes == 0);
  // Every share was a transparent one the daemon accepted; none was refused.
  CHECK(count(d.log(), "shares 20971520 bytes read-only") == 3);
  CHECK(count(d.log(), "dedup transparent mode") == 0);
}

TEST_CASE("dedup transparent: partial uploads are not shared, a later whole one is", "[dedup]") {
  DaemonProcess d("dedup-trp", transparent_quota());
  REQUIRE(d.start());
  TenantProcess t(d,
                  {"init", "alloc:p:20M", "upload:p:3:19M",                // not the whole allocation
                   "alloc:q:20M", "upload:q:3:10M", "upload:q:3:10M:10M",  // whole, but in two copies
                   "upload:p:3:18M:2M",                                    // not from its pointer
                   "verify:p:3:20M#partial", "sleep:1500", "upload:p:3:20M", "verify:p:3:20M#whole", "verify:q:3:20M",
                   "sleep:1500"},
                  4453);
  const auto partial = t.wait_line("verify:p:3:20M#partial");
  {
    INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
    CHECK(partial.at("ok") == "1");
    std::this_thread::sleep_for(200ms);
    const auto s = snapshot(d);
    CHECK(s->devices[0].dedup_logical_bytes == 0);
    CHECK(physical(*s) == 2 * kAlloc);
  }
  REQUIRE(t.wait_line("verify:p:3:20M#whole").at("ok") == "1");
  const auto s = wait_state(d, [](const state::State& x) { return x.devices[0].dedup_logical_bytes == kAlloc; });
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  CHECK(s->devices[0].dedup_logical_bytes == kAlloc);
  CHECK(s->devices[0].dedup_physical_bytes == kAlloc);
  REQUIRE(exited_ok(t.finish()));
  CHECK(t.line("verify:q:3:20M").at("ok") == "1");
}

TEST_CASE("dedup transparent: a namespace that is off shares nothing, asked once per process", "[dedup]") {
  DaemonProcess d("dedup-troff", transparent_quota());
  REQUIRE(d.start());
  // uid 4460 is in namespace `default` (dedup off). Three whole-allocation uploads.
  TenantProcess t(d,
                  {"init", "alloc:a:20M", "upload:a:1:20M", "alloc:b:20M", "upload:b:1:20M", "alloc:c:8M",
                   "uploadasync:c:1:8M", "streamsync", "verify:a:1:20M", "verify:c:1:8M", "sleep:1000"},
                  4460);
  REQUIRE(t.wait_line("verify:c:1:8M").at("ok") == "1");
  const auto s = snapshot(d);
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  CHECK(s->devices[0].dedup_logical_bytes == 0);
  CHECK(physical(*s) == 48 * MiB);
  REQUIRE(exited_ok(t.finish()));
  CHECK(t.line("verify:a:1:20M").at("ok") == "1");
  // Exactly one transparent offer reached the daemon, refused with dedup_disabled.
  CHECK(count(d.log(), "tenant uid:4460: transparent share of grant") == 1);
  CHECK(count(d.log(), "refused: its namespace is not in dedup transparent mode") == 1);
  // The explicit API still works in a namespace that is off.
  TenantProcess e(d, {"init", "alloc:w:20M", "upload:w:2:20M", "share:w:0:20M", "verify:w:2:20M"}, 4461);
  REQUIRE(exited_ok(e.finish()));
  CHECK(e.line("share:w:0:20M").at("rc") == "0");
  CHECK(field(e.line("share:w:0:20M"), "shared") == kAlloc);
  CHECK(e.line("verify:w:2:20M").at("ok") == "1");
}

TEST_CASE("dedup: chunk hash", "[dedup][unit]") {
  std::vector<std::uint8_t> a(2 * MiB, 0x5a);
  std::vector<std::uint8_t> b = a;
  CHECK(chunk_hash_reference(a.data(), a.size()) == chunk_hash_reference(b.data(), b.size()));
  b[12345] ^= 1;
  CHECK(chunk_hash_reference(a.data(), a.size()) != chunk_hash_reference(b.data(), b.size()));
  std::vector<std::uint8_t> z(2 * MiB, 0);
  CHECK(chunk_hash_reference(z.data(), z.size()) != chunk_hash_reference(z.data(), z.size() - 8));
}
