// The simulated NVML (libnvidia-ml.so.1): the slice of NVML that vlake uses, over the same
// simulated machine as the simulated driver (VLAKE_SIM_NODE; see node.hpp, docs/simulator.md).
//
// Contract
// - Devices, capacity and UUIDs are those of the node: its parameters when it is in use,
//   otherwise this process's VLAKE_SIM_* environment (read by the first nvmlInit*). UUIDs are
//   the bytes cuDeviceGetUuid_v2 returns, as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
// - Memory and processes are read from the node at each call: used = what cuMemGetInfo_v2
//   reports (allocations plus VLAKE_SIM_CONTEXT_MEMORY per primary context), reserved = 0; each
//   live allocation is charged to its first live holder (creator first), importers are not;
//   after the creator let go, to no process while a non-holder keeps a descriptor of it.
//   Host-located allocations (CU_MEM_LOCATION_TYPE_HOST_NUMA) count nowhere here: neither in a
//   device's used memory nor in a process's figure (NodeSnapshot::host_used has them).
// - Return codes follow the real library (measured on the H100, driver 580.159.04; see
//   docs/simulator.md): every call but nvmlErrorString needs nvmlInit*; init is counted and
//   each nvmlShutdown undoes one; buffers too small give NVML_ERROR_INSUFFICIENT_SIZE.
// - Thread-safety: every entry point may be called from any thread (one mutex); none throws.
#include "vlake/common/nvml_api.hpp"
#include "vlake/common/uuid.hpp"

#include "node.hpp"
#include "rules.hpp"

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>

#define VLAKE_NVML_API extern "C" __attribute__((visibility("default")))

// The opaque device handle: one static object per ordinal, valid for the library's lifetime.
struct nvmlDevice_st {
  int index = 0;
};

namespace {

using vlake::sim::NodeSnapshot;
namespace rules = vlake::sim::rules;

struct State {
  std::string node;
  int device_count = 0;
  std::uint64_t capacity = 0;
  std::string uuids[rules::kMaxDevices];
  std::unique_ptr<vlake::sim::NodeObserver> observer;
};

std::mutex g_mu;
int g_refs = 0;
State* g_state = nullptr;  // non-null iff g_refs > 0
nvmlDevice_st g_devices[rules::kMaxDevices] = {{0}, {1}, {2},  {3},  {4},  {5},  {6},  {7},
                                               {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};

template <class F>
nvmlReturn_t guarded(F&& f) noexcept {
  try {
    std::lock_guard lock(g_mu);
    return f();
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

std::string uuid_text(const std::string& node, int ordinal) {
  return vlake::Uuid::from_bytes(vlake::sim::device_uuid(node, ordinal).data()).to_string();
}

nvmlReturn_t init_locked() {
  if (g_refs > 0) {
    ++g_refs;
    return NVML_SUCCESS;
  }
  vlake::sim::Config config;
  std::string error;
  if (!vlake::sim::read_config(config, error)) {
    std::fprintf(stderr, "vlake-sim-nvml: %s\n", error.c_str());
    return NVML_ERROR_DRIVER_NOT_LOADED;
  }
  auto state = std::make_unique<State>();
  state->node = config.node;
  state->device_count = config.device_count;
  state->capacity = config.capacity;
  state->observer = std::make_unique<vlake::sim::NodeObserver>(config.node);
  NodeSnapshot snap;
  if (state->observer->read(snap) && snap.in_use) {  // the machine as its users set it up
    state->device_count = snap.device_count;
    state->capacity = snap.capacity;
  }
  for (int i = 0; i < state->device_count; ++i) state->uuids[i] = uuid_text(config.node, i);
  g_state = state.release();
  g_refs = 1;
  return NVML_SUCCESS;
}

// The device of a handle, or -1.
int device_of(nvmlDevice_t device) {
  for (int i = 0; i < g_state->device_count; ++i) {
    if (device == &g_devices[i]) return i;
  }
  return -1;
}

// Copies `text` into a caller buffer of `length` bytes (NUL included).
nvmlReturn_t put_text(const std::string& text, char* buf, unsigned length) {
  if (buf == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (length < text.size() + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return NVML_SUCCESS;
}

// Used bytes and capacity of device `d` now (nothing used when the node does not exist).
void memory_of(int d, std::uint64_t& used, std::uint64_t& total) {
  NodeSnapshot snap;
  used = 0;
  total = g_state->capacity;
  if (g_state->observer->read(snap)) {
    total = snap.capacity;
    if (d < snap.device_count) used = snap.used[d];
  }
  if (used > total) used = total;
}

}  // namespace

VLAKE_NVML_API nvmlReturn_t nvmlInit_v2(void) {
  return guarded([] { return init_locked(); });
}

VLAKE_NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;  // every flag is accepted (measured: 99 succeeds)
  return guarded([] { return init_locked(); });
}

VLAKE_NVML_API nvmlReturn_t nvmlShutdown(void) {
  return guarded([]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    if (--g_refs == 0) {
      delete g_state;
      g_state = nullptr;
    }
    return NVML_SUCCESS;
  });
}

VLAKE_NVML_API const char* nvmlErrorString(nvmlReturn_t result) {
  // The driver's texts (measured); codes not listed read "Unknown Error", as there.
  switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 17: return "GPU access blocked by the operating system";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
  }
}

VLAKE_NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    return put_text(rules::kNvmlDriverVersion, version, length);
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    if (deviceCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = static_cast<unsigned>(g_state->device_count);
    return NVML_SUCCESS;
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    if (device == nullptr || index >= static_cast<unsigned>(g_state->device_count)) {
      return NVML_ERROR_INVALID_ARGUMENT;  // an index past the last device too (measured)
    }
    *device = &g_devices[index];
    return NVML_SUCCESS;
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_state->device_count; ++i) {
      if (g_state->uuids[i] == uuid) {
        *device = &g_devices[i];
        return NVML_SUCCESS;
      }
    }
    return NVML_ERROR_NOT_FOUND;  // malformed text too (measured)
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    const int d = device_of(device);
    if (d < 0) return NVML_ERROR_INVALID_ARGUMENT;
    return put_text(g_state->uuids[d], uuid, length);
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    const int d = device_of(device);
    if (d < 0 || index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *index = static_cast<unsigned>(d);
    return NVML_SUCCESS;
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    if (device_of(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    return put_text(rules::kDeviceName, name, length);
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    const int d = device_of(device);
    if (d < 0 || memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    std::uint64_t used = 0;
    std::uint64_t total = 0;
    memory_of(d, used, total);
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    const int d = device_of(device);
    if (d < 0 || memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != VLAKE_NVML_MEMORY_V2) return NVML_ERROR_FUNCTION_NOT_FOUND;  // measured
    std::uint64_t used = 0;
    std::uint64_t total = 0;
    memory_of(d, used, total);
    memory->total = total;
    memory->reserved = 0;  // the simulator reserves nothing (the H100 reserves ~480 MiB)
    memory->used = used;   // total = reserved + used + free (measured)
    memory->free = total - used;
    return NVML_SUCCESS;
  });
}

VLAKE_NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                                    nvmlProcessInfo_t* infos) {
  return guarded([&]() -> nvmlReturn_t {
    if (g_refs == 0) return NVML_ERROR_UNINITIALIZED;
    const int d = device_of(device);
    if (d < 0 || infoCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (infos == nullptr && *infoCount != 0) return NVML_ERROR_INVALID_ARGUMENT;  // measured
    NodeSnapshot snap;
    const bool exists = g_state->observer->read(snap) && d < snap.device_count;
    const auto n = exists ? static_cast<unsigned>(snap.processes[static_cast<std::size_t>(d)].size()) : 0u;
    if (*infoCount < n) {
      *infoCount = n;
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; ++i) {
      const auto& p = snap.processes[static_cast<std::size_t>(d)][i];
      infos[i].pid = static_cast<unsigned>(p.pid);
      infos[i].usedGpuMemory = p.bytes;
      infos[i].gpuInstanceId = VLAKE_NVML_VALUE_NOT_AVAILABLE;  // measured (no MIG)
      infos[i].computeInstanceId = VLAKE_NVML_VALUE_NOT_AVAILABLE;
    }
    *infoCount = n;
    return NVML_SUCCESS;
  });
}

// Every entry point has the prototype nvml_api.hpp declares.
#define VLAKE_SIM_NVML_ENTRY_POINTS(X) \
  X(nvmlInit_v2)                       \
  X(nvmlInitWithFlags)                 \
  X(nvmlShutdown)                      \
  X(nvmlErrorString)                   \
  X(nvmlSystemGetDriverVersion)        \
  X(nvmlDeviceGetCount_v2)             \
  X(nvmlDeviceGetHandleByIndex_v2)     \
  X(nvmlDeviceGetHandleByUUID)         \
  X(nvmlDeviceGetUUID)                 \
  X(nvmlDeviceGetIndex)                \
  X(nvmlDeviceGetName)                 \
  X(nvmlDeviceGetMemoryInfo)           \
  X(nvmlDeviceGetMemoryInfo_v2)        \
  X(nvmlDeviceGetComputeRunningProcesses_v3)
#define VLAKE_SIM_CHECK_NVML(fn) static_assert(std::is_same_v<decltype(&fn), PFN_##fn>, #fn " does not match its PFN");
VLAKE_SIM_NVML_ENTRY_POINTS(VLAKE_SIM_CHECK_NVML)
#undef VLAKE_SIM_CHECK_NVML
#undef VLAKE_SIM_NVML_ENTRY_POINTS
