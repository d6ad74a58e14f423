// The slice of the NVML ABI vlake uses: the hook virtualizes the memory queries, the daemon
// reads per-process usage, and sim/ implements it. Declared here (NVML's header is not part of
// the CUDA toolkit headers vlake builds against); the layouts are the stable NVML ABI and a
// test compares them with the real nvml.h wherever one is installed.
//
// Contract: plain C declarations, no state. Function pointer typedefs name the exported
// symbols; callers resolve them with dlsym from libnvidia-ml.so.1 (real or simulated).
#pragma once

#include <cstddef>
#include <type_traits>

extern "C" {

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;

enum : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
  unsigned int version;  // must be nvmlMemory_v2
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;  // excludes `reserved`: total = reserved + used + free (measured)
} nvmlMemory_v2_t;

// NVML_STRUCT_VERSION(Memory, 2)
#define VLAKE_NVML_MEMORY_V2 (static_cast<unsigned int>(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct nvmlProcessInfo_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_t;

#define VLAKE_NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

typedef nvmlReturn_t (*PFN_nvmlInit_v2)(void);
typedef nvmlReturn_t (*PFN_nvmlShutdown)(void);
typedef const char* (*PFN_nvmlErrorString)(nvmlReturn_t);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetCount_v2)(unsigned int*);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetHandleByIndex_v2)(unsigned int, nvmlDevice_t*);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetHandleByUUID)(const char*, nvmlDevice_t*);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetUUID)(nvmlDevice_t, char*, unsigned int);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t*);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetComputeRunningProcesses_v3)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*);

// Added for sim/'s NVML (values and texts measured on the H100, driver 580.159.04).
enum : int {
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  // What the driver's nvmlDeviceGetMemoryInfo_v2 returns for a version other than
  // VLAKE_NVML_MEMORY_V2 (measured: not NVML_ERROR_ARGUMENT_VERSION_MISMATCH).
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
};
// nvmlProcessInfo_t.gpuInstanceId / computeInstanceId outside MIG.
#define VLAKE_NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFu
#define VLAKE_NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define VLAKE_NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80

typedef nvmlReturn_t (*PFN_nvmlInitWithFlags)(unsigned int);
typedef nvmlReturn_t (*PFN_nvmlSystemGetDriverVersion)(char*, unsigned int);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetIndex)(nvmlDevice_t, unsigned int*);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetName)(nvmlDevice_t, char*, unsigned int);
}

static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlMemory_v2_t) == 40 && offsetof(nvmlMemory_v2_t, total) == 8);
static_assert(sizeof(nvmlProcessInfo_t) == 24 && offsetof(nvmlProcessInfo_t, usedGpuMemory) == 8);
static_assert(VLAKE_NVML_MEMORY_V2 == 0x02000028u);
