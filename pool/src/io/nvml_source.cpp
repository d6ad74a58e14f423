#include "vlake/pool/nvml_source.hpp"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <stdexcept>

#include "vlake/common/nvml_api.hpp"

namespace vlake::pool {

namespace {

class DlNvml final : public NvmlSource {
 public:
  explicit DlNvml(const std::string& library) {
    dl_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (dl_ == nullptr) {
      const char* e = ::dlerror();
      throw std::runtime_error("cannot load " + library + ": " + (e != nullptr ? e : "?"));
    }
    init_ = sym<PFN_nvmlInit_v2>("nvmlInit_v2");
    count_ = sym<PFN_nvmlDeviceGetCount_v2>("nvmlDeviceGetCount_v2");
    by_index_ = sym<PFN_nvmlDeviceGetHandleByIndex_v2>("nvmlDeviceGetHandleByIndex_v2");
    uuid_ = sym<PFN_nvmlDeviceGetUUID>("nvmlDeviceGetUUID");
    procs_ = sym<PFN_nvmlDeviceGetComputeRunningProcesses_v3>("nvmlDeviceGetComputeRunningProcesses_v3");
    meminfo_ = sym<PFN_nvmlDeviceGetMemoryInfo>("nvmlDeviceGetMemoryInfo");
    // v2 keeps the driver's reserve out of `used` (v1 counts it: ~480 MiB on an H100 that no
    // process is charged); v1 where the library lacks it.
    meminfo_v2_ = reinterpret_cast<PFN_nvmlDeviceGetMemoryInfo_v2>(::dlsym(dl_, "nvmlDeviceGetMemoryInfo_v2"));
    if (const nvmlReturn_t r = init_(); r != NVML_SUCCESS) {
      throw std::runtime_error(library + ": nvmlInit_v2 failed (" + std::to_string(r) + ")");
    }
    enumerate();
  }
  DlNvml(const DlNvml&) = delete;
  DlNvml& operator=(const DlNvml&) = delete;
  ~DlNvml() override = default;  // the library stays loaded (like the CUDA driver)

  std::optional<std::vector<ProcessUsage>> processes(const Uuid& gpu) override {
    nvmlDevice_t dev = find(gpu);
    if (dev == nullptr) {
      enumerate();  // devices may appear late (driver reload, a GPU NVML saw only now)
      dev = find(gpu);
    }
    if (dev == nullptr) return std::nullopt;
    std::vector<nvmlProcessInfo_t> infos(64);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned n = static_cast<unsigned>(infos.size());
      const nvmlReturn_t r = procs_(dev, &n, infos.data());
      if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
        infos.resize(static_cast<std::size_t>(n) + 64);
        continue;
      }
      if (r != NVML_SUCCESS) {
        throw std::runtime_error("nvmlDeviceGetComputeRunningProcesses_v3 failed (" + std::to_string(r) + ")");
      }
      std::vector<ProcessUsage> out;
      for (unsigned i = 0; i < n && i < infos.size(); ++i) {
        const unsigned long long used = infos[i].usedGpuMemory;
        // NVML_VALUE_NOT_AVAILABLE (all ones) when the driver cannot tell (e.g. no permission).
        out.push_back(ProcessUsage{infos[i].pid, Bytes{used == ~0ULL ? 0 : used}});
      }
      return out;
    }
    throw std::runtime_error("nvmlDeviceGetComputeRunningProcesses_v3: process list keeps growing");
  }

  std::optional<Bytes> used(const Uuid& gpu) override {
    nvmlDevice_t dev = find(gpu);
    if (dev == nullptr) return std::nullopt;
    if (meminfo_v2_ != nullptr) {
      nvmlMemory_v2_t m2{};
      m2.version = VLAKE_NVML_MEMORY_V2;
      const nvmlReturn_t r = meminfo_v2_(dev, &m2);
      if (r == NVML_SUCCESS) return Bytes{m2.used};
      if (r != NVML_ERROR_FUNCTION_NOT_FOUND && r != NVML_ERROR_NOT_SUPPORTED) {
        throw std::runtime_error("nvmlDeviceGetMemoryInfo_v2 failed (" + std::to_string(r) + ")");
      }
    }
    nvmlMemory_t m{};
    if (const nvmlReturn_t r = meminfo_(dev, &m); r != NVML_SUCCESS) {
      throw std::runtime_error("nvmlDeviceGetMemoryInfo failed (" + std::to_string(r) + ")");
    }
    return Bytes{m.used};
  }

 private:
  void enumerate() {
    devices_.clear();
    unsigned n = 0;
    if (count_(&n) != NVML_SUCCESS) throw std::runtime_error("nvmlDeviceGetCount_v2 failed");
    for (unsigned i = 0; i < n; ++i) {
      nvmlDevice_t d = nullptr;
      if (by_index_(i, &d) != NVML_SUCCESS) continue;
      char buf[VLAKE_NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
      if (uuid_(d, buf, sizeof buf) != NVML_SUCCESS) continue;
      if (auto u = Uuid::parse(buf)) devices_.emplace_back(*u, d);
    }
  }

  nvmlDevice_t find(const Uuid& gpu) const {
    for (const auto& [u, d] : devices_) {
      if (u == gpu) return d;
    }
    return nullptr;
  }

  template <class F>
  F sym(const char* name) {
    void* p = ::dlsym(dl_, name);
    if (p == nullptr) throw std::runtime_error(std::string("NVML library lacks ") + name);
    return reinterpret_cast<F>(p);
  }

  void* dl_ = nullptr;
  PFN_nvmlInit_v2 init_ = nullptr;
  PFN_nvmlDeviceGetCount_v2 count_ = nullptr;
  PFN_nvmlDeviceGetHandleByIndex_v2 by_index_ = nullptr;
  PFN_nvmlDeviceGetUUID uuid_ = nullptr;
  PFN_nvmlDeviceGetComputeRunningProcesses_v3 procs_ = nullptr;
  PFN_nvmlDeviceGetMemoryInfo meminfo_ = nullptr;
  PFN_nvmlDeviceGetMemoryInfo_v2 meminfo_v2_ = nullptr;  // nullptr: v1 only
  std::vector<std::pair<Uuid, nvmlDevice_t>> devices_;
};

}  // namespace

std::unique_ptr<NvmlSource> open_nvml(const std::string& library) { return std::make_unique<DlNvml>(library); }

std::vector<GpuSample> sample_nvml(NvmlSource& nvml, const std::vector<std::pair<DeviceOrdinal, Uuid>>& devices) {
  std::vector<GpuSample> out;
  for (const auto& [ordinal, uuid] : devices) {
    auto procs = nvml.processes(uuid);
    if (!procs) continue;
    GpuSample g;
    g.device = ordinal;
    g.used = nvml.used(uuid).value_or(Bytes{0});
    g.processes = std::move(*procs);
    out.push_back(std::move(g));
  }
  return out;
}

NonpoolResult attribute_nonpool(NvmlSource& nvml, const NonpoolInputs& in) {
  return attribute_nonpool(sample_nvml(nvml, in.devices), in);
}

NonpoolResult attribute_nonpool(const std::vector<GpuSample>& sample, const NonpoolInputs& in) {
  NonpoolResult out;
  for (const GpuSample& g : sample) {
    const DeviceOrdinal ordinal = g.device;
    for (const auto& [pid, tenant] : in.pid_tenant) out[{tenant.value(), ordinal.value()}] = Bytes{0};
    for (const ProcessUsage& p : g.processes) {
      if (p.pid == in.daemon_pid) continue;
      const auto t = in.pid_tenant.find(p.pid);
      if (t == in.pid_tenant.end()) continue;
      Bytes used = p.used;
      if (const auto o = in.orphaned.find({p.pid, ordinal.value()}); o != in.orphaned.end()) {
        used = used > o->second ? used - o->second : Bytes{0};
      }
      out[{t->second.value(), ordinal.value()}] += used;
    }
  }
  return out;
}

}  // namespace vlake::pool
