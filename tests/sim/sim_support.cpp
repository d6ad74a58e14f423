#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>

namespace simtest {
namespace {

std::string make_node() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return "simtest-" + std::to_string(::getpid()) + "-" + std::to_string(now % 1000000007);
}

// Runs before main: every test process gets its own node, so parallel ctest runs never share
// capacity; children spawned by a test inherit it unless the test overrides it.
struct EnvSetup {
  std::string node = make_node();
  EnvSetup() {
    ::setenv("VLAKE_SIM_NODE", node.c_str(), 1);
    ::setenv("VLAKE_SIM_DEVICE_MEMORY", "1GiB", 1);
    ::setenv("VLAKE_SIM_DEVICE_COUNT", std::to_string(kDevices).c_str(), 1);
  }
};
EnvSetup g_env;

}  // namespace

const std::string& node_name() { return g_env.node; }

std::string fresh_node(const std::string& tag) {
  static std::atomic<int> counter{0};
  return g_env.node + "-" + tag + "-" + std::to_string(counter++);
}

CUcontext init_ctx(int dev) {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return ctx;
}

size_t used_bytes(int dev) {
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
  REQUIRE(cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS);
  size_t f = 0;
  size_t t = 0;
  const CUresult rc = cuMemGetInfo_v2(&f, &t);
  REQUIRE(cuCtxPopCurrent_v2(nullptr) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRelease_v2(dev) == CUDA_SUCCESS);
  REQUIRE(rc == CUDA_SUCCESS);
  REQUIRE(t == kCapacity);
  return t - f;
}

CUmemAllocationProp device_prop(int dev, bool posix_fd) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

void set_access(CUdeviceptr va, size_t size, CUmemAccess_flags flags, int dev) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = dev;
  desc.flags = flags;
  REQUIRE(cuMemSetAccess(va, size, &desc, 1) == CUDA_SUCCESS);
}

Child spawn_probe(const std::vector<std::string>& args, const Env& env, long uid, long gid) {
  vlake::testsupport::Env vars = vlake::testsupport::Env::inherited();
  vars.apply(env);
  vlake::testsupport::Spawn spec;
  spec.argv = {VLAKE_SIM_PROBE};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = vars.strings();
  spec.err = vlake::testsupport::Stream::merged;
  spec.uid = uid;
  spec.gid = gid;
  Child c;
  c.process = std::make_unique<vlake::testsupport::Process>(spec);
  c.pid = c.process->pid();
  return c;
}

bool read_until(Child& c, const std::string& marker, int timeout_ms) {
  const bool found =
      c.process->read_until([&] { return c.process->out().find(marker) != std::string::npos; }, timeout_ms);
  c.output = c.process->out();
  return found;
}

int finish(Child& c) {
  c.process->drain(60000);
  const int status = c.process->wait(60000) < 0 ? c.process->kill() : *c.process->status();
  c.output = c.process->out();
  c.process.reset();
  c.pid = -1;
  return vlake::testsupport::exit_code(status);
}

int run_probe(const std::vector<std::string>& args, const Env& env, std::string& output, long uid, long gid) {
  Child c = spawn_probe(args, env, uid, gid);
  const int status = finish(c);
  output = c.output;
  return status;
}

std::string value_of(const std::string& output, const std::string& key) {
  const std::string needle = key + "=";
  size_t pos = 0;
  while ((pos = output.find(needle, pos)) != std::string::npos) {
    if (pos == 0 || output[pos - 1] == '\n') {
      const size_t start = pos + needle.size();
      return output.substr(start, output.find('\n', start) - start);
    }
    pos += needle.size();
  }
  return "";
}

}  // namespace simtest
