// The counted paths against a real vlaked with the simulator's NVML (docs/hook.md, "What is
// covered"): memory the driver allocates itself — a cuMemCreate with the GPUDirect-RDMA flag, a
// stream-ordered pool, graph memory — is in the tenant's figure of the state segment, equal to
// what NVML attributes to the process, refused at the limit, and not counted again as memory
// outside vlake.
#include <catch2/catch.hpp>

#include <string>

#include "tenant_process.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace vlake::e2e;
using pooltest::DaemonProcess;

#ifdef VLAKE_SIM_NVML_LIB
namespace {

const char* kYaml =
    "version: 1\ndefault: {limit: 32MiB}\nnamespaces:\n  - {name: lab}\n"
    "users:\n  - {uid: 4242, namespace: lab, limit: 32MiB}\n";

}  // namespace

TEST_CASE("memory the driver allocates for pools graphs and RDMA handles is the tenant's in the state segment",
          "[e2e][counted]") {
  DaemonProcess d("counted", kYaml);
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  TenantProcess t(
      d,
      {"init", "createx:h:4M:rdma", "pool:p", "palloc:a:p:6M", "graph:g", "gnalloc:g:x:8M", "ginst:e:g", "glaunch:e",
       "procmem#1", "palloc:b:p:20M", "graph:g2", "gnalloc:g2:y:20M", "ginst:e2:g2", "procmem#2", "sleep:20000"},
      4242);
  auto first = t.wait_line("procmem#1");
  auto second = t.wait_line("procmem#2");
  INFO(t.out() << t.err());
  REQUIRE(first["rc"] == "0");
  const std::uint64_t process = std::stoull(first["bytes"]);
  CHECK(process == 18 * MiB);  // 4 MiB handle + 6 MiB pool + 8 MiB graph memory
  // Over the 32 MiB limit: refused, nothing more allocated.
  CHECK(t.wait_line("palloc:b:p:20M")["rc"] == std::to_string(kOutOfMemory));
  CHECK(t.wait_line("ginst:e2:g2")["rc"] == std::to_string(kOutOfMemory));
  CHECK(std::stoull(second["bytes"]) == process);
  auto record = [&] {
    const auto s = pooltest::snapshot(d.state);
    const state::TenantRecord* r = pooltest::tenant(*s, "lab/user:4242");
    return r == nullptr ? state::TenantRecord{} : *r;
  };
  CHECK(record().granted[0] == process);  // the daemon's figure is what NVML sees
  // Every NVML reading taken once the process is done is fully explained by its grants. (A pool
  // grows before the hook counts the growth, and a refused growth is given back: a reading taken
  // in that moment, and applied when the loop gets to it, may show it for one reading. So the
  // readings judged start two after the last step.)
  auto samples = [&] { return pooltest::snapshot(d.state)->counters.nvml_samples; };
  const std::uint64_t done = samples();
  REQUIRE(pooltest::eventually([&] { return samples() >= done + 2; }, 5000));
  std::uint64_t judged = 0;
  state::TenantRecord off{};
  bool moved = false;
  for (std::uint64_t last = samples(); judged < 8 && !moved;) {
    REQUIRE(pooltest::eventually([&] { return samples() > last; }, 5000));
    last = samples();
    off = record();
    moved = off.nonpool[0] != 0 || off.unhooked[0] != 0;
    ++judged;
  }
  INFO("after " << judged << " readings: granted " << off.granted[0] << ", non-pool " << off.nonpool[0] << ", unhooked "
                << off.unhooked[0] << "\n"
                << d.log());
  CHECK_FALSE(moved);
  t.kill9();
  CHECK(pooltest::eventually([&] { return record().granted[0] == 0; }, 5000));
}

TEST_CASE("a counted grant is decided on a fresh NVML reading that includes the process's new context",
          "[e2e][counted]") {
  // The timer samples NVML once an hour here, so only the resample a counted grant triggers can
  // see the tenant's 8 MiB context: without it 4 x 8 MiB would fit the 32 MiB limit and the
  // process would hold 40 MiB.
  DaemonProcess d("counted-fresh", kYaml);
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "3600000"}));
  TenantProcess t(d,
                  {"init", "createx:h1:8M:rdma", "createx:h2:8M:rdma", "createx:h3:8M:rdma", "createx:h4:8M:rdma",
                   "procmem", "sleep:20000"},
                  4242, "0", {"VLAKE_SIM_CONTEXT_MEMORY=8MiB"});
  auto mem = t.wait_line("procmem");
  INFO(t.out() << t.err());
  CHECK(t.wait_line("createx:h3:8M:rdma")["rc"] == "0");
  CHECK(t.wait_line("createx:h4:8M:rdma")["rc"] == std::to_string(kOutOfMemory));
  REQUIRE(mem["rc"] == "0");
  CHECK(std::stoull(mem["bytes"]) == 32 * MiB);  // context + 3 handles: exactly the limit
  const auto s = pooltest::snapshot(d.state);
  const state::TenantRecord* r = pooltest::tenant(*s, "lab/user:4242");
  REQUIRE(r != nullptr);
  CHECK(r->granted[0] == 24 * MiB);
  CHECK(r->nonpool[0] == 8 * MiB);
}
#endif
