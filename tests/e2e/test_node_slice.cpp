// The node slice end to end, on the simulated driver: vlaked + tenant processes under
// LD_PRELOAD=libvlake-hook.so. Each case uses its own simulated machine, socket and state.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pool_client.hpp"
#include "tenant_process.hpp"
#include "vlake/common/driver.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace std::chrono_literals;
using namespace vlake::e2e;
using pooltest::DaemonProcess;
using pooltest::tenant;

namespace {

// Bytes of simulated device memory mapped into these processes right now, from the kernel's
// view (/proc/<pid>/maps: the simulator's memfds), independent of the daemon's accounting.
// The processes are stopped (SIGSTOP) while their maps are read, so the sum is one instant.
std::uint64_t mapped_device_bytes(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) ::kill(p, SIGSTOP);
  for (pid_t p : pids) {
    for (int i = 0; i < 200; ++i) {
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
      std::string line;
      std::getline(stat, line);
      const auto close = line.rfind(')');
      if (close == std::string::npos || close + 2 >= line.size()) break;  // exited
      const char state = line[close + 2];
      if (state == 'T' || state == 't' || state == 'Z' || state == 'X') break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  // Distinct device bytes: the union of the mapped file ranges of each memfd (a handle mapped in
  // two processes, or twice, is one piece of memory).
  std::map<std::string, std::vector<std::pair<std::uint64_t, std::uint64_t>>> by_inode;
  for (pid_t p : pids) {
    std::ifstream maps("/proc/" + std::to_string(p) + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
      if (line.find("/memfd:vlake-sim:") == std::string::npos) continue;
      std::istringstream in(line);
      std::string range, perms, offset, dev, inode;
      in >> range >> perms >> offset >> dev >> inode;
      const auto dash = range.find('-');
      const std::uint64_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
      const std::uint64_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
      const std::uint64_t off = std::stoull(offset, nullptr, 16);
      by_inode[dev + ":" + inode].emplace_back(off, off + (hi - lo));
    }
  }
  for (pid_t p : pids) ::kill(p, SIGCONT);
  std::uint64_t sum = 0;
  for (auto& [k, v] : by_inode) {
    std::sort(v.begin(), v.end());
    std::uint64_t end = 0;
    for (const auto& [a, b] : v) {
      const std::uint64_t from = std::max(a, end);
      if (b > from) sum += b - from;
      end = std::max(end, b);
    }
  }
  return sum;
}

std::string limits_yaml(const std::string& default_limit, const std::string& users = "") {
  return "version: 1\ndefault:\n  limit: " + default_limit + "\n" + users;
}

}  // namespace

TEST_CASE("over the limit a tenant gets CUDA_ERROR_OUT_OF_MEMORY and one clear line", "[e2e]") {
  DaemonProcess d("limit", limits_yaml("64MiB"));
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "alloc:a:48M", "alloc:b:32M", "info", "free:a", "alloc:c:32M"});
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err());
  CHECK(t.line("alloc:a")["rc"] == "0");
  CHECK(t.line("alloc:b")["rc"] == std::to_string(kOutOfMemory));
  CHECK(t.line("alloc:c")["rc"] == "0");  // after a free there is room again
  CHECK(t.line("info")["total"] == std::to_string(64 * MiB));
  CHECK(t.line("info")["free"] == std::to_string(16 * MiB));
  // One line naming tenant, limit, usage and request.
  CHECK(t.err().find("vlake: out of memory") != std::string::npos);
  CHECK(t.err().find("uid:0") != std::string::npos);
  CHECK(t.err().find("64 MiB limit") != std::string::npos);
  const auto s = snapshot(d);
  CHECK(s->counters.denials_over_limit == 1);
}

TEST_CASE("cuMemGetInfo and cuDeviceTotalMem show the tenant's limit", "[e2e]") {
  DaemonProcess d("info", limits_yaml("1GiB", "users:\n  - uid: 4242\n    limit: 96MiB\n"));
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "info#before", "totalmem", "alloc:a:40M", "info#after"}, 4242);
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err());
  CHECK(t.line("info#before")["total"] == std::to_string(96 * MiB));
  CHECK(t.line("info#before")["free"] == std::to_string(96 * MiB));
  CHECK(t.line("totalmem")["bytes"] == std::to_string(96 * MiB));
  CHECK(t.line("info#after")["free"] == std::to_string(56 * MiB));
}

TEST_CASE("memory freed by tenant A is granted to tenant B and reads back as zeros", "[e2e]") {
  DaemonProcess d("scrub", limits_yaml("256MiB"));
  REQUIRE(d.start({"--handle-reuse", "node"}));  // a handle changing tenant: node mode only
  {
    TenantProcess a(d, {"init", "alloc:a:32M", "fill:a:32M:171", "free:a"}, 4242);
    REQUIRE(exited_ok(a.finish()));
    INFO(a.out() << a.err());
    REQUIRE(a.line("fill:a")["ok"] == "1");
  }
  const auto before = snapshot(d);
  TenantProcess b(d, {"init", "alloc:b:32M", "check:b:32M:0"}, 4243);
  REQUIRE(exited_ok(b.finish()));
  INFO(b.out() << b.err());
  CHECK(b.line("alloc:b")["rc"] == "0");
  CHECK(b.line("check:b")["ok"] == "1");
  const auto after = snapshot(d);
  // The same handle went from A to B (reused from the free pool), and it was zeroed on the way.
  CHECK(after->counters.reuses == before->counters.reuses + 1);
  CHECK(after->counters.scrubs == before->counters.scrubs + 1);
  CHECK(after->counters.handles_created == before->counters.handles_created);
}

TEST_CASE("a mapping kept by an idle tenant goes back to the GPU when the idle release retires it", "[e2e]") {
  // docs/hook.md, "Kept mappings": A frees 640 MiB with no reserve; the hook keeps the mapping
  // and the daemon pools the handle bound to A (retained, charged to A). After the idle period
  // the daemon retires it and sends A a Drop; A's hook unmaps it and says Dropped; the memory
  // is back on the GPU (the simulator's real free memory) and another tenant gets it.
  DaemonProcess d("keptdrop",
                  "version: 1\nnamespaces:\n  - {name: na, limit: 100%, users: [4242]}\n"
                  "  - {name: nb, limit: 100%, users: [4243]}\n");
  REQUIRE(d.start({"--pool-idle-release", "300ms", "--sample-interval-ms", "100"}));
  TenantProcess a(d, {"init", "alloc:a:640M", "free:a", "sleep:30000"}, 4242);
  REQUIRE(a.wait_line("free:a")["rc"] == "0");
  auto s = snapshot(d);
  const auto* ta = tenant(*s, "na/user:4242");
  REQUIRE(ta != nullptr);
  CHECK(ta->granted[0] == 0);
  CHECK(ta->retained[0] == 640 * MiB);  // kept: still the tenant's
  // Within a few idle periods: retired, dropped, closed, gone from the pool and the books.
  bool back = false;
  for (int i = 0; i < 300 && !back; ++i) {
    std::this_thread::sleep_for(10ms);
    s = snapshot(d);
    ta = tenant(*s, "na/user:4242");
    back = ta != nullptr && ta->retained[0] == 0 && s->devices[0].pool_bytes == 0 && s->devices[0].held_fd_bytes == 0;
  }
  CHECK(back);
  ::setenv("VLAKE_SIM_NODE", d.node.c_str(), 1);
  ::setenv("VLAKE_SIM_DEVICE_MEMORY", "1GiB", 1);
  auto gpu = open_driver(VLAKE_SIM_LIB);
  CHECK(gpu->memory_info(DeviceOrdinal{0}).free == gpu->total_memory(DeviceOrdinal{0}));
  TenantProcess b(d, {"init", "alloc:b:640M", "check:b:640M:0", "free:b"}, 4243);
  REQUIRE(exited_ok(b.finish()));
  INFO(b.out() << b.err());
  CHECK(b.line("alloc:b")["rc"] == "0");
  CHECK(b.line("check:b")["ok"] == "1");
}

TEST_CASE("a tenant killed with SIGKILL has all its memory back within 1 s", "[e2e]") {
  DaemonProcess d("kill", limits_yaml("256MiB"));
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "alloc:a:64M", "alloc:b:32M", "fill:a:64M:1", "sleep:60000"}, 4242);
  REQUIRE(t.wait_line("fill:a")["ok"] == "1");
  REQUIRE(granted(d, "uid:4242") == 96 * MiB);
  const auto killed = std::chrono::steady_clock::now();
  t.kill9();
  std::uint64_t still = 1;
  while (std::chrono::steady_clock::now() - killed < 1s) {
    still = granted(d, "uid:4242");
    if (still == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(still == 0);
  const auto s = snapshot(d);
  // Its last process is gone: its handles (bound to it, docs/pool.md "Handle binding") were
  // retired, nothing is kept or charged for it, the memory is back on the GPU.
  CHECK(s->devices[0].free_bytes == 0);
  CHECK(s->devices[0].pool_bytes == 0);
  CHECK(s->devices[0].retained_bytes == 0);
  CHECK(s->devices[0].held_fd_bytes == 0);
  CHECK(s->devices[0].granted_bytes == 0);
  CHECK(s->counters.process_exits == 1);
}

TEST_CASE("4 processes x 4 threads of random alloc/free never exceed the tenant's limit", "[e2e]") {
  constexpr std::uint64_t kLimit = 96 * MiB;
  DaemonProcess d("stress", limits_yaml("96MiB"));
  REQUIRE(d.start());
  std::vector<std::unique_ptr<TenantProcess>> tenants;
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i) {
    tenants.push_back(std::make_unique<TenantProcess>(d, std::vector<std::string>{"init", "stress:4:40:24M"}));
    pids.push_back(tenants.back()->pid());
  }
  // Watch the daemon's accounting and, independently, the device memory the tenant processes
  // really have mapped (the simulated driver's physical state) while they run.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> max_granted{0}, max_mapped{0}, samples{0};
  std::thread watcher([&] {
    while (!stop) {
      const std::uint64_t g = granted(d, "uid:0");
      const std::uint64_t m = mapped_device_bytes(pids);
      if (g > max_granted) max_granted = g;
      if (m > max_mapped) max_mapped = m;
      ++samples;
      std::this_thread::sleep_for(2ms);
    }
  });
  int ok = 0, refused = 0;
  for (auto& t : tenants) {
    REQUIRE(exited_ok(t->finish(90000)));
    const auto r = t->line("stress");
    INFO(t->out() << t->err());
    CHECK(r.at("errors") == "0");
    CHECK(r.at("overlaps") == "0");
    ok += std::stoi(r.at("ok"));
    refused += std::stoi(r.at("refused"));
  }
  stop = true;
  watcher.join();
  INFO("ok=" << ok << " refused=" << refused << " samples=" << samples << " max granted=" << max_granted
             << " max mapped=" << max_mapped);
  CHECK(ok > 0);
  CHECK(refused > 0);  // the limit was really reached
  CHECK(samples > 10);
  CHECK(max_granted <= kLimit);
  CHECK(max_mapped > 0);
  CHECK(max_mapped <= kLimit);
  // The daemon sees the exits: the tenant's last session ending retires its handles, and the
  // tenant, holding nothing, has its record freed.
  auto s = snapshot(d);
  for (int i = 0; i < 200 && pooltest::live_sessions(*s) != 0; ++i) {
    std::this_thread::sleep_for(10ms);
    s = snapshot(d);
  }
  CHECK(pooltest::live_sessions(*s) == 0);
  const auto* t0 = tenant(*s, "uid:0");
  CHECK((t0 == nullptr || t0->granted[0] == 0));
  // Accounting matches the driver: what the daemon holds is what the simulated GPU has in use.
  ::setenv("VLAKE_SIM_NODE", d.node.c_str(), 1);
  for (const auto& kv : pooltest::child_env(d.node)) {
    if (kv.rfind("VLAKE_SIM_DEVICE_MEMORY=", 0) == 0) {
      ::setenv("VLAKE_SIM_DEVICE_MEMORY", kv.substr(24).c_str(), 1);
    }
  }
  auto gpu = open_driver(VLAKE_SIM_LIB);
  const Bytes capacity = gpu->total_memory(DeviceOrdinal{0});
  CHECK(s->devices[0].pool_bytes == (capacity - gpu->memory_info(DeviceOrdinal{0}).free).value());
}

TEST_CASE("vlaked killed and restarted under load: tenants keep running, accounting equal", "[e2e]") {
  DaemonProcess d("restart", limits_yaml("256MiB"));
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "alloc:a:32M", "alloc:b:16M", "fill:a:32M:7", "sleep:1500", "check:a:32M:7", "free:a",
                      "alloc:c:64M", "fill:c:64M:9", "info", "free:b", "free:c"});
  REQUIRE(t.wait_line("fill:a")["ok"] == "1");
  const auto before = snapshot(d);
  const auto* tb = tenant(*before, "uid:0");
  REQUIRE(tb != nullptr);
  REQUIRE(tb->granted[0] == 48 * MiB);

  d.signal(SIGKILL);
  REQUIRE(d.wait_exit() >= 0);
  REQUIRE(d.start());
  const auto after = snapshot(d);
  const auto* ta = tenant(*after, "uid:0");
  REQUIRE(ta != nullptr);
  CHECK(after->header.starts == 2);
  CHECK(ta->granted[0] == tb->granted[0]);
  CHECK(ta->limit[0] == tb->limit[0]);
  std::size_t live_before = 0, live_after = 0;
  for (const auto& g : before->grants) live_before += g.state != state::kGrantFree ? 1 : 0;
  for (const auto& g : after->grants) live_after += g.state != state::kGrantFree ? 1 : 0;
  CHECK(live_after == live_before);

  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err() << d.log());
  CHECK(t.line("check:a")["ok"] == "1");  // its mapping survived the daemon
  CHECK(t.line("free:a")["rc"] == "0");
  CHECK(t.line("alloc:c")["rc"] == "0");  // and the new daemon serves it
  CHECK(t.line("fill:c")["ok"] == "1");
  CHECK(t.line("free:c")["rc"] == "0");
  std::uint64_t left = 1;
  for (int i = 0; i < 100 && left != 0; ++i) {
    left = granted(d, "uid:0");
    std::this_thread::sleep_for(10ms);
  }
  CHECK(left == 0);
}

TEST_CASE("quota file edited while a tenant runs: new limits apply, an invalid edit changes nothing", "[e2e][quota]") {
  const auto yaml = [](const std::string& limit) {
    return "version: 1\ndefault:\n  limit: 1GiB\nnamespaces:\n  - name: team\n    limit: 256MiB\n"
           "users:\n  - uid: 4242\n    limit: " +
           limit + "\n    namespace: team\n";
  };
  DaemonProcess d("reload", yaml("128MiB"));
  REQUIRE(d.start());
  const auto limit_of = [&] {
    const auto s = snapshot(d);
    const auto* t = tenant(*s, "team/user:4242");
    return t == nullptr ? 0 : t->limit[0];
  };
  const auto rewrite = [&](const std::string& text) {  // like an editor: write aside, rename over
    const std::string tmp = d.config + ".new";
    { std::ofstream(tmp) << text; }
    REQUIRE(::rename(tmp.c_str(), d.config.c_str()) == 0);
  };
  TenantProcess t(
      d,
      {"init", "info#1", "alloc:a:32M", "sleep:3000", "info#2", "alloc:b:48M", "sleep:3000", "info#3", "alloc:c:16M"},
      4242);
  REQUIRE(t.wait_line("info#1")["total"] == std::to_string(128 * MiB));

  rewrite(yaml("64MiB"));  // lowered while the tenant runs
  for (int i = 0; i < 200 && limit_of() != 64 * MiB; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(limit_of() == 64 * MiB);
  REQUIRE(t.wait_line("alloc:b").size() > 0);

  rewrite(yaml("64 MegaBytes"));  // invalid: rejected, the 64 MiB limit stays
  std::uint64_t errors = 0;
  for (int i = 0; i < 200 && errors == 0; ++i) {
    errors = snapshot(d)->counters.config_reload_errors;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(errors == 1);
  CHECK(limit_of() == 64 * MiB);

  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err() << d.log());
  CHECK(t.line("info#2")["total"] == std::to_string(64 * MiB));
  CHECK(t.line("alloc:b")["rc"] == std::to_string(kOutOfMemory));  // 32 + 48 > 64
  CHECK(t.err().find("of its 64 MiB limit") != std::string::npos);
  CHECK(t.line("info#3")["total"] == std::to_string(64 * MiB));
  CHECK(t.line("alloc:c")["rc"] == "0");  // 32 + 16 <= 64: the old (valid) limit is in force
  const auto s = snapshot(d);
  CHECK(s->config.rejected == 1);
  CHECK(std::string(s->config.last_error).find("vlake.yaml:") != std::string::npos);
}

TEST_CASE("a namespace's limit and other namespaces' guarantees refuse with their own message", "[e2e][quota]") {
  DaemonProcess d("nsmsg", R"(version: 1
default:
  limit: 1GiB
namespaces:
  - name: small
    limit: 64MiB
    pod_limit: 48MiB
    users: [4242, 4243]
  - name: reserved
    guaranteed: 900MiB
    users: [4245]
)");
  REQUIRE(d.start());
  TenantProcess holder(d, {"init", "alloc:a:40M", "sleep:20000"}, 4242);
  REQUIRE(holder.wait_line("alloc:a")["rc"] == "0");
  TenantProcess a(d, {"init", "alloc:a:32M"}, 4243);  // 32 <= its 48, but 40 + 32 > 64
  REQUIRE(exited_ok(a.finish()));
  INFO(a.out() << a.err());
  CHECK(a.line("alloc:a")["rc"] == std::to_string(kOutOfMemory));
  CHECK(a.err().find("the namespace of tenant small/user:4243 holds 40 MiB of its 64 MiB limit") != std::string::npos);
  // The simulated GPU has 1 GiB: 124 MiB are not guaranteed, 40 of them borrowed by `small`.
  TenantProcess b(d, {"init", "alloc:a:60M", "alloc:b:40M"}, 4244);  // default namespace
  REQUIRE(exited_ok(b.finish()));
  INFO(b.out() << b.err());
  CHECK(b.line("alloc:a")["rc"] == "0");
  CHECK(b.line("alloc:b")["rc"] == std::to_string(kOutOfMemory));  // 40 + 60 + 40 > 124
  CHECK(b.err().find("guaranteed to other namespaces") != std::string::npos);
  const auto s = snapshot(d);
  CHECK(s->counters.denials_namespace_limit == 1);
  CHECK(s->counters.denials_guarantee == 1);
}

TEST_CASE("a tenant at vlaked's session cap gets CUDA_ERROR_OUT_OF_MEMORY and the daemon's reason", "[e2e]") {
  DaemonProcess d("scap", limits_yaml("64MiB"));
  REQUIRE(d.start({"--max-sessions-per-tenant", "1"}));
  // This process holds uid 0's one session.
  pooltest::PoolClient holder(d.socket);
  holder.hello();
  TenantProcess t(d, {"init", "alloc:a:4M"});
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err());
  // Refused from its CUDA context on (docs/hook.md, "Contexts"): no memory outside its session.
  CHECK(t.line("init")["rc"] == std::to_string(kOutOfMemory));
  CHECK(t.line("alloc:a")["rc"] != "0");
  // The daemon's text, not "cannot reach vlaked".
  CHECK(t.err().find("vlake: vlaked refused this process (session cap: tenant uid:0 holds 1 of 1 sessions "
                     "(vlaked --max-sessions-per-tenant)); a CUDA context on GPU 0 refused") != std::string::npos);
  CHECK(t.err().find("cannot reach") == std::string::npos);
  CHECK(snapshot(d)->counters.denials_session_cap >= 1);
}
