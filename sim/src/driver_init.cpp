// The simulated driver's entry: cuInit (reads the environment, attaches to the simulated node),
// cuDriverGetVersion, cuGetErrorString/Name, cuGetProcAddress(_v2) and the simulator's own
// exports (call counters, the device file, the node lock's owner; docs/simulator.md).
//
// The cuGetProcAddress table holds every row of common/include/vlake/common/cuda_api.def plus
// the simulator's own rows (VLAKE_SIM_PER_THREAD_ROWS, VLAKE_SIM_EXTRA_ROWS in
// driver_internal.hpp).
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "node.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

// Entry points beyond cuda_api.def (the kernel path of vlake::Driver::fill_u32_kernel): the
// same prototype check cuda_api.hpp does for the listed ones.
static_assert(std::is_same_v<decltype(&::cuModuleLoadData), PFN_cuModuleLoadData_v2000>);
static_assert(std::is_same_v<decltype(&::cuModuleUnload), PFN_cuModuleUnload_v2000>);
static_assert(std::is_same_v<decltype(&::cuModuleGetFunction), PFN_cuModuleGetFunction_v2000>);
static_assert(std::is_same_v<decltype(&::cuLaunchKernel), PFN_cuLaunchKernel_v4000>);
// The _ptsz rows of cuda_api.def are checked against the legacy PFN there; the exact per-thread
// type too:
static_assert(std::is_same_v<decltype(&::cuMemAllocAsync_ptsz), PFN_cuMemAllocAsync_v11020_ptsz>);
static_assert(std::is_same_v<decltype(&::cuMemFreeAsync_ptsz), PFN_cuMemFreeAsync_v11020_ptsz>);

using vlake::sim::Process;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

// ---- Environment --------------------------------------------------------------------------------

CUresult init_failure(const std::string& msg, CUresult rc) {
  std::fprintf(stderr, "vlake-sim: %s\n", msg.c_str());
  return rc;
}

CUresult do_init() {
  vlake::sim::Config config;
  std::string error;
  if (!vlake::sim::read_config(config, error)) return init_failure(error, CUDA_ERROR_INVALID_VALUE);
  auto proc = std::make_unique<Process>();
  proc->node_name = config.node;
  proc->device_count = config.device_count;
  proc->capacity = config.capacity;
  proc->context_memory = config.context_memory;
  proc->peer_access = config.peer_access;
  proc->host_vmm = config.host_vmm;
  proc->link_bandwidth = config.link_bandwidth;
  for (int i = 0; i < rules::kMaxDevices; ++i) {
    proc->ctxs[i].device = i;
    proc->pools[i].device = i;
  }
  if (CUresult rc = vlake::sim::Node::attach(config.node, config.device_count, config.capacity, config.host_capacity,
                                             config.access, vlake::sim::current_process(), proc->node);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  g_proc = proc.release();
  return CUDA_SUCCESS;
}

// ---- cuGetProcAddress table -----------------------------------------------------------------

struct ProcRow {
  const char* base;
  int version;
  void* fn;
  bool per_thread;  // a _ptsz/_ptds variant
};

constexpr bool per_thread_symbol(std::string_view sym) { return sym.ends_with("_ptsz") || sym.ends_with("_ptds"); }

// cuGetProcAddress (v1: `v2` false) and cuGetProcAddress_v2. Among the rows of `symbol`, the
// per-thread rows answer CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM when the base has any
// (measured: "cuMemcpyHtoD"@7000 -> cuMemcpyHtoD_v2_ptds, but @3020 -> version not sufficient),
// the legacy rows answer otherwise; the highest version <= cuda_version wins. Not found: v2
// succeeds with a null pointer and the reason in *status (measured), v1 fails.
CUresult resolve_proc(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status, bool v2) {
  static const ProcRow rows[] = {
#define VLAKE_CU_API(base, sym, version) {#base, version, reinterpret_cast<void*>(&::sym), per_thread_symbol(#sym)},
#include "vlake/common/cuda_api.def"
#undef VLAKE_CU_API
#define VLAKE_SIM_PT_ROW(base, sym, version, pfn) {#base, version, reinterpret_cast<void*>(&::sym), true},
      VLAKE_SIM_PER_THREAD_ROWS(VLAKE_SIM_PT_ROW)
#undef VLAKE_SIM_PT_ROW
#define VLAKE_SIM_EXTRA_ROW(base, sym, version) {#base, version, reinterpret_cast<void*>(&::sym), false},
          VLAKE_SIM_EXTRA_ROWS(VLAKE_SIM_EXTRA_ROW)
#undef VLAKE_SIM_EXTRA_ROW
  };
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pfn = nullptr;
  bool known = false;
  bool has_per_thread = false;
  for (const ProcRow& r : rows) {
    if (std::strcmp(r.base, symbol) != 0) continue;
    known = true;
    has_per_thread = has_per_thread || r.per_thread;
  }
  const bool want_per_thread = has_per_thread && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const ProcRow* best = nullptr;
  for (const ProcRow& r : rows) {
    if (r.per_thread != want_per_thread || std::strcmp(r.base, symbol) != 0) continue;
    if (r.version <= cuda_version && (best == nullptr || r.version > best->version)) best = &r;
  }
  if (best == nullptr) {
    if (status != nullptr) {
      *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return v2 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

// ---- Error strings ----------------------------------------------------------------------------

struct ErrorRow {
  CUresult code;
  const char* name;
  const char* text;
};

const ErrorRow* find_error(CUresult code) {
  static const ErrorRow rows[] = {
#define VLAKE_SIM_ERROR(name, text) {name, #name, text},
#include "error_table.inc"
#undef VLAKE_SIM_ERROR
  };
  for (const ErrorRow& r : rows) {
    if (r.code == code) return &r;
  }
  return nullptr;
}

}  // namespace

// =================================================================================================
// Initialization, versions, errors
// =================================================================================================

VLAKE_SIM_API CUresult cuInit(unsigned int Flags) {
  VLAKE_SIM_COUNT(cuInit);
  return guarded([&]() -> CUresult {
    if (g_init.load() == 1) return check_init();
    std::lock_guard lock(g_init_mu);
    const int state = g_init.load();
    if (state == 1) return check_init();
    if (state == 2) return g_init_error.load();
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const CUresult rc = do_init();
    if (rc != CUDA_SUCCESS) {
      g_init_error.store(rc);
      g_init.store(2, std::memory_order_release);
      return rc;
    }
    g_init_pid.store(::getpid());
    g_init.store(1, std::memory_order_release);
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuDriverGetVersion(int* driverVersion) {
  VLAKE_SIM_COUNT(cuDriverGetVersion);
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = rules::kDriverVersion;
  return CUDA_SUCCESS;
}

VLAKE_SIM_API CUresult cuGetErrorString(CUresult error, const char** pStr) {
  VLAKE_SIM_COUNT(cuGetErrorString);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorRow* r = find_error(error);
  *pStr = r != nullptr ? r->text : nullptr;
  return r != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VLAKE_SIM_API CUresult cuGetErrorName(CUresult error, const char** pStr) {
  VLAKE_SIM_COUNT(cuGetErrorName);
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorRow* r = find_error(error);
  *pStr = r != nullptr ? r->name : nullptr;
  return r != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VLAKE_SIM_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  VLAKE_SIM_COUNT(cuGetProcAddress);
  return guarded([&] { return resolve_proc(symbol, pfn, cudaVersion, flags, nullptr, false); });
}

VLAKE_SIM_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                           CUdriverProcAddressQueryResult* symbolStatus) {
  VLAKE_SIM_COUNT(cuGetProcAddress_v2);
  return guarded([&] { return resolve_proc(symbol, pfn, cudaVersion, flags, symbolStatus, true); });
}

extern "C" __attribute__((visibility("default"))) unsigned long long vlake_sim_call_count(const char* entry) noexcept {
  return vlake::sim::calls::count_of(entry);
}

extern "C" __attribute__((visibility("default"))) unsigned long long vlake_sim_vmm_call_count() noexcept {
  return vlake::sim::calls::vmm_total();
}

// The thread holding the lock of the node VLAKE_SIM_NODE names (default "default") now, 0 if
// none (node.hpp, node_lock_owner). Needs no cuInit. Not part of the CUDA API.
extern "C" __attribute__((visibility("default"))) int vlake_sim_node_lock_owner() noexcept {
  try {
    const char* n = std::getenv("VLAKE_SIM_NODE");
    return vlake::sim::node_lock_owner(n != nullptr ? n : "default");
  } catch (...) {
    return 0;
  }
}

// The file this process keeps open while it uses the simulated GPUs (node.hpp), named for
// vlake::Driver::device_files(); "" before cuInit succeeded. Not part of the CUDA API.
extern "C" __attribute__((visibility("default"))) const char* vlake_sim_device_file() noexcept {
  if (g_proc == nullptr) return "";
  static const std::string file = vlake::sim::device_file(g_proc->node_name);  // g_proc never changes
  return file.c_str();
}
