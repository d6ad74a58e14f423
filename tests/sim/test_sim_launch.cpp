// The simulator's launch variants (cooperative, extensible, host functions), cuCtxSynchronize_v2,
// and the per-thread variants of the pool and graph calls the hook intercepts.
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

using namespace simtest;

namespace {

std::uint32_t word_at(CUdeviceptr p) {
  std::uint32_t w = 0;
  REQUIRE(cuMemcpyDtoH_v2(&w, p, sizeof w) == CUDA_SUCCESS);
  return w;
}

struct Fill {
  CUdeviceptr p;
  unsigned long long n;
  unsigned v;
  void* args[3] = {&p, &n, &v};
};

}  // namespace

TEST_CASE("cooperative launches run like cuLaunchKernel within the co-resident limit", "[sim][launch]") {
  init_ctx();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  Fill f{p, 16, 0x11};
  CHECK(cuLaunchCooperativeKernel(fill_kernel(), 2, 1, 1, 64, 1, 1, 0, nullptr, f.args) == CUDA_SUCCESS);
  CHECK(word_at(p + 60) == 0x11u);
  f.v = 0x22;
  CHECK(cuLaunchCooperativeKernel_ptsz(fill_kernel(), 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, f.args) ==
        CUDA_SUCCESS);
  CHECK(word_at(p) == 0x22u);
  // 132 multiprocessors hold 32 blocks of 64 threads each (2048 threads), 2 of 1024.
  CHECK(cuLaunchCooperativeKernel(fill_kernel(), 132 * 32, 1, 1, 64, 1, 1, 0, nullptr, f.args) == CUDA_SUCCESS);
  CHECK(cuLaunchCooperativeKernel(fill_kernel(), 132 * 32 + 1, 1, 1, 64, 1, 1, 0, nullptr, f.args) ==
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
  CHECK(cuLaunchCooperativeKernel(fill_kernel(), 132 * 2 + 1, 1, 1, 1024, 1, 1, 0, nullptr, f.args) ==
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
  CHECK(cuLaunchCooperativeKernel(fill_kernel(), 1, 1, 1, 2048, 1, 1, 0, nullptr, f.args) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchCooperativeKernel(fill_kernel(), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("cuLaunchKernelEx takes its geometry and stream from the launch config", "[sim][launch]") {
  init_ctx();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
  Fill f{p, 8, 0x33};
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 8;
  cfg.blockDimY = cfg.blockDimZ = 1;
  CHECK(cuLaunchKernelEx(&cfg, fill_kernel(), f.args, nullptr) == CUDA_SUCCESS);
  CHECK(word_at(p + 28) == 0x33u);
  f.v = 0x44;
  cfg.hStream = CU_STREAM_PER_THREAD;
  CHECK(cuLaunchKernelEx_ptsz(&cfg, fill_kernel(), f.args, nullptr) == CUDA_SUCCESS);
  CHECK(word_at(p) == 0x44u);

  CUlaunchAttribute coop{};
  coop.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  coop.value.cooperative = 1;
  cfg.attrs = &coop;
  cfg.numAttrs = 1;
  cfg.gridDimX = 132 * 32 + 1;
  cfg.blockDimX = 64;
  CHECK(cuLaunchKernelEx(&cfg, fill_kernel(), f.args, nullptr) == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
  coop.value.cooperative = 0;
  CHECK(cuLaunchKernelEx(&cfg, fill_kernel(), f.args, nullptr) == CUDA_SUCCESS);
  cfg.attrs = nullptr;  // numAttrs 1 without attributes
  CHECK(cuLaunchKernelEx(&cfg, fill_kernel(), f.args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchKernelEx(nullptr, fill_kernel(), f.args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  cfg.numAttrs = 0;
  cfg.gridDimX = 0;
  CHECK(cuLaunchKernelEx(&cfg, fill_kernel(), f.args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  cfg.gridDimX = 1;
  cfg.hStream = reinterpret_cast<CUstream>(&f);
  CHECK(cuLaunchKernelEx(&cfg, fill_kernel(), f.args, nullptr) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("cuLaunchHostFunc runs the function before it returns, outside the driver's locks", "[sim][launch]") {
  init_ctx();
  struct Seen {
    int calls = 0;
    CUresult inner = CUDA_ERROR_UNKNOWN;
  } seen;
  auto fn = [](void* user) {
    auto* s = static_cast<Seen*>(user);
    ++s->calls;
    CUdeviceptr p = 0;  // the driver may be called from a host function in the simulator
    s->inner = cuMemAlloc_v2(&p, 64);
    if (s->inner == CUDA_SUCCESS) cuMemFree_v2(p);
  };
  CHECK(cuLaunchHostFunc(nullptr, fn, &seen) == CUDA_SUCCESS);
  CHECK(seen.calls == 1);
  CHECK(seen.inner == CUDA_SUCCESS);
  CHECK(cuLaunchHostFunc_ptsz(CU_STREAM_PER_THREAD, fn, &seen) == CUDA_SUCCESS);
  CHECK(seen.calls == 2);
  CHECK(cuLaunchHostFunc(nullptr, nullptr, &seen) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchHostFunc(reinterpret_cast<CUstream>(&seen), fn, &seen) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(seen.calls == 2);
}

TEST_CASE("cuCtxSynchronize_v2 synchronizes a given context or the current one", "[sim][context]") {
  CUcontext c0 = init_ctx(0);
  CUcontext c1 = init_ctx(1);  // current
  CHECK(cuCtxSynchronize_v2(nullptr) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize_v2(c0) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize_v2(reinterpret_cast<CUcontext>(&c0)) == CUDA_ERROR_INVALID_CONTEXT);
  // A fault in device 1's context is reported for it, not for device 0's.
  CHECK(launch_fill(CUdeviceptr{4096}, 1, 0) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize_v2(c1) == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(cuCtxSynchronize_v2(nullptr) == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(cuCtxSynchronize_v2(c0) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxReset_v2(1) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize_v2(c1) == CUDA_SUCCESS);
  // A released context is not live.
  REQUIRE(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize_v2(c0) == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("a device's current pool and the per-thread pool and graph calls", "[sim][pool]") {
  init_ctx();
  CUmemoryPool def = nullptr;
  CUmemoryPool cur = nullptr;
  REQUIRE(cuDeviceGetDefaultMemPool(&def, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetMemPool(&cur, 0) == CUDA_SUCCESS);
  CHECK(cur == def);
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  REQUIRE(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS);
  CHECK(cuDeviceSetMemPool(0, pool) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetMemPool(&cur, 0) == CUDA_SUCCESS);
  CHECK(cur == pool);
  CHECK(cuDeviceSetMemPool(1, pool) == CUDA_ERROR_INVALID_VALUE);  // a pool of another device
  CHECK(cuDeviceSetMemPool(5, pool) == CUDA_ERROR_INVALID_DEVICE);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocFromPoolAsync_ptsz(&p, 4096, pool, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CUmemoryPool owner = nullptr;
  REQUIRE(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == CUDA_SUCCESS);
  CHECK(owner != nullptr);
  CHECK(cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetMemPool(&cur, 0) == CUDA_SUCCESS);
  CHECK(cur == def);  // destroying the current pool makes the default current again

  // A graph allocating and freeing 2 MiB: instantiated, uploaded and launched per thread.
  CUgraph g = nullptr;
  REQUIRE(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};
  alloc.poolProps = props;
  alloc.bytesize = kGran;
  CUgraphNode an = nullptr;
  CUgraphNode fn = nullptr;
  REQUIRE(cuGraphAddMemAllocNode(&an, g, nullptr, 0, &alloc) == CUDA_SUCCESS);
  REQUIRE(cuGraphAddMemFreeNode(&fn, g, &an, 1, alloc.dptr) == CUDA_SUCCESS);
  CUDA_GRAPH_INSTANTIATE_PARAMS ip{};
  CUgraphExec e = nullptr;
  REQUIRE(cuGraphInstantiateWithParams_ptsz(&e, g, &ip) == CUDA_SUCCESS);
  CHECK(ip.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS);
  auto reserved = [] {
    cuuint64_t v = 0;
    REQUIRE(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS);
    return v;
  };
  CHECK(reserved() == 0);
  CHECK(cuGraphUpload_ptsz(e, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(reserved() == kGran);
  CHECK(cuGraphLaunch_ptsz(e, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(reserved() == kGran);
  CHECK(cuGraphLaunch_ptsz(e, reinterpret_cast<CUstream>(&e)) == CUDA_ERROR_INVALID_HANDLE);
  ip.flags = ~cuuint64_t{0};
  CUgraphExec bad = nullptr;
  CHECK(cuGraphInstantiateWithParams_ptsz(&bad, g, &ip) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuGraphExecDestroy(e) == CUDA_SUCCESS);
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGraphMemTrim(0) == CUDA_SUCCESS);
  CHECK(reserved() == 0);
}
