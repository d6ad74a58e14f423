// vlaked on the simulator with the simulator's NVML: GPU memory of processes without a session
// (no hook, VLAKE_DISABLE, the driver called directly) is attributed to the tenant of their uid
// and handled per the quota file's `enforce` (docs/daemon.md, "Memory outside vlake"): processes
// NVML lists (they have a context: `meminfo` makes one) by their NVML figure, and processes that
// create memory without a context (NVML does not list them) by the device's unlisted memory,
// found through the node file they keep open.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "harness.hpp"
#include "tenant_figures.hpp"
#include "units.hpp"
#include "vlake/common/proc.hpp"
#include "vlake/contracts/protocol.hpp"

using namespace vlake;
using namespace vlake::pooltest;
namespace st = vlake::state;

#ifdef VLAKE_SIM_NVML_LIB
using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

std::string unhooked_config(const std::string& policy) {
  return "version: 1\ndefault: {limit: 16MiB, " + policy + "}\nusers:\n  - {uid: 4242, limit: 64MiB}\n";
}

std::uint64_t unhooked(const std::string& state, const std::string& name) {
  return tenant_gpu0(state, name, &st::TenantRecord::unhooked);
}

// `pid` (tenant user:4242's) gets killed, and the kill is counted and logged.
void expect_killed(const DaemonProcess& d, std::uint32_t pid) {
  auto gone = [&] {
    const auto st = read_proc_stat(pid);
    return !st || st->state == 'Z';
  };
  REQUIRE(eventually(gone, 10000));
  CHECK(eventually([&] { return snapshot(d.state)->counters.unhooked_kills == 1; }, 3000));
  CHECK_THAT(d.log(), Catch::Contains("killed pid " + std::to_string(pid) + " of tenant user:4242"));
}

void rewrite(const DaemonProcess& d, const std::string& yaml) {
  {
    std::ofstream out(d.config + ".tmp");
    out << yaml;
  }
  REQUIRE(::rename((d.config + ".tmp").c_str(), d.config.c_str()) == 0);
}

}  // namespace

TEST_CASE(
    "daemon unhooked: a process without a session is its uid's unhooked memory that refuse counts and account only "
    "shows",
    "[daemon][unhooked]") {
  DaemonProcess d("unhooked", unhooked_config("enforce: refuse"));
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  Helper outside(d.node, 4242, 0);  // never says Hello: the driver called without the hook
  outside.ok("meminfo");            // a context: NVML lists it
  outside.ok("own " + std::to_string(40 * kMiB));
  Helper hooked(d.node, 4242, 0);
  hooked.ok("connect " + d.socket);
  REQUIRE(eventually([&] { return unhooked(d.state, "user:4242") == 40 * kMiB; }, 5000));
  auto snap = snapshot(d.state);
  const st::TenantRecord* t = tenant(*snap, "user:4242");
  REQUIRE(t != nullptr);
  CHECK(t->unhooked_processes == 1);
  CHECK(t->enforce == 1);
  CHECK(t->nonpool[0] == 0);
  CHECK(snap->devices[0].unhooked_bytes == 40 * kMiB);
  CHECK(snap->devices[0].nvml_used_bytes >= 40 * kMiB);
  // 40 MiB outside vlake + 32 asked > 64: refused, counted as the unhooked memory's doing.
  CHECK(num(hooked.ok("grant " + std::to_string(32 * kMiB)), "status") == static_cast<int>(proto::Status::over_limit));
  CHECK(snapshot(d.state)->counters.denials_unhooked == 1);
  CHECK(num(hooked.ok("grant " + std::to_string(24 * kMiB)), "status") == 0);
  CHECK_THAT(d.log(), Catch::Contains("GPU memory outside vlake"));

  // enforce: account shows the memory and no longer counts it.
  rewrite(d, unhooked_config("enforce: account"));
  d.signal(SIGHUP);
  REQUIRE(eventually([&] { return tenant(*snapshot(d.state), "user:4242")->enforce == 0; }, 5000));
  CHECK(num(hooked.ok("grant " + std::to_string(32 * kMiB)), "status") == 0);
  CHECK(unhooked(d.state, "user:4242") == 40 * kMiB);
}

TEST_CASE("daemon unhooked: enforce kill kills the unhooked process after the grace and counts it",
          "[daemon][unhooked]") {
  DaemonProcess d("unhooked-kill", unhooked_config("enforce: kill, kill_grace: 300ms"));
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  Helper under(d.node, 0, 0);  // uid 0: 16 MiB limit, uses 8 outside: never killed
  under.ok("meminfo");
  under.ok("own " + std::to_string(8 * kMiB));
  Helper over(d.node, 4242, 0);
  over.ok("meminfo");
  over.ok("own " + std::to_string(80 * kMiB));  // over the 64 MiB limit on its own
  expect_killed(d, static_cast<std::uint32_t>(over.pid()));
  const auto st = read_proc_stat(static_cast<std::uint32_t>(under.pid()));
  REQUIRE(st.has_value());
  CHECK(st->state != 'Z');
  CHECK(eventually([&] { return unhooked(d.state, "uid:0") == 8 * kMiB; }, 3000));
  CHECK(snapshot(d.state)->counters.unhooked_kills == 1);
}

TEST_CASE(
    "daemon unhooked: by default a process outside vlake that keeps its tenant over its limit is killed after "
    "the grace",
    "[daemon][unhooked]") {
  // No `enforce` anywhere: the default policy must not let the tenant keep memory above its
  // limit (a renamed libcuda, the driver called by address) past kill_grace.
  DaemonProcess d("unhooked-default", unhooked_config("kill_grace: 300ms"));
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  Helper within(d.node, 0, 0);  // uid 0: 16 MiB limit, uses 8 outside: never killed
  within.ok("meminfo");
  within.ok("own " + std::to_string(8 * kMiB));
  Helper over(d.node, 4242, 0);
  over.ok("meminfo");
  over.ok("own " + std::to_string(128 * kMiB));  // twice its 64 MiB limit
  CHECK(eventually(
      [&] {
        const auto snap = snapshot(d.state);
        const st::TenantRecord* t = tenant(*snap, "user:4242");
        return t != nullptr && t->enforce == 2;  // kill, though the quota file names no policy
      },
      5000));
  expect_killed(d, static_cast<std::uint32_t>(over.pid()));
  CHECK(eventually([&] { return unhooked(d.state, "user:4242") != 128 * kMiB; }, 5000));
  const auto st = read_proc_stat(static_cast<std::uint32_t>(within.pid()));
  REQUIRE(st.has_value());
  CHECK(st->state != 'Z');
}

TEST_CASE("daemon unhooked: memory created without a context (not in NVML's list) is its process's tenant's",
          "[daemon][unhooked]") {
  DaemonProcess d("unlisted", unhooked_config("enforce: refuse"));
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  Helper listed(d.node, 0, 0);  // a context, 8 MiB: NVML lists it with its figure
  listed.ok("meminfo");
  listed.ok("own " + std::to_string(8 * kMiB));
  Helper outside(d.node, 4242, 0);  // never connects, never creates a context
  outside.ok("own " + std::to_string(256 * kMiB));
  REQUIRE(eventually(
      [&] {
        const std::uint64_t u = unhooked(d.state, "user:4242");  // ~0: no such tenant yet
        return u != ~0ULL && u >= 256 * kMiB;
      },
      5000));
  auto snap = snapshot(d.state);
  const st::TenantRecord* t = tenant(*snap, "user:4242");
  REQUIRE(t != nullptr);
  CHECK(t->unhooked[0] == 256 * kMiB);
  CHECK(t->unhooked_processes == 1);
  CHECK(snap->devices[0].unlisted_bytes == 256 * kMiB);
  CHECK(unhooked(d.state, "uid:0") == 8 * kMiB);
  CHECK_THAT(d.log(), Catch::Contains("pid " + std::to_string(outside.pid()) + " uses " + std::to_string(256 * kMiB) +
                                      " bytes of GPU memory outside vlake"));
}

TEST_CASE("daemon unhooked: enforce kill kills a process that holds memory without a context", "[daemon][unhooked]") {
  DaemonProcess d("unlisted-kill", unhooked_config("enforce: kill, kill_grace: 300ms"));
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  Helper over(d.node, 4242, 0);
  over.ok("own " + std::to_string(256 * kMiB));  // over the 64 MiB limit, and not in NVML's list
  expect_killed(d, static_cast<std::uint32_t>(over.pid()));
  CHECK(eventually([&] { return snapshot(d.state)->devices[0].unlisted_bytes == 0; }, 3000));
}
#endif
