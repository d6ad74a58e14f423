// The simulated NVML (build/<preset>/sim/libnvidia-ml.so.1) against the simulated driver: every
// entry point, the buffer protocol, used/free equal to cuMemGetInfo_v2, the per-process charge
// rule (first live holder, creator first) across processes, and the per-context overhead.
// This binary runs with VLAKE_SIM_CONTEXT_MEMORY=8MiB (set before main, inherited by probes).
#include "sim_helpers.hpp"
#include "sim_support.hpp"
#include "units.hpp"
#include "vlake/common/nvml_api.hpp"
#include "vlake/common/uuid.hpp"

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using namespace simtest;

namespace {

constexpr size_t kContext = size_t{8} << 20;
using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

struct ContextEnv {
  ContextEnv() { ::setenv("VLAKE_SIM_CONTEXT_MEMORY", "8MiB", 1); }
};
ContextEnv g_context_env;

// The simulated NVML, resolved with dlsym like its users do.
struct Nvml {
  void* lib = nullptr;
  PFN_nvmlInit_v2 init = nullptr;
  PFN_nvmlInitWithFlags init_flags = nullptr;
  PFN_nvmlShutdown shutdown = nullptr;
  PFN_nvmlErrorString error_string = nullptr;
  PFN_nvmlSystemGetDriverVersion driver_version = nullptr;
  PFN_nvmlDeviceGetCount_v2 count = nullptr;
  PFN_nvmlDeviceGetHandleByIndex_v2 by_index = nullptr;
  PFN_nvmlDeviceGetHandleByUUID by_uuid = nullptr;
  PFN_nvmlDeviceGetUUID uuid = nullptr;
  PFN_nvmlDeviceGetIndex index = nullptr;
  PFN_nvmlDeviceGetName name = nullptr;
  PFN_nvmlDeviceGetMemoryInfo memory = nullptr;
  PFN_nvmlDeviceGetMemoryInfo_v2 memory_v2 = nullptr;
  PFN_nvmlDeviceGetComputeRunningProcesses_v3 processes = nullptr;
};

template <class F>
void bind(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
  INFO(name);
  REQUIRE(f != nullptr);
}

const Nvml& nvml() {
  static Nvml n = [] {
    Nvml x;
    x.lib = ::dlopen(VLAKE_SIM_NVML_LIB, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(x.lib != nullptr);
    bind(x.lib, x.init, "nvmlInit_v2");
    bind(x.lib, x.init_flags, "nvmlInitWithFlags");
    bind(x.lib, x.shutdown, "nvmlShutdown");
    bind(x.lib, x.error_string, "nvmlErrorString");
    bind(x.lib, x.driver_version, "nvmlSystemGetDriverVersion");
    bind(x.lib, x.count, "nvmlDeviceGetCount_v2");
    bind(x.lib, x.by_index, "nvmlDeviceGetHandleByIndex_v2");
    bind(x.lib, x.by_uuid, "nvmlDeviceGetHandleByUUID");
    bind(x.lib, x.uuid, "nvmlDeviceGetUUID");
    bind(x.lib, x.index, "nvmlDeviceGetIndex");
    bind(x.lib, x.name, "nvmlDeviceGetName");
    bind(x.lib, x.memory, "nvmlDeviceGetMemoryInfo");
    bind(x.lib, x.memory_v2, "nvmlDeviceGetMemoryInfo_v2");
    bind(x.lib, x.processes, "nvmlDeviceGetComputeRunningProcesses_v3");
    return x;
  }();
  return n;
}

// nvmlInit_v2 for the scope of a test (every test leaves NVML uninitialized).
struct NvmlSession {
  NvmlSession() { REQUIRE(nvml().init() == NVML_SUCCESS); }
  ~NvmlSession() { nvml().shutdown(); }
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;
};

nvmlDevice_t device(unsigned i) {
  nvmlDevice_t d = nullptr;
  REQUIRE(nvml().by_index(i, &d) == NVML_SUCCESS);
  return d;
}

nvmlMemory_t memory(unsigned i) {
  nvmlMemory_t m{};
  REQUIRE(nvml().memory(device(i), &m) == NVML_SUCCESS);
  return m;
}

// pid -> bytes charged on device i.
std::map<unsigned, unsigned long long> charges(unsigned i) {
  unsigned n = 0;
  const nvmlReturn_t rc = nvml().processes(device(i), &n, nullptr);
  REQUIRE((rc == NVML_SUCCESS || rc == NVML_ERROR_INSUFFICIENT_SIZE));
  std::vector<nvmlProcessInfo_t> infos(n + 4);
  n = static_cast<unsigned>(infos.size());
  REQUIRE(nvml().processes(device(i), &n, infos.data()) == NVML_SUCCESS);
  std::map<unsigned, unsigned long long> out;
  for (unsigned k = 0; k < n; ++k) {
    CHECK(infos[k].gpuInstanceId == VLAKE_NVML_VALUE_NOT_AVAILABLE);
    CHECK(infos[k].computeInstanceId == VLAKE_NVML_VALUE_NOT_AVAILABLE);
    out[infos[k].pid] = infos[k].usedGpuMemory;
  }
  return out;
}

std::string uuid_text(const CUuuid& u) { return vlake::Uuid::from_bytes(u.bytes).to_string(); }

// Sets environment variables for a scope and puts the old values back.
class ScopedEnv {
 public:
  explicit ScopedEnv(const Env& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old != nullptr ? std::string(old) : std::string("\x01"));
      ::setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v == "\x01") {
        ::unsetenv(k.c_str());
      } else {
        ::setenv(k.c_str(), v.c_str(), 1);
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  Env saved_;
};

unsigned self_pid() { return static_cast<unsigned>(::getpid()); }

}  // namespace

namespace {

// The start of a test on device 0: a current context, an NVML session, this process's pid and
// the device's used memory before the test allocates.
struct Baseline {
  Baseline() : ctx(init_ctx()), me(self_pid()), before(memory(0).used) {}
  CUcontext ctx;
  NvmlSession session;
  unsigned me;
  unsigned long long before;
};

}  // namespace

TEST_CASE("nvml exports only nvml* and every call but nvmlErrorString needs init", "[sim][nvml]") {
  const Nvml& n = nvml();
  CHECK(::dlsym(n.lib, "_ZN5vlake3sim10parse_sizeEPKcRm") == nullptr);  // internals are hidden
  CHECK(std::string(n.error_string(NVML_SUCCESS)) == "Success");
  CHECK(std::string(n.error_string(NVML_ERROR_UNINITIALIZED)) == "Uninitialized");
  CHECK(std::string(n.error_string(NVML_ERROR_INVALID_ARGUMENT)) == "Invalid Argument");
  CHECK(std::string(n.error_string(NVML_ERROR_NOT_FOUND)) == "Not Found");
  CHECK(std::string(n.error_string(NVML_ERROR_INSUFFICIENT_SIZE)) == "Insufficient Size");
  CHECK(std::string(n.error_string(NVML_ERROR_FUNCTION_NOT_FOUND)) == "Function Not Found");
  CHECK(std::string(n.error_string(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)) == "Argument version mismatch");
  CHECK(std::string(n.error_string(NVML_ERROR_UNKNOWN)) == "Unknown Error");
  CHECK(std::string(n.error_string(12345)) == "Unknown Error");

  unsigned count = 77;
  char buf[96];
  nvmlDevice_t d = nullptr;
  CHECK(n.count(&count) == NVML_ERROR_UNINITIALIZED);
  CHECK(count == 77);
  CHECK(n.driver_version(buf, sizeof buf) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.by_index(0, &d) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.shutdown() == NVML_ERROR_UNINITIALIZED);

  // Init is counted (measured): two inits need two shutdowns; flags are accepted.
  REQUIRE(n.init() == NVML_SUCCESS);
  REQUIRE(n.init_flags(99) == NVML_SUCCESS);
  CHECK(n.shutdown() == NVML_SUCCESS);
  CHECK(n.count(&count) == NVML_SUCCESS);
  CHECK(count == kDevices);
  CHECK(n.shutdown() == NVML_SUCCESS);
  CHECK(n.count(&count) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.shutdown() == NVML_ERROR_UNINITIALIZED);
  REQUIRE(n.init_flags(0) == NVML_SUCCESS);
  CHECK(n.count(&count) == NVML_SUCCESS);
  CHECK(n.shutdown() == NVML_SUCCESS);
}

TEST_CASE("nvml devices are the driver's: index, UUID, name, driver version", "[sim][nvml]") {
  init_ctx();
  NvmlSession session;
  const Nvml& n = nvml();
  unsigned count = 0;
  REQUIRE(n.count(&count) == NVML_SUCCESS);
  REQUIRE(count == kDevices);
  for (unsigned i = 0; i < count; ++i) {
    INFO("device " << i);
    nvmlDevice_t d = device(i);
    unsigned index = 99;
    CHECK(n.index(d, &index) == NVML_SUCCESS);
    CHECK(index == i);
    CUuuid cu{};
    REQUIRE(cuDeviceGetUuid_v2(&cu, static_cast<CUdevice>(i)) == CUDA_SUCCESS);
    char text[VLAKE_NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    REQUIRE(n.uuid(d, text, sizeof text) == NVML_SUCCESS);
    CHECK(std::string(text) == uuid_text(cu));
    nvmlDevice_t again = nullptr;
    CHECK(n.by_uuid(text, &again) == NVML_SUCCESS);
    CHECK(again == d);
    char name[VLAKE_NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    REQUIRE(n.name(d, name, sizeof name) == NVML_SUCCESS);
    char cu_name[128] = {};
    REQUIRE(cuDeviceGetName(cu_name, sizeof cu_name, static_cast<CUdevice>(i)) == CUDA_SUCCESS);
    CHECK(std::string(name) == cu_name);
  }
  CHECK(device(0) != device(1));

  // Buffer sizes: the text plus its NUL (measured: 41 bytes for a UUID).
  nvmlDevice_t d = device(0);
  char buf[96];
  CHECK(n.uuid(d, buf, 41) == NVML_SUCCESS);
  CHECK(n.uuid(d, buf, 40) == NVML_ERROR_INSUFFICIENT_SIZE);
  const unsigned name_len = static_cast<unsigned>(std::strlen("vlake simulated GPU"));
  CHECK(n.name(d, buf, name_len + 1) == NVML_SUCCESS);
  CHECK(n.name(d, buf, name_len) == NVML_ERROR_INSUFFICIENT_SIZE);
  REQUIRE(n.driver_version(buf, VLAKE_NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE) == NVML_SUCCESS);
  CHECK(std::string(buf) == "580.159.04");
  CHECK(n.driver_version(buf, 5) == NVML_ERROR_INSUFFICIENT_SIZE);

  // Bad arguments (measured codes).
  nvmlDevice_t out = nullptr;
  unsigned u = 0;
  CHECK(n.by_index(kDevices, &out) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.by_index(0, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.by_uuid("GPU-00000000-0000-0000-0000-000000000000", &out) == NVML_ERROR_NOT_FOUND);
  CHECK(n.by_uuid("junk", &out) == NVML_ERROR_NOT_FOUND);
  CHECK(n.by_uuid(nullptr, &out) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.uuid(nullptr, buf, sizeof buf) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.index(reinterpret_cast<nvmlDevice_t>(buf), &u) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.index(d, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.count(nullptr) == NVML_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("nvml memory equals cuMemGetInfo_v2 and includes each context", "[sim][nvml]") {
  init_ctx();
  NvmlSession session;
  const Nvml& n = nvml();
  const size_t base = used_bytes();
  CHECK(base == kContext);  // this process's primary context, nothing else
  nvmlMemory_t m = memory(0);
  CHECK(m.total == kCapacity);
  CHECK(m.used == base);
  CHECK(m.free == kCapacity - base);
  CHECK(memory(1).used == 0);  // no context, nothing allocated on device 1

  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc_v2(&p, 3 * kMiB) == CUDA_SUCCESS);
  CUmemAllocationProp prop = device_prop(1);
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(cuMemCreate(&h, 3 * kGran, &prop, 0) == CUDA_SUCCESS);
  CHECK(memory(0).used == used_bytes(0));
  CHECK(memory(0).used == base + 2 * kGran);
  CHECK(memory(1).used == 3 * kGran);

  nvmlMemory_v2_t m2{};
  m2.version = VLAKE_NVML_MEMORY_V2;
  REQUIRE(n.memory_v2(device(0), &m2) == NVML_SUCCESS);
  CHECK(m2.total == kCapacity);
  CHECK(m2.reserved == 0);
  CHECK(m2.used == base + 2 * kGran);
  CHECK(m2.reserved + m2.used + m2.free == m2.total);  // as on the H100
  for (unsigned version :
       {0u, static_cast<unsigned>(sizeof(nvmlMemory_v2_t) | (1u << 24)), static_cast<unsigned>(32u | (2u << 24))}) {
    m2.version = version;
    CHECK(n.memory_v2(device(0), &m2) == NVML_ERROR_FUNCTION_NOT_FOUND);  // measured
  }
  CHECK(n.memory_v2(device(0), nullptr) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.memory(device(0), nullptr) == NVML_ERROR_INVALID_ARGUMENT);

  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(memory(0).used == base);
  CHECK(memory(1).used == 0);

  // Contexts count against capacity: fill what is left, and a new process's context no longer
  // fits (its retain fails with out-of-memory); another allocation neither.
  const size_t left = (kCapacity - base) / kGran * kGran;
  prop = device_prop(0);
  REQUIRE(cuMemCreate(&h, left, &prop, 0) == CUDA_SUCCESS);
  CHECK(memory(0).free == kCapacity - base - left);
  std::string out;
  REQUIRE(run_probe({"used"}, {}, out) == 1);
  CHECK(value_of(out, "failed").find("cuDevicePrimaryCtxRetain") != std::string::npos);
  CHECK(value_of(out, "rc") == std::to_string(CUDA_ERROR_OUT_OF_MEMORY));
  CUmemGenericAllocationHandle h2 = 0;
  CHECK(cuMemCreate(&h2, kGran, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  REQUIRE(run_probe({"used"}, {}, out) == 0);  // now its context fits: two contexts used
  CHECK(value_of(out, "used") == std::to_string(2 * kContext));
  CHECK(memory(0).used == base);  // the probe's context went away with it
}

TEST_CASE("nvml charges an allocation to its first live holder", "[sim][nvml]") {
  // Measured on the H100: the creator is charged while it holds the allocation, importers are
  // not; when the creator lets go the charge moves to a remaining holder.
  init_ctx();
  NvmlSession session;
  const Nvml& n = nvml();
  const unsigned me = self_pid();
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext}});
  CHECK(charges(1).empty());

  const size_t size = 32 * kMiB;
  CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  const CUdeviceptr va = map_read_write(prop, size, h);
  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  Child importer = spawn_probe({"import", std::to_string(fd), std::to_string(size)});
  ::close(fd);
  REQUIRE(read_until(importer, "ready=1"));
  const auto them = static_cast<unsigned>(importer.pid);

  auto c = charges(0);
  CHECK(c == std::map<unsigned, unsigned long long>{{me, kContext + size}, {them, kContext}});
  CHECK(memory(0).used == 2 * kContext + size);
  CHECK(memory(0).used == used_bytes());

  // The buffer protocol.
  unsigned count = 0;
  CHECK(n.processes(device(0), &count, nullptr) == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(count == 2);
  nvmlProcessInfo_t one[1];
  count = 1;
  CHECK(n.processes(device(0), &count, one) == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(count == 2);
  count = 1;
  CHECK(n.processes(device(0), &count, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(n.processes(device(0), nullptr, one) == NVML_ERROR_INVALID_ARGUMENT);
  count = 0;
  CHECK(n.processes(device(1), &count, nullptr) == NVML_SUCCESS);
  CHECK(count == 0);

  // The creator lets go: the importer is charged; the total does not change.
  REQUIRE(cuMemUnmap(va, size) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, size) == CUDA_SUCCESS);
  c = charges(0);
  CHECK(c == std::map<unsigned, unsigned long long>{{me, kContext}, {them, kContext + size}});
  CHECK(memory(0).used == 2 * kContext + size);

  // The last holder dies: the memory and its context are gone.
  REQUIRE(::kill(importer.pid, SIGKILL) == 0);
  CHECK(finish(importer) == 128 + SIGKILL);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext}});
  CHECK(memory(0).used == kContext);
  CHECK(memory(0).used == used_bytes());
}

TEST_CASE("nvml charges no process while the creator let go and a descriptor is open", "[sim][nvml]") {
  // Measured on the H100 (docs/driver.md "What NVML reports"): A creates and exports, B imports
  // and maps; A releases its handle but keeps the descriptor: the memory is charged to no process.
  // Once the last descriptor closes, the charge moves to B.
  init_ctx();
  NvmlSession session;
  const unsigned me = self_pid();
  const size_t size = 16 * kMiB;
  CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  const int fd = create_and_export(prop, size, h);
  Child importer = spawn_probe({"import", std::to_string(fd), std::to_string(size)});
  REQUIRE(read_until(importer, "ready=1"));
  const auto them = static_cast<unsigned>(importer.pid);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext + size}, {them, kContext}});

  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);  // this process keeps `fd`
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext}, {them, kContext}});
  CHECK(memory(0).used == 2 * kContext + size);
  CHECK(memory(0).used == used_bytes());

  ::close(fd);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext}, {them, kContext + size}});
  CHECK(memory(0).used == 2 * kContext + size);

  REQUIRE(::kill(importer.pid, SIGKILL) == 0);
  CHECK(finish(importer) == 128 + SIGKILL);
  CHECK(memory(0).used == kContext);
}

TEST_CASE("an allocation held only through a descriptor stays on the device, charged to no process", "[sim][nvml]") {
  // Measured on the H100 (docs/driver.md): after the creator released its handle, an exported
  // descriptor still open keeps the memory in use; NVML charges it to no process until the last
  // descriptor closes.
  const Baseline base;
  const size_t size = 16 * kMiB;
  CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  const int fd = create_and_export(prop, size, h);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(memory(0).used == base.before + size);
  CHECK(used_bytes() == base.before + size);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{base.me, kContext}});
  // The descriptor still reaches the memory: importing it again needs no new capacity.
  CUmemGenericAllocationHandle again = 0;
  REQUIRE(cuMemImportFromShareableHandle(&again, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  CHECK(memory(0).used == base.before + size);
  REQUIRE(cuMemRelease(again) == CUDA_SUCCESS);
  ::close(fd);
  CHECK(memory(0).used == base.before);
  CHECK(used_bytes() == base.before);
}

TEST_CASE("memory created without a context is in used but its process is not listed", "[sim][nvml]") {
  // Measured on the H100: a process that calls cuMemCreate without ever creating a context is
  // not in nvmlDeviceGetComputeRunningProcesses_v3, yet its memory is in the device's used
  // memory. It still has the driver's device file open (here the node file), which is how
  // vlaked finds it (docs/daemon.md, "Memory outside vlake").
  const Baseline base;
  const size_t size = 32 * kMiB;
  Child creator = spawn_probe({"create", std::to_string(size)});
  REQUIRE(read_until(creator, "ready=1"));
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{base.me, kContext}});
  CHECK(memory(0).used == base.before + size);
  CHECK(memory(0).used == used_bytes());
  nvmlMemory_v2_t m2{};
  m2.version = VLAKE_NVML_MEMORY_V2;
  REQUIRE(nvml().memory_v2(device(0), &m2) == NVML_SUCCESS);
  CHECK(m2.used == base.before + size);

  // The node file stays open in the process (O_CLOEXEC) while it is attached.
  const char* node = std::getenv("VLAKE_SIM_NODE");
  const std::string file = std::string("/dev/shm/vlake-sim-") + (node != nullptr ? node : "default");
  const std::string fd_dir = "/proc/" + std::to_string(creator.pid) + "/fd";
  bool open_there = false;
  for (int fd = 0; fd < 64 && !open_there; ++fd) {
    char buf[256];
    const ssize_t len = ::readlink((fd_dir + "/" + std::to_string(fd)).c_str(), buf, sizeof buf - 1);
    open_there = len > 0 && std::string(buf, static_cast<size_t>(len)) == file;
  }
  CHECK(open_there);

  // It dies: its memory is gone with it.
  REQUIRE(::kill(creator.pid, SIGKILL) == 0);
  CHECK(finish(creator) == 128 + SIGKILL);
  CHECK(memory(0).used == base.before);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{base.me, kContext}});
}

TEST_CASE("host-located memory counts in no device's used memory and in no process's figure", "[sim][nvml][host]") {
  // Host-located VMM memory (CU_MEM_LOCATION_TYPE_HOST_NUMA) is not GPU memory: NVML's used
  // memory and per-process figures leave it out, for its creator and its importers alike.
  const Baseline base;
  const size_t size = 32 * kMiB;
  CUmemAllocationProp prop = device_prop(0);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  MappedAllocation host(prop, size);
  set_access(host.va, size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 0);
  REQUIRE(cuMemsetD8_v2(host.va, 0x2c, size) == CUDA_SUCCESS);
  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, host.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  Child importer = spawn_probe({"import", std::to_string(fd), std::to_string(size)});
  ::close(fd);
  REQUIRE(read_until(importer, "ready=1"));
  CHECK(value_of(importer.output, "value") == std::to_string(0x2c2c2c2cu));
  const auto them = static_cast<unsigned>(importer.pid);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{base.me, kContext}, {them, kContext}});
  CHECK(charges(1).empty());
  CHECK(memory(0).used == base.before + kContext);  // the importer's context only
  CHECK(memory(0).used == used_bytes());
  CHECK(memory(1).used == 0);
  REQUIRE(::kill(importer.pid, SIGKILL) == 0);
  CHECK(finish(importer) == 128 + SIGKILL);
  CHECK(memory(0).used == base.before);
}

TEST_CASE("nvml charges follow holder order, not the last one in", "[sim][nvml]") {
  // Two importers of one allocation: after the creator lets go, the first importer is charged,
  // and when it goes the second one is.
  init_ctx();
  NvmlSession session;
  const unsigned me = self_pid();
  CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  const int fd = create_and_export(prop, kGran, h);
  Child first = spawn_probe({"import", std::to_string(fd)});
  REQUIRE(read_until(first, "ready=1"));
  Child second = spawn_probe({"import", std::to_string(fd)});
  REQUIRE(read_until(second, "ready=1"));
  ::close(fd);
  const auto a = static_cast<unsigned>(first.pid);
  const auto b = static_cast<unsigned>(second.pid);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext + kGran}, {a, kContext}, {b, kContext}});
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext}, {a, kContext + kGran}, {b, kContext}});
  ::kill(first.pid, SIGKILL);
  finish(first);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext}, {b, kContext + kGran}});
  ::kill(second.pid, SIGKILL);
  finish(second);
  CHECK(charges(0) == std::map<unsigned, unsigned long long>{{me, kContext}});
  CHECK(memory(0).used == kContext);
}

TEST_CASE("nvml reads the machine from the node, or from the environment when unused", "[sim][nvml]") {
  const std::string node = fresh_node("nvml");
  ScopedEnv env(Env{{"VLAKE_SIM_NODE", node}, {"VLAKE_SIM_DEVICE_COUNT", "3"}, {"VLAKE_SIM_DEVICE_MEMORY", "2GiB"}});
  const Nvml& n = nvml();
  {
    NvmlSession session;  // nobody uses the node: this process's environment describes it
    unsigned count = 0;
    REQUIRE(n.count(&count) == NVML_SUCCESS);
    CHECK(count == 3);
    CHECK(memory(2).total == (size_t{2} << 30));
    CHECK(memory(2).used == 0);
    CHECK(charges(0).empty());
  }
  // A process sets the node up with other parameters: NVML reports the node as it is.
  Child holder = spawn_probe({"hold", std::to_string(4 * kGran)},
                             {{"VLAKE_SIM_DEVICE_COUNT", "1"}, {"VLAKE_SIM_DEVICE_MEMORY", "512MiB"}});
  REQUIRE(read_until(holder, "ready=1"));
  {
    NvmlSession session;
    unsigned count = 0;
    REQUIRE(n.count(&count) == NVML_SUCCESS);
    CHECK(count == 1);
    CHECK(memory(0).total == (size_t{512} << 20));
    CHECK(memory(0).used == kContext + 4 * kGran);
    CHECK(charges(0) ==
          std::map<unsigned, unsigned long long>{{static_cast<unsigned>(holder.pid), kContext + 4 * kGran}});
    ::kill(holder.pid, SIGKILL);
    finish(holder);
    CHECK(memory(0).used == 0);
    CHECK(charges(0).empty());
  }
  {
    ScopedEnv bad(Env{{"VLAKE_SIM_DEVICE_MEMORY", "lots"}});
    CHECK(n.init() == NVML_ERROR_DRIVER_NOT_LOADED);
    unsigned count = 0;
    CHECK(n.count(&count) == NVML_ERROR_UNINITIALIZED);
  }
}

TEST_CASE("VLAKE_SIM_CONTEXT_MEMORY is a size or 0", "[sim][env]") {
  std::string out;
  for (const char* good : {"0", "518MiB", "4096B"}) {
    INFO(good);
    REQUIRE(run_probe({"used"}, {{"VLAKE_SIM_NODE", fresh_node("ctx")}, {"VLAKE_SIM_CONTEXT_MEMORY", good}}, out) == 0);
    std::uint64_t expected = 0;
    if (std::string(good) == "518MiB") expected = size_t{518} << 20;
    if (std::string(good) == "4096B") expected = 4096;
    CHECK(value_of(out, "used") == std::to_string(expected));
  }
  REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", fresh_node("ctx")}, {"VLAKE_SIM_CONTEXT_MEMORY", "much"}}, out) == 0);
  CHECK(value_of(out, "rc") == std::to_string(CUDA_ERROR_INVALID_VALUE));
  CHECK(out.find("vlake-sim: VLAKE_SIM_CONTEXT_MEMORY") != std::string::npos);
}
