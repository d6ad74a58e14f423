// The simulator's peer access between its two devices (docs/simulator.md, "Several devices"):
// cuDeviceCanAccessPeer, cuCtxEnable/DisablePeerAccess and their errors, peer access of kernels
// to another device's cuMemAlloc memory, per-device VMM access (several descriptors at once,
// cuMemGetAccess per device, the copy engines and kernels of a context obeying its device's
// access), cuMemcpyPeer.
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

using namespace simtest;

namespace {

// One 2 MiB VMM allocation of device `owner`, mapped with no access yet.
struct PeerVmm : MappedAllocation {
  explicit PeerVmm(int owner) : MappedAllocation(device_prop(owner), kGran) {}
  unsigned long long access(int dev) const {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev;
    unsigned long long flags = 99;
    REQUIRE(cuMemGetAccess(&flags, &loc, va) == CUDA_SUCCESS);
    return flags;
  }
};

CUmemAccessDesc desc(int dev, CUmemAccess_flags flags) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev;
  d.flags = flags;
  return d;
}

}  // namespace

TEST_CASE("cuDeviceCanAccessPeer and cuCtxEnable/DisablePeerAccess answer with the driver's errors", "[sim][peer]") {
  CUcontext c1 = init_ctx(1);
  CUcontext c0 = init_ctx(0);
  int can = -1;
  CHECK(cuDeviceCanAccessPeer(&can, 0, 1) == CUDA_SUCCESS);
  CHECK(can == 1);
  CHECK(cuDeviceCanAccessPeer(&can, 1, 1) == CUDA_SUCCESS);
  CHECK(can == 0);
  CHECK(cuDeviceCanAccessPeer(&can, 0, kDevices) == CUDA_ERROR_INVALID_DEVICE);
  CHECK(cuDeviceCanAccessPeer(nullptr, 0, 1) == CUDA_ERROR_INVALID_VALUE);

  CHECK(cuCtxDisablePeerAccess(c1) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK(cuCtxEnablePeerAccess(c1, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCtxEnablePeerAccess(c0, 0) == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);  // itself (measured)
  CHECK(cuCtxEnablePeerAccess(reinterpret_cast<CUcontext>(&can), 0) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuCtxEnablePeerAccess(c1, 0) == CUDA_SUCCESS);
  CHECK(cuCtxEnablePeerAccess(c1, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  CHECK(cuCtxDisablePeerAccess(c1) == CUDA_SUCCESS);
  CHECK(cuCtxDisablePeerAccess(c1) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);

  // Access is one way and per context: device 1 did not get access to device 0.
  CHECK(cuCtxEnablePeerAccess(c1, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK(cuCtxDisablePeerAccess(c0) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  // Releasing the peer's primary context ends the access; with no current context: INVALID_CONTEXT.
  REQUIRE(cuDevicePrimaryCtxRelease_v2(1) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  CHECK(cuCtxDisablePeerAccess(c1) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
  CHECK(cuCtxDisablePeerAccess(c1) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  CHECK(cuCtxEnablePeerAccess(c1, 0) == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("a kernel touching another device's cuMemAlloc memory needs peer access", "[sim][peer]") {
  CUcontext c1 = init_ctx(1);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  CUdeviceptr managed = 0;
  REQUIRE(cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  init_ctx(0);
  // Managed memory is reachable from every device.
  CHECK(launch_fill(managed, 1024, 0x02020202u) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  // Copies are staged by the driver: they work without peer access.
  std::vector<unsigned char> back(16, 0);
  CHECK(cuMemsetD8_v2(p, 3, 4096) == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoH_v2(back.data(), p, back.size()) == CUDA_SUCCESS);
  CHECK(back[0] == 3);
  REQUIRE(cuCtxEnablePeerAccess(c1, 0) == CUDA_SUCCESS);
  CHECK(launch_fill(p, 1024, 0x01010101u) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoH_v2(back.data(), p, back.size()) == CUDA_SUCCESS);
  CHECK(back[0] == 1);
  REQUIRE(cuCtxDisablePeerAccess(c1) == CUDA_SUCCESS);
  CHECK(launch_fill(p, 1024, 0) == CUDA_SUCCESS);  // asynchronous: the fault comes later
  CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
  REQUIRE(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK(cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(cuMemFree_v2(managed) == CUDA_SUCCESS);
}

TEST_CASE("VMM access is per device: several descriptors and cuMemGetAccess per device", "[sim][peer]") {
  CUcontext c1 = init_ctx(1);
  init_ctx(0);
  PeerVmm m(1);
  CHECK(m.access(0) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CHECK(m.access(1) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  const CUmemAccessDesc own = desc(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  REQUIRE(cuMemSetAccess(m.va, kGran, &own, 1) == CUDA_SUCCESS);
  // Device 0's context: its copy engines and kernels may not touch it, peer access or not
  // (cuCtxEnablePeerAccess concerns cuMemAlloc memory only).
  REQUIRE(cuCtxEnablePeerAccess(c1, 0) == CUDA_SUCCESS);
  CHECK(cuMemsetD8_v2(m.va, 1, 4096) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  // Both devices in one call.
  const CUmemAccessDesc both[] = {desc(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), desc(0, CU_MEM_ACCESS_FLAGS_PROT_READ)};
  REQUIRE(cuMemSetAccess(m.va, kGran, both, 2) == CUDA_SUCCESS);
  CHECK(m.access(0) == CU_MEM_ACCESS_FLAGS_PROT_READ);
  CHECK(m.access(1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  unsigned char b = 0;
  CHECK(cuMemcpyDtoH_v2(&b, m.va, 1) == CUDA_SUCCESS);
  CHECK(cuMemsetD8_v2(m.va, 1, 4096) == CUDA_ERROR_INVALID_VALUE);  // read-only for device 0
  const CUmemAccessDesc rw0 = desc(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  REQUIRE(cuMemSetAccess(m.va, kGran, &rw0, 1) == CUDA_SUCCESS);
  CHECK(cuMemsetD8_v2(m.va, 9, 4096) == CUDA_SUCCESS);
  CHECK(launch_fill(m.va, 1024, 0x07070707u) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(m.access(1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);  // untouched by a descriptor of device 0
  // Revoking device 0 leaves device 1 its access; device 0's kernel then faults.
  const CUmemAccessDesc none0 = desc(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  REQUIRE(cuMemSetAccess(m.va, kGran, &none0, 1) == CUDA_SUCCESS);
  CHECK(m.access(0) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CHECK(m.access(1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  REQUIRE(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoH_v2(&b, m.va, 1) == CUDA_SUCCESS);
  CHECK(b == 7);
  CUcontext c0 = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&c0, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  CHECK(launch_fill(m.va, 1024, 0) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
  REQUIRE(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS);
}

TEST_CASE("cuMemcpyPeer copies between two devices' memory", "[sim][peer]") {
  CUcontext c1 = init_ctx(1);
  CUdeviceptr src = 0;
  REQUIRE(cuMemAlloc_v2(&src, 4096) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8_v2(src, 0x42, 4096) == CUDA_SUCCESS);
  CUcontext c0 = init_ctx(0);
  CUdeviceptr dst = 0;
  REQUIRE(cuMemAlloc_v2(&dst, 4096) == CUDA_SUCCESS);
  CHECK(cuMemcpyPeer(dst, c0, src, c1, 4096) == CUDA_SUCCESS);
  unsigned char b = 0;
  CHECK(cuMemcpyDtoH_v2(&b, dst + 4095, 1) == CUDA_SUCCESS);
  CHECK(b == 0x42);
  CHECK(cuMemcpyPeer(dst, c0, src, nullptr, 4096) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuMemcpyPeer(dst, c0, src, c1, 8192) == CUDA_ERROR_INVALID_VALUE);  // past the allocation
  CHECK(cuMemFree_v2(dst) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  CHECK(cuMemFree_v2(src) == CUDA_SUCCESS);
}

TEST_CASE("VLAKE_SIM_PEER_ACCESS=0 makes the devices unable to access each other", "[sim][peer][env]") {
  std::string out;
  const int status =
      run_probe({"peer"}, {{"VLAKE_SIM_PEER_ACCESS", "0"}, {"VLAKE_SIM_NODE", fresh_node("nopeer")}}, out);
  INFO(out);
  CHECK(status == 0);
  CHECK(value_of(out, "can") == "0");
  CHECK(value_of(out, "enable") == std::to_string(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED));
  std::string bad;
  run_probe({"peer"}, {{"VLAKE_SIM_PEER_ACCESS", "yes"}, {"VLAKE_SIM_NODE", fresh_node("badpeer")}}, bad);
  CHECK(bad.find("VLAKE_SIM_PEER_ACCESS='yes' is not 0 or 1") != std::string::npos);
}
