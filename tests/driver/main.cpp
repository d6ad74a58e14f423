// Entry point of the conformance suite: opens the driver named by VLAKE_TEST_DRIVER (default:
// the system's libcuda.so.1) and runs the Catch2 session against it. Exits 77 (CTest: skipped)
// when that driver cannot be loaded or has no device, so a machine without a GPU reports the
// GPU variant as skipped, never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "support.hpp"

namespace vlake::test {
namespace {
std::unique_ptr<Driver> g_driver;
}
Driver& driver() { return *g_driver; }
}  // namespace vlake::test

int main(int argc, char* argv[]) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
  }
  if (!listing) {
    const char* lib = std::getenv(vlake::test::kDriverEnv);
    const std::string library = lib != nullptr && *lib != '\0' ? lib : "libcuda.so.1";
    try {
      vlake::test::g_driver = vlake::open_driver(library);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "SKIP: no usable CUDA driver (%s): %s\n", library.c_str(), e.what());
      return vlake::test::kSkipExit;
    }
    if (vlake::test::g_driver->device_count() == 0) {
      std::fprintf(stderr, "SKIP: %s reports no device\n", library.c_str());
      return vlake::test::kSkipExit;
    }
    std::fprintf(stderr, "driver under test: %s, device 0: %s\n", library.c_str(),
                 vlake::test::g_driver->device_name(vlake::DeviceOrdinal{0}).c_str());
  }
  return Catch::Session().run(argc, argv);
}
