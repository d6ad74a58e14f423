// VLAKE_DISABLE=1 against a real vlaked with the simulator's NVML: honoured only where the quota
// file allows it (allow_disable), and then the process's memory is charged to its tenant as
// memory outside vlake (docs/quota.md, docs/daemon.md "Memory outside vlake").
#include <catch2/catch.hpp>

#include <string>

#include "tenant_process.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace vlake::e2e;
using pooltest::DaemonProcess;

#ifdef VLAKE_SIM_NVML_LIB
namespace {

std::string yaml(bool allow) {
  return std::string("version: 1\ndefault: {limit: 16MiB}\nnamespaces:\n  - {name: lab, allow_disable: ") +
         (allow ? "true" : "false") + "}\nusers:\n  - {uid: 4242, namespace: lab, limit: 16MiB}\n";
}

}  // namespace

TEST_CASE("VLAKE_DISABLE allowed by the quota file passes through and is charged as memory outside vlake",
          "[e2e][unhooked]") {
  DaemonProcess d("disable-ok", yaml(true));
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  TenantProcess t(d, {"init", "alloc:a:24M", "sleep:20000"}, 4242, "0", {"VLAKE_DISABLE=1"});
  CHECK(t.wait_line("alloc:a")["rc"] == "0");  // over its 16 MiB: the hook is off
  auto outside = [&] {
    const auto s = pooltest::snapshot(d.state);
    const state::TenantRecord* r = pooltest::tenant(*s, "lab/user:4242");
    return r == nullptr ? 0 : r->unhooked[0];
  };
  CHECK(pooltest::eventually([&] { return outside() >= 24 * MiB; }, 5000));
  const auto s = pooltest::snapshot(d.state);
  CHECK(pooltest::live_sessions(*s) == 0);
  CHECK(s->counters.passthrough_refused == 0);
  CHECK(pooltest::tenant(*s, "lab/user:4242")->unhooked_processes == 1);
  CHECK(d.log().find("VLAKE_DISABLE allowed") != std::string::npos);
  t.kill9();
}

TEST_CASE("VLAKE_DISABLE the quota file does not allow leaves the hook enforcing the limit", "[e2e][unhooked]") {
  DaemonProcess d("disable-no", yaml(false));
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  TenantProcess t(d, {"init", "alloc:a:8M", "alloc:b:24M"}, 4242, "0", {"VLAKE_DISABLE=1"});
  t.finish();
  INFO(t.out() << t.err());
  CHECK(t.line("alloc:a")["rc"] == "0");
  CHECK(t.line("alloc:b")["rc"] == std::to_string(kOutOfMemory));
  CHECK(t.err().find("does not allow it for tenant lab/user:4242") != std::string::npos);
  CHECK(pooltest::snapshot(d.state)->counters.passthrough_refused == 1);
}
#endif
