// What dedup saves in the simulated device's real memory (docs/dedup.md, "Measured on the
// simulator"): the simulator's used memory (what NVML reports on a real GPU), not vlake's own
// counters, which are checked beside it. Four tenant processes (tests/hook/tenant.cpp under the
// hook, local reserve on as by default, each with a simulated CUDA context of kContext bytes)
// load the same 192 MiB of weights; with sharing the device holds one replica, without it four.
// What the sharing saved is then usable: a fifth tenant, of another namespace, is granted it and
// the device still holds everything (the replaced private memory went back to the driver, and
// admission counts the shared chunks once: docs/quota.md). And the transparent mode's Async path
// waits for its stream only for an upload it offers.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dedup_quota.hpp"
#include "tenant_process.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace std::chrono_literals;
using namespace vlake::e2e;
using pooltest::DaemonProcess;

namespace {

constexpr std::uint64_t kReplica = 192 * MiB;  // one replica's weights: 96 whole chunks
constexpr std::uint64_t kContext = 8 * MiB;    // VLAKE_SIM_CONTEXT_MEMORY of every tenant
constexpr int kReplicas = 4;
constexpr std::uint64_t kSaved = (kReplicas - 1) * kReplica;  // 576 MiB
constexpr std::uint64_t kDevice = 1024 * MiB;                 // the harness's simulated GPU
// vlaked's hash scratch buffer (8 KiB, cuMemAlloc: one 2 MiB granule in the simulator), allocated
// at the first share and kept for the daemon's life.
constexpr std::uint64_t kHashScratch = 2 * MiB;
// The harness's simulated GPU has 1 GiB: 4 unshared replicas + kSaved do not fit, one shared
// replica + kSaved do.
constexpr long kFifthUid = 4470;

// The replicas' uids (uid0 .. uid0 + 3) are the namespace `serve`, one trust domain, guaranteed
// 256 MiB (one replica and the contexts, physically); the fifth tenant is in `batch`, without a
// guarantee: it may borrow the other 768 MiB less what serve borrows.
std::string quota(long uid0) {
  std::string users;
  for (int i = 0; i < kReplicas; ++i) users += (i != 0 ? ", " : "") + std::to_string(uid0 + i);
  return "version: 1\n"
         "default:\n"
         "  limit: 1GiB\n"
         "namespaces:\n"
         "  - name: serve\n"
         "    guaranteed: 256MiB\n"
         "    dedup_domain: shared\n"
         "    users: [" +
         users +
         "]\n"
         "  - name: batch\n"
         "    users: [" +
         std::to_string(kFifthUid) + "]\n";
}

// The fifth tenant: allocates what four replicas' sharing saves, writes and reads all of it,
// then waits for `go`.
std::unique_ptr<TenantProcess> start_fifth(const DaemonProcess& d, const std::string& go) {
  return std::make_unique<TenantProcess>(
      d, std::vector<std::string>{"init", "alloc:x:576M", "fill:x:576M:7", "waitfile:" + go, "free:x"}, kFifthUid,
      "2GiB", std::vector<std::string>{"VLAKE_SIM_CONTEXT_MEMORY=8MiB"});
}

// Waits until no retired descriptor is held any more (a tenant's driver may still hold the
// replaced handles' descriptors until the hook releases them after the commit; the daemon's
// rescan then closes them).
std::unique_ptr<state::State> settled(const DaemonProcess& d) {
  auto s = snapshot(d);
  for (int i = 0; i < 100 && s->devices[0].held_fd_bytes != 0; ++i) {
    std::this_thread::sleep_for(20ms);
    s = snapshot(d);
  }
  return s;
}

void touch(const std::string& path) { std::ofstream(path) << "go\n"; }

struct Replicas {
  std::vector<std::unique_ptr<TenantProcess>> ts;
  std::string go;  // created by the test: the replicas verify, free and exit
};

// Four tenants load the same weights (and share them when `share`), then wait for `go`.
Replicas start_replicas(const DaemonProcess& d, bool share, long uid0) {
  Replicas r;
  r.go = d.dir + "/go";
  for (int i = 0; i < kReplicas; ++i) {
    std::vector<std::string> steps = {"init", "alloc:w:192M", "upload:w:9:192M"};
    if (share) steps.push_back("share:w:0:192M");
    steps.insert(steps.end(), {"verify:w:9:192M", "waitfile:" + r.go, "verify:w:9:192M#after", "free:w", "sleep:1500"});
    r.ts.push_back(std::make_unique<TenantProcess>(d, steps, uid0 + i, "2GiB",
                                                   std::vector<std::string>{"VLAKE_SIM_CONTEXT_MEMORY=8MiB"}));
  }
  return r;
}

// The simulated device's memory in use less the tenants' contexts.
std::uint64_t used_less_contexts(const DaemonProcess& d, int contexts) {
  const std::uint64_t used = pooltest::sim_used(d.node);
  const std::uint64_t ctx = static_cast<std::uint64_t>(contexts) * kContext;
  return used > ctx ? used - ctx : 0;
}

std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

// The replica checked its weights (the "verify" step's line says ok=1).
void require_verified(const DaemonProcess& d, TenantProcess& t) {
  const auto v = t.wait_line("verify:w:9:192M ", 150000);  // 4 × 192 MiB uploads: slow under ASan
  INFO(t.out() << t.err() << "\ndaemon log:\n" << d.log());
  REQUIRE(v.count("ok") == 1);
  CHECK(v.at("ok") == "1");
}

// start_replicas(), then each replica checked its weights.
Replicas verified_replicas(const DaemonProcess& d, bool share, long uid0) {
  Replicas r = start_replicas(d, share, uid0);
  for (auto& t : r.ts) require_verified(d, *t);
  return r;
}

double mib(std::uint64_t b) { return static_cast<double>(b) / static_cast<double>(MiB); }

}  // namespace

TEST_CASE("dedup memory: four sharing replicas use one replica of device memory and a fifth tenant gets the rest",
          "[dedup]") {
  DaemonProcess d("dedup-mem", quota(4480));
  // The figures below count the fifth tenant's free pool memory: the idle release must not give
  // it back meanwhile, however long a sanitizer build takes to get there.
  REQUIRE(d.start({"--pool-idle-release", "off"}));
  const std::uint64_t before = pooltest::sim_used(d.node);
  Replicas r = verified_replicas(d, true, 4480);
  for (auto& t : r.ts) {
    const auto sh = t->wait_line("share:w:0:192M");
    CHECK(sh.at("rc") == "0");
    CHECK(sh.at("shared") == std::to_string(kReplica));
    CHECK(sh.at("copied") == "0");
  }
  const auto s = settled(d);
  const std::uint64_t used = used_less_contexts(d, kReplicas) - before;
  const auto& dev = s->devices[0];
  std::printf(
      "dedup memory: shared x%d: sim used %.1f MiB less %d contexts = %.1f MiB = %.3f x one replica; "
      "vlake: dedup logical %.1f MiB physical %.1f MiB, pool %.1f MiB (free %.1f MiB), granted %.1f MiB\n",
      kReplicas, mib(pooltest::sim_used(d.node)), kReplicas, mib(used),
      static_cast<double>(used) / static_cast<double>(kReplica), mib(dev.dedup_logical_bytes),
      mib(dev.dedup_physical_bytes), mib(dev.pool_bytes), mib(dev.free_bytes), mib(dev.granted_bytes));
  INFO("daemon log:\n" << d.log());
  // The device's real memory: one replica (plus the daemon's hash scratch, within the 10 %).
  CHECK(used * 100 <= kReplica * 110);
  CHECK(used == kReplica + kHashScratch);
  // vlake's counters beside it: one physical copy, four logical, nothing kept in the free pool
  // (the replaced private handles were released to the driver), every tenant charged in full.
  CHECK(dev.dedup_physical_bytes == kReplica);
  CHECK(dev.dedup_logical_bytes == kReplicas * kReplica);
  CHECK(dev.pool_bytes == kReplica);
  CHECK(dev.free_bytes == 0);
  CHECK(dev.granted_bytes == kReplicas * kReplica);
  CHECK(dev.held_fd_bytes == 0);

  // A fifth tenant of another namespace is granted what the sharing saved (576 MiB) and uses
  // it; the device holds all of it: one replica, the fifth's memory, five contexts.
  CHECK(kDevice - pooltest::sim_used(d.node) >= kSaved + kContext);
  const std::string go5 = d.dir + "/go5";
  auto fifth = start_fifth(d, go5);
  {
    const auto f = fifth->wait_line("fill:x:576M", 30000);
    INFO(fifth->out() << fifth->err() << "\ndaemon log:\n" << d.log());
    REQUIRE(f.count("rc") == 1);
    CHECK(fifth->line("alloc:x:576M").at("rc") == "0");
    CHECK(f.at("rc") == "0");
    CHECK(f.at("ok") == "1");
  }
  const auto s5 = snapshot(d);
  const std::uint64_t used5 = pooltest::sim_used(d.node);
  std::printf(
      "dedup memory: fifth tenant: %.1f MiB granted; sim used %.1f MiB of %.1f MiB; vlake: granted %.1f MiB, "
      "borrowed %.1f MiB, guarantee refusals %llu\n",
      mib(kSaved), mib(used5), mib(kDevice), mib(s5->devices[0].granted_bytes), mib(s5->devices[0].borrowed_bytes),
      static_cast<unsigned long long>(s5->counters.denials_guarantee));
  CHECK(used5 <= kDevice);
  CHECK(used5 - before >= kReplica + kSaved + (kReplicas + 1) * kContext);
  CHECK(s5->devices[0].granted_bytes >= kReplicas * kReplica + kSaved);
  CHECK(s5->counters.denials_guarantee == 0);
  CHECK(s5->counters.denials_over_limit == 0);
  touch(go5);
  REQUIRE(exited_ok(fifth->finish()));
  // Its memory is back in the daemon's free pool (kept for its tenant until the idle release).
  auto after5 = snapshot(d);
  for (int i = 0; i < 100 && after5->devices[0].granted_bytes != kReplicas * kReplica; ++i) {
    std::this_thread::sleep_for(20ms);
    after5 = snapshot(d);
  }
  CHECK(after5->devices[0].granted_bytes == kReplicas * kReplica);
  const std::uint64_t fifth_free = after5->devices[0].free_bytes;
  CHECK(fifth_free <= kSaved);

  // The replicas' weights are intact; a freed shared allocation skips the local reserve, so the
  // device is empty but for the contexts (and the fifth's free pool memory) once all four freed.
  touch(r.go);
  for (auto& t : r.ts) {
    const auto f = t->wait_line("free:w", 30000);
    INFO(t->out() << t->err());
    REQUIRE(f.count("rc") == 1);
    CHECK(f.at("rc") == "0");
    CHECK(t->line("verify:w:9:192M#after").at("ok") == "1");
  }
  std::uint64_t left = ~0ull;
  for (int i = 0; i < 100; ++i) {
    left = used_less_contexts(d, kReplicas) - before;
    if (left == kHashScratch + fifth_free) break;
    std::this_thread::sleep_for(20ms);
  }
  CHECK(left == kHashScratch + fifth_free);
  const auto end = snapshot(d);
  CHECK(end->devices[0].pool_bytes == fifth_free);
  CHECK(end->devices[0].granted_bytes == 0);
  CHECK(end->devices[0].dedup_logical_bytes == 0);
  CHECK(end->devices[0].dedup_physical_bytes == 0);
  for (auto& t : r.ts) REQUIRE(exited_ok(t->finish()));
}

TEST_CASE("dedup memory: four replicas without sharing use four replicas and leave no room for a fifth", "[dedup]") {
  DaemonProcess d("dedup-mem-off", quota(4490));
  REQUIRE(d.start());
  const std::uint64_t before = pooltest::sim_used(d.node);
  Replicas r = verified_replicas(d, false, 4490);
  const std::uint64_t used = used_less_contexts(d, kReplicas) - before;
  const auto s = snapshot(d);
  std::printf(
      "dedup memory: unshared x%d: sim used less contexts %.1f MiB = %.3f x one replica; vlake: pool %.1f MiB, "
      "dedup logical %.1f MiB\n",
      kReplicas, mib(used), static_cast<double>(used) / static_cast<double>(kReplica), mib(s->devices[0].pool_bytes),
      mib(s->devices[0].dedup_logical_bytes));
  CHECK(used == kReplicas * kReplica);
  CHECK(s->devices[0].dedup_logical_bytes == 0);
  // What sharing would have saved is not there, and admission says so before the device does:
  // the fifth tenant's 576 MiB would take memory guaranteed to serve.
  CHECK(kDevice - pooltest::sim_used(d.node) < kSaved);
  auto fifth = start_fifth(d, d.dir + "/go5");
  const auto a = fifth->wait_line("alloc:x:576M", 30000);
  INFO(fifth->out() << fifth->err());
  REQUIRE(a.count("rc") == 1);
  CHECK(a.at("rc") == "2");  // CUDA_ERROR_OUT_OF_MEMORY
  CHECK(snapshot(d)->counters.denials_guarantee >= 1);
  fifth->kill9();
  touch(r.go);
  for (auto& t : r.ts) REQUIRE(exited_ok(t->finish()));
}

TEST_CASE("dedup transparent: an Async upload synchronizes its stream only for an offer", "[dedup]") {
  DaemonProcess d("dedup-trsync", deduptest::transparent_quota("4496"));
  REQUIRE(d.start());
  // The share fences with cuCtxSynchronize: every cuStreamSynchronize counted here is the Async
  // wrapper waiting for an upload it is about to offer.
  const std::vector<std::string> uploads = {
      "init",
      "alloc:a:20M",
      "uploadasync:a:1:20M",  // offered: one synchronization
      "calls:cuStreamSynchronize#first",
      "alloc:b:20M",
      "uploadasync:b:1:19M",     // partial: not offered, no synchronization
      "uploadasync:b:1:1M:19M",  // not from the allocation's pointer: neither
      "alloc:c:20M",
      "uploadasync:c:1:20M",  // transparent: offered; off: the mode is known to be off
      "calls:cuStreamSynchronize#last",
      "sync",
      "verify:a:1:20M",
      "verify:b:1:20M",
      "verify:c:1:20M"};
  TenantProcess on(d, uploads, 4496);
  TenantProcess off(d, uploads, 4497);
  REQUIRE(exited_ok(on.finish()));
  REQUIRE(exited_ok(off.finish()));
  INFO("on:\n" << on.out() << on.err() << "\noff:\n" << off.out() << off.err() << "\ndaemon log:\n" << d.log());
  for (const TenantProcess* t : {&on, &off}) {
    CHECK(t->line("calls:cuStreamSynchronize#first").at("rc") == "0");
    CHECK(t->line("calls:cuStreamSynchronize#first").at("count") == "1");
    CHECK(t->line("verify:a:1:20M").at("ok") == "1");
    CHECK(t->line("verify:b:1:20M").at("ok") == "1");
    CHECK(t->line("verify:c:1:20M").at("ok") == "1");
  }
  CHECK(on.line("calls:cuStreamSynchronize#last").at("count") == "2");
  CHECK(off.line("calls:cuStreamSynchronize#last").at("count") == "1");
  // The tenant of the namespace that is off asked once.
  CHECK(count_of(d.log(), "tenant uid:4497: transparent share of grant") == 1);
}
