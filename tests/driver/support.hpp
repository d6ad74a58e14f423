// Shared pieces of the driver conformance suite: the driver under test, the child-process
// helper, and the messages the two exchange.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "process.hpp"
#include "vlake/common/driver.hpp"
#include "vlake/common/unique_fd.hpp"

namespace vlake::test {

// The driver every test case uses (opened once by main()).
Driver& driver();

// Exit status that CTest reports as "skipped" (no driver / no device here).
inline constexpr int kSkipExit = 77;

// Environment variable naming the driver library under test (a soname or a path).
inline constexpr const char* kDriverEnv = "VLAKE_TEST_DRIVER";

// Runs the child helper with `args` (vlake::test_support's process.hpp); its end of a
// SOCK_SEQPACKET pair is passed as the first argument. Returns the parent's end; wait() reaps
// the child and returns its wait status (throws when it runs past 5 minutes). A child never
// waited for is SIGKILLed and reaped with the Child.
struct Child {
  int pid = -1;
  UniqueFd socket;
  std::unique_ptr<testsupport::Process> process;
  int wait();
};
Child spawn_child(const std::vector<std::string>& args);

// What the child reports after an illegal kernel access (status codes of each step).
struct IllegalAccessReport {
  std::int32_t launch;
  std::int32_t first_sync;
  std::int32_t second_sync;
  std::int32_t copy_after;    // a copy from valid memory after the fault (needs the context)
  std::int32_t create_after;  // a VMM create after the fault (needs no context)
};
static_assert(std::is_trivially_copyable_v<IllegalAccessReport>);

// Runs `f` and returns the DriverError code it threw, or 0 if it did not throw.
template <class F>
DriverStatus status_of(F&& f) {
  try {
    f();
  } catch (const DriverError& e) {
    return e.code();
  }
  return 0;
}

}  // namespace vlake::test
