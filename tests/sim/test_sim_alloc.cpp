// Pitched, managed and stream-ordered allocations, their device attributes, and cuGetProcAddress
// with the per-thread-default-stream flag. Expected values are the H100 measurements recorded
// in docs/simulator.md (sim/tools/measure_driver.cpp).
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace simtest;

namespace {

int device_attr(CUdevice_attribute a) {
  int v = -12345;
  REQUIRE(cuDeviceGetAttribute(&v, a, 0) == CUDA_SUCCESS);
  return v;
}

}  // namespace

TEST_CASE("device attributes of the new allocation paths", "[sim][alloc]") {
  init_ctx();
  CHECK(device_attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 1);
  CHECK(device_attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == 1);
  CHECK(device_attr(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT) == 32);  // measured on the H100
  CHECK(device_attr(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT) == 512);       // the pitch granule
}

TEST_CASE("cuMemAllocPitch_v2 rounds the width up to 512 bytes", "[sim][alloc]") {
  init_ctx();
  const size_t base = used_bytes();
  struct Case {
    size_t width;
    size_t pitch;
  };
  const Case cases[] = {{1, 512},     {100, 512},   {511, 512},   {512, 512},    {513, 1024},
                        {1000, 1024}, {4096, 4096}, {5000, 5120}, {65536, 65536}};
  for (unsigned elem : {4u, 8u, 16u}) {
    for (const Case& c : cases) {
      INFO("element " << elem << " width " << c.width);
      CUdeviceptr p = 0;
      size_t pitch = 0;
      REQUIRE(cuMemAllocPitch_v2(&p, &pitch, c.width, 10, elem) == CUDA_SUCCESS);
      CHECK(pitch == c.pitch);
      CHECK(p % 512 == 0);
      CUdeviceptr range_base = 0;
      size_t range_size = 0;
      REQUIRE(cuMemGetAddressRange_v2(&range_base, &range_size, p) == CUDA_SUCCESS);
      CHECK(range_base == p);
      CHECK(range_size == c.pitch * 10);
      CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) == 1);
      // The last row is writable, one byte past it is not (copy engines check).
      std::vector<unsigned char> row(pitch, 0x5a);
      CHECK(cuMemcpyHtoD_v2(p + 9 * pitch, row.data(), pitch) == CUDA_SUCCESS);
      CHECK(cuMemcpyHtoD_v2(p + 9 * pitch + 1, row.data(), pitch) == CUDA_ERROR_INVALID_VALUE);
      REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
    }
  }
  // Charged like cuMemAlloc, in 2 MiB granules: 5120 * 1000 bytes -> 6 MiB (measured).
  CUdeviceptr p = 0;
  size_t pitch = 0;
  REQUIRE(cuMemAllocPitch_v2(&p, &pitch, 5000, 1000, 4) == CUDA_SUCCESS);
  CHECK(pitch == 5120);
  CHECK(used_bytes() == base + 3 * kGran);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(used_bytes() == base);

  // Rejected requests (measured): element sizes other than 4/8/16, zero width or height, no
  // pitch pointer.
  for (unsigned elem : {0u, 1u, 2u, 3u, 32u}) {
    INFO("element " << elem);
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 512, 10, elem) == CUDA_ERROR_INVALID_VALUE);
  }
  CHECK(cuMemAllocPitch_v2(&p, &pitch, 0, 10, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAllocPitch_v2(&p, &pitch, 512, 0, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAllocPitch_v2(&p, nullptr, 512, 4, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAllocPitch_v2(&p, &pitch, size_t{1} << 31, 1, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(used_bytes() == base);
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  CHECK(cuMemAllocPitch_v2(&p, &pitch, 512, 4, 4) == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("cuMemAllocManaged is host-backed device memory counted like cuMemAlloc", "[sim][alloc]") {
  CUcontext ctx = init_ctx();
  const size_t base = used_bytes();
  const size_t bytes = (size_t{3} << 20) + 100;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
  CHECK(used_bytes() == base + 2 * kGran);

  // The host reads and writes it directly, and the copy engines see the same bytes.
  auto* host = reinterpret_cast<std::uint32_t*>(static_cast<std::uintptr_t>(p));
  host[0] = 0xfeedu;
  std::uint32_t back = 0;
  REQUIRE(cuMemcpyDtoH_v2(&back, p, sizeof back) == CUDA_SUCCESS);
  CHECK(back == 0xfeedu);
  REQUIRE(cuMemsetD32_v2(p + 4, 0xabcdu, 1) == CUDA_SUCCESS);
  CHECK(host[1] == 0xabcdu);

  // Attributes (measured): managed, device memory type, the same host pointer, its context.
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_MANAGED, p + 8) == 1);
  CHECK(attr<unsigned>(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CU_MEMORYTYPE_DEVICE);
  CHECK(attr<void*>(CU_POINTER_ATTRIBUTE_HOST_POINTER, p + 8) ==
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(p + 8)));
  CHECK(attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, p) == ctx);
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == 0);
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) == 0);
  CHECK(attr<size_t>(CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == bytes);
  CHECK(attr<CUmemoryPool>(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == nullptr);

  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(used_bytes() == base);
  CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);

  REQUIRE(cuMemAllocManaged(&p, kGran, CU_MEM_ATTACH_HOST) == CUDA_SUCCESS);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
  CHECK(cuMemAllocManaged(&p, kGran, 0) == CUDA_ERROR_INVALID_VALUE);  // measured
  CHECK(cuMemAllocManaged(&p, 0, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAllocManaged(&p, kCapacity + kGran, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(used_bytes() == base);
}

TEST_CASE("cuMemAllocAsync and cuMemFreeAsync are synchronous pool allocations", "[sim][alloc]") {
  init_ctx();
  const size_t base = used_bytes();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocAsync(&p, size_t{32} << 20, s) == CUDA_SUCCESS);
  CHECK(used_bytes() == base + (size_t{32} << 20));  // charged at once (measured)
  REQUIRE(cuMemsetD8Async(p, 7, size_t{32} << 20, s) == CUDA_SUCCESS);
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  REQUIRE(cuMemGetAddressRange_v2(&range_base, &range_size, p + 100) == CUDA_SUCCESS);
  CHECK(range_base == p);
  CHECK(range_size == size_t{32} << 20);
  CHECK(attr<CUmemoryPool>(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) != nullptr);  // measured
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) == 0);     // measured
  CHECK(attr<int>(CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == 0);
  REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK(used_bytes() == base);  // released by the time the stream is synchronized (measured)
  CHECK(cuMemFreeAsync(p, s) == CUDA_ERROR_INVALID_VALUE);

  // The per-thread variants and the legacy/per-thread stream handles.
  REQUIRE(cuMemAllocAsync_ptsz(&p, 1000, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(used_bytes() == base + kGran);
  REQUIRE(cuMemFreeAsync_ptsz(p, CU_STREAM_LEGACY) == CUDA_SUCCESS);
  CHECK(used_bytes() == base);

  // Measured corner cases: size 0 gives a null pointer; freeing null succeeds; cuMemFree frees
  // pool memory and cuMemFreeAsync frees cuMemAlloc memory; an unknown address is refused.
  p = 0x77;
  CHECK(cuMemAllocAsync(&p, 0, nullptr) == CUDA_SUCCESS);
  CHECK(p == 0);
  CHECK(cuMemFreeAsync(0, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocAsync(&p, kGran, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemFree_v2(p) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc_v2(&p, kGran) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemFreeAsync(0x1234000, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(used_bytes() == base);
  CHECK(cuMemAllocAsync(&p, kCapacity + kGran, nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(cuMemAllocAsync(&p, kGran, reinterpret_cast<CUstream>(&p)) == CUDA_ERROR_INVALID_HANDLE);

  // Pool memory outlives the primary context (cuda.h: context destruction does not free it);
  // cuMemAlloc memory does not.
  CUdeviceptr pooled = 0;
  CUdeviceptr plain = 0;
  REQUIRE(cuMemAllocAsync(&pooled, kGran, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc_v2(&plain, kGran) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS);
  CHECK(used_bytes() == base + kGran);
  REQUIRE(cuMemFreeAsync(pooled, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemFree_v2(plain) == CUDA_ERROR_INVALID_VALUE);
  CHECK(used_bytes() == base);
}

TEST_CASE("cuGetProcAddress returns the per-thread variants for the per-thread flag", "[sim][proc]") {
  void* lib = sim_handle();
  struct Row {
    const char* base;
    int version;
    const char* legacy;
    const char* per_thread;  // nullptr: no per-thread variant
  };
  const Row rows[] = {
      {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
      {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
      {"cuMemcpyHtoD", 7000, "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"},
      {"cuMemcpyDtoH", 7000, "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds"},
      {"cuMemcpyDtoD", 13000, "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds"},
      {"cuMemcpyHtoDAsync", 7000, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"},
      {"cuMemcpyDtoHAsync", 7000, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"},
      {"cuMemcpyDtoDAsync", 7000, "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz"},
      {"cuMemsetD8", 7000, "cuMemsetD8_v2", "cuMemsetD8_v2_ptds"},
      {"cuMemsetD32", 7000, "cuMemsetD32_v2", "cuMemsetD32_v2_ptds"},
      {"cuMemsetD8Async", 7000, "cuMemsetD8Async", "cuMemsetD8Async_ptsz"},
      {"cuMemsetD32Async", 7000, "cuMemsetD32Async", "cuMemsetD32Async_ptsz"},
      {"cuStreamSynchronize", 7000, "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
      {"cuStreamQuery", 7000, "cuStreamQuery", "cuStreamQuery_ptsz"},
      {"cuStreamWaitEvent", 7000, "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"},
      {"cuEventRecord", 7000, "cuEventRecord", "cuEventRecord_ptsz"},
      {"cuLaunchKernel", 7000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
      {"cuMemcpy", 7000, "cuMemcpy", "cuMemcpy_ptds"},
      {"cuMemcpyAsync", 7000, "cuMemcpyAsync", "cuMemcpyAsync_ptsz"},
      {"cuMemcpyPeer", 7000, "cuMemcpyPeer", "cuMemcpyPeer_ptds"},
      {"cuMemcpyPeerAsync", 7000, "cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz"},
      {"cuMemcpy2D", 7000, "cuMemcpy2D_v2", "cuMemcpy2D_v2_ptds"},
      {"cuMemcpy2DUnaligned", 7000, "cuMemcpy2DUnaligned_v2", "cuMemcpy2DUnaligned_v2_ptds"},
      {"cuMemcpy2DAsync", 7000, "cuMemcpy2DAsync_v2", "cuMemcpy2DAsync_v2_ptsz"},
      {"cuMemcpy3D", 7000, "cuMemcpy3D_v2", "cuMemcpy3D_v2_ptds"},
      {"cuMemcpy3DAsync", 7000, "cuMemcpy3DAsync_v2", "cuMemcpy3DAsync_v2_ptsz"},
      {"cuMemsetD16", 7000, "cuMemsetD16_v2", "cuMemsetD16_v2_ptds"},
      {"cuMemsetD16Async", 7000, "cuMemsetD16Async", "cuMemsetD16Async_ptsz"},
      {"cuMemsetD2D8", 7000, "cuMemsetD2D8_v2", "cuMemsetD2D8_v2_ptds"},
      {"cuMemsetD2D16", 7000, "cuMemsetD2D16_v2", "cuMemsetD2D16_v2_ptds"},
      {"cuMemsetD2D32", 7000, "cuMemsetD2D32_v2", "cuMemsetD2D32_v2_ptds"},
      {"cuMemsetD2D8Async", 7000, "cuMemsetD2D8Async", "cuMemsetD2D8Async_ptsz"},
      {"cuMemsetD2D16Async", 7000, "cuMemsetD2D16Async", "cuMemsetD2D16Async_ptsz"},
      {"cuMemsetD2D32Async", 7000, "cuMemsetD2D32Async", "cuMemsetD2D32Async_ptsz"},
      {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"},
      {"cuLaunchHostFunc", 10000, "cuLaunchHostFunc", "cuLaunchHostFunc_ptsz"},
      {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
      {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
      {"cuGraphLaunch", 10000, "cuGraphLaunch", "cuGraphLaunch_ptsz"},
      {"cuGraphUpload", 11010, "cuGraphUpload", "cuGraphUpload_ptsz"},
      {"cuGraphInstantiateWithParams", 12000, "cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"},
      {"cuCtxSynchronize", 12090, "cuCtxSynchronize", nullptr},
      {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2", nullptr},
      {"cuMemAlloc", 3020, "cuMemAlloc_v2", nullptr},
      {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", nullptr},
      {"cuMemAllocManaged", 6000, "cuMemAllocManaged", nullptr},
      {"cuMemCreate", 12000, "cuMemCreate", nullptr},
  };
  for (const Row& r : rows) {
    INFO(r.base << "@" << r.version);
    void* legacy = ::dlsym(lib, r.legacy);
    REQUIRE(legacy != nullptr);
    void* per_thread = r.per_thread != nullptr ? ::dlsym(lib, r.per_thread) : legacy;
    REQUIRE(per_thread != nullptr);
    if (r.per_thread != nullptr) CHECK(per_thread != legacy);
    for (cuuint64_t flags : {cuuint64_t{0}, cuuint64_t{CU_GET_PROC_ADDRESS_LEGACY_STREAM},
                             cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}}) {
      INFO("flags " << flags);
      void* fn = nullptr;
      CUdriverProcAddressQueryResult st{};
      REQUIRE(cuGetProcAddress_v2(r.base, &fn, r.version, flags, &st) == CUDA_SUCCESS);
      CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS);
      CHECK(fn == (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ? per_thread : legacy));
    }
  }
  // Per-thread variants of pre-7.0 functions exist from 7.0 on: an older request with the flag
  // finds nothing (measured), although the legacy function exists at that version.
  for (const char* base : {"cuMemcpyHtoD", "cuMemcpyHtoDAsync", "cuStreamSynchronize"}) {
    INFO(base);
    void* fn = &fn;
    CUdriverProcAddressQueryResult st{};
    CHECK(cuGetProcAddress_v2(base, &fn, 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) == CUDA_SUCCESS);
    CHECK(fn == nullptr);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  }
}

TEST_CASE("the per-thread variants behave like the legacy functions", "[sim][proc]") {
  init_ctx();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocAsync_ptsz(&p, kGran, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  const std::uint32_t in[2] = {11, 22};
  std::uint32_t out[2] = {};
  CHECK(cuMemcpyHtoD_v2_ptds(p, in, sizeof in) == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoD_v2_ptds(p + 8, p, sizeof in) == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoH_v2_ptds(out, p + 8, sizeof out) == CUDA_SUCCESS);
  CHECK(out[1] == 22);
  CHECK(cuMemsetD32Async_ptsz(p, 5, 1, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoHAsync_v2_ptsz(out, p, 4, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(out[0] == 5);
  CHECK(cuMemsetD8_v2_ptds(p, 1, 4) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize_ptsz(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(cuStreamQuery_ptsz(nullptr) == CUDA_SUCCESS);
  CHECK(cuMemcpyHtoD_v2_ptds(p + kGran - 4, in, sizeof in) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeAsync_ptsz(p, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize_ptsz(reinterpret_cast<CUstream>(&p)) == CUDA_ERROR_INVALID_HANDLE);
}
