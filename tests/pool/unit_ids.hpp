// Tenant and GPU ids for the unit tests of the pool's rooms, defined once: the test files of a target
// share a translation unit in its unity build (tests/CMakeLists.txt) and name these with
// using-declarations.
#pragma once

#include "vlake/common/strong_types.hpp"

namespace vlake::pooltest {

inline constexpr TenantId kA{1};
inline constexpr TenantId kB{2};
inline constexpr DeviceOrdinal kGpu0{0};
inline constexpr DeviceOrdinal kGpu1{1};

}  // namespace vlake::pooltest
