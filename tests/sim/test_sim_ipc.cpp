// Legacy CUDA IPC in the simulator (docs/simulator.md): VMM memory is refused as the driver does;
// cuMemAlloc memory is not carried across processes (a documented simulator limit), so no handle
// is ever issued and every open or close is refused. The codes are listed in docs/driver.md as
// not yet measured.
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <cstring>

using namespace simtest;

TEST_CASE("cuIpcGetMemHandle refuses VMM memory and the simulator issues no legacy IPC handle", "[sim][ipc]") {
  init_ctx();
  CUipcMemHandle h{};
  std::memset(&h, 0x5a, sizeof h);

  // VMM memory: refused (IS_LEGACY_CUDA_IPC_CAPABLE is 0 on the H100).
  const CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle mem = 0;
  const CUdeviceptr va = map_read_write(prop, kGran, mem);
  CHECK(cuIpcGetMemHandle(&h, va) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuIpcGetMemHandle(&h, va + 4096) == CUDA_ERROR_INVALID_VALUE);

  // cuMemAlloc memory: a simulator limit; an unknown pointer and a null handle: refused.
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, kGran) == CUDA_SUCCESS);
  CHECK(cuIpcGetMemHandle(&h, p) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuIpcGetMemHandle(&h, 0x1234000) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuIpcGetMemHandle(nullptr, p) == CUDA_ERROR_INVALID_VALUE);

  // No handle was issued: opens and closes are refused, bad flags too.
  CUdeviceptr opened = 0;
  CHECK(cuIpcOpenMemHandle_v2(&opened, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuIpcOpenMemHandle_v2(&opened, h, 0x80) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuIpcOpenMemHandle_v2(nullptr, h, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(opened == 0);
  CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);

  // Without a context: the context rule comes first.
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  CHECK(cuIpcGetMemHandle(&h, p) == CUDA_ERROR_INVALID_CONTEXT);
  init_ctx();
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
  REQUIRE(cuMemUnmap(va, kGran) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, kGran) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(mem) == CUDA_SUCCESS);
}
