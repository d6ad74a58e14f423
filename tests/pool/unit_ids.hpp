// Tenant and GPU ids and a start time for the unit tests of the pool's rooms, defined once: the test files of a target
// share a translation unit in its unity build (tests/CMakeLists.txt) and name these with
// using-declarations.
#pragma once

#include <chrono>

#include "vlake/common/strong_types.hpp"

namespace vlake::roomtest {

inline constexpr TenantId kA{1};
inline constexpr TenantId kB{2};
inline constexpr DeviceOrdinal kGpu0{0};
inline constexpr DeviceOrdinal kGpu1{1};
// The rooms' clock (steady_clock) an hour after its epoch, where the tests start.
inline constexpr std::chrono::steady_clock::time_point kT0{std::chrono::hours(1)};

}  // namespace vlake::roomtest
