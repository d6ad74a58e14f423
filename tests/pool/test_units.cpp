// Unit tests of the daemon's parts that need no GPU: options, the accounting invariant under
// threads, NVML attribution (fake NVML). The state segment's tests are in tests/contracts.
#include <catch2/catch.hpp>

#include <set>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "vlake/common/proc.hpp"
#include "vlake/pool/accounting.hpp"
#include "vlake/pool/conn_limits.hpp"
#include "vlake/pool/nvml_source.hpp"
#include "vlake/pool/options.hpp"
#include "vlake/pool/proc_identity.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;

namespace {
DaemonOptions parse(const std::vector<const char*>& args) {
  const char* argv[32] = {"vlaked"};
  int argc = 1;
  for (const char* a : args) argv[argc++] = a;
  return DaemonOptions::parse(argc, argv);
}
}  // namespace

TEST_CASE("options: defaults, values, errors", "[pool][options]") {
  const DaemonOptions d = parse({});
  CHECK(d.config == "/etc/vlake/vlake.yaml");
  CHECK(d.socket == "/run/vlake/vlaked.sock");
  CHECK(d.state == "vlake-state");
  CHECK(d.driver == "libcuda.so.1");
  CHECK(d.nvml == "libnvidia-ml.so.1");
  CHECK(d.log_level == LogLevel::info);
  CHECK(d.sample_interval.count() == 1000);
  CHECK(d.lock_path() == "/run/vlake/vlaked.sock.lock");
  CHECK_FALSE(d.help);

  const DaemonOptions o = parse({"--config", "/c.yaml", "--socket=/tmp/s", "--state", "st", "--driver", "/x.so",
                                 "--nvml", "none", "--log-level", "debug", "--sample-interval-ms", "250"});
  CHECK(o.config == "/c.yaml");
  CHECK(o.socket == "/tmp/s");
  CHECK(o.state == "st");
  CHECK(o.driver == "/x.so");
  CHECK(o.nvml.empty());
  CHECK(o.log_level == LogLevel::debug);
  CHECK(o.sample_interval.count() == 250);
  CHECK(parse({"--help"}).help);
  CHECK_THAT(DaemonOptions::usage(), Catch::Contains("--sample-interval-ms"));
  CHECK(parse({}).state_mode == 0600);
  CHECK(parse({"--state-mode", "0640", "--state-group", "4242"}).state_mode == 0640);
  CHECK(parse({"--state-group", "4242"}).state_gid == 4242);

  struct Bad {
    std::vector<const char*> args;
    const char* msg;
  };
  const std::vector<Bad> bad = {
      {{"--bogus"}, "unknown option '--bogus'"},
      {{"--socket"}, "option --socket needs a value"},
      {{"--log-level", "loud"}, "unknown log level 'loud'"},
      {{"--sample-interval-ms", "0"}, "--sample-interval-ms must be a number 10..3600000"},
      {{"--sample-interval-ms", "abc"}, "--sample-interval-ms must be a number"},
      {{"--state", "a/b"}, "--state must be a name without '/'"},
      {{"--config="}, "needs a non-empty value"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--state-mode", "0666"}, "no write for group/others"},
      {{"--state-mode", "0400"}, "owner read-write"},
      {{"--state-mode", "rw"}, "--state-mode must be an octal mode"},
      {{"--state-group", "no-such-group-vlake"}, "no group named 'no-such-group-vlake'"},
  };
  for (const auto& b : bad) {
    INFO(b.msg);
    try {
      (void)parse(b.args);
      FAIL("accepted");
    } catch (const OptionsError& e) {
      CHECK_THAT(e.what(), Catch::Contains(b.msg));
    }
  }
}

TEST_CASE("options: limits against hostile tenants", "[pool][options][limits]") {
  const DaemonOptions d = parse({});
  const DaemonOptions o =
      parse({"--max-sessions-per-tenant", "4", "--max-grants-per-tenant=100", "--max-connections-per-uid", "9",
             "--max-unauthenticated", "7", "--max-unauthenticated-per-uid", "3", "--hello-timeout-ms", "250",
             "--guard-event-rate", "2", "--guard-event-burst", "5"});
  // Each limit: its option, its value by default (d) and as the command line above sets it (o),
  // then what each must be.
  struct Limit {
    const char* option;
    long long by_default;
    long long set;
    long long want_default;
    long long want_set;
  };
  const Limit limits[] = {
      {"--max-sessions-per-tenant", d.max_sessions_per_tenant, o.max_sessions_per_tenant, 128, 4},
      {"--max-grants-per-tenant", d.max_grants_per_tenant, o.max_grants_per_tenant, 2048, 100},
      {"--max-connections-per-uid", d.max_connections_per_uid, o.max_connections_per_uid, 256, 9},
      {"--max-unauthenticated", d.max_unauthenticated, o.max_unauthenticated, 512, 7},
      {"--max-unauthenticated-per-uid", d.max_unauthenticated_per_uid, o.max_unauthenticated_per_uid, 64, 3},
      {"--hello-timeout-ms", d.hello_timeout.count(), o.hello_timeout.count(), 5000, 250},
      {"--guard-event-rate", d.guard_event_rate, o.guard_event_rate, 10, 2},
      {"--guard-event-burst", d.guard_event_burst, o.guard_event_burst, 20, 5},
  };
  for (const Limit& l : limits) {
    INFO(l.option);
    CHECK(l.by_default == l.want_default);
    CHECK(l.set == l.want_set);
  }
  CHECK_THROWS_WITH(parse({"--max-sessions-per-tenant", "1025"}),
                    "--max-sessions-per-tenant must be a number 1..1024, got '1025'");
  CHECK_THROWS_WITH(parse({"--max-grants-per-tenant", "0"}),
                    "--max-grants-per-tenant must be a number 1..16384, got '0'");
  CHECK_THROWS_AS(parse({"--hello-timeout-ms", "5s"}), OptionsError);
}

TEST_CASE("connection limits: per-peer cap, awaiting-Hello caps, Hello deadline", "[pool][limits]") {
  using namespace std::chrono;
  ConnLimits l(ConnLimitSettings{3, 4, 2, milliseconds(100)});
  const auto t0 = steady_clock::time_point(hours(1));
  const std::string a = ConnLimits::peer_of(1000, "");
  const std::string b = ConnLimits::peer_of(1001, "");
  CHECK(a == "uid 1000");
  CHECK(ConnLimits::peer_of(0, "abc") == "allocation abc");
  CHECK(l.admit(1, a, t0) == ConnLimits::Admit::ok);
  CHECK(l.admit(2, a, t0) == ConnLimits::Admit::ok);
  CHECK(l.admit(3, a, t0) == ConnLimits::Admit::unauthenticated_peer_cap);
  CHECK(l.describe(ConnLimits::Admit::unauthenticated_peer_cap, a) ==
        "unauthenticated cap: uid 1000 has 2 of 2 connections awaiting Hello (vlaked --max-unauthenticated-per-uid)");
  l.authenticated(1);
  CHECK(l.admit(4, a, t0) == ConnLimits::Admit::ok);
  l.authenticated(4);
  CHECK(l.admit(5, a, t0) == ConnLimits::Admit::peer_cap);  // 1, 2, 4 held
  CHECK(l.describe(ConnLimits::Admit::peer_cap, a) ==
        "connection cap: uid 1000 holds 3 of 3 connections (vlaked --max-connections-per-uid)");
  CHECK(l.admit(6, b, t0) == ConnLimits::Admit::ok);
  CHECK(l.admit(7, b, t0 + milliseconds(50)) == ConnLimits::Admit::ok);
  CHECK(l.unauthenticated() == 3);  // 2, 6, 7
  const std::string c = ConnLimits::peer_of(1002, "");
  CHECK(l.admit(8, c, t0) == ConnLimits::Admit::ok);
  CHECK(l.take_evicted().empty());
  // The table is full (2, 6, 7, 8): a newcomer of a peer holding none evicts the oldest of the
  // peer holding the most (b: 6).
  CHECK(l.admit(9, ConnLimits::peer_of(1003, ""), t0) == ConnLimits::Admit::ok);
  CHECK(l.take_evicted() == std::vector<std::uint64_t>{6});
  CHECK(l.take_evicted().empty());
  CHECK(l.unauthenticated() == 4);
  // Every peer holds one now: a second of c's is refused (it would hold the most).
  CHECK(l.admit(10, c, t0) == ConnLimits::Admit::unauthenticated_cap);
  CHECK(l.describe(ConnLimits::Admit::unauthenticated_cap, c) ==
        "unauthenticated cap: 4 of 4 connections await Hello (vlaked --max-unauthenticated), no peer holds more of "
        "them than uid 1002");
  CHECK(l.take_evicted().empty());
  CHECK(l.next_deadline() == t0 + milliseconds(100));
  CHECK(l.expired(t0 + milliseconds(99)).empty());
  std::vector<std::uint64_t> late = l.expired(t0 + milliseconds(100));
  std::sort(late.begin(), late.end());
  CHECK(late == std::vector<std::uint64_t>{2, 8, 9});
  CHECK(l.next_deadline() == t0 + milliseconds(150));
  CHECK(l.connections(a) == 2);  // 1 and 4; 2 expired
  CHECK(l.connections(b) == 1);  // 7; 6 evicted
  l.closed(1);
  l.closed(4);
  l.closed(4);  // twice: ignored
  l.closed(6);  // evicted: already forgotten
  CHECK(l.connections(a) == 0);
  CHECK(l.expired(t0 + seconds(1)) == std::vector<std::uint64_t>{7});
  CHECK_FALSE(l.next_deadline().has_value());
}

TEST_CASE("connection limits: silent connections of many peers only displace their own", "[pool][limits]") {
  using namespace std::chrono;
  // 8 peers × 64 silent connections fill the 512 awaiting Hello; an honest peer's connections
  // each evict the oldest of a flooding peer, never one of its own.
  ConnLimits l(ConnLimitSettings{256, 512, 64, milliseconds(5000)});
  const auto t0 = steady_clock::time_point(hours(1));
  std::uint64_t id = 1;
  for (int i = 0; i < 64; ++i) {
    for (std::uint32_t u = 0; u < 8; ++u)
      REQUIRE(l.admit(id++, ConnLimits::peer_of(60001 + u, ""), t0 + milliseconds(i)) == ConnLimits::Admit::ok);
  }
  REQUIRE(l.unauthenticated() == 512);
  REQUIRE(l.take_evicted().empty());
  const std::string honest = ConnLimits::peer_of(4200, "");
  std::set<std::uint64_t> mine;
  for (int i = 0; i < 40; ++i) {
    mine.insert(id);
    CHECK(l.admit(id++, honest, t0 + seconds(1)) == ConnLimits::Admit::ok);
    CHECK(l.take_evicted().size() == 1);
    // Each flooding peer reconnects at once: it may displace another flooder, never the honest.
    for (std::uint32_t u = 0; u < 8; ++u) (void)l.admit(id++, ConnLimits::peer_of(60001 + u, ""), t0 + seconds(1));
    for (std::uint64_t e : l.take_evicted()) CHECK(mine.count(e) == 0);
  }
  CHECK(l.connections(honest) == 40);
  CHECK(l.unauthenticated() == 512);
}

TEST_CASE("log limiter: a burst per key, then one line per token with the suppressed count", "[pool][limits]") {
  using namespace std::chrono;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  {
    Logger log("t", LogLevel::info, fds[1]);
    std::uint64_t counter = 0;
    LogLimiter l(log, 1.0, 2.0, &counter);
    const auto t0 = steady_clock::time_point(hours(1));
    CHECK(l.warn("k", "one", t0));
    CHECK(l.warn("k", "two", t0));
    CHECK_FALSE(l.warn("k", "three", t0));
    CHECK_FALSE(l.warn("k", "four", t0));
    CHECK(l.warn("other", "x", t0));  // keys are independent
    CHECK(l.info("k", "five", t0 + seconds(1)));
    CHECK(counter == 2);
    CHECK(l.suppressed() == 2);
    // Many made-up keys: memory stays bounded, lines are still limited.
    int logged = 0;
    for (int i = 0; i < 10000; ++i) logged += l.warn("key " + std::to_string(i), "y", t0 + seconds(1)) ? 1 : 0;
    CHECK(logged <= static_cast<int>(LogLimiter::kMaxKeys) + 2);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  CHECK(out.rfind("t: warn: one\nt: warn: two\nt: warn: x\nt: info: five (2 similar lines suppressed)\n", 0) == 0);
}

TEST_CASE("options: --metrics-address", "[pool][options]") {
  // The default listens on loopback only: the metrics name tenants, namespaces and usage, which
  // other hosts need not see unless --metrics-address says so.
  CHECK(parse({}).metrics_address == "127.0.0.1:19400");
  CHECK_THAT(DaemonOptions::usage(), Catch::Contains("default 127.0.0.1:19400"));
  CHECK(parse({"--metrics-address", ":19400"}).metrics_address == ":19400");
  CHECK_FALSE(parse({}).metrics_address_given);
  CHECK(parse({"--metrics-address", "none"}).metrics_address.empty());
  CHECK(parse({"--metrics-address=127.0.0.1:9500"}).metrics_address == "127.0.0.1:9500");
  CHECK(parse({"--metrics-address=127.0.0.1:9500"}).metrics_address_given);
  CHECK_THROWS_WITH(parse({"--metrics-address", "19400"}), Catch::StartsWith("--metrics-address: "));
  CHECK_THROWS_AS(parse({"--metrics-address", ":0"}), OptionsError);
  CHECK_THAT(DaemonOptions::usage(), Catch::Contains("--metrics-address ADDR"));
}

TEST_CASE("accounting: reserve, commit, rollback, uncharge", "[pool][accounting]") {
  Accounting a;
  const TenantId t{1};
  const DeviceOrdinal d{0};
  CHECK_FALSE(a.reserve(t, d, 1_B).has_value());  // no limit set: 0
  a.set_limit(t, d, 10_MiB);
  {
    auto r = a.reserve(t, d, 6_MiB);
    REQUIRE(r);
    CHECK(a.usage(t, d).reserved == 6_MiB);
    CHECK_FALSE(a.reserve(t, d, 6_MiB).has_value());  // reserved counts
  }                                                   // destroyed uncommitted: rolled back
  CHECK(a.usage(t, d).reserved == 0_B);
  auto r = a.reserve(t, d, 6_MiB);
  REQUIRE(r);
  r->commit();
  CHECK(a.usage(t, d).granted == 6_MiB);
  CHECK(a.usage(t, d).reserved == 0_B);
  a.set_nonpool(t, d, 3_MiB);
  Accounting::Usage seen{};
  CHECK_FALSE(a.reserve(t, d, 2_MiB, &seen).has_value());  // 6 + 3 + 2 > 10
  CHECK(seen.used() == 9_MiB);
  CHECK(a.reserve(t, d, 1_MiB).has_value());
  CHECK(a.uncharge(t, d, 6_MiB));
  CHECK(a.usage(t, d).granted == 0_B);
  CHECK_FALSE(a.uncharge(t, d, 1_MiB));  // more than granted: clamped, reported
  a.restore(t, d, 20_MiB);               // recovered grants may exceed the limit
  CHECK(a.usage(t, d).granted == 20_MiB);
  CHECK_FALSE(a.reserve(t, d, 1_B).has_value());
  CHECK_FALSE(a.reserve(t, d, Bytes{~0ULL}).has_value());  // no overflow
}

TEST_CASE("accounting: no interleaving of threads exceeds a limit", "[pool][accounting]") {
  Accounting a;
  constexpr int kTenants = 5;
  constexpr int kDevices = 2;
  std::mt19937 setup(12345);
  std::map<std::pair<std::uint32_t, std::int32_t>, Bytes> limits;
  for (std::uint32_t t = 1; t <= kTenants; ++t) {
    for (std::int32_t d = 0; d < kDevices; ++d) {
      const Bytes limit = Bytes{(1 + setup() % 64) * (1ULL << 20)};
      a.set_limit(TenantId{t}, DeviceOrdinal{d}, limit);
      a.set_nonpool(TenantId{t}, DeviceOrdinal{d}, Bytes{(setup() % 4) * (1ULL << 20)});
      limits[{t, d}] = limit;
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> violations{0};
  std::atomic<std::uint64_t> checks{0};
  std::thread checker([&] {
    while (!stop.load()) {
      for (const auto& e : a.snapshot()) {
        if ((e.usage.granted + e.usage.nonpool + e.usage.reserved).value() > e.usage.limit.value()) ++violations;
      }
      ++checks;
    }
  });
  constexpr int kThreads = 8;
  std::vector<std::map<std::pair<std::uint32_t, std::int32_t>, Bytes>> held(kThreads);
  std::atomic<std::uint64_t> granted_ok{0};
  std::atomic<std::uint64_t> refused{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < kThreads; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 rng(static_cast<unsigned>(w) * 7919u + 1u);
      for (int i = 0; i < 20000; ++i) {
        const std::uint32_t t = 1 + rng() % kTenants;
        const std::int32_t d = static_cast<std::int32_t>(rng() % kDevices);
        auto& mine = held[static_cast<std::size_t>(w)][{t, d}];
        const unsigned op = rng() % 10;
        if (op < 5) {
          const Bytes n = Bytes{(1 + rng() % 16) * (1ULL << 20)};
          auto r = a.reserve(TenantId{t}, DeviceOrdinal{d}, n);
          if (!r) {
            ++refused;
            continue;
          }
          if (rng() % 4 == 0) {
            r->rollback();
          } else {
            r->commit();
            mine += n;
            ++granted_ok;
          }
        } else if (mine > 0_B) {
          const Bytes n = Bytes{std::min<std::uint64_t>(mine.value(), (1 + rng() % 16) * (1ULL << 20))};
          REQUIRE(a.uncharge(TenantId{t}, DeviceOrdinal{d}, n));
          mine -= n;
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  stop = true;
  checker.join();
  CHECK(violations.load() == 0);
  CHECK(checks.load() > 10);
  CHECK(granted_ok.load() > 1000);
  CHECK(refused.load() > 100);  // limits were actually contended
  // What each thread believes it holds is exactly what the books say.
  for (std::uint32_t t = 1; t <= kTenants; ++t) {
    for (std::int32_t d = 0; d < kDevices; ++d) {
      Bytes sum{0};
      for (const auto& h : held) {
        if (auto it = h.find({t, d}); it != h.end()) sum += it->second;
      }
      const auto u = a.usage(TenantId{t}, DeviceOrdinal{d});
      CHECK(u.granted == sum);
      CHECK(u.reserved == 0_B);
      CHECK(u.granted + u.nonpool <= limits[{t, d}]);
    }
  }
}

namespace {
class FakeNvml final : public NvmlSource {
 public:
  std::map<Uuid, std::vector<ProcessUsage>> gpus;
  std::optional<std::vector<ProcessUsage>> processes(const Uuid& gpu) override {
    auto it = gpus.find(gpu);
    if (it == gpus.end()) return std::nullopt;
    return it->second;
  }
  std::optional<Bytes> used(const Uuid& gpu) override {
    auto it = gpus.find(gpu);
    if (it == gpus.end()) return std::nullopt;
    Bytes sum{0};
    for (const ProcessUsage& p : it->second) sum += p.used;
    return sum;
  }
};
}  // namespace

TEST_CASE("nvml: non-pool usage is attributed to session tenants", "[pool][nvml]") {
  FakeNvml nvml;
  Uuid g0{};
  g0[0] = 1;
  Uuid g1{};
  g1[0] = 2;
  Uuid g2{};  // a GPU NVML does not know
  g2[0] = 3;
  const std::uint32_t daemon = 100;
  nvml.gpus[g0] = {{daemon, 900_MiB}, {201, 500_MiB}, {202, 300_MiB}, {203, 100_MiB}, {999, 700_MiB}};
  nvml.gpus[g1] = {{201, 50_MiB}, {204, 10_MiB}};
  NonpoolInputs in;
  in.daemon_pid = daemon;
  in.devices = {{DeviceOrdinal{0}, g0}, {DeviceOrdinal{1}, g1}, {DeviceOrdinal{2}, g2}};
  in.pid_tenant = {
      {201, TenantId{1}}, {202, TenantId{1}}, {203, TenantId{2}}, {204, TenantId{3}}, {daemon, TenantId{9}}};
  // pid 202 holds a 200 MiB orphaned grant on GPU 0 (its charge moved to it); pid 203 one
  // larger than what NVML shows: clamped at 0.
  in.orphaned[{202, 0}] = 200_MiB;
  in.orphaned[{203, 0}] = 150_MiB;
  const NonpoolResult r = attribute_nonpool(nvml, in);
  CHECK(r.at({1, 0}) == 500_MiB + 100_MiB);
  CHECK(r.at({2, 0}) == 0_B);
  CHECK(r.at({3, 0}) == 0_B);  // present (reset to 0) though NVML lists no process of it
  CHECK(r.at({9, 0}) == 0_B);  // the daemon's pid is never attributed
  CHECK(r.at({1, 1}) == 50_MiB);
  CHECK(r.at({3, 1}) == 10_MiB);
  CHECK(r.count({1, 2}) == 0);  // unknown GPU: no entry
}

TEST_CASE("nvml: a missing library is an error, not a crash", "[pool][nvml]") {
  CHECK_THROWS_WITH(open_nvml("/nonexistent/libnvidia-ml.so.1"), Catch::Contains("cannot load"));
}

TEST_CASE("proc identity: uid and gid and pod UID and allocation mounts are read from /proc text", "[pool][unhooked]") {
  CHECK(parse_status_ids("Name:\tpython\nUid:\t1000\t1001\t1001\t1001\nGid:\t50\t60\t60\t60\n") ==
        std::make_pair(std::uint32_t{1001}, std::uint32_t{60}));
  CHECK_FALSE(parse_status_ids("Name:\tx\nUid:\t1\t1\t1\t1\n").has_value());
  CHECK(pod_uid_from_cgroup(
            "0::/kubepods.slice/kubepods-burstable.slice/"
            "kubepods-burstable-pod4f0a1b2c_1111_2222_3333_444455556666.slice/cri-containerd-ab.scope\n") ==
        "4f0a1b2c-1111-2222-3333-444455556666");
  CHECK(pod_uid_from_cgroup("11:memory:/kubepods/besteffort/pod4f0a1b2c-1111-2222-3333-444455556666/abcdef\n") ==
        "4f0a1b2c-1111-2222-3333-444455556666");
  CHECK(pod_uid_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n").empty());
  const std::string mountinfo =
      "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
      "600 500 8:1 /var/lib/vlake/alloc/0123456789abcdef /run/vlake rw - ext4 /dev/sda1 rw\n"
      "601 500 8:1 /var/lib/vlake/alloc/0123456789abcdef/ld.so.preload /etc/ld.so.preload ro - ext4 /dev/sda1 rw\n"
      "602 500 8:1 /data/fedcba9876543210/model.bin /model ro - ext4 /dev/sda1 rw\n";
  CHECK(alloc_ids_from_mountinfo(mountinfo) == std::vector<std::string>{"0123456789abcdef"});
  // The test process itself: root here, no pod.
  const auto me = read_process_identity(static_cast<std::uint32_t>(::getpid()), true);
  REQUIRE(me.has_value());
  CHECK(me->uid == ::geteuid());
  CHECK(me->start_time == process_start_time(static_cast<std::uint32_t>(::getpid())));
  CHECK_FALSE(read_process_identity(0x7ffffff0u, false).has_value());
}

TEST_CASE("proc identity: the GPU's users are the processes with a device file open or mapped", "[pool][unhooked]") {
  const std::vector<std::string> real = {"/dev/nvidia*"};
  CHECK(matches_device_file("/dev/nvidiactl", real));
  CHECK(matches_device_file("/dev/nvidia0", real));
  CHECK(matches_device_file("/dev/nvidia-uvm", real));
  CHECK_FALSE(matches_device_file("/dev/null", real));
  CHECK_FALSE(matches_device_file("/dev/nvidi", real));
  const std::vector<std::string> sim = {"/dev/shm/vlake-sim-a"};
  CHECK(matches_device_file("/dev/shm/vlake-sim-a", sim));
  CHECK(matches_device_file("/dev/shm/vlake-sim-a (deleted)", sim));
  CHECK_FALSE(matches_device_file("/dev/shm/vlake-sim-ab", sim));
  CHECK_FALSE(matches_device_file("/dev/shm/vlake-sim-a", {}));

  // A child with the file open is a user; this process (`self`), though it has it open, is not.
  const std::string path = "/dev/shm/vlake-units-devfile-" + std::to_string(::getpid());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  const std::vector<std::uint32_t> users = device_file_users({path}, static_cast<std::uint32_t>(::getpid()));
  CHECK(users == std::vector<std::uint32_t>{static_cast<std::uint32_t>(child)});
  CHECK(device_file_users({}, 0).empty());
  // "map:" entries ask for a mapping, not a descriptor: the child has the file open, unmapped.
  CHECK(device_file_users({"map:" + path}, static_cast<std::uint32_t>(::getpid())).empty());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  ::close(fd);
  CHECK(device_file_users({path}, static_cast<std::uint32_t>(::getpid())).empty());

  // A child that maps the file and closes its descriptor is a user by its mapping only (as a CUDA
  // process maps /dev/nvidiactl), which "map:" finds and a plain entry does not.
  REQUIRE(::truncate(path.c_str(), 4096) == 0);
  REQUIRE(::pipe(ready) == 0);
  const pid_t mapper = ::fork();
  REQUIRE(mapper >= 0);
  if (mapper == 0) {
    const int mfd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    void* m = mfd < 0 ? MAP_FAILED : ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, mfd, 0);
    if (m == MAP_FAILED) ::_exit(1);
    ::close(mfd);
    const char r = 'r';
    if (::write(ready[1], &r, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  REQUIRE(::read(ready[0], &c, 1) == 1);
  const auto self = static_cast<std::uint32_t>(::getpid());
  CHECK(device_file_users({"map:" + path}, self) == std::vector<std::uint32_t>{static_cast<std::uint32_t>(mapper)});
  CHECK(device_file_users({path}, self).empty());
  ::kill(mapper, SIGKILL);
  ::waitpid(mapper, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  ::unlink(path.c_str());
}

TEST_CASE("options: --pool-idle-release and --pool-keep", "[pool][options][idle]") {
  using std::chrono::milliseconds;
  CHECK(parse({}).pool_idle_release == milliseconds(30'000));
  CHECK(parse({}).pool_keep == 0);
  CHECK(parse({"--pool-idle-release", "200ms"}).pool_idle_release == milliseconds(200));
  CHECK(parse({"--pool-idle-release=2m"}).pool_idle_release == milliseconds(120'000));
  CHECK(parse({"--pool-idle-release", "250ms"}).pool_idle_release == milliseconds(250));
  CHECK(parse({"--pool-idle-release", "1h"}).pool_idle_release == milliseconds(3'600'000));
  CHECK(parse({"--pool-idle-release", "off"}).pool_idle_release == milliseconds(0));
  CHECK(parse({"--pool-idle-release", "0"}).pool_idle_release == milliseconds(0));
  CHECK(parse({"--pool-keep", "1GiB"}).pool_keep == (1ull << 30));
  CHECK_THROWS_WITH(parse({"--pool-idle-release", "250"}),
                    "--pool-idle-release: \"250\": a duration needs a unit; write 250s or 250ms");
  CHECK_THROWS_WITH(parse({"--pool-idle-release", "-5s"}),
                    "--pool-idle-release: \"-5s\": a duration cannot be negative");
  CHECK_THROWS_WITH(parse({"--pool-idle-release", "1441m"}), "--pool-idle-release: \"1441m\": must be at most 24h");
  CHECK_THROWS_WITH(parse({"--pool-keep", "1GB"}), Catch::StartsWith("--pool-keep: \"1GB\""));
  CHECK_THAT(DaemonOptions::usage(), Catch::Contains("--pool-idle-release DURATION"));
  CHECK_THAT(DaemonOptions::usage(), Catch::Contains("--pool-keep SIZE"));
}
