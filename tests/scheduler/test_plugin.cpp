// The device plugin against a fake kubelet (Registration + DevicePlugin client + PodResources)
// over real Unix sockets, GPUs from the simulated driver (2 GPUs of 1 GiB, unit 256 MiB: 4 ids
// per GPU).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "support.hpp"
#include "vlake/contracts/allocation.hpp"

using namespace vlake;
using namespace vlake::schedtest;

namespace {

struct Fixture {
  std::string root = make_temp_dir();
  std::string kdir = root + "/device-plugins";
  std::string node = "sched" + std::to_string(::getpid());
  int vlaked_fd = -1;
  scheduler::PluginOptions o;

  Fixture() {
    ::mkdir(kdir.c_str(), 0755);
    ::mkdir((root + "/pod-resources").c_str(), 0755);
    vlaked_fd = listen_unix(root + "/vlaked.sock");
    o.kubelet_dir = kdir;
    o.endpoint = "vlake-test.sock";
    o.unit = Bytes{256ull << 20};
    o.alloc_root = root + "/alloc";
    o.hook_path = "/var/lib/vlake/lib/libvlake-hook.so";  // on the host; containers see the default path
    o.pod_resources_socket = root + "/pod-resources/kubelet.sock";
    o.attribution_interval = std::chrono::milliseconds(100);
    o.gc_grace = std::chrono::milliseconds(300);
    o.vlaked_socket = root + "/vlaked.sock";
    o.state = node + "-nostate";
    o.health_interval = std::chrono::milliseconds(50);
  }
  ~Fixture() {
    ::close(vlaked_fd);
    ::unlink(("/dev/shm/vlake-sim-" + node).c_str());
    remove_dir(root);
  }
};

// The fixture with its fake kubelet and the plugin (two simulated GPUs) running, registered.
struct Registered : Fixture {
  FakeKubelet kubelet{kdir};
  RunningPlugin plugin{o, node, 2};
  Registered() { REQUIRE(kubelet.registration.wait_requests(1)); }
};

std::vector<v1beta1::ListAndWatchResponse> read_updates(grpc::ClientReader<v1beta1::ListAndWatchResponse>& r,
                                                        std::size_t n) {
  std::vector<v1beta1::ListAndWatchResponse> out;
  v1beta1::ListAndWatchResponse m;
  while (out.size() < n && r.Read(&m)) out.push_back(m);
  return out;
}

std::set<std::string> health_of(const v1beta1::ListAndWatchResponse& m) {
  std::set<std::string> h;
  for (const auto& d : m.devices()) h.insert(d.health());
  return h;
}

}  // namespace

TEST_CASE("plugin registers vlake.io/gpu-memory with its endpoint and options", "[scheduler]") {
  Registered f;
  FakeKubelet& kubelet = f.kubelet;
  const auto req = kubelet.registration.requests().at(0);
  CHECK(req.version() == "v1beta1");
  CHECK(req.resource_name() == "vlake.io/gpu-memory");
  CHECK(req.endpoint() == "vlake-test.sock");
  CHECK(req.options().get_preferred_allocation_available());
  CHECK_FALSE(req.options().pre_start_required());
  CHECK(exists(f.kdir + "/vlake-test.sock"));

  auto stub = kubelet.plugin(req.endpoint());
  grpc::ClientContext ctx;
  v1beta1::Empty e;
  v1beta1::DevicePluginOptions opts;
  REQUIRE(stub->GetDevicePluginOptions(&ctx, e, &opts).ok());
  CHECK(opts.get_preferred_allocation_available());
}

TEST_CASE("ListAndWatch sends the device list and an update when health changes", "[scheduler]") {
  Registered f;
  FakeKubelet& kubelet = f.kubelet;
  auto stub = kubelet.plugin(f.o.endpoint);
  grpc::ClientContext ctx;
  auto reader = stub->ListAndWatch(&ctx, v1beta1::Empty{});
  auto first = read_updates(*reader, 1);
  REQUIRE(first.size() == 1);
  REQUIRE(first[0].devices_size() == 8);  // 2 GPUs x (1 GiB / 256 MiB)
  std::set<std::string> gpus;
  for (const auto& d : first[0].devices()) {
    auto s = alloc::split_device_id(d.id());
    REQUIRE(s);
    CHECK(s->first.rfind("GPU-", 0) == 0);
    CHECK(s->second < 4);
    gpus.insert(s->first);
    CHECK(d.health() == "Healthy");
  }
  CHECK(gpus.size() == 2);

  // vlaked's socket disappears: every device turns Unhealthy, in a new list.
  ::unlink(f.o.vlaked_socket.c_str());
  auto second = read_updates(*reader, 1);
  REQUIRE(second.size() == 1);
  CHECK(second[0].devices_size() == 8);
  CHECK(health_of(second[0]) == std::set<std::string>{"Unhealthy"});
  // ... and Healthy again once it is back.
  ::close(f.vlaked_fd);
  f.vlaked_fd = listen_unix(f.o.vlaked_socket);
  auto third = read_updates(*reader, 1);
  REQUIRE(third.size() == 1);
  CHECK(health_of(third[0]) == std::set<std::string>{"Healthy"});
  ctx.TryCancel();
}

TEST_CASE("GetPreferredAllocation keeps a container on one GPU and honours must-include", "[scheduler]") {
  Registered f;
  FakeKubelet& kubelet = f.kubelet;
  RunningPlugin& p = f.plugin;
  const auto ids = p->device_ids();
  REQUIRE(ids.size() == 8);
  const std::string g0 = alloc::split_device_id(ids[0])->first;
  const std::string g1 = alloc::split_device_id(ids[4])->first;
  auto stub = kubelet.plugin(f.o.endpoint);

  auto ask = [&](const std::vector<std::string>& avail, const std::vector<std::string>& must, int size) {
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    for (const auto& a : avail) c->add_available_deviceids(a);
    for (const auto& m : must) c->add_must_include_deviceids(m);
    c->set_allocation_size(size);
    v1beta1::PreferredAllocationResponse resp;
    grpc::ClientContext ctx;
    REQUIRE(stub->GetPreferredAllocation(&ctx, req, &resp).ok());
    REQUIRE(resp.container_responses_size() == 1);
    const auto& r = resp.container_responses(0).deviceids();
    return std::vector<std::string>(r.begin(), r.end());
  };
  // GPU 0 has 1 free unit, GPU 1 has 3: two units come from GPU 1.
  auto r = ask({ids[3], ids[5], ids[6], ids[7]}, {}, 2);
  REQUIRE(r.size() == 2);
  for (const auto& id : r) CHECK(alloc::split_device_id(id)->first == g1);
  // Must-include on GPU 0: the rest comes from GPU 0 too, even though GPU 1 has more.
  r = ask({ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]}, {ids[2]}, 2);
  REQUIRE(r.size() == 2);
  CHECK(std::find(r.begin(), r.end(), ids[2]) != r.end());
  for (const auto& id : r) CHECK(alloc::split_device_id(id)->first == g0);
  // Nothing fits on one GPU: no preference.
  CHECK(ask({ids[0], ids[4]}, {}, 2).empty());
}

TEST_CASE("Allocate creates the allocation directory and answers mounts, envs and CDI names", "[scheduler]") {
  Registered f;
  FakeKubelet& kubelet = f.kubelet;
  RunningPlugin& p = f.plugin;
  const auto ids = p->device_ids();
  const std::string g1 = alloc::split_device_id(ids[4])->first;
  auto stub = kubelet.plugin(f.o.endpoint);

  v1beta1::AllocateRequest req;
  auto* c = req.add_container_requests();
  c->add_devices_ids(ids[4]);
  c->add_devices_ids(ids[5]);
  v1beta1::AllocateResponse resp;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->Allocate(&ctx, req, &resp).ok());
  }
  REQUIRE(resp.container_responses_size() == 1);
  const auto& cr = resp.container_responses(0);
  const std::string id = cr.envs().at("VLAKE_ALLOCATION");
  REQUIRE(alloc::valid_id(id));
  CHECK(cr.envs().at("VLAKE_SOCKET") == "/run/vlake/vlaked.sock");
  CHECK(cr.envs().at("NVIDIA_VISIBLE_DEVICES") == g1);
  REQUIRE(cr.cdi_devices_size() == 1);
  CHECK(cr.cdi_devices(0).name() == "nvidia.com/gpu=" + g1);
  const std::string dir = f.o.alloc_root + "/" + id;
  std::map<std::string, std::pair<std::string, bool>> mounts;  // container path -> (host, ro)
  for (const auto& m : cr.mounts()) mounts[m.container_path()] = {m.host_path(), m.read_only()};
  REQUIRE(mounts.count("/run/vlake") == 1);
  CHECK(mounts["/run/vlake"] == std::make_pair(dir, true));  // read-only: the socket needs no write access
  // The directory holds what the container sees, nothing vlaked or the plugin reads.
  CHECK_FALSE(exists(dir + "/allocation"));
  CHECK_FALSE(exists(dir + "/owner"));
  // The host's hook, wherever it is installed, at the one path tenants see (docs/device-plugin.md).
  CHECK(mounts.at("/usr/lib/vlake/libvlake-hook.so") == std::make_pair(f.o.hook_path, true));
  CHECK(mounts.count(f.o.hook_path) == 0);
  CHECK(mounts.at("/etc/ld.so.preload") == std::make_pair(dir + "/ld.so.preload", true));
  CHECK(read_file(dir + "/ld.so.preload") == "/usr/lib/vlake/libvlake-hook.so\n");

  const auto a = alloc::read_allocation_record(f.o.alloc_root, id);
  REQUIRE(a);
  CHECK(a->id == id);
  CHECK(a->gpu_uuid == g1);
  CHECK(a->bytes.value() == 2 * (256ull << 20));
  CHECK(a->device_ids == std::vector<std::string>{ids[4], ids[5]});
  CHECK(a->created > 0);

  // Two GPUs in one container: refused.
  v1beta1::AllocateRequest bad;
  auto* bc = bad.add_container_requests();
  bc->add_devices_ids(ids[0]);
  bc->add_devices_ids(ids[4]);
  grpc::ClientContext ctx2;
  const grpc::Status s = stub->Allocate(&ctx2, bad, &resp);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("Allocate with --gpu-visibility env and --preload false", "[scheduler]") {
  Fixture f;
  f.o.gpu_visibility = scheduler::GpuVisibility::env;
  f.o.preload = false;
  FakeKubelet kubelet(f.kdir);
  RunningPlugin p(f.o, f.node, 1);
  REQUIRE(kubelet.registration.wait_requests(1));
  auto stub = kubelet.plugin(f.o.endpoint);
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids(p->device_ids().at(0));
  v1beta1::AllocateResponse resp;
  grpc::ClientContext ctx;
  REQUIRE(stub->Allocate(&ctx, req, &resp).ok());
  const auto& cr = resp.container_responses(0);
  CHECK(cr.cdi_devices_size() == 0);
  CHECK(cr.envs().count("NVIDIA_VISIBLE_DEVICES") == 1);
  for (const auto& m : cr.mounts()) CHECK(m.container_path() != "/etc/ld.so.preload");
}

TEST_CASE("plugin re-registers when the kubelet restarts", "[scheduler]") {
  Fixture f;
  auto kubelet = std::make_unique<FakeKubelet>(f.kdir);
  RunningPlugin p(f.o, f.node, 1);
  REQUIRE(kubelet->registration.wait_requests(1));
  REQUIRE(wait_for([&] { return p->registrations() == 1; }));
  // A kubelet restart: it goes away, removes every plugin socket, comes back.
  kubelet->stop();
  ::unlink((f.kdir + "/" + f.o.endpoint).c_str());
  kubelet = std::make_unique<FakeKubelet>(f.kdir);
  REQUIRE(kubelet->registration.wait_requests(1));
  CHECK(kubelet->registration.requests().at(0).resource_name() == "vlake.io/gpu-memory");
  REQUIRE(wait_for([&] { return exists(f.kdir + "/" + f.o.endpoint); }));
  // The new server answers.
  auto stub = kubelet->plugin(f.o.endpoint);
  grpc::ClientContext ctx;
  v1beta1::DevicePluginOptions opts;
  REQUIRE(stub->GetDevicePluginOptions(&ctx, v1beta1::Empty{}, &opts).ok());
  // The plugin counts a registration when the kubelet's reply arrives, after the kubelet has
  // recorded the request: wait for it.
  CHECK(wait_for([&] { return p->registrations() >= 2; }));
}

TEST_CASE("attribution writes the owner and removes allocations whose container is gone", "[scheduler]") {
  Fixture f;
  FakeKubelet kubelet(f.kdir);
  FakePodResources pods(f.o.pod_resources_socket);
  RunningPlugin p(f.o, f.node, 1);
  REQUIRE(kubelet.registration.wait_requests(1));
  auto stub = kubelet.plugin(f.o.endpoint);
  const auto ids = p->device_ids();
  auto allocate = [&](std::vector<std::string> dev) {
    v1beta1::AllocateRequest req;
    auto* c = req.add_container_requests();
    for (const auto& d : dev) c->add_devices_ids(d);
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    REQUIRE(stub->Allocate(&ctx, req, &resp).ok());
    return resp.container_responses(0).envs().at("VLAKE_ALLOCATION");
  };
  const std::string a = allocate({ids[0], ids[1]});
  const std::string b = allocate({ids[2]});
  pods.add("research", "train-0", "worker", "vlake.io/gpu-memory", {ids[1], ids[0]});
  pods.add("research", "other", "main", "vlake.io/gpu-memory", {ids[3]});  // no allocation of ours
  const std::string adir = f.o.alloc_root + "/" + a;
  REQUIRE(wait_for([&] { return exists(f.o.alloc_root + "/records/" + a + ".owner"); }));
  const auto owner = alloc::read_owner_record(f.o.alloc_root, a);
  REQUIRE(owner);
  CHECK(*owner == alloc::Owner{"research", "train-0", "worker"});
  // b is never listed: removed after the grace period (no vlaked state: no sessions).
  REQUIRE(wait_for([&] { return !exists(f.o.alloc_root + "/" + b); }, 5000));
  REQUIRE(wait_for([&] { return !exists(f.o.alloc_root + "/records/" + b + ".allocation"); }, 5000));
  CHECK(exists(adir));
  // a's container goes: a is removed too.
  pods.clear();
  REQUIRE(wait_for([&] { return !exists(adir); }, 5000));
  REQUIRE(wait_for([&] { return !exists(f.o.alloc_root + "/records/" + a + ".owner"); }, 5000));
}
