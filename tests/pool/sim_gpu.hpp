// One simulated 1 GiB GPU loaded into the test process (ctest runs each test case in its own
// process); its node file goes when the object does. For the pool's in-process tests.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "vlake/common/driver.hpp"

namespace vlake::pooltest {

class SimGpu {
 public:
  explicit SimGpu(const std::string& prefix = "node") : node_(prefix + "-" + std::to_string(::getpid())) {
    ::setenv("VLAKE_SIM_NODE", node_.c_str(), 1);
    ::setenv("VLAKE_SIM_DEVICE_MEMORY", "1GiB", 1);
    ::setenv("VLAKE_SIM_DEVICE_COUNT", "1", 1);
    driver_ = open_driver(VLAKE_SIM_LIB);
  }
  ~SimGpu() { ::unlink(("/dev/shm/vlake-sim-" + node_).c_str()); }
  SimGpu(const SimGpu&) = delete;
  SimGpu& operator=(const SimGpu&) = delete;
  Driver& driver() { return *driver_; }

 private:
  std::string node_;
  std::unique_ptr<Driver> driver_;
};

}  // namespace vlake::pooltest
