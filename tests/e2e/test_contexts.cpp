// CUDA contexts count against a tenant's limit (docs/quota.md, "Contexts"): a real vlaked with
// the simulator's NVML, tenants whose every primary context takes VLAKE_SIM_CONTEXT_MEMORY on the
// simulated GPU (as an H100 context takes ~518 MiB before any allocation). The hook asks vlaked
// to admit a context before the driver creates it: the processes beyond what the limit holds get
// CUDA_ERROR_OUT_OF_MEMORY from the call that would create it, with vlake's message, and what the
// tenant holds on the GPU — read from the simulator's NVML, not from vlake — stays within its
// limit plus one context.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tenant_process.hpp"
#include "vlake/common/nvml_api.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace vlake::e2e;
using pooltest::DaemonProcess;

#ifdef VLAKE_SIM_NVML_LIB
namespace {

constexpr std::uint64_t kContext = 64 * MiB;  // VLAKE_SIM_CONTEXT_MEMORY of every process
constexpr std::uint64_t kLimit = 2 * kContext + 16 * MiB;
constexpr int kProcesses = 10;

// NVML's per-process figures on GPU 0 of the simulated node (the simulator's libnvidia-ml, read
// by this test process itself: nothing of vlake's in between).
std::map<std::uint32_t, std::uint64_t> nvml_processes(const std::string& node) {
  ::setenv("VLAKE_SIM_NODE", node.c_str(), 1);
  ::setenv("VLAKE_SIM_DEVICE_MEMORY", "1GiB", 1);
  ::setenv("VLAKE_SIM_DEVICE_COUNT", "1", 1);
  static void* lib = ::dlopen(VLAKE_SIM_NVML_LIB, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  auto init = reinterpret_cast<PFN_nvmlInit_v2>(::dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<PFN_nvmlShutdown>(::dlsym(lib, "nvmlShutdown"));
  auto by_index = reinterpret_cast<PFN_nvmlDeviceGetHandleByIndex_v2>(::dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto processes = reinterpret_cast<PFN_nvmlDeviceGetComputeRunningProcesses_v3>(
      ::dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  REQUIRE((init && shutdown && by_index && processes));
  REQUIRE(init() == NVML_SUCCESS);
  nvmlDevice_t dev{};
  REQUIRE(by_index(0, &dev) == NVML_SUCCESS);
  std::vector<nvmlProcessInfo_t> info(64);
  unsigned int count = static_cast<unsigned int>(info.size());
  REQUIRE(processes(dev, &count, info.data()) == NVML_SUCCESS);
  std::map<std::uint32_t, std::uint64_t> out;
  for (unsigned int i = 0; i < count; ++i) out[info[i].pid] += info[i].usedGpuMemory;
  shutdown();
  return out;
}

std::string config() {
  return "version: 1\ndefault: {limit: 64MiB}\nusers:\n  - {uid: 4242, limit: " + std::to_string(kLimit >> 20) +
         "MiB}\n";
}

}  // namespace

TEST_CASE(
    "contexts: a tenant starting 10 processes holds at most its limit plus one context and the rest get "
    "CUDA_ERROR_OUT_OF_MEMORY with vlake's message",
    "[e2e][contexts]") {
  DaemonProcess d("contexts", config());
  // vlaked's own context is as large as a tenant's: the size it charges before measuring any.
  d.env = {"VLAKE_SIM_CONTEXT_MEMORY=64MiB"};
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  // It took one reading before its first Hello (the line may follow the socket by a moment).
  CHECK(pooltest::eventually(
      [&] { return d.log().find("GPU 0: a CUDA context is charged 64 MiB (daemon)") != std::string::npos; }, 10000));

  std::vector<std::unique_ptr<TenantProcess>> tenants;
  for (int i = 0; i < kProcesses; ++i) {
    tenants.push_back(std::make_unique<TenantProcess>(d, std::vector<std::string>{"init", "sleep:60000"}, 4242, "0",
                                                      std::vector<std::string>{"VLAKE_SIM_CONTEXT_MEMORY=64MiB"}));
  }
  int created = 0;
  int refused = 0;
  std::vector<std::size_t> live;
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    const auto line = tenants[i]->wait_line("init");
    REQUIRE(line.count("rc") == 1);
    if (line.at("rc") == "0") {
      ++created;
      live.push_back(i);
    } else {
      CHECK(line.at("rc") == std::to_string(kOutOfMemory));
      ++refused;
    }
  }
  CHECK(created == 2);  // 2 × 64 MiB fit 144 MiB; a third would not
  CHECK(refused == kProcesses - 2);

  // What the tenant's processes hold per NVML: at most the limit plus one context.
  std::uint64_t held = 0;
  for (const auto& [pid, bytes] : nvml_processes(d.node)) {
    for (const auto& t : tenants) {
      if (static_cast<std::uint32_t>(t->pid()) == pid) held += bytes;
    }
  }
  CHECK(held == 2 * kContext);
  CHECK(held <= kLimit + kContext);

  // Every refused process said why, with the usual out-of-memory line.
  int messages = 0;
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    if (std::find(live.begin(), live.end(), i) != live.end()) continue;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (tenants[i]->err().find("a CUDA context of 64 MiB refused") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      (void)tenants[i]->wait_line("never", 100);
    }
    CHECK_THAT(tenants[i]->err(), Catch::Contains("vlake: out of memory on GPU 0: tenant user:4242 holds") &&
                                      Catch::Contains("of its 144 MiB limit; a CUDA context of 64 MiB refused"));
    ++messages;
  }
  CHECK(messages == kProcesses - 2);
  CHECK(pooltest::snapshot(d.state)->counters.denials_tenant_limit >= static_cast<std::uint64_t>(kProcesses - 2));

  // A context's admission ends with its process: the next one fits again.
  REQUIRE_FALSE(live.empty());
  tenants[live.front()]->kill9();
  CHECK(pooltest::eventually(
      [&] {
        const auto s = pooltest::snapshot(d.state);
        const state::TenantRecord* r = pooltest::tenant(*s, "user:4242");
        return r != nullptr && r->nonpool[0] <= kContext;
      },
      10000));
  TenantProcess next(d, {"init", "sleep:60000"}, 4242, "0", {"VLAKE_SIM_CONTEXT_MEMORY=64MiB"});
  CHECK(next.wait_line("init")["rc"] == "0");
}

TEST_CASE("contexts: cuCtxCreate and green contexts are admitted like a primary one, destroying one gives it back",
          "[e2e][contexts]") {
  DaemonProcess d("ctxcreate", config());
  d.env = {"VLAKE_SIM_CONTEXT_MEMORY=64MiB"};
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  // 144 MiB hold two 64 MiB contexts: the primary one and one created; a third of any kind is
  // refused until one is destroyed.
  const std::string oom = std::to_string(kOutOfMemory);
  TenantProcess t(d,
                  {"init", "ctxcreate:c1:cuCtxCreate_v4", "ctxcreate:c2", "ctxcreate:c3:cuCtxCreate_v3", "greenctx:g1",
                   "ctxdestroy:c1", "ctxcreate:c4:cuCtxCreate_v3", "greenctx:g2", "ctxdestroy:c4", "greenctx:g3",
                   "ctxcreate:c5", "sleep:60000"},
                  4242, "0", {"VLAKE_SIM_CONTEXT_MEMORY=64MiB"});
  CHECK(t.wait_line("init")["rc"] == "0");
  CHECK(t.wait_line("ctxcreate:c1:cuCtxCreate_v4")["rc"] == "0");
  CHECK(t.wait_line("ctxcreate:c2")["rc"] == oom);  // cuCtxCreate_v2
  CHECK(t.wait_line("ctxcreate:c3:cuCtxCreate_v3")["rc"] == oom);
  CHECK(t.wait_line("greenctx:g1")["rc"] == oom);
  CHECK(t.wait_line("ctxdestroy:c1")["rc"] == "0");
  CHECK(t.wait_line("ctxcreate:c4:cuCtxCreate_v3")["rc"] == "0");
  CHECK(t.wait_line("greenctx:g2")["rc"] == oom);
  CHECK(t.wait_line("ctxdestroy:c4")["rc"] == "0");
  CHECK(t.wait_line("greenctx:g3")["rc"] == "0");
  CHECK(t.wait_line("ctxcreate:c5")["rc"] == oom);
  CHECK_THAT(t.err(), Catch::Contains("vlake: out of memory on GPU 0: tenant user:4242 holds") &&
                          Catch::Contains("a CUDA context of 64 MiB refused"));

  // The simulator's NVML: the process holds two contexts, no more.
  const auto procs = nvml_processes(d.node);
  const auto it = procs.find(static_cast<std::uint32_t>(t.pid()));
  REQUIRE(it != procs.end());
  CHECK(it->second == 2 * kContext);
  // vlaked charges what NVML shows: two contexts, within the limit.
  CHECK(pooltest::eventually(
      [&] {
        const auto s = pooltest::snapshot(d.state);
        const state::TenantRecord* r = pooltest::tenant(*s, "user:4242");
        return r != nullptr && r->nonpool[0] == 2 * kContext;
      },
      10000));
}
#endif
