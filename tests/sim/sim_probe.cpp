// A helper process for the simulator tests: it links the simulated libcuda.so.1 and does one
// thing named on its command line, printing results as "key=value" lines on stdout.
//
//   init              cuInit; prints rc, and when it succeeded count, total and uuid (device 0)
//   preinit           checks what works and what fails before cuInit; prints ok=1 or why not
//   hold BYTES        allocates BYTES with cuMemCreate, prints ready=1, then sleeps forever
//   create BYTES      like hold, but without ever creating a context (cuInit + cuMemCreate only)
//   import FD [BYTES] imports the POSIX fd FD (an allocation of BYTES, default 2 MiB), maps it,
//                     reads its first word, prints ready=1 and value=..., then sleeps forever
//   used              prints used=<bytes> (total - free of device 0)
//   host BYTES...     with a context: prints attr= and numa= (device 0's
//                     HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and HOST_NUMA_ID), gran_rc=
//                     (granularity of host NUMA node 0), rc<i>= of one host-located cuMemCreate per
//                     size, device_rc= of a 2 MiB device cuMemCreate, used=; then ready=1, and holds
//                     everything until killed
//   host-copy BYTES   with a context: a host-located and a device allocation of BYTES, mapped and
//                     accessible; prints the nanoseconds of a copy host memory -> host-located
//                     (htod_ns), host-located -> device memory (dtod_ns) and a memset of the
//                     host-located memory (memset_ns)
#include "vlake/common/cuda_api.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int fail(const char* what, CUresult rc) {
  std::printf("ok=0\nfailed=%s\nrc=%d\n", what, static_cast<int>(rc));
  std::fflush(stdout);
  return 1;
}

#define PROBE_CHECK(call)                             \
  do {                                                \
    CUresult rc_ = (call);                            \
    if (rc_ != CUDA_SUCCESS) return fail(#call, rc_); \
  } while (0)

int init_ctx() {
  PROBE_CHECK(cuInit(0));
  CUcontext ctx = nullptr;
  PROBE_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  PROBE_CHECK(cuCtxSetCurrent(ctx));
  return 0;
}

CUmemAllocationProp device_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAllocationProp host_prop() {
  CUmemAllocationProp prop = device_prop();
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  return prop;
}

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

int cmd_init() {
  const CUresult rc = cuInit(0);
  std::printf("rc=%d\n", static_cast<int>(rc));
  if (rc == CUDA_SUCCESS) {
    int count = 0;
    size_t total = 0;
    cuDeviceGetCount(&count);
    cuDeviceTotalMem_v2(&total, 0);
    CUuuid uuid{};
    cuDeviceGetUuid_v2(&uuid, 0);
    std::printf("count=%d\ntotal=%zu\nuuid=", count, total);
    for (char b : uuid.bytes) std::printf("%02x", static_cast<unsigned>(static_cast<unsigned char>(b)));
    std::printf("\n");
  }
  return 0;
}

// Peer access between devices 0 and 1: cuDeviceCanAccessPeer and cuCtxEnablePeerAccess.
int cmd_peer() {
  const CUresult rc = cuInit(0);
  std::printf("rc=%d\n", static_cast<int>(rc));
  if (rc != CUDA_SUCCESS) return 0;
  int can = -1;
  cuDeviceCanAccessPeer(&can, 0, 1);
  CUcontext c0 = nullptr;
  CUcontext c1 = nullptr;
  cuDevicePrimaryCtxRetain(&c0, 0);
  cuDevicePrimaryCtxRetain(&c1, 1);
  cuCtxSetCurrent(c0);
  std::printf("can=%d\nenable=%d\n", can, static_cast<int>(cuCtxEnablePeerAccess(c1, 0)));
  return 0;
}

int cmd_preinit() {
  int version = 0;
  PROBE_CHECK(cuDriverGetVersion(&version));
  const char* s = nullptr;
  PROBE_CHECK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  PROBE_CHECK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  PROBE_CHECK(cuGetProcAddress_v2("cuInit", &fn, 12000, 0, &status));
  PROBE_CHECK(cuGetProcAddress("cuMemAlloc", &fn, 3020, 0));
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_ERROR_NOT_INITIALIZED) return fail("count", CUDA_SUCCESS);
  size_t f = 0;
  size_t t = 0;
  if (cuMemGetInfo_v2(&f, &t) != CUDA_ERROR_NOT_INITIALIZED) return fail("info", CUDA_SUCCESS);
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = device_prop();
  if (cuMemCreate(&h, 2u << 20, &prop, 0) != CUDA_ERROR_NOT_INITIALIZED) {
    return fail("create", CUDA_SUCCESS);
  }
  CUcontext ctx = nullptr;
  if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_ERROR_NOT_INITIALIZED) {
    return fail("retain", CUDA_SUCCESS);
  }
  std::printf("ok=1\n");
  return 0;
}

// Creates `bytes` of device memory and holds it until killed; with_context: after retaining the
// primary context (as most programs do), else after cuInit only (NVML then lists no process).
int cmd_hold(std::size_t bytes, bool with_context) {
  if (with_context) {
    if (int rc = init_ctx(); rc != 0) return rc;
  } else {
    PROBE_CHECK(cuInit(0));
  }
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = device_prop();
  PROBE_CHECK(cuMemCreate(&h, bytes, &prop, 0));
  std::printf("ready=1\n");
  std::fflush(stdout);
  sleep_forever();
}

int cmd_import(int fd, size_t size) {
  if (int rc = init_ctx(); rc != 0) return rc;
  CUmemGenericAllocationHandle h = 0;
  PROBE_CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ::close(fd);
  CUmemAllocationProp prop{};
  PROBE_CHECK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
  CUdeviceptr va = 0;
  PROBE_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
  PROBE_CHECK(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  PROBE_CHECK(cuMemSetAccess(va, size, &desc, 1));
  std::uint32_t value = 0;
  PROBE_CHECK(cuMemcpyDtoH_v2(&value, va, sizeof value));
  PROBE_CHECK(cuMemRelease(h));  // the mapping keeps it alive
  std::printf("value=%u\nready=1\n", value);
  std::fflush(stdout);
  sleep_forever();
}

int cmd_host(int argc, char** argv) {
  if (int rc = init_ctx(); rc != 0) return rc;
  int attr = -1;
  int numa = -2;
  PROBE_CHECK(cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  PROBE_CHECK(cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0));
  const CUmemAllocationProp prop = host_prop();
  size_t g = 0;
  std::printf("attr=%d\nnuma=%d\ngran_rc=%d\n", attr, numa,
              static_cast<int>(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
  for (int i = 0; i < argc; ++i) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult rc = cuMemCreate(&h, std::strtoull(argv[i], nullptr, 10), &prop, 0);
    std::printf("rc%d=%d\n", i, static_cast<int>(rc));
  }
  CUmemGenericAllocationHandle d = 0;
  const CUmemAllocationProp dprop = device_prop();
  std::printf("device_rc=%d\n", static_cast<int>(cuMemCreate(&d, 2u << 20, &dprop, 0)));
  size_t f = 0;
  size_t t = 0;
  PROBE_CHECK(cuMemGetInfo_v2(&f, &t));
  std::printf("used=%zu\nready=1\n", t - f);
  std::fflush(stdout);
  sleep_forever();
}

// A mapped allocation of `size` bytes with `prop`, read-write for device 0.
int map_rw(const CUmemAllocationProp& prop, size_t size, CUdeviceptr& va) {
  CUmemGenericAllocationHandle h = 0;
  PROBE_CHECK(cuMemCreate(&h, size, &prop, 0));
  PROBE_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
  PROBE_CHECK(cuMemMap(va, size, 0, h, 0));
  PROBE_CHECK(cuMemRelease(h));
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  PROBE_CHECK(cuMemSetAccess(va, size, &desc, 1));
  return 0;
}

int cmd_host_copy(size_t size) {
  if (int rc = init_ctx(); rc != 0) return rc;
  CUdeviceptr host = 0;
  CUdeviceptr dev = 0;
  if (int rc = map_rw(host_prop(), size, host); rc != 0) return rc;
  if (int rc = map_rw(device_prop(), size, dev); rc != 0) return rc;
  std::string buf(size, 'x');
  auto ns = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    const CUresult rc = f();
    const auto t1 = std::chrono::steady_clock::now();
    return rc != CUDA_SUCCESS ? -static_cast<long long>(rc)
                              : static_cast<long long>(std::chrono::nanoseconds(t1 - t0).count());
  };
  // Host to host-located memory first, and the device memory touched, so that the copy between
  // them does not fault pages in.
  std::printf("htod_ns=%lld\n", ns([&] { return cuMemcpyHtoD_v2(host, buf.data(), size); }));
  PROBE_CHECK(cuMemsetD8_v2(dev, 0x11, size));
  std::printf("dtod_ns=%lld\n", ns([&] { return cuMemcpyDtoD_v2(dev, host, size); }));
  std::printf("memset_ns=%lld\n", ns([&] { return cuMemsetD8_v2(host, 0x5a, size); }));
  return 0;
}

int cmd_used() {
  if (int rc = init_ctx(); rc != 0) return rc;
  size_t f = 0;
  size_t t = 0;
  PROBE_CHECK(cuMemGetInfo_v2(&f, &t));
  std::printf("used=%zu\ntotal=%zu\n", t - f, t);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: vlake_sim_probe init|preinit|hold BYTES|create BYTES|import FD [BYTES]|used|host "
                 "BYTES...|host-copy BYTES\n");
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "init") return cmd_init();
  if (cmd == "preinit") return cmd_preinit();
  if (cmd == "peer") return cmd_peer();
  if (cmd == "hold" && argc == 3) return cmd_hold(std::strtoull(argv[2], nullptr, 10), true);
  if (cmd == "create" && argc == 3) return cmd_hold(std::strtoull(argv[2], nullptr, 10), false);
  if (cmd == "import" && argc == 3) return cmd_import(std::atoi(argv[2]), size_t{2} << 20);
  if (cmd == "import" && argc == 4) {
    return cmd_import(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10));
  }
  if (cmd == "used") return cmd_used();
  if (cmd == "host") return cmd_host(argc - 2, argv + 2);
  if (cmd == "host-copy" && argc == 3) return cmd_host_copy(std::strtoull(argv[2], nullptr, 10));
  std::fprintf(stderr, "vlake_sim_probe: unknown command %s\n", cmd.c_str());
  return 2;
}
