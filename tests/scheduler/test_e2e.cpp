// End to end on the simulated driver: plugin + fake kubelet + fake PodResources + a real
// vlaked (--alloc-root) + a hooked tenant process that reaches vlaked only through its
// allocation's socket.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>

#include <sstream>

#include "http_get.hpp"
#include "support.hpp"
#include "tenant_process.hpp"
#include "vlake/contracts/allocation.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace vlake::schedtest;

using vlake::e2e::kOutOfMemory;
using vlake::e2e::MiB;

TEST_CASE("a pod's process is attributed and limited to its allocation and its namespace quota", "[scheduler][e2e]") {
  // GPU: 1 GiB. The pod gets 3 units of 256 MiB; its namespace may hold 640 MiB in all.
  pooltest::DaemonProcess d("k8s",
                            "version: 1\n"
                            "default: {limit: 100%}\n"
                            "namespaces:\n"
                            "  - name: research\n"
                            "    limit: 640MiB\n");
  const std::string root = make_temp_dir();
  struct Cleanup {
    std::string dir;
    ~Cleanup() { remove_dir(dir); }
  } cleanup{root};  // destroyed after the plugin below
  const std::string alloc_root = root + "/alloc";
  const int port = exptest::free_port();
  const bool started = d.start({"--alloc-root", alloc_root, "--metrics-address", "127.0.0.1:" + std::to_string(port),
                                "--sample-interval-ms", "100"});
  INFO(d.log());
  REQUIRE(started);

  scheduler::PluginOptions o;
  o.kubelet_dir = root + "/device-plugins";
  ::mkdir(o.kubelet_dir.c_str(), 0755);
  o.unit = Bytes{256 * MiB};
  o.alloc_root = alloc_root;
  o.pod_resources_socket = root + "/pod-resources.sock";
  o.attribution_interval = std::chrono::milliseconds(100);
  o.gc_grace = std::chrono::milliseconds(300);
  o.vlaked_socket = d.socket;
  o.state = d.state;
  o.health_interval = std::chrono::milliseconds(100);
  FakeKubelet kubelet(o.kubelet_dir);
  FakePodResources pods(o.pod_resources_socket);
  RunningPlugin plugin(o, d.node, 1);
  REQUIRE(kubelet.registration.wait_requests(1));

  const auto ids = plugin->device_ids();
  REQUIRE(ids.size() == 4);
  auto stub = kubelet.plugin(o.endpoint);
  v1beta1::AllocateRequest req;
  auto* c = req.add_container_requests();
  for (int i = 0; i < 3; ++i) c->add_devices_ids(ids[static_cast<std::size_t>(i)]);
  v1beta1::AllocateResponse resp;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->Allocate(&ctx, req, &resp).ok());
  }
  const std::string id = resp.container_responses(0).envs().at("VLAKE_ALLOCATION");
  const std::string dir = alloc_root + "/" + id;
  pods.add("research", "train-0", "worker", "vlake.io/gpu-memory", {ids[0], ids[1], ids[2]});
  REQUIRE(wait_for([&] { return exists(alloc_root + "/records/" + id + ".owner") && exists(dir + "/vlaked.sock"); }));

  // The tenant connects through the allocation's socket (what /run/vlake/vlaked.sock is in
  // the container); its uid (root) plays no part.
  const std::string main_socket = d.socket;
  d.socket = dir + "/vlaked.sock";
  e2e::TenantProcess t(d, {"init", "info", "alloc:a:256M", "alloc:b:512M", "alloc:c:256M", "sleep:30000"});
  d.socket = main_socket;
  auto info = t.wait_line("info");
  INFO(t.out() << t.err() << d.log());
  REQUIRE(info["rc"] == "0");
  CHECK(info["total"] == std::to_string(768 * MiB));  // the allocation's bytes
  CHECK(t.wait_line("alloc:a")["rc"] == "0");
  CHECK(t.wait_line("alloc:b")["rc"] == std::to_string(kOutOfMemory));  // 768 MiB > namespace's 640
  CHECK(t.wait_line("alloc:c")["rc"] == "0");
  CHECK(t.err().find("research") != std::string::npos);  // the refusal names the namespace

  {
    const auto s = state::StateReader(d.state).snapshot();
    const state::TenantRecord* rec = nullptr;
    for (const auto& r : s->tenants) {
      if (r.in_use != 0 && std::string(r.name) == "pod:research/train-0/worker") rec = &r;
    }
    REQUIRE(rec != nullptr);
    CHECK(rec->limit[0] == 768 * MiB);
    CHECK(rec->granted[0] == 512 * MiB);
    std::string ns;
    for (const auto& n : s->namespaces) {
      if (n.in_use != 0 && n.id == rec->namespace_id) ns = n.name;
    }
    CHECK(ns == "research");
  }

  const auto m = exptest::http_get(port, "/metrics");
  INFO(m.body);
  CHECK(m.body.find("vlake_tenant_limit_bytes{") != std::string::npos);
  bool labelled = false;
  std::istringstream lines(m.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("vlake_tenant_limit_bytes{", 0) == 0 && line.find(",tenant_pod=\"train-0\"") != std::string::npos &&
        line.find(",tenant_container=\"worker\"") != std::string::npos &&
        line.find(",tenant_namespace=\"research\"") != std::string::npos) {
      labelled = true;
    }
  }
  CHECK(labelled);

  // The pod goes away while its process still runs: the allocation stays while vlaked has
  // a session of it, and goes once the process is gone.
  pods.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  CHECK(exists(dir + "/vlaked.sock"));
  t.kill9();
  (void)t.finish(5000);
  REQUIRE(wait_for([&] { return !exists(dir); }, 10000));
  // vlaked closed the allocation's socket.
  REQUIRE(wait_for([&] { return d.log().find("allocation " + id + " removed") != std::string::npos; }, 5000));
}
