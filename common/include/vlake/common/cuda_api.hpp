// Typed view of the CUDA driver ABI that vlake uses (the list lives in cuda_api.def).
//
// Contract
// - Declares every function of cuda_api.def with the real driver's prototype (cuda.h compiled
//   with __CUDA_API_VERSION_INTERNAL so the legacy, unversioned symbols are visible too) and
//   checks at compile time that each prototype equals cudaTypedefs.h's PFN_<base>_v<version>.
// - CudaApi is a table of typed function pointers filled from one loaded driver library
//   (the real libcuda.so.1 or the simulator); nothing is ever called through an untyped or
//   variadic pointer.
// - Thread-safety: a filled table is immutable and may be read from any thread.
#pragma once

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>
#include <cudaTypedefs.h>

#include <type_traits>

namespace vlake::cuda {

#define VLAKE_CU_API(base, symbol, version)                                   \
  static_assert(std::is_same_v<decltype(&::symbol), PFN_##base##_v##version>, \
                #symbol " does not match cudaTypedefs.h PFN_" #base "_v" #version);
#include "vlake/common/cuda_api.def"
#undef VLAKE_CU_API

// One slot per row of cuda_api.def, named after the exported symbol.
struct CudaApi {
#define VLAKE_CU_API(base, symbol, version) PFN_##base##_v##version symbol = nullptr;
#include "vlake/common/cuda_api.def"
#undef VLAKE_CU_API
};

// A row of cuda_api.def as data: what cuGetProcAddress tables are built from.
struct ApiRow {
  const char* base;
  const char* symbol;
  int version;
};

inline constexpr ApiRow kApiRows[] = {
#define VLAKE_CU_API(base, symbol, version) ApiRow{#base, #symbol, version},
#include "vlake/common/cuda_api.def"
#undef VLAKE_CU_API
};

}  // namespace vlake::cuda
