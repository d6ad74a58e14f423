// A fake libnvidia-ml for the daemon tests: one GPU whose UUID and per-process usage come from
// the file named by $VLAKE_FAKE_NVML_FILE, re-read on every call:
//   line 1: the GPU's UUID ("GPU-xxxxxxxx-...")      (no file: no GPU)
//   then:   "<pid> <bytes>" per process
// The GPU's used memory (nvmlDeviceGetMemoryInfo) is the sum of the processes' bytes.
// Only the entry points vlaked uses exist. Every entry point catches everything.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "vlake/common/nvml_api.hpp"

namespace {

struct Snapshot {
  std::string uuid;
  std::vector<std::pair<unsigned, unsigned long long>> procs;
};

bool read_file(Snapshot& s) {
  const char* path = std::getenv("VLAKE_FAKE_NVML_FILE");
  if (path == nullptr) return false;
  std::ifstream in(path);
  if (!in || !std::getline(in, s.uuid) || s.uuid.empty()) return false;
  unsigned pid = 0;
  unsigned long long bytes = 0;
  while (in >> pid >> bytes) s.procs.emplace_back(pid, bytes);
  return true;
}

nvmlDevice_t the_device() { return reinterpret_cast<nvmlDevice_t>(static_cast<std::uintptr_t>(0x1000)); }

}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvmlReturn_t nvmlInit_v2() { return NVML_SUCCESS; }
__attribute__((visibility("default"))) nvmlReturn_t nvmlShutdown() { return NVML_SUCCESS; }

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) {
  try {
    Snapshot s;
    *count = read_file(s) ? 1 : 0;
    return NVML_SUCCESS;
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t* d) {
  if (i != 0) return NVML_ERROR_INVALID_ARGUMENT;
  *d = the_device();
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* buf, unsigned n) {
  try {
    Snapshot s;
    if (d != the_device() || !read_file(s)) return NVML_ERROR_INVALID_ARGUMENT;
    if (s.uuid.size() + 1 > n) return NVML_ERROR_INSUFFICIENT_SIZE;
    std::memcpy(buf, s.uuid.c_str(), s.uuid.size() + 1);
    return NVML_SUCCESS;
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d,
                                                                                            unsigned* count,
                                                                                            nvmlProcessInfo_t* infos) {
  try {
    Snapshot s;
    if (d != the_device() || !read_file(s)) return NVML_ERROR_INVALID_ARGUMENT;
    if (*count < s.procs.size()) {
      *count = static_cast<unsigned>(s.procs.size());
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (std::size_t i = 0; i < s.procs.size(); ++i) {
      infos[i] = nvmlProcessInfo_t{s.procs[i].first, s.procs[i].second, 0, 0};
    }
    *count = static_cast<unsigned>(s.procs.size());
    return NVML_SUCCESS;
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  try {
    Snapshot s;
    if (d != the_device() || !read_file(s)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used = 0;
    for (const auto& p : s.procs) used += p.second;
    *m = nvmlMemory_t{80ULL << 30, 80ULL << 30 > used ? (80ULL << 30) - used : 0, used};
    return NVML_SUCCESS;
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

}  // extern "C"
