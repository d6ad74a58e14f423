// Helpers shared by the simulator tests: the test process's node, context setup, and running
// the vlake_sim_probe helper in child processes (vlake::test_support's process.hpp).
#pragma once

#include "vlake/common/cuda_api.hpp"

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "process.hpp"

namespace simtest {

// The node of this test process (unique per process; set in the environment before main).
const std::string& node_name();
inline constexpr size_t kCapacity = size_t{1} << 30;  // VLAKE_SIM_DEVICE_MEMORY of the tests
inline constexpr size_t kGran = size_t{2} << 20;
inline constexpr int kDevices = 2;

// cuInit + retain device `dev`'s primary context + make it current on this thread.
CUcontext init_ctx(int dev = 0);

// Bytes used on device `dev` (total - free from cuMemGetInfo_v2, with dev's context current).
size_t used_bytes(int dev = 0);

CUmemAllocationProp device_prop(int dev = 0, bool posix_fd = true);
void set_access(CUdeviceptr va, size_t size, CUmemAccess_flags flags, int dev = 0);

using Env = std::vector<std::pair<std::string, std::string>>;  // overrides; value "\x01" unsets

struct Child {
  pid_t pid = -1;
  std::string output;                                    // what was read so far of its stdout+stderr
  std::unique_ptr<vlake::testsupport::Process> process;  // SIGKILLs and reaps the probe when dropped
};

// Starts the probe with `args`; the environment is this process's plus `env`. `uid`/`gid` >= 0
// (root only): the child runs with that uid and/or gid and no supplementary groups; it exits
// 126 when it cannot switch.
Child spawn_probe(const std::vector<std::string>& args, const Env& env = {}, long uid = -1, long gid = -1);
// Reads the child's output until it contains `marker` (or EOF / timeout). True when found.
bool read_until(Child& c, const std::string& marker, int timeout_ms = 10000);
// Waits for the child and reads all its output; returns the exit status (or 128 + signal).
int finish(Child& c);
// spawn + finish.
int run_probe(const std::vector<std::string>& args, const Env& env, std::string& output, long uid = -1, long gid = -1);
// The value of "key=value" in a probe's output ("" when absent).
std::string value_of(const std::string& output, const std::string& key);
// A node name that no other test uses.
std::string fresh_node(const std::string& tag);

}  // namespace simtest
