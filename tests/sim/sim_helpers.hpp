// Helpers of the simulator's Catch2 tests (failures are REQUIRE failures): the simulator's
// library handle, pointer attributes, and the kernel the tests launch, vlake_fill_u32(unsigned*
// p, unsigned long long n, unsigned v), which sets p[0..n) = v (the simulator runs it on the
// host by its entry name; see sim/src/driver_kernels.cpp).
#pragma once

#include "vlake/common/cuda_api.hpp"

#include <catch2/catch.hpp>

#include <dlfcn.h>

namespace simtest {

// The simulated libcuda.so.1 this test binary links (VLAKE_SIM_LIB), already loaded.
inline void* sim_handle() {
  void* h = ::dlopen(VLAKE_SIM_LIB, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(h != nullptr);
  return h;
}

// Pointer attribute `a` of `p` (cuPointerGetAttribute must succeed).
template <class T>
T attr(CUpointer_attribute a, CUdeviceptr p) {
  T v{};
  REQUIRE(cuPointerGetAttribute(&v, a, p) == CUDA_SUCCESS);
  return v;
}

inline constexpr const char* kFillPtx = R"(
.version 8.0
.target sm_75
.address_size 64
.visible .entry vlake_fill_u32(.param .u64 p0, .param .u64 p1, .param .u32 p2)
{
  ret;
}
)";

// The loaded vlake_fill_u32 (loaded once per process; modules outlive contexts in the simulator).
inline CUfunction fill_kernel() {
  static CUfunction fn = [] {
    CUmodule mod = nullptr;
    REQUIRE(cuModuleLoadData(&mod, kFillPtx) == CUDA_SUCCESS);
    CUfunction f = nullptr;
    REQUIRE(cuModuleGetFunction(&f, mod, "vlake_fill_u32") == CUDA_SUCCESS);
    return f;
  }();
  return fn;
}

// Launches vlake_fill_u32(p, n, v) on the legacy stream with 4 blocks of 256 threads.
inline CUresult launch_fill(CUdeviceptr p, unsigned long long n, unsigned v) {
  void* args[] = {&p, &n, &v};
  return cuLaunchKernel(fill_kernel(), 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr);
}

// A `size`-byte VMM allocation with `prop`, mapped at a range of its own: the handle in `h`, the
// mapped address returned. No access is set.
inline CUdeviceptr create_and_map(const CUmemAllocationProp& prop, size_t size, CUmemGenericAllocationHandle& h) {
  REQUIRE(cuMemCreate(&h, size, &prop, 0) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, size, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va, size, 0, h, 0) == CUDA_SUCCESS);
  return va;
}

// create_and_map, then read-write access for the allocation's own device (prop.location).
inline CUdeviceptr map_read_write(const CUmemAllocationProp& prop, size_t size, CUmemGenericAllocationHandle& h) {
  const CUdeviceptr va = create_and_map(prop, size, h);
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(cuMemSetAccess(va, size, &desc, 1) == CUDA_SUCCESS);
  return va;
}

// A `size`-byte VMM allocation with `prop` (handle in `h`), exported as a POSIX descriptor, which
// is returned (the caller closes it).
inline int create_and_export(const CUmemAllocationProp& prop, size_t size, CUmemGenericAllocationHandle& h) {
  REQUIRE(cuMemCreate(&h, size, &prop, 0) == CUDA_SUCCESS);
  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  return fd;
}

// create_and_map's allocation as an object: unmapped, its range freed and its handle released
// when it goes (results ignored: a test that failed may have released it already).
struct MappedAllocation {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  size_t size = 0;
  MappedAllocation(const CUmemAllocationProp& prop, size_t bytes) : size(bytes) { va = create_and_map(prop, size, h); }
  ~MappedAllocation() {
    cuMemUnmap(va, size);
    cuMemAddressFree(va, size);
    cuMemRelease(h);
  }
  MappedAllocation(const MappedAllocation&) = delete;
  MappedAllocation& operator=(const MappedAllocation&) = delete;
};

}  // namespace simtest
