// vlake::pool NVML usage source and non-pool attribution.
//
// NvmlSource: per-process device memory on one GPU (nvmlDeviceGetComputeRunningProcesses_v3)
// and the GPU's used memory (nvmlDeviceGetMemoryInfo_v2's `used`, which leaves out the driver's
// reserve; v1 where the library has no v2), the GPU named by its 16-byte UUID. open_nvml() binds a real or
// simulated libnvidia-ml.so.1 at run time (dlopen); tests substitute a fake implementation.
//
// attribute_nonpool(): a tenant's non-pool usage on a GPU is the sum, over the pids that hold
// a session of that tenant, of what NVML charges to the pid — minus the bytes of that pid's
// orphaned grants on that GPU (memory granted before a daemon restart: its charge moved from
// the old daemon to the tenant process), clamped at 0. The daemon's own pid is never
// attributed (NVML charges pool memory to the daemon while it holds the handles).
//
// sample_nvml(): one reading of every GPU NVML knows (processes and used memory); the Node
// attributes it (Node::observe_gpus: session pids as above, every other pid to the tenant of
// its uid or Kubernetes allocation as "unhooked" memory, docs/daemon.md).
//
// Errors: open_nvml() throws std::runtime_error (missing library, symbols, nvmlInit failure).
// processes() returns nullopt for a GPU NVML does not know and throws std::runtime_error on
// an NVML failure. Thread-safety: one NvmlSource per thread (the daemon samples on its loop).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/common/uuid.hpp"

namespace vlake::pool {

struct ProcessUsage {
  std::uint32_t pid;
  Bytes used;
};

class NvmlSource {
 public:
  virtual ~NvmlSource() = default;
  [[nodiscard]] virtual std::optional<std::vector<ProcessUsage>> processes(const Uuid& gpu) = 0;
  // Device memory in use (nvmlDeviceGetMemoryInfo_v2's `used`, reserve excluded); nullopt for a GPU NVML does not
  // know. Throws std::runtime_error on an NVML failure.
  [[nodiscard]] virtual std::optional<Bytes> used(const Uuid& gpu) = 0;
};

std::unique_ptr<NvmlSource> open_nvml(const std::string& library);

struct NonpoolInputs {
  std::vector<std::pair<DeviceOrdinal, Uuid>> devices;
  std::unordered_map<std::uint32_t, TenantId> pid_tenant;  // pids holding a session
  // (pid, ordinal) → bytes of its grants NVML charges to that pid and that are already charged
  // (orphaned grants, counted grants): subtracted from its figure, clamped at 0.
  std::map<std::pair<std::uint32_t, std::int32_t>, Bytes> orphaned;
  std::uint32_t daemon_pid = 0;
};

// (tenant id, device ordinal) → non-pool bytes; every (tenant of pid_tenant, device that NVML
// knows) gets an entry, 0 included, so stale values are overwritten.
using NonpoolResult = std::map<std::pair<std::uint32_t, std::int32_t>, Bytes>;
NonpoolResult attribute_nonpool(NvmlSource& nvml, const NonpoolInputs& in);

// One GPU's NVML reading.
struct GpuSample {
  DeviceOrdinal device{0};
  Bytes used{0};  // nvmlDeviceGetMemoryInfo_v2 (reserve excluded)
  std::vector<ProcessUsage> processes;
};
// The GPUs of `devices` that NVML knows, in that order (throws like processes()/used()).
std::vector<GpuSample> sample_nvml(NvmlSource& nvml, const std::vector<std::pair<DeviceOrdinal, Uuid>>& devices);
// attribute_nonpool() over a reading already taken (GPUs absent from `sample` get no entry).
NonpoolResult attribute_nonpool(const std::vector<GpuSample>& sample, const NonpoolInputs& in);

}  // namespace vlake::pool
