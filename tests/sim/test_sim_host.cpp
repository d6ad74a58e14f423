// Host-located VMM memory in the simulator (docs/simulator.md, "Host-located memory"):
// CU_MEM_LOCATION_TYPE_HOST_NUMA handles, charged to the node's host memory and to no device,
// reached by the copy engines and kernels like device memory, shared across processes, shown in
// the node's snapshot (host_used, host_holders); VLAKE_SIM_HOST_MEMORY, VLAKE_SIM_HOST_VMM and
// VLAKE_SIM_LINK_BANDWIDTH through the probe (each a fresh process and node).
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "node.hpp"

using namespace simtest;

namespace {

CUmemAllocationProp host_prop(int numa = 0) {
  CUmemAllocationProp prop = device_prop();
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = numa;
  return prop;
}

// Nodes of probes this file killed: a killed process leaves its node's file behind (the last
// process to detach normally removes it), so stop() removes them.
std::vector<std::string> g_killed_nodes;

// The probe's "host" command on a fresh node with `env`: its output, once it reported ready=1
// (or exited).
std::string host_probe(const std::vector<std::string>& sizes, const Env& env, Child& child) {
  const std::string node = fresh_node("host");
  g_killed_nodes.push_back(node);
  Env all{{"VLAKE_SIM_NODE", node}};
  all.insert(all.end(), env.begin(), env.end());
  std::vector<std::string> args{"host"};
  args.insert(args.end(), sizes.begin(), sizes.end());
  child = spawn_probe(args, all);
  read_until(child, "ready=1");
  return child.output;
}

// Ends a probe that holds its memory until killed.
void stop(Child& c) {
  ::kill(c.pid, SIGKILL);
  finish(c);
  for (const std::string& node : g_killed_nodes) ::unlink(vlake::sim::device_file(node).c_str());
  g_killed_nodes.clear();
}

vlake::sim::NodeSnapshot node_snapshot() {
  vlake::sim::NodeObserver observer(node_name());
  vlake::sim::NodeSnapshot snap;
  REQUIRE(observer.read(snap));
  return snap;
}

std::uint64_t host_held_by(const vlake::sim::NodeSnapshot& snap, pid_t pid) {
  for (const auto& h : snap.host_holders) {
    if (h.pid == pid) return h.bytes;
  }
  return 0;
}

std::uint64_t nvml_charge(const vlake::sim::NodeSnapshot& snap, int device, pid_t pid) {
  for (const auto& p : snap.processes.at(static_cast<size_t>(device))) {
    if (p.pid == pid) return p.bytes;
  }
  return 0;
}

}  // namespace

TEST_CASE("host-located memory: created, mapped, copied, launched on, and on no device", "[sim][host]") {
  init_ctx();
  int vmm = -1;
  int numa = -1;
  REQUIRE(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) ==
          CUDA_SUCCESS);
  REQUIRE(cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 1) == CUDA_SUCCESS);
  CHECK(vmm == 1);
  CHECK(numa == 0);

  const CUmemAllocationProp prop = host_prop();
  size_t g = 0;
  REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
  CHECK(g == kGran);
  CUmemGenericAllocationHandle bad = 0;
  const CUmemAllocationProp other_node = host_prop(1);
  CHECK(cuMemCreate(&bad, kGran, &other_node, 0) == CUDA_ERROR_INVALID_VALUE);
  g = 0;
  REQUIRE(cuMemGetAllocationGranularity(&g, &other_node, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
  CHECK(g == kGran);  // any node id, as on the H200
  CUmemAllocationProp plain_host = host_prop();
  plain_host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CHECK(cuMemCreate(&bad, kGran, &plain_host, 0) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuMemCreate(&bad, kGran + 4096, &prop, 0) == CUDA_ERROR_INVALID_VALUE);

  const size_t used0 = used_bytes(0);
  const size_t used1 = used_bytes(1);
  const size_t size = 4 * kGran;
  {
    MappedAllocation host(prop, size);
    CHECK(used_bytes(0) == used0);
    CHECK(used_bytes(1) == used1);
    CUmemAllocationProp got{};
    REQUIRE(cuMemGetAllocationPropertiesFromHandle(&got, host.h) == CUDA_SUCCESS);
    CHECK(got.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA);
    CHECK(got.location.id == 0);
    CHECK(got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

    // A fresh mapping has no access; device locations open it, to copies and kernels alike.
    std::uint32_t word = 7;
    CHECK(cuMemcpyHtoD_v2(host.va, &word, sizeof word) == CUDA_ERROR_INVALID_VALUE);
    set_access(host.va, size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 0);
    unsigned long long flags = 0;
    CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
    REQUIRE(cuMemGetAccess(&flags, &loc, host.va) == CUDA_SUCCESS);
    CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    REQUIRE(cuMemsetD32_v2(host.va, 0x01020304u, size / 4) == CUDA_SUCCESS);
    REQUIRE(launch_fill(host.va + kGran, kGran / 4, 0xfeedbeefu) == CUDA_SUCCESS);
    REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
    std::vector<std::uint32_t> words(size / 4);
    REQUIRE(cuMemcpyDtoH_v2(words.data(), host.va, size) == CUDA_SUCCESS);
    CHECK(std::all_of(words.begin(), words.begin() + kGran / 4, [](auto w) { return w == 0x01020304u; }));
    CHECK(
        std::all_of(words.begin() + kGran / 4, words.begin() + 2 * kGran / 4, [](auto w) { return w == 0xfeedbeefu; }));
    CHECK(attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, host.va) == 0);  // the current context's device
    CHECK(attr<unsigned>(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host.va) == CU_MEMORYTYPE_HOST);
    CUdeviceptr base = 0;
    size_t range = 0;
    REQUIRE(cuMemGetAddressRange_v2(&base, &range, host.va + kGran + 100) == CUDA_SUCCESS);
    CHECK(base == host.va);
    CHECK(range == size);

    // Device memory and host-located memory copy into each other (cuMemcpyDtoD).
    MappedAllocation dev(device_prop(0), size);
    set_access(dev.va, size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 0);
    CHECK(used_bytes(0) == used0 + size);
    REQUIRE(cuMemcpyDtoD_v2(dev.va, host.va, size) == CUDA_SUCCESS);
    std::vector<std::uint32_t> back(size / 4);
    REQUIRE(cuMemcpyDtoH_v2(back.data(), dev.va, size) == CUDA_SUCCESS);
    CHECK(back == words);

    // Export and import in this process: the same allocation, the same handle.
    int fd = -1;
    REQUIRE(cuMemExportToShareableHandle(&fd, host.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
    CUmemGenericAllocationHandle again = 0;
    REQUIRE(cuMemImportFromShareableHandle(&again, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
    ::close(fd);
    CHECK(again == host.h);
    REQUIRE(cuMemRelease(again) == CUDA_SUCCESS);
    CUmemGenericAllocationHandle retained = 0;
    REQUIRE(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(host.va + 100)) == CUDA_SUCCESS);
    CHECK(retained == host.h);
    REQUIRE(cuMemRelease(retained) == CUDA_SUCCESS);
  }
  CHECK(used_bytes(0) == used0);
}

TEST_CASE("host-located memory is in the snapshot's host figures, not in a device's or NVML's", "[sim][host]") {
  init_ctx();
  const vlake::sim::NodeSnapshot before = node_snapshot();
  CHECK(before.host_used == 0);
  CHECK(before.host_holders.empty());
  CHECK(before.host_capacity == std::uint64_t{64} << 30);  // VLAKE_SIM_HOST_MEMORY's default

  const size_t size = 8 * kGran;
  CUmemGenericAllocationHandle h = 0;
  const int fd = create_and_export(host_prop(), size, h);
  Child importer = spawn_probe({"import", std::to_string(fd), std::to_string(size)});
  ::close(fd);
  REQUIRE(read_until(importer, "ready=1"));
  CUmemGenericAllocationHandle own = 0;
  const CUmemAllocationProp prop = host_prop();
  REQUIRE(cuMemCreate(&own, 2 * kGran, &prop, 0) == CUDA_SUCCESS);

  vlake::sim::NodeSnapshot snap = node_snapshot();
  CHECK(snap.host_used == size + 2 * kGran);
  REQUIRE(snap.host_holders.size() == 2);
  CHECK(std::is_sorted(snap.host_holders.begin(), snap.host_holders.end(),
                       [](const auto& a, const auto& b) { return a.pid < b.pid; }));
  CHECK(host_held_by(snap, ::getpid()) == size + 2 * kGran);
  CHECK(host_held_by(snap, importer.pid) == size);  // every holder counts what it holds
  for (int d = 0; d < kDevices; ++d) CHECK(snap.used[d] == before.used[d]);
  CHECK(nvml_charge(snap, 0, ::getpid()) == nvml_charge(before, 0, ::getpid()));
  CHECK(nvml_charge(snap, 0, importer.pid) == 0);

  // The creator lets go: the importer's mapping keeps the memory; killed, it is gone.
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  snap = node_snapshot();
  CHECK(snap.host_used == size + 2 * kGran);
  CHECK(host_held_by(snap, ::getpid()) == 2 * kGran);
  CHECK(host_held_by(snap, importer.pid) == size);
  REQUIRE(::kill(importer.pid, SIGKILL) == 0);
  CHECK(finish(importer) == 128 + SIGKILL);
  snap = node_snapshot();
  CHECK(snap.host_used == 2 * kGran);
  REQUIRE(snap.host_holders.size() == 1);
  CHECK(host_held_by(snap, ::getpid()) == 2 * kGran);
  REQUIRE(cuMemRelease(own) == CUDA_SUCCESS);
  snap = node_snapshot();
  CHECK(snap.host_used == 0);
  CHECK(snap.host_holders.empty());
}

TEST_CASE("VLAKE_SIM_HOST_MEMORY bounds the node's host-located memory, apart from the devices'", "[sim][host]") {
  Child c;
  const std::string mib4 = std::to_string(size_t{4} << 20);
  std::string out = host_probe({mib4, mib4, std::to_string(kGran)}, {{"VLAKE_SIM_HOST_MEMORY", "8MiB"}}, c);
  CHECK(value_of(out, "rc0") == "0");
  CHECK(value_of(out, "rc1") == "0");
  CHECK(value_of(out, "rc2") == std::to_string(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(value_of(out, "device_rc") == "0");  // the devices are not the host's memory
  CHECK(value_of(out, "used") == std::to_string(kGran));
  stop(c);

  // More than the devices' capacity (1 GiB each here) fits in host memory.
  out = host_probe({std::to_string(size_t{3} << 30)}, {}, c);
  CHECK(value_of(out, "rc0") == "0");
  CHECK(value_of(out, "used") == std::to_string(kGran));
  stop(c);
  out = host_probe({std::to_string(size_t{3} << 30)}, {{"VLAKE_SIM_HOST_MEMORY", "2GiB"}}, c);
  CHECK(value_of(out, "rc0") == std::to_string(CUDA_ERROR_OUT_OF_MEMORY));
  stop(c);
  out = host_probe({std::to_string(kGran)}, {{"VLAKE_SIM_HOST_MEMORY", "0"}}, c);
  CHECK(value_of(out, "rc0") == std::to_string(CUDA_ERROR_OUT_OF_MEMORY));
  stop(c);
}

TEST_CASE("VLAKE_SIM_HOST_VMM=0: no host-located memory", "[sim][host]") {
  Child c;
  std::string out = host_probe({std::to_string(kGran)}, {{"VLAKE_SIM_HOST_VMM", "0"}}, c);
  CHECK(value_of(out, "attr") == "0");
  CHECK(value_of(out, "numa") == "0");
  CHECK(value_of(out, "gran_rc") == std::to_string(CUDA_ERROR_NOT_SUPPORTED));
  CHECK(value_of(out, "rc0") == std::to_string(CUDA_ERROR_NOT_SUPPORTED));
  CHECK(value_of(out, "device_rc") == "0");
  stop(c);
  out = host_probe({std::to_string(kGran)}, {{"VLAKE_SIM_HOST_VMM", "1"}}, c);
  CHECK(value_of(out, "attr") == "1");
  CHECK(value_of(out, "gran_rc") == "0");
  CHECK(value_of(out, "rc0") == "0");
  stop(c);
}

TEST_CASE("bad host variables fail cuInit with one line", "[sim][host][env]") {
  const std::pair<const char*, const char*> bad[] = {
      {"VLAKE_SIM_HOST_MEMORY", "64G"},    {"VLAKE_SIM_HOST_MEMORY", "8"},
      {"VLAKE_SIM_HOST_MEMORY", ""},       {"VLAKE_SIM_HOST_VMM", "yes"},
      {"VLAKE_SIM_HOST_VMM", ""},          {"VLAKE_SIM_HOST_VMM", "2"},
      {"VLAKE_SIM_LINK_BANDWIDTH", "25G"}, {"VLAKE_SIM_LINK_BANDWIDTH", "1.5GiB"},
      {"VLAKE_SIM_LINK_BANDWIDTH", "100"},
  };
  for (const auto& [name, text] : bad) {
    INFO(name << "='" << text << "'");
    std::string out;
    REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", fresh_node("hostenv")}, {name, text}}, out) == 0);
    CHECK(value_of(out, "rc") == std::to_string(CUDA_ERROR_INVALID_VALUE));
    CHECK(out.find(std::string("vlake-sim: ") + name) != std::string::npos);
  }
  for (const char* text : {"0", "1GiB", "25GiB", "50Gi"}) {
    INFO("VLAKE_SIM_LINK_BANDWIDTH='" << text << "'");
    std::string out;
    REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", fresh_node("hostenv")}, {"VLAKE_SIM_LINK_BANDWIDTH", text}}, out) ==
            0);
    CHECK(value_of(out, "rc") == "0");
  }
}

TEST_CASE("copies to and from host-located memory take bytes / VLAKE_SIM_LINK_BANDWIDTH", "[sim][host]") {
  const size_t size = size_t{64} << 20;
  std::string out;
  REQUIRE(run_probe({"host-copy", std::to_string(size)},
                    {{"VLAKE_SIM_NODE", fresh_node("link")}, {"VLAKE_SIM_LINK_BANDWIDTH", "1GiB"}}, out) == 0);
  INFO(out);
  // 64 MiB at 1 GiB/s: 62.5 ms each.
  for (const char* key : {"dtod_ns", "htod_ns", "memset_ns"}) {
    INFO(key);
    const std::string v = value_of(out, key);
    REQUIRE(!v.empty());
    CHECK(std::strtoll(v.c_str(), nullptr, 10) >= 60'000'000);
  }
}
