#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

extern char** environ;

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
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) vars[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : env) {
    if (v == "\x01") {
      vars.erase(k);
    } else {
      vars[k] = v;
    }
  }
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings{VLAKE_SIM_PROBE};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    if ((uid >= 0 || gid >= 0) && ::setgroups(0, nullptr) != 0) ::_exit(126);
    if (gid >= 0 && ::setgid(static_cast<gid_t>(gid)) != 0) ::_exit(126);
    if (uid >= 0 && ::setuid(static_cast<uid_t>(uid)) != 0) ::_exit(126);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  Child c;
  c.pid = pid;
  c.out = fds[0];
  return c;
}

bool read_until(Child& c, const std::string& marker, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (c.output.find(marker) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{c.out, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(c.out, buf, sizeof buf);
    if (n <= 0) return c.output.find(marker) != std::string::npos;
    c.output.append(buf, static_cast<size_t>(n));
  }
  return true;
}

int finish(Child& c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(c.out, buf, sizeof buf);
    if (n <= 0) break;
    c.output.append(buf, static_cast<size_t>(n));
  }
  ::close(c.out);
  c.out = -1;
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  c.pid = -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
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
