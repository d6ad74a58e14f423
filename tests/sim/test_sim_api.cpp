// The simulator's entry points in one process: proc-address resolution, error strings,
// context rules, sticky errors, pointer attributes, streams/events and thread-safety.
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

using namespace simtest;

namespace {

struct Vmm {
  CUdeviceptr va = 0;
  size_t size = 0;
};

struct TwoChunks {
  CUmemGenericAllocationHandle h1 = 0;
  CUmemGenericAllocationHandle h2 = 0;
  CUdeviceptr va = 0;
};

// Two 2 MiB allocations of `prop` mapped side by side, without access, at the start of a 6 MiB
// reservation (the caller unmaps, releases and frees).
TwoChunks two_chunks(const CUmemAllocationProp& prop) {
  TwoChunks c;
  REQUIRE(cuMemCreate(&c.h1, kGran, &prop, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemCreate(&c.h2, kGran, &prop, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressReserve(&c.va, 3 * kGran, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(c.va, kGran, 0, c.h1, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(c.va + kGran, kGran, 0, c.h2, 0) == CUDA_SUCCESS);
  return c;
}

}  // namespace

TEST_CASE("the test binary uses the simulator", "[sim]") {
  void* h = sim_handle();
  CHECK(::dlsym(h, "cuInit") == reinterpret_cast<void*>(&cuInit));
  int version = 0;
  REQUIRE(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  CHECK(version == 13000);
}

TEST_CASE("cuGetProcAddress resolves base name + version over cuda_api.def", "[sim][proc]") {
  void* lib = sim_handle();
  for (const auto& row : vlake::cuda::kApiRows) {
    INFO(row.base << "@" << row.version << " -> " << row.symbol);
    void* expected = ::dlsym(lib, row.symbol);
    REQUIRE(expected != nullptr);
    // Rows of _ptsz/_ptds symbols answer the per-thread-default-stream flag (cuda_api.def).
    const std::string sym = row.symbol;
    const bool per_thread = sym.ends_with("_ptsz") || sym.ends_with("_ptds");
    const cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    CHECK(cuGetProcAddress_v2(row.base, &fn, row.version, flags, &status) == CUDA_SUCCESS);
    CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(fn == expected);
    fn = nullptr;
    CHECK(cuGetProcAddress(row.base, &fn, row.version, flags) == CUDA_SUCCESS);
    CHECK(fn == expected);
  }

  auto resolve = [](const char* name, int version, CUdriverProcAddressQueryResult* status, cuuint64_t flags = 0) {
    void* fn = reinterpret_cast<void*>(&cuInit);  // must be overwritten
    const CUresult rc = cuGetProcAddress_v2(name, &fn, version, flags, status);
    return std::make_pair(rc, fn);
  };
  CUdriverProcAddressQueryResult st{};
  CHECK(resolve("cuMemAlloc", 3020, &st).second == ::dlsym(lib, "cuMemAlloc_v2"));
  CHECK(resolve("cuMemAlloc", 13000, &st).second == ::dlsym(lib, "cuMemAlloc_v2"));
  CHECK(resolve("cuGetProcAddress", 11030, &st).second == ::dlsym(lib, "cuGetProcAddress"));
  CHECK(resolve("cuGetProcAddress", 11080, &st).second == ::dlsym(lib, "cuGetProcAddress"));
  CHECK(resolve("cuGetProcAddress", 12000, &st).second == ::dlsym(lib, "cuGetProcAddress_v2"));
  CHECK(resolve("cuDeviceGetUuid", 11030, &st).second == ::dlsym(lib, "cuDeviceGetUuid"));
  CHECK(resolve("cuDeviceGetUuid", 11040, &st).second == ::dlsym(lib, "cuDeviceGetUuid_v2"));
  CHECK(resolve("cuMemCreate", 12000, &st, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM).second ==
        ::dlsym(lib, "cuMemCreate"));

  // Not found: cuGetProcAddress_v2 succeeds with a null pointer and says why (measured).
  auto r = resolve("cuMemAllocAsync", 11010, &st);
  CHECK(r.first == CUDA_SUCCESS);
  CHECK(r.second == nullptr);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  r = resolve("cuMemCreate", 10010, &st);
  CHECK(r.first == CUDA_SUCCESS);
  CHECK(r.second == nullptr);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  r = resolve("cuNoSuchFunction", 13000, &st);
  CHECK(r.first == CUDA_SUCCESS);
  CHECK(r.second == nullptr);
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  r = resolve("cuMemAlloc_v2", 13000, &st);  // versioned ABI names are not base names
  CHECK(r.first == CUDA_SUCCESS);
  CHECK(r.second == nullptr);
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  // ... and the 4-argument cuGetProcAddress fails (measured).
  void* v1 = &v1;
  CHECK(cuGetProcAddress("cuNoSuchFunction", &v1, 13000, 0) == CUDA_ERROR_NOT_FOUND);
  CHECK(v1 == nullptr);
  v1 = &v1;
  CHECK(cuGetProcAddress("cuMemAllocAsync", &v1, 11010, 0) == CUDA_ERROR_NOT_FOUND);
  // Below 3020, "cuMemAlloc" is the pre-3.2 ABI (measured: the exported unversioned symbol).
  CHECK(resolve("cuMemAlloc", 3010, &st).second == ::dlsym(lib, "cuMemAlloc"));
  CHECK(v1 == nullptr);
  CHECK(resolve("cuInit", 13000, nullptr).first == CUDA_SUCCESS);             // status may be null
  CHECK(resolve("cuInit", 13000, &st, 4).first == CUDA_ERROR_INVALID_VALUE);  // unknown flag
  void* fn = nullptr;
  CHECK(cuGetProcAddress_v2(nullptr, &fn, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGetProcAddress_v2("cuInit", nullptr, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("cuGetErrorName/String know every CUresult of cuda.h", "[sim][errors]") {
  std::ifstream in(VLAKE_CUDA_H);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t begin = text.find("typedef enum cudaError_enum");
  const size_t end = text.find("} CUresult;", begin);
  REQUIRE(begin != std::string::npos);
  const std::string body = text.substr(begin, end - begin);
  const std::regex entry(R"((CUDA_[A-Z0-9_]+)\s*=\s*(\d+))");
  int seen = 0;
  for (auto it = std::sregex_iterator(body.begin(), body.end(), entry); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    const auto code = static_cast<CUresult>(std::stoi((*it)[2]));
    INFO(name);
    const char* got = nullptr;
    REQUIRE(cuGetErrorName(code, &got) == CUDA_SUCCESS);
    REQUIRE(got != nullptr);
    CHECK(name == got);
    got = nullptr;
    REQUIRE(cuGetErrorString(code, &got) == CUDA_SUCCESS);
    REQUIRE(got != nullptr);
    CHECK(std::strlen(got) > 0);
    ++seen;
  }
  CHECK(seen > 90);
  const char* s = nullptr;
  REQUIRE(cuGetErrorString(CUDA_SUCCESS, &s) == CUDA_SUCCESS);
  CHECK(std::string(s) == "no error");
  REQUIRE(cuGetErrorString(CUDA_ERROR_ILLEGAL_ADDRESS, &s) == CUDA_SUCCESS);
  CHECK(std::string(s) == "an illegal memory access was encountered");
  s = "x";
  CHECK(cuGetErrorString(static_cast<CUresult>(12345), &s) == CUDA_ERROR_INVALID_VALUE);
  CHECK(s == nullptr);
  s = "x";
  CHECK(cuGetErrorName(static_cast<CUresult>(12345), &s) == CUDA_ERROR_INVALID_VALUE);
  CHECK(s == nullptr);
  CHECK(cuGetErrorName(CUDA_SUCCESS, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("devices answer like a small H100 node", "[sim][device]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == kDevices);
  CUdevice dev = -1;
  CHECK(cuDeviceGet(&dev, 1) == CUDA_SUCCESS);
  CHECK(dev == 1);
  CHECK(cuDeviceGet(&dev, kDevices) == CUDA_ERROR_INVALID_DEVICE);
  char name[64];
  REQUIRE(cuDeviceGetName(name, sizeof name, 0) == CUDA_SUCCESS);
  CHECK(std::string(name) == "vlake simulated GPU");
  char bus[32];
  REQUIRE(cuDeviceGetPCIBusId(bus, sizeof bus, 1) == CUDA_SUCCESS);
  CHECK(std::string(bus) == "0000:02:00.0");
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem_v2(&total, 1) == CUDA_SUCCESS);
  CHECK(total == kCapacity);
  CUuuid u0{};
  CUuuid u0b{};
  CUuuid u1{};
  REQUIRE(cuDeviceGetUuid(&u0, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetUuid_v2(&u0b, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetUuid_v2(&u1, 1) == CUDA_SUCCESS);
  CHECK(std::memcmp(u0.bytes, u0b.bytes, 16) == 0);
  CHECK(std::memcmp(u0.bytes, u1.bytes, 16) != 0);
  const std::pair<CUdevice_attribute, int> expected[] = {
      {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 2},
  };
  for (const auto& [a, v] : expected) {
    INFO("attribute " << static_cast<int>(a));
    int got = -7;
    REQUIRE(cuDeviceGetAttribute(&got, a, 1) == CUDA_SUCCESS);
    CHECK(got == v);
  }
  int got = 0;
  CHECK(cuDeviceGetAttribute(&got, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuDeviceGetAttribute(&got, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7) == CUDA_ERROR_INVALID_DEVICE);
  size_t g = 0;
  CUmemAllocationProp prop = device_prop(1);
  REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
  CHECK(g == kGran);
  REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
  CHECK(g == kGran);
}

TEST_CASE("context rules - per-thread current context and INVALID_CONTEXT without one", "[sim][context]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  std::vector<CUresult> results;
  std::thread([&] {
    CUcontext cur = reinterpret_cast<CUcontext>(&results);
    results.push_back(cuCtxGetCurrent(&cur));
    results.push_back(cur == nullptr ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    CUdeviceptr p = 0;
    size_t f = 0;
    size_t t = 0;
    CUdevice d = 0;
    CUstream s = nullptr;
    CUevent e = nullptr;
    int word = 0;
    results.push_back(cuMemAlloc_v2(&p, 16));
    results.push_back(cuMemFree_v2(p));
    results.push_back(cuMemGetInfo_v2(&f, &t));
    results.push_back(cuCtxSynchronize());
    results.push_back(cuCtxGetDevice(&d));
    results.push_back(cuStreamCreate(&s, 0));
    results.push_back(cuEventCreate(&e, 0));
    results.push_back(cuMemcpyHtoD_v2(p, &word, sizeof word));
    results.push_back(cuMemsetD8_v2(p, 0, 1));
  }).join();
  REQUIRE(results.size() == 11);
  CHECK(results[0] == CUDA_SUCCESS);
  CHECK(results[1] == CUDA_SUCCESS);
  for (size_t i = 2; i < results.size(); ++i) {
    INFO("call " << i);
    CHECK(results[i] == CUDA_ERROR_INVALID_CONTEXT);
  }

  // The VMM calls need no context.
  std::thread([&] {
    CUmemAllocationProp prop = device_prop();
    size_t g = 0;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = 0;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    results.clear();
    results.push_back(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    results.push_back(cuMemCreate(&h, kGran, &prop, 0));
    results.push_back(cuMemAddressReserve(&va, kGran, 0, 0, 0));
    results.push_back(cuMemMap(va, kGran, 0, h, 0));
    results.push_back(cuMemSetAccess(va, kGran, &desc, 1));
    results.push_back(cuMemUnmap(va, kGran));
    results.push_back(cuMemAddressFree(va, kGran));
    results.push_back(cuMemRelease(h));
  }).join();
  for (size_t i = 0; i < results.size(); ++i) {
    INFO("VMM call " << i);
    CHECK(results[i] == CUDA_SUCCESS);
  }

  // Push / pop / set.
  std::thread([&] {
    results.clear();
    CUcontext c0 = nullptr;
    CUcontext c1 = nullptr;
    CUcontext popped = nullptr;
    CUcontext cur = nullptr;
    CUdevice d = -1;
    results.push_back(cuCtxPopCurrent_v2(&popped) == CUDA_ERROR_INVALID_CONTEXT ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuDevicePrimaryCtxRetain(&c0, 0));
    results.push_back(cuDevicePrimaryCtxRetain(&c1, 1));
    results.push_back(cuCtxPushCurrent_v2(c0));
    results.push_back(cuCtxPushCurrent_v2(c1));
    results.push_back(cuCtxGetDevice(&d));
    results.push_back(d == 1 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuCtxPopCurrent_v2(&popped));
    results.push_back(popped == c1 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuCtxGetDevice(&d));
    results.push_back(d == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuCtxSetCurrent(c1));  // replaces the top
    results.push_back(cuCtxGetCurrent(&cur));
    results.push_back(cur == c1 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuCtxSetCurrent(nullptr));  // pops it
    results.push_back(cuCtxGetCurrent(&cur));
    results.push_back(cur == nullptr ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuCtxSetCurrent(reinterpret_cast<CUcontext>(&d)) == CUDA_ERROR_INVALID_CONTEXT
                          ? CUDA_SUCCESS
                          : CUDA_ERROR_UNKNOWN);
    // A released primary context is no longer usable.
    unsigned flags = 9;
    int active = 0;
    results.push_back(cuDevicePrimaryCtxRelease_v2(1));
    results.push_back(cuDevicePrimaryCtxGetState(1, &flags, &active));
    results.push_back(active == 0 && flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuCtxSetCurrent(c1));
    results.push_back(cuCtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    results.push_back(cuDevicePrimaryCtxRelease_v2(1) == CUDA_ERROR_INVALID_CONTEXT ? CUDA_SUCCESS
                                                                                    : CUDA_ERROR_UNKNOWN);
    results.push_back(cuDevicePrimaryCtxRelease_v2(0));
  }).join();
  for (size_t i = 0; i < results.size(); ++i) {
    INFO("step " << i);
    CHECK(results[i] == CUDA_SUCCESS);
  }
}

TEST_CASE("the copy engines refuse bad accesses and leave the context usable", "[sim][access]") {
  init_ctx(1);
  const CUmemAllocationProp prop = device_prop(1);
  auto [h1, h2, va] = two_chunks(prop);
  std::vector<char> buf(2 * kGran, 'x');
  auto refused = [&](const char* what, CUresult rc) {
    INFO(what);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  };
  refused("no access", cuMemcpyHtoD_v2(va, buf.data(), 16));
  refused("no access, read", cuMemcpyDtoH_v2(buf.data(), va, 16));
  set_access(va, 2 * kGran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 1);
  CHECK(cuMemcpyHtoD_v2(va + kGran - 8, buf.data(), 16) == CUDA_SUCCESS);  // across two chunks
  CHECK(cuMemcpyDtoD_v2(va, va + kGran - 8, 16) == CUDA_SUCCESS);
  refused("reserved, unmapped", cuMemcpyHtoD_v2(va + 2 * kGran - 8, buf.data(), 16));
  refused("memset past mapping", cuMemsetD8_v2(va + 2 * kGran - 1, 0, 2));
  set_access(va + kGran, kGran, CU_MEM_ACCESS_FLAGS_PROT_READ, 1);
  CHECK(cuMemcpyDtoH_v2(buf.data(), va + kGran, 64) == CUDA_SUCCESS);
  refused("write to read-only", cuMemsetD32_v2(va + kGran, 1, 4));
  refused("DtoD into read-only", cuMemcpyDtoD_v2(va + kGran, va, 4));
  refused("wild pointer", cuMemcpyHtoD_v2(CUdeviceptr{4096}, buf.data(), 4));
  CUdeviceptr small = 0;
  REQUIRE(cuMemAlloc_v2(&small, size_t{1} << 20) == CUDA_SUCCESS);
  CHECK(cuMemsetD8_v2(small, 7, size_t{1} << 20) == CUDA_SUCCESS);
  refused("cuMemAlloc overrun", cuMemsetD8_v2(small, 7, (size_t{1} << 20) + 4096));
  REQUIRE(cuMemUnmap(va, 2 * kGran) == CUDA_SUCCESS);
  refused("after unmap", cuMemcpyDtoH_v2(buf.data(), va, 4));
  REQUIRE(cuMemFree_v2(small) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h1) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h2) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, 3 * kGran) == CUDA_SUCCESS);
}

TEST_CASE("an illegal kernel access poisons the context with ILLEGAL_ADDRESS", "[sim][sticky]") {
  init_ctx(1);
  const CUmemAllocationProp prop = device_prop(1);
  auto [h1, h2, va] = two_chunks(prop);
  std::vector<char> buf(64);

  auto expect_poisoned = [&](const char* what, CUdeviceptr p, unsigned long long n) {
    INFO(what);
    CHECK(launch_fill(p, n, 0xBADu) == CUDA_SUCCESS);  // launches are asynchronous
    CUdeviceptr q = 0;
    size_t f = 0;
    size_t t = 0;
    CUstream s = nullptr;
    CUdevice d = 0;
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);  // sticky
    CHECK(cuMemAlloc_v2(&q, 16) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(cuMemGetInfo_v2(&f, &t) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(cuStreamCreate(&s, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(cuCtxGetDevice(&d) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(cuMemcpyDtoH_v2(buf.data(), va, 1) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(launch_fill(va, 1, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
    // VMM calls need no context and keep working.
    CUmemGenericAllocationHandle extra = 0;
    CHECK(cuMemCreate(&extra, kGran, &prop, 0) == CUDA_SUCCESS);
    CHECK(cuMemRelease(extra) == CUDA_SUCCESS);
    // Another process on the node is unaffected.
    std::string out;
    CHECK(run_probe({"used"}, {}, out) == 0);
    // The other device's context of this process is unaffected (the error is per context).
    CUcontext c0 = nullptr;
    REQUIRE(cuDevicePrimaryCtxRetain(&c0, 0) == CUDA_SUCCESS);
    REQUIRE(cuCtxPushCurrent_v2(c0) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    REQUIRE(cuCtxPopCurrent_v2(nullptr) == CUDA_SUCCESS);
    REQUIRE(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS);
    // Resetting the primary context clears it (as cudaDeviceReset does).
    REQUIRE(cuDevicePrimaryCtxReset_v2(1) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  };

  expect_poisoned("no access", va, 1);
  set_access(va, 2 * kGran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 1);
  // Across two adjacent chunks with access: fine, and the bytes land.
  REQUIRE(launch_fill(va, 2 * kGran / 4, 0x5a5a5a5au) == CUDA_SUCCESS);
  REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS);
  unsigned word = 0;
  REQUIRE(cuMemcpyDtoH_v2(&word, va + 2 * kGran - 4, 4) == CUDA_SUCCESS);
  CHECK(word == 0x5a5a5a5au);
  expect_poisoned("past the last mapping", va + kGran, kGran / 4 + 1);
  set_access(va + kGran, kGran, CU_MEM_ACCESS_FLAGS_PROT_READ, 1);
  expect_poisoned("read-only", va + kGran, 1);
  CUdeviceptr small = 0;
  REQUIRE(cuMemAlloc_v2(&small, size_t{1} << 20) == CUDA_SUCCESS);
  expect_poisoned("cuMemAlloc overrun", small, (size_t{1} << 20) / 4 + 1024);
  CUdeviceptr base = 0;
  CHECK(cuMemGetAddressRange_v2(&base, nullptr, small) == CUDA_ERROR_NOT_FOUND);  // reset freed it
  REQUIRE(cuMemUnmap(va, 2 * kGran) == CUDA_SUCCESS);
  expect_poisoned("after unmap", va, 1);
  REQUIRE(cuMemRelease(h1) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h2) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, 3 * kGran) == CUDA_SUCCESS);

  // Module and launch arguments.
  CUmodule mod = nullptr;
  CHECK(cuModuleLoadData(&mod, "not ptx") == CUDA_ERROR_INVALID_IMAGE);
  REQUIRE(cuModuleLoadData(&mod, kFillPtx) == CUDA_SUCCESS);
  CUfunction fn = nullptr;
  CHECK(cuModuleGetFunction(&fn, mod, "other") == CUDA_ERROR_NOT_FOUND);
  REQUIRE(cuModuleGetFunction(&fn, mod, "vlake_fill_u32") == CUDA_SUCCESS);
  void* args[] = {&base, &base, &word};
  CHECK(cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, nullptr, args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, reinterpret_cast<CUstream>(&word), args, nullptr) ==
        CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuModuleUnload(mod) == CUDA_SUCCESS);
  CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("pointer attributes and address ranges of cuMemAlloc and VMM memory", "[sim][pointer]") {
  CUcontext ctx = init_ctx();
  const size_t n = (size_t{3} << 20) + 5;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
  CHECK(p % kGran == 0);
  CHECK(attr<CUdeviceptr>(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 100) == p);
  CHECK(attr<size_t>(CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 100) == n);
  CHECK(attr<unsigned>(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CU_MEMORYTYPE_DEVICE);
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == 0);
  CHECK(attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, p) == ctx);
  CHECK(attr<CUdeviceptr>(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p + 100) == p + 100);
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == 0);
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_MAPPED, p) == 1);
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) == 1);
  CHECK(attr<unsigned>(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p) == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE(cuMemGetAddressRange_v2(&base, &size, p + n - 1) == CUDA_SUCCESS);
  CHECK(base == p);
  CHECK(size == n);
  CHECK(cuMemGetAddressRange_v2(&base, &size, p + n) == CUDA_ERROR_NOT_FOUND);

  // A stitched VMM range: 4 MiB + 2 MiB handles, adjacent in one reservation.
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h1 = 0;
  CUmemGenericAllocationHandle h2 = 0;
  REQUIRE(cuMemCreate(&h1, 2 * kGran, &prop, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemCreate(&h2, kGran, &prop, 0) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, 3 * kGran, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va, 2 * kGran, 0, h1, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va + 2 * kGran, kGran, 0, h2, 0) == CUDA_SUCCESS);
  set_access(va, 3 * kGran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  set_access(va + 2 * kGran, kGran, CU_MEM_ACCESS_FLAGS_PROT_READ);
  REQUIRE(cuMemGetAddressRange_v2(&base, &size, va + 2 * kGran + 10) == CUDA_SUCCESS);
  CHECK(base == va + 2 * kGran);  // one chunk, not the stitched whole
  CHECK(size == kGran);
  REQUIRE(cuMemGetAddressRange_v2(&base, &size, va + 1) == CUDA_SUCCESS);
  CHECK(base == va);
  CHECK(size == 2 * kGran);
  const CUdeviceptr q = va + 2 * kGran + 64;
  CHECK(attr<CUdeviceptr>(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q) == va + 2 * kGran);
  CHECK(attr<size_t>(CU_POINTER_ATTRIBUTE_RANGE_SIZE, q) == kGran);
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q) == 0);
  CHECK(attr<unsigned>(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q) == CU_MEMORYTYPE_DEVICE);
  CHECK(attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, q) == nullptr);
  CHECK(attr<unsigned>(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, q) == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ);
  CHECK(attr<unsigned>(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, va) == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
  CHECK(attr<unsigned long long>(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, q) ==
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK(attr<unsigned long long>(CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, q) !=
        attr<unsigned long long>(CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, va));

  // Several at once, for a known and an unknown pointer.
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,  CU_POINTER_ATTRIBUTE_CONTEXT,
                                 CU_POINTER_ATTRIBUTE_MAPPED,       CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                 CU_POINTER_ATTRIBUTE_HOST_POINTER, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned type = 99;
  CUcontext c = ctx;
  int mapped = 7;
  CUdeviceptr dp = 1;
  void* hp = &type;
  int ordinal = 5;
  void* data[] = {&type, &c, &mapped, &dp, &hp, &ordinal};
  REQUIRE(cuPointerGetAttributes(6, which, data, p) == CUDA_SUCCESS);
  CHECK(type == CU_MEMORYTYPE_DEVICE);
  CHECK(c == ctx);
  CHECK(mapped == 1);
  CHECK(dp == p);
  CHECK(hp == nullptr);
  CHECK(ordinal == 0);
  std::vector<char> host(64);
  const auto wild = reinterpret_cast<CUdeviceptr>(host.data());
  REQUIRE(cuPointerGetAttributes(6, which, data, wild) == CUDA_SUCCESS);
  CHECK(type == 0);
  CHECK(c == nullptr);
  CHECK(mapped == 0);
  CHECK(dp == 0);
  CHECK(ordinal == -2);
  unsigned t = 0;
  CHECK(cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, wild) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, p) == CUDA_ERROR_INVALID_VALUE);
  // Reserved but unmapped VA is unknown too.
  REQUIRE(cuMemUnmap(va + 2 * kGran, kGran) == CUDA_SUCCESS);
  CHECK(cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q) == CUDA_ERROR_INVALID_VALUE);

  REQUIRE(cuMemUnmap(va, 2 * kGran) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, 3 * kGran) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h1) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h2) == CUDA_SUCCESS);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("capacity - out of memory and what keeps memory charged", "[sim][memory]") {
  init_ctx();
  const size_t base = used_bytes();
  REQUIRE(base == 0);
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle big = 0;
  CUmemGenericAllocationHandle h = 0;
  CHECK(cuMemCreate(&h, kCapacity + kGran, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(cuMemCreate(&big, kCapacity - kGran, &prop, 0) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, 1) == CUDA_SUCCESS);  // charged as one 2 MiB granule
  CHECK(used_bytes() == kCapacity);
  CHECK(cuMemCreate(&h, kGran, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr q = 0;
  CHECK(cuMemAlloc_v2(&q, 1) == CUDA_ERROR_OUT_OF_MEMORY);
  // Device 1 has its own capacity.
  CUmemAllocationProp prop1 = device_prop(1);
  REQUIRE(cuMemCreate(&h, kGran, &prop1, 0) == CUDA_SUCCESS);
  CHECK(used_bytes(1) == kGran);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(used_bytes(1) == 0);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(big) == CUDA_SUCCESS);
  CHECK(used_bytes() == 0);

  // cuMemCreate arguments.
  CHECK(cuMemCreate(&h, kGran + 4096, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemCreate(&h, 0, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp odd = prop;
  odd.location.id = kDevices;
  CHECK(cuMemCreate(&h, kGran, &odd, 0) == CUDA_ERROR_INVALID_DEVICE);
  odd = prop;
  odd.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  CHECK(cuMemCreate(&h, kGran, &odd, 0) == CUDA_ERROR_NOT_SUPPORTED);

  // A released handle stays charged while mapped; a retained one until released again.
  REQUIRE(cuMemCreate(&h, 2 * kGran, &prop, 0) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, 2 * kGran, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va, 2 * kGran, 0, h, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(cuMemRelease(h) == CUDA_ERROR_INVALID_VALUE);  // no reference left to release
  CHECK(used_bytes() == 2 * kGran);
  CHECK(cuMemAddressFree(va, 2 * kGran) == CUDA_ERROR_INVALID_VALUE);  // still mapped
  CUmemGenericAllocationHandle again = 0;
  REQUIRE(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + kGran + 3)) == CUDA_SUCCESS);
  CUmemAllocationProp got{};
  REQUIRE(cuMemGetAllocationPropertiesFromHandle(&got, again) == CUDA_SUCCESS);
  CHECK(got.location.id == 0);
  CHECK(got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  REQUIRE(cuMemUnmap(va, 2 * kGran) == CUDA_SUCCESS);
  CHECK(used_bytes() == 2 * kGran);  // the retained reference
  REQUIRE(cuMemRelease(again) == CUDA_SUCCESS);
  CHECK(used_bytes() == 0);
  CHECK(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va)) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemAddressFree(va, 2 * kGran) == CUDA_SUCCESS);

  // Export needs the POSIX-fd handle type.
  CUmemAllocationProp plain = device_prop(0, false);
  REQUIRE(cuMemCreate(&h, kGran, &plain, 0) == CUDA_SUCCESS);
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  // Import of an fd that is not a simulator allocation.
  int devnull = ::open("/dev/null", O_RDONLY);
  CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(devnull)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_ERROR_UNKNOWN);
  ::close(devnull);
  CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(devnull)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
        CUDA_ERROR_UNKNOWN);  // a closed descriptor (measured)
}

TEST_CASE("whole-mapping rules of unmap and set-access over adjacent mappings", "[sim][vmm]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h[3] = {};
  for (auto& x : h) REQUIRE(cuMemCreate(&x, kGran, &prop, 0) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, 4 * kGran, 0, 0, 0) == CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) REQUIRE(cuMemMap(va + i * kGran, kGran, 0, h[i], 0) == CUDA_SUCCESS);
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(va, 3 * kGran, &desc, 1) == CUDA_SUCCESS);  // three whole mappings
  CHECK(cuMemSetAccess(va + 4096, kGran, &desc, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemSetAccess(va, kGran + 4096, &desc, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemSetAccess(va, 4 * kGran, &desc, 1) == CUDA_ERROR_INVALID_VALUE);  // runs off the end
  CHECK(cuMemMap(va + kGran, kGran, 0, h[0], 0) == CUDA_ERROR_INVALID_VALUE);  // over a mapping
  CHECK(cuMemMap(va + 3 * kGran, kGran, 4096, h[0], 0) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuMemMap(va + 3 * kGran, kGran / 2, 0, h[0], 0) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuMemMap(va + 4096, kGran, 0, h[0], 0) == CUDA_ERROR_INVALID_VALUE);       // unaligned
  CHECK(cuMemMap(va + 4 * kGran, kGran, 0, h[0], 0) == CUDA_ERROR_INVALID_VALUE);  // outside
  CHECK(cuMemUnmap(va + kGran, kGran / 2) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemUnmap(va + kGran / 2, kGran) == CUDA_ERROR_INVALID_VALUE);
  // Host view: the stitched range is one contiguous host range with the mappings' bytes.
  auto* bytes = reinterpret_cast<unsigned char*>(va);
  bytes[kGran - 1] = 0xAB;
  bytes[kGran] = 0xCD;
  CHECK(cuMemUnmap(va + 2 * kGran - 4096, kGran) == CUDA_ERROR_INVALID_VALUE);  // ends inside
  // Two adjacent whole mappings plus unmapped VA: fine; so is a range with nothing mapped.
  CHECK(cuMemUnmap(va + kGran, 3 * kGran) == CUDA_SUCCESS);
  CHECK(cuMemUnmap(va, kGran) == CUDA_SUCCESS);
  CHECK(cuMemUnmap(va, kGran) == CUDA_SUCCESS);
  CHECK(cuMemUnmap(va + 3 * kGran, 2 * kGran) == CUDA_ERROR_INVALID_VALUE);  // leaves the reservation
  // The handle kept its bytes: map it elsewhere.
  REQUIRE(cuMemMap(va + 3 * kGran, kGran, 0, h[1], 0) == CUDA_SUCCESS);
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  REQUIRE(cuMemSetAccess(va + 3 * kGran, kGran, &desc, 1) == CUDA_SUCCESS);
  unsigned long long flags = 9;
  REQUIRE(cuMemGetAccess(&flags, &desc.location, va + 3 * kGran + 5) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READ);
  CHECK(bytes[3 * kGran] == 0xCD);
  REQUIRE(cuMemUnmap(va + 3 * kGran, kGran) == CUDA_SUCCESS);
  for (auto& x : h) REQUIRE(cuMemRelease(x) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, 4 * kGran) == CUDA_SUCCESS);
}

TEST_CASE("streams and events are synchronous with steady-clock elapsed time", "[sim][stream]") {
  init_ctx();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent a = nullptr;
  CUevent b = nullptr;
  CUevent untimed = nullptr;
  REQUIRE(cuEventCreate(&a, 0) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&b, CU_EVENT_BLOCKING_SYNC) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  float ms = -1;
  CHECK(cuEventElapsedTime_v2(&ms, a, b) == CUDA_ERROR_INVALID_HANDLE);  // not recorded
  REQUIRE(cuEventRecord(a, s) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  const unsigned in = 0x12345678u;
  unsigned out = 0;
  REQUIRE(cuMemsetD32Async(p, 0, 1024, s) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyHtoDAsync_v2(p + 8, &in, 4, s) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoDAsync_v2(p + 16, p + 8, 4, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoHAsync_v2(&out, p + 16, 4, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(out == in);  // complete when the call returns
  REQUIRE(cuMemsetD8Async(p, 0xFF, 2, CU_STREAM_LEGACY) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoH_v2(&out, p, 4) == CUDA_SUCCESS);
  CHECK(out == 0x0000FFFFu);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(cuEventRecord(b, s) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(untimed, nullptr) == CUDA_SUCCESS);
  CHECK(cuStreamWaitEvent(s, b, 0) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(cuEventQuery(b) == CUDA_SUCCESS);
  CHECK(cuEventSynchronize(b) == CUDA_SUCCESS);
  REQUIRE(cuEventElapsedTime_v2(&ms, a, b) == CUDA_SUCCESS);
  CHECK(ms >= 19.0f);
  CHECK(ms < 5000.0f);
  CHECK(cuEventElapsedTime_v2(&ms, a, untimed) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy_v2(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamSynchronize(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMemsetD8Async(p, 0, 1, s) == CUDA_ERROR_INVALID_HANDLE);
  for (CUevent e : {a, b, untimed}) REQUIRE(cuEventDestroy_v2(e) == CUDA_SUCCESS);
  CHECK(cuEventQuery(a) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("many threads create and map and access and unmap and release concurrently", "[sim][threads]") {
  CUcontext ctx = init_ctx();
  const size_t base = used_bytes();
  constexpr int kThreads = 8;
  constexpr int kIterations = 150;
  std::atomic<int> failures{0};
  std::atomic<int> first_line{0};
  auto fail = [&](int line) {
    int expected = 0;
    first_line.compare_exchange_strong(expected, line);
    ++failures;
  };
#define T_CHECK(cond) \
  do {                \
    if (!(cond)) {    \
      fail(__LINE__); \
      return;         \
    }                 \
  } while (0)
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      T_CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
      const CUmemAllocationProp prop = device_prop();
      CUdeviceptr va = 0;
      T_CHECK(cuMemAddressReserve(&va, 2 * kGran, 0, 0, 0) == CUDA_SUCCESS);
      std::vector<unsigned> pattern(4096);
      std::vector<unsigned> back(4096);
      for (int i = 0; i < kIterations; ++i) {
        CUmemGenericAllocationHandle h1 = 0;
        CUmemGenericAllocationHandle h2 = 0;
        T_CHECK(cuMemCreate(&h1, kGran, &prop, 0) == CUDA_SUCCESS);
        T_CHECK(cuMemCreate(&h2, kGran, &prop, 0) == CUDA_SUCCESS);
        T_CHECK(cuMemMap(va, kGran, 0, h1, 0) == CUDA_SUCCESS);
        T_CHECK(cuMemMap(va + kGran, kGran, 0, h2, 0) == CUDA_SUCCESS);
        CUmemAccessDesc desc{};
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = 0;
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        T_CHECK(cuMemSetAccess(va, 2 * kGran, &desc, 1) == CUDA_SUCCESS);
        for (size_t k = 0; k < pattern.size(); ++k) {
          pattern[k] = static_cast<unsigned>(t * 1000003 + i * 7919 + static_cast<int>(k));
        }
        const CUdeviceptr at = va + kGran - 8192;  // straddles the two handles
        T_CHECK(cuMemcpyHtoD_v2(at, pattern.data(), pattern.size() * 4) == CUDA_SUCCESS);
        T_CHECK(cuMemcpyDtoH_v2(back.data(), at, back.size() * 4) == CUDA_SUCCESS);
        T_CHECK(back == pattern);
        CUmemGenericAllocationHandle again = 0;
        T_CHECK(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + kGran)) == CUDA_SUCCESS);
        T_CHECK(again == h2);
        T_CHECK(cuMemRelease(again) == CUDA_SUCCESS);
        if (i % 5 == 0) {
          CUdeviceptr p = 0;
          T_CHECK(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
          T_CHECK(cuMemsetD32_v2(p, static_cast<unsigned>(i), 1024) == CUDA_SUCCESS);
          T_CHECK(cuMemFree_v2(p) == CUDA_SUCCESS);
        }
        T_CHECK(cuMemRelease(h1) == CUDA_SUCCESS);  // mapped: stays alive
        T_CHECK(cuMemUnmap(va, 2 * kGran) == CUDA_SUCCESS);
        T_CHECK(cuMemRelease(h2) == CUDA_SUCCESS);
        size_t f = 0;
        size_t total = 0;
        T_CHECK(cuMemGetInfo_v2(&f, &total) == CUDA_SUCCESS);
      }
      T_CHECK(cuMemAddressFree(va, 2 * kGran) == CUDA_SUCCESS);
    });
  }
  for (auto& th : threads) th.join();
#undef T_CHECK
  INFO("first failing line " << first_line.load());
  CHECK(failures.load() == 0);
  CHECK(used_bytes() == base);
}
