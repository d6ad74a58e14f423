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

}  // namespace simtest
