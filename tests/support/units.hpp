// Byte units for the tests, defined once. A test file names them with
// `using namespace vlake::testunits;` (or a using-declaration), which may repeat: the test
// targets are unity builds (tests/CMakeLists.txt), where a target's files share a translation
// unit, so a constant each file defined for itself would clash.
#pragma once

#include <cstdint>

namespace vlake::testunits {

inline constexpr std::uint64_t kKiB = std::uint64_t{1} << 10;
inline constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
// The same, as the hook's and the end-to-end tests spell them.
inline constexpr std::uint64_t MiB = kMiB;
inline constexpr std::uint64_t GiB = kGiB;

}  // namespace vlake::testunits
