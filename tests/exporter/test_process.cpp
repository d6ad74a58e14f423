// vlaked --metrics-address on the simulator with two tenant helper processes: /metrics over
// HTTP, the per-tenant series compared with vlakectl's numbers, /healthz across SIGSTOP, a port
// in use, promtool's check of a real scrape.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <thread>

#include "ctl_process.hpp"
#include "harness.hpp"
#include "http_get.hpp"
#include "json_parse.hpp"
#include "units.hpp"
#include "vlake/exporter/server.hpp"

using namespace vlake;
using exptest::Exposition;
using exptest::http_get;
using exptest::parse_prometheus;
using vlake::pooltest::DaemonProcess;
using vlake::pooltest::Helper;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

const char* const kConfig =
    "version: 1\n"
    "default:\n"
    "  limit: 256MiB\n"
    "users:\n"
    "  - uid: 4401\n"
    "    limit: 64MiB\n";

std::string addr(int port) { return "127.0.0.1:" + std::to_string(port); }

}  // namespace

TEST_CASE("exporter: per-tenant series of a running vlaked match vlakectl", "[process]") {
  const int port = exptest::free_port();
  DaemonProcess d("exp", kConfig);
  REQUIRE(d.start({"--metrics-address", addr(port)}));
  CHECK_THAT(d.log(), Catch::Contains("metrics on http://" + addr(port) + "/metrics"));
  Helper a(d.node, 4401, 0);
  Helper b(d.node, 4402, 0);
  REQUIRE(a.ok("connect " + d.socket).at("name") == "user:4401");
  REQUIRE(b.ok("connect " + d.socket).at("name") == "uid:4402");
  const std::string ok = std::to_string(static_cast<int>(proto::Status::ok));
  const auto g8 = a.ok("grant " + std::to_string(8 * kMiB));
  REQUIRE(g8.at("status") == ok);
  const auto g4 = a.ok("grant " + std::to_string(4 * kMiB));
  REQUIRE(g4.at("status") == ok);
  REQUIRE(b.ok("grant " + std::to_string(6 * kMiB)).at("status") == ok);
  CHECK(a.ok("grant " + std::to_string(64 * kMiB)).at("status") ==
        std::to_string(static_cast<int>(proto::Status::over_limit)));  // over its 64 MiB limit

  const auto r = http_get(port, "/metrics");
  REQUIRE(r.status == 200);
  CHECK_THAT(r.headers.at("content-type"), Catch::StartsWith("text/plain; version=0.0.4"));
  const Exposition e = parse_prometheus(r.body);
  CHECK(e.value("vlake_daemon_up") == 1);
  CHECK(e.value("vlake_tenants") == 2);
  CHECK(e.value("vlake_sessions", {{"state", "connected"}}) == 2);
  CHECK(e.value("vlake_grants_total") == 3);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "tenant_limit"}}) == 1);
  CHECK(e.value("vlake_grant_duration_seconds_count") == 3);
  CHECK(e.value("vlake_grant_duration_seconds_bucket", {{"le", "+Inf"}}) == 3);
  CHECK(e.value("vlake_grant_duration_seconds_sum") > 0);
  CHECK(e.value("vlake_tenant_granted_bytes", {{"tenant", "user:4401"}, {"gpu_index", "0"}}) == 12.0 * kMiB);
  CHECK(e.value("vlake_tenant_limit_bytes", {{"tenant", "user:4401"}, {"gpu_index", "0"}}) == 64.0 * kMiB);
  CHECK(e.value("vlake_tenant_granted_bytes", {{"tenant", "uid:4402"}, {"gpu_index", "0"}}) == 6.0 * kMiB);
  CHECK(e.value("vlake_tenant_sessions", {{"tenant", "uid:4402"}, {"tenant_namespace", "default"}}) == 1);
  CHECK(e.value("vlake_pool_granted_bytes", {{"gpu_index", "0"}}) == 18.0 * kMiB);
  CHECK(e.value("vlake_guard_violations_total", {{"kind", "readonly_write"}}) == 0);
  CHECK(e.value("vlake_kernel_faults_total", {{"guarded", "false"}, {"maps_shared", "false"}}) == 0);

  // vlakectl's numbers for the same (unchanged) state.
  const auto ctl = ctltest::run_ctl({"--state", d.state, "tenants", "--json"});
  INFO("vlakectl stderr: " << ctl.err);
  REQUIRE(ctl.exit_code == 0);
  const ctltest::Json j = ctltest::parse_json(ctl.out);
  const ctltest::Json& tenants = j.at("tenants");
  REQUIRE(tenants.size() == 2);
  std::size_t compared = 0;
  for (const ctltest::Json& t : tenants.items) {
    const std::string name = t.at("name").str();
    for (const ctltest::Json& g : t.at("gpus").items) {
      const std::map<std::string, std::string> l{{"tenant", name},
                                                 {"tenant_namespace", t.at("namespace").str()},
                                                 {"tenant_pod", ""},
                                                 {"tenant_container", ""},
                                                 {"gpu_index", std::to_string(g.at("index").u64())}};
      INFO(name << " on GPU " << g.at("index").u64());
      CHECK(e.value("vlake_tenant_used_bytes", l) == static_cast<double>(g.at("used").u64()));
      CHECK(e.value("vlake_tenant_granted_bytes", l) == static_cast<double>(g.at("granted").u64()));
      CHECK(e.value("vlake_tenant_limit_bytes", l) == static_cast<double>(g.at("limit").u64()));
      CHECK(e.value("vlake_tenant_nonpool_bytes", l) == static_cast<double>(g.at("nonpool").u64()));
      CHECK(e.value("vlake_tenant_over_limit", l) == (g.at("over_limit").boolean() ? 1 : 0));
      ++compared;
    }
    CHECK(e.find("vlake_tenant_used_bytes", {{"tenant", name}}).size() == t.at("gpus").size());
  }
  CHECK(compared == 2);

  // promtool's linter over the real scrape (CI installs Debian's prometheus package).
  const std::string promtool = VLAKE_PROMTOOL;
  if (promtool.empty() || ::access(promtool.c_str(), X_OK) != 0) {
    WARN("promtool not installed: skipping `promtool check metrics`");
  } else {
    const std::string file = d.dir + "/scrape.txt";
    std::ofstream(file) << r.body;
    const std::string cmd = promtool + " check metrics < " + file + " > " + d.dir + "/promtool.out 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ostringstream out_buf;
    out_buf << std::ifstream(d.dir + "/promtool.out").rdbuf();
    const std::string out = out_buf.str();
    INFO("promtool: " << out);
    CHECK(rc == 0);
  }

  // Both of a's grants back to the free pool: handles of 8 and 4 MiB, bound to a (default
  // --handle-reuse tenant). Stitched, they serve one 12 MiB grant of a's without a new handle:
  // fragmentation 0 (the largest handle alone would say 1/3). A new tenant gets none of it.
  a.ok("release " + g8.at("id"));
  a.ok("release " + g4.at("id"));
  const Exposition e2 = parse_prometheus(http_get(port, "/metrics").body);
  const std::map<std::string, std::string> gpu0{{"gpu_index", "0"}};
  CHECK(e2.value("vlake_pool_free_handles", gpu0) == 2);
  CHECK(e2.value("vlake_pool_free_bytes", gpu0) == 12.0 * kMiB);
  CHECK(e2.value("vlake_pool_largest_servable_bytes", gpu0) == 12.0 * kMiB);
  CHECK(e2.value("vlake_pool_largest_servable_new_tenant_bytes", gpu0) == 0);
  CHECK(e2.value("vlake_pool_fragmentation_ratio", gpu0) == 0);
  CHECK(e2.value("vlake_releases_total") == 2);
  CHECK(e2.value("vlake_tenant_granted_bytes", {{"tenant", "user:4401"}, {"gpu_index", "0"}}) == 0);
}

TEST_CASE("exporter: no per-process series (pids, idle times) unless --metrics-process-series on", "[process]") {
  // Every local user reaches 127.0.0.1: by default the scrape names tenants, never their
  // processes' pids or activity, which the root-only state segment keeps to itself.
  for (const bool on : {false, true}) {
    INFO("--metrics-process-series " << (on ? "on" : "off"));
    const int port = exptest::free_port();
    DaemonProcess d(on ? "exp-pids-on" : "exp-pids", kConfig);
    REQUIRE(d.start({"--metrics-address", addr(port), "--metrics-process-series", on ? "on" : "off"}));
    Helper a(d.node, 4401, 0);
    Helper b(d.node, 4402, 0);
    a.ok("connect " + d.socket);
    b.ok("connect " + d.socket);
    REQUIRE(a.ok("grant " + std::to_string(4 * kMiB)).at("status") ==
            std::to_string(static_cast<int>(proto::Status::ok)));
    const auto r = http_get(port, "/metrics");
    REQUIRE(r.status == 200);
    const Exposition e = parse_prometheus(r.body);
    // The per-tenant families stay either way.
    CHECK(e.value("vlake_tenant_granted_bytes", {{"tenant", "user:4401"}, {"gpu_index", "0"}}) == 4.0 * kMiB);
    CHECK(e.find("vlake_tenant_idle_seconds", {{"tenant", "uid:4402"}}).size() == 1);
    const std::string pid_a = "pid=\"" + std::to_string(a.pid()) + "\"";
    const std::string pid_b = "pid=\"" + std::to_string(b.pid()) + "\"";
    if (on) {
      CHECK(e.find("vlake_process_idle_seconds", {{"pid", std::to_string(a.pid())}, {"tenant", "user:4401"}}).size() ==
            1);
      CHECK(e.find("vlake_process_idle_seconds", {{"pid", std::to_string(b.pid())}, {"tenant", "uid:4402"}}).size() ==
            1);
    } else {
      CHECK(e.find("vlake_process_idle_seconds", {}).empty());
      CHECK(r.body.find("vlake_process_idle_seconds") == std::string::npos);
      CHECK(r.body.find(pid_a) == std::string::npos);
      CHECK(r.body.find(pid_b) == std::string::npos);
      CHECK(r.body.find("pid=") == std::string::npos);  // no family carries a pid label
    }
  }
}

TEST_CASE("exporter: /healthz is 200 while vlaked runs, 503 once it stops refreshing", "[process]") {
  const int port = exptest::free_port();
  DaemonProcess d("exph");
  REQUIRE(d.start({"--metrics-address", addr(port)}));  // --sample-interval-ms 50 (harness)
  CHECK(http_get(port, "/healthz").status == 200);
  CHECK(http_get(port, "/nope").status == 404);

  // A stopped daemon cannot answer its own endpoint (its server threads stop with it): watch
  // its segment through a second server in this process, as a stuck daemon's threads would.
  const int port2 = exptest::free_port();
  exporter::MetricsServer watcher(addr(port2), d.state);
  CHECK(http_get(port2, "/healthz").status == 200);
  d.signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // > 3 x 50 ms
  const auto h = http_get(port2, "/healthz");
  CHECK(h.status == 503);
  CHECK_THAT(h.body, Catch::Contains("has not refreshed its state"));
  CHECK(parse_prometheus(http_get(port2, "/metrics").body).value("vlake_daemon_up") == 0);
  d.signal(SIGCONT);
  CHECK(pooltest::eventually([&] { return http_get(port2, "/healthz").status == 200; }, 3000));
  CHECK(http_get(port, "/healthz").status == 200);

  // A graceful stop: the segment says so.
  d.signal(SIGTERM);
  CHECK(d.wait_exit() == 0);
  const auto after = http_get(port2, "/healthz");
  CHECK(after.status == 503);
}

TEST_CASE("exporter: vlaked refuses to start when its metrics port is in use", "[process]") {
  int port = 0;
  const int fd = exptest::listen_loopback(1, port);
  DaemonProcess d("expu");
  CHECK_FALSE(d.start({"--metrics-address", addr(port)}));
  ::close(fd);
  CHECK_THAT(d.log(), Catch::Contains("metrics exporter: cannot listen on " + addr(port)));
}
