// vlake_hook_tenant: a CUDA program for the hook tests, driven by command-line steps.
//
// It is NOT linked to libcuda: like cudart, it dlopens libcuda.so.1, looks up
// "cuGetProcAddress_v2" with dlsym, asks it for "cuInit" and for "cuGetProcAddress" (11030) and
// resolves every other entry point through that pointer by base name + version. With --direct
// it instead dlopens libcuda.so.1 RTLD_GLOBAL and takes every entry point from
// dlsym(RTLD_DEFAULT, "<exported symbol>") (a program linked to libcuda). --ptds resolves with
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.
//
// Each step prints one line "<step> rc=<CUresult> key=value ..." on stdout (steps run in a
// fork()ed child print "child <step> ..."). Sizes accept K/M/G suffixes (binary). Steps:
//   init | init-only | noctx
//   alloc:N:SIZE  free:N  fill:N:SIZE:BYTE  check:N:SIZE:BYTE  pitch:N:W:H:ELEM  async:N:SIZE  freeasync:N
//   managed:N:SIZE  info  infoloop:COUNT (free= distinct= ms=)  totalmem  range:N:OFF  attr:N:OFF
//   asyncloop:ITERS:SIZE  cuMemAllocAsync + cuMemFreeAsync + cuStreamSynchronize, ITERS times (failures=)
//   create:H:SIZE[:nofd]  reserve:V:SIZE  map:V:OFF:H  unmap:V:OFF:SIZE  addrfree:V
//   retain:H2:V:OFF  release:H  props:H  export:H:V:OFF
//   nvml[:I]  threads:T:ITERS:SIZE  stress:T:ITERS:MAXSIZE  fork ... endfork  sleep:MS
//   laterfree:N:MS  a thread frees N after MS ms while the next steps run; it prints
//                   "laterfree:N:MS rc= ms=" (ms: how long cuMemFree took) when done
//   where:BASE:VERSION[:ptds]  dlsym:SYMBOL  dlsym-next:SYMBOL
//   kfill:N:OFF:COUNT[:VALUE]  launches vlake_fill_u32 on COUNT u32 elements at N's pointer + OFF
//                              (OFF may be negative); the launch's rc only (faults are async)
//   kfillstream:N:OFF:COUNT[:VALUE]  the same on the tenant's stream (see streamsync)
//   sync  cuCtxSynchronize     streamsync  cuStreamSynchronize on the tenant's stream
//   memset:N:OFF:SIZE:BYTE     cuMemsetD8 at N's pointer + OFF (OFF may be negative)
//   memset32async:N:OFF:COUNT:VALUE  cuMemsetD32Async of COUNT u32 at N's pointer + OFF (tenant's stream)
//   dtod:N:OFF:M:SIZE          cuMemcpyDtoD of SIZE bytes from M's pointer to N's pointer + OFF
//   layout:N                   the returned pointer's 256 B alignment and its distance to the
//                              end of its 2 MiB chunk (tail=), and cuMemGetAddressRange on it
//   kstress:ITERS:MAXSIZE      random sizes (256 B .. MAXSIZE, not multiples of 256), each
//                              allocation filled by the kernel exactly to its end, read back,
//                              freed; then cuCtxSynchronize
//   upload:N:SEED:SIZE[:OFF]   cuMemcpyHtoD of a pseudo-random pattern (SEED, by offset from N's
//                              pointer) to N's pointer + OFF
//   uploadasync:N:SEED:SIZE[:OFF]  the same with cuMemcpyHtoDAsync on the tenant's stream (no
//                              synchronize afterwards: the step's rc is the call's)
//   verify:N:SEED:SIZE[:OFF]   cuMemcpyDtoH and compare with that pattern (ok=, bad= bytes)
//   poke:N:OFF                 flips the bits of one byte (cuMemcpyDtoH + cuMemcpyHtoD)
//   ctxcreate:C[:SYMBOL]       cuCtxCreate on the current device through the ABI SYMBOL
//                              (cuCtxCreate_v2, the default; cuCtxCreate_v3, cuCtxCreate_v4); C names it
//   ctxdestroy:C               cuCtxDestroy_v2 of C
//   greenctx:G  greendestroy:G cuGreenCtxCreate of all the device's SMs / cuGreenCtxDestroy
//   ctx:D                      retains device D's primary context and makes it current; later
//                              create/map/totalmem use device D (init: device 0)
//   peer:D  unpeer:D           cuCtxEnablePeerAccess / cuCtxDisablePeerAccess(device D's context)
//   access:N:D                 cuMemGetAccess of N's pointer for device D (flags=)
//   sendfd:H:PATH              exports handle H (POSIX fd) and sends the descriptor over the Unix
//                              socket PATH (connects, retrying until it exists; SCM_RIGHTS)
//   recvfd:H:PATH:SIZE         listens on PATH, receives one descriptor and imports it as H
//   touch:PATH  waitfile:PATH  creates PATH / waits (up to 30 s) until PATH exists
//   calls:ENTRY  prints count=<the simulator's call count of ENTRY in this process> (docs/simulator.md)
//   peerrace:ITERS             allocations on device 1 racing peer access toggled from device 0
//                              (errors= bad_after_race= bad_enabled= bad_disabled=, all 0 when
//                              consistent)
//   reclaim:N                  vlake_reclaim_register (dlsym) with a callback that frees N (in the
//                              context current now) when the hook runs it (rc= the status)
//   reclaimwait:MS             waits up to MS for a reclaim run: count= (vlake_reclaim_count),
//                              freed_rc= (the callback's cuMemFree, -1 if it did not run)
//   share:N:OFF:SIZE           vlake_share_readonly_ex (looked up with dlsym) on N's pointer + OFF
//                              (rc= its status, shared= merged= copied= chunk=)
//   ipcget:N:FILE[:OFF]        cuIpcGetMemHandle of N's pointer + OFF; the 64 bytes go to FILE
//                              (written whole: a temporary file renamed)
//   ipcopen:N:FILE             waits (20 s at most) for FILE, cuIpcOpenMemHandle_v2 of its bytes
//                              (lazy peer access); N is the pointer it returns
//   ipcclose:N                 cuIpcCloseMemHandle of N's pointer
//   Counted paths (pools and graphs), on the tenant's stream:
//   createx:H:SIZE:rdma|compress  cuMemCreate with gpuDirectRDMACapable / generic compression
//   alloc1:N:SIZE              the pre-3.2 cuMemAlloc ABI ("cuMemAlloc"@2000)
//   pool:P[:THRESHOLD]  defpool:P  palloc:N:P:SIZE  pfree:N  ptrim:P:KEEP  pdestroy:P
//   pattr:P                    reserved= used= of the pool
//   capture  capalloc:N:SIZE  capfree:N  endcapture:G
//   graph:G  gnalloc:G:N:SIZE  gnfree:G:N  ginst:E:G  ginstup:E:G (+upload)  ginstaf:E:G (auto-free)
//   ginst11:E:G (the CUDA 11 cuGraphInstantiate_v2)  glaunch:E  gupload:E
//   gexecdestroy:E  gtrim      gattr  reserved= used= of device 0's graph memory
//   procmem                    bytes= this process's memory on GPU 0 in the simulator's NVML
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../../common/src/kernels_ptx.hpp"
#include "vlake/common/nvml_api.hpp"

namespace {

// base, exported symbol, ABI version, version requested from cuGetProcAddress
#define TENANT_API(X)                                                                             \
  X(cuInit, cuInit, 2000, 2000)                                                                   \
  X(cuDeviceGet, cuDeviceGet, 2000, 2000)                                                         \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 7000)                               \
  X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 4000)                                                 \
  X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, 4000)                                                 \
  X(cuMemAlloc, cuMemAlloc_v2, 3020, 3020)                                                        \
  X(cuMemFree, cuMemFree_v2, 3020, 3020)                                                          \
  X(cuMemAllocPitch, cuMemAllocPitch_v2, 3020, 3020)                                              \
  X(cuMemAllocAsync, cuMemAllocAsync, 11020, 11020)                                               \
  X(cuMemFreeAsync, cuMemFreeAsync, 11020, 11020)                                                 \
  X(cuMemAllocManaged, cuMemAllocManaged, 6000, 6000)                                             \
  X(cuMemGetInfo, cuMemGetInfo_v2, 3020, 3020)                                                    \
  X(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020, 3020)                                            \
  X(cuMemGetAddressRange, cuMemGetAddressRange_v2, 3020, 3020)                                    \
  X(cuPointerGetAttribute, cuPointerGetAttribute, 4000, 4000)                                     \
  X(cuPointerGetAttributes, cuPointerGetAttributes, 7000, 7000)                                   \
  X(cuMemsetD8, cuMemsetD8_v2, 3020, 3020)                                                        \
  X(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020, 3020)                                                    \
  X(cuMemcpyHtoD, cuMemcpyHtoD_v2, 3020, 3020)                                                    \
  X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, 3020, 3020)                                          \
  X(cuMemcpyDtoD, cuMemcpyDtoD_v2, 3020, 3020)                                                    \
  X(cuMemsetD32Async, cuMemsetD32Async, 3020, 3020)                                               \
  X(cuMemCreate, cuMemCreate, 10020, 12000)                                                       \
  X(cuMemRelease, cuMemRelease, 10020, 12000)                                                     \
  X(cuMemAddressReserve, cuMemAddressReserve, 10020, 10020)                                       \
  X(cuMemAddressFree, cuMemAddressFree, 10020, 10020)                                             \
  X(cuMemMap, cuMemMap, 10020, 10020)                                                             \
  X(cuMemUnmap, cuMemUnmap, 10020, 10020)                                                         \
  X(cuMemSetAccess, cuMemSetAccess, 10020, 10020)                                                 \
  X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 11000)                       \
  X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, 10020)                     \
  X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, 10020)                 \
  X(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle, 10020, 10020) \
  X(cuStreamCreate, cuStreamCreate, 2000, 2000)                                                   \
  X(cuStreamSynchronize, cuStreamSynchronize, 2000, 2000)                                         \
  X(cuCtxSynchronize, cuCtxSynchronize, 2000, 2000)                                               \
  X(cuModuleLoadData, cuModuleLoadData, 2000, 2000)                                               \
  X(cuModuleGetFunction, cuModuleGetFunction, 2000, 2000)                                         \
  X(cuLaunchKernel, cuLaunchKernel, 4000, 4000)                                                   \
  X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, 4000, 4000)                                     \
  X(cuCtxDisablePeerAccess, cuCtxDisablePeerAccess, 4000, 4000)                                   \
  X(cuMemGetAccess, cuMemGetAccess, 10020, 10020)                                                 \
  X(cuIpcGetMemHandle, cuIpcGetMemHandle, 4010, 4010)                                             \
  X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, 11000, 11000)                                      \
  X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, 4010, 4010)

struct Api {
#define X(base, symbol, abi, req) PFN_##base##_v##abi base = nullptr;
  TENANT_API(X)
#undef X
};

Api api;
void* g_lib = nullptr;
PFN_cuGetProcAddress_v12000 g_gpa2 = nullptr;
PFN_cuGetProcAddress_v11030 g_gpa1 = nullptr;
bool g_direct = false;
cuuint64_t g_flags = CU_GET_PROC_ADDRESS_DEFAULT;
std::string g_prefix;

struct Named {
  std::uint64_t value = 0;
  std::uint64_t size = 0;
};
std::map<std::string, Named> vars;
CUstream g_stream = nullptr;
int g_device = 0;  // the device of the current context (ctx:D)

void out(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void out(const char* fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::printf("%s%s\n", g_prefix.c_str(), line);
  std::fflush(stdout);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t p = s.find(':', start);
    parts.push_back(s.substr(start, p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return parts;
}

std::uint64_t size_of(const std::string& s) {
  char* end = nullptr;
  std::uint64_t v = std::strtoull(s.c_str(), &end, 10);
  switch (end != nullptr ? *end : '\0') {
    case 'K': v <<= 10; break;
    case 'M': v <<= 20; break;
    case 'G': v <<= 30; break;
    default: break;
  }
  return v;
}

const char* lib_of(void* fn) {
  if (fn == nullptr) return "none";
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const char* b = std::strrchr(info.dli_fname, '/');
  return b != nullptr ? b + 1 : info.dli_fname;
}

bool resolve_all() {
  if (g_direct) {
    g_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (g_lib == nullptr) return false;
#define X(base, symbol, abi, req) api.base = reinterpret_cast<PFN_##base##_v##abi>(dlsym(RTLD_DEFAULT, #symbol));
    TENANT_API(X)
#undef X
    return true;
  }
  g_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (g_lib == nullptr) return false;
  g_gpa2 = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(g_lib, "cuGetProcAddress_v2"));
  if (g_gpa2 == nullptr) return false;
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  g_gpa2("cuInit", &p, 12000, 0, &st);
  api.cuInit = reinterpret_cast<PFN_cuInit_v2000>(p);
  p = nullptr;
  g_gpa2("cuGetProcAddress", &p, 11030, 0, &st);
  g_gpa1 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(p);
  if (g_gpa1 == nullptr) return false;
    // With --ptds, names that have no per-thread variant resolve without the flag.
#define X(base, symbol, abi, req)                                            \
  p = nullptr;                                                               \
  if (g_gpa1(#base, &p, req, g_flags) == CUDA_SUCCESS ||                     \
      g_gpa1(#base, &p, req, CU_GET_PROC_ADDRESS_DEFAULT) == CUDA_SUCCESS) { \
    api.base = reinterpret_cast<PFN_##base##_v##abi>(p);                     \
  }
  TENANT_API(X)
#undef X
  return true;
}

#define CALL(fn, ...) (api.fn != nullptr ? api.fn(__VA_ARGS__) : static_cast<CUresult>(-1))

// reclaim:N — the callback frees N on the hook's reclaim thread (no context current there).
CUdeviceptr g_reclaim_ptr = 0;
CUcontext g_reclaim_ctx = nullptr;
std::atomic<int> g_reclaim_rc{-1};
std::uint64_t reclaim_callback(void*, int, std::uint64_t) {
  if (g_reclaim_ptr == 0) return 0;
  CALL(cuCtxSetCurrent, g_reclaim_ctx);
  g_reclaim_rc = CALL(cuMemFree, g_reclaim_ptr);
  g_reclaim_ptr = 0;
  return g_reclaim_rc == CUDA_SUCCESS ? 1 : 0;
}

std::uint64_t var(const std::string& n) { return vars.count(n) != 0 ? vars[n].value : 0; }

CUstream stream() {
  if (g_stream == nullptr) CALL(cuStreamCreate, &g_stream, 0);
  return g_stream;
}

std::int64_t offset_of(const std::string& s) {
  if (!s.empty() && s[0] == '-') return -static_cast<std::int64_t>(size_of(s.substr(1)));
  return static_cast<std::int64_t>(size_of(s));
}

CUfunction g_fill = nullptr;

CUresult fill_kernel(CUfunction& f) {
  if (g_fill == nullptr) {
    CUmodule m = nullptr;
    CUresult rc = CALL(cuModuleLoadData, &m, vlake::detail::kKernelsPtx);
    if (rc != CUDA_SUCCESS) return rc;
    rc = CALL(cuModuleGetFunction, &g_fill, m, "vlake_fill_u32");
    if (rc != CUDA_SUCCESS) return rc;
  }
  f = g_fill;
  return CUDA_SUCCESS;
}

CUresult launch_fill(CUdeviceptr p, unsigned long long count, unsigned value, CUstream on = nullptr) {
  CUfunction f = nullptr;
  if (CUresult rc = fill_kernel(f); rc != CUDA_SUCCESS) return rc;
  void* params[] = {&p, &count, &value};
  return CALL(cuLaunchKernel, f, 64, 1, 1, 128, 1, 1, 0, on, params, nullptr);
}

void step_kstress(const std::string& s, const std::vector<std::string>& a) {
  const int iters = std::atoi(a.at(1).c_str());
  const std::uint64_t max = std::max<std::uint64_t>(512, size_of(a.at(2)));
  unsigned seed = static_cast<unsigned>(::getpid()) * 7919u + 17u;
  int errors = 0;
  int mismatches = 0;
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> live;
  for (int i = 0; i < iters; ++i) {
    seed = seed * 1103515245u + 12345u;
    std::uint64_t size = 256 + (seed >> 4) % (max - 256);
    size = size / 4 * 4;
    if (size % 256 == 0) size += 4;
    CUdeviceptr p = 0;
    if (CALL(cuMemAlloc, &p, size) != CUDA_SUCCESS) {
      ++errors;
      continue;
    }
    const auto value = static_cast<unsigned>(i + 1);
    if (launch_fill(p, size / 4, value) != CUDA_SUCCESS) ++errors;
    unsigned tail[4] = {};
    if (CALL(cuMemcpyDtoH, tail, p + size - sizeof tail, sizeof tail) != CUDA_SUCCESS) ++errors;
    for (unsigned v : tail) mismatches += v != value ? 1 : 0;
    live.emplace_back(p, size);
    // Keep a few allocations alive so neighbours exist; free the oldest one.
    if (live.size() > 4 || (seed >> 20) % 3 == 0) {
      if (CALL(cuMemFree, live.front().first) != CUDA_SUCCESS) ++errors;
      live.erase(live.begin());
    }
  }
  for (const auto& [p, size] : live) {
    if (CALL(cuMemFree, p) != CUDA_SUCCESS) ++errors;
  }
  const CUresult sync = CALL(cuCtxSynchronize);
  out("%s rc=%d errors=%d mismatches=%d sync=%d", s.c_str(),
      errors == 0 && mismatches == 0 && sync == CUDA_SUCCESS ? 0 : 1, errors, mismatches, sync);
}

void step_nvml(const std::string& s, unsigned index) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    out("%s rc=-1 error=%s", s.c_str(), dlerror());
    return;
  }
  auto init = reinterpret_cast<PFN_nvmlInit_v2>(dlsym(lib, "nvmlInit_v2"));
  auto get = reinterpret_cast<PFN_nvmlDeviceGetHandleByIndex_v2>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto mem = reinterpret_cast<PFN_nvmlDeviceGetMemoryInfo>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  auto mem2 = reinterpret_cast<PFN_nvmlDeviceGetMemoryInfo_v2>(dlsym(lib, "nvmlDeviceGetMemoryInfo_v2"));
  if (init == nullptr || get == nullptr || mem == nullptr || mem2 == nullptr) {
    out("%s rc=-1 error=missing-symbols", s.c_str());
    return;
  }
  int rc = init();
  nvmlDevice_t dev = nullptr;
  if (rc == NVML_SUCCESS) rc = get(index, &dev);
  nvmlMemory_t m{};
  nvmlMemory_v2_t m2{};
  m2.version = VLAKE_NVML_MEMORY_V2;
  if (rc == NVML_SUCCESS) rc = mem(dev, &m);
  if (rc == NVML_SUCCESS) rc = mem2(dev, &m2);
  out("%s rc=%d total=%llu used=%llu free=%llu v2_total=%llu v2_used=%llu v2_free=%llu "
      "v2_reserved=%llu mem_lib=%s mem2_lib=%s",
      s.c_str(), rc, m.total, m.used, m.free, m2.total, m2.used, m2.free, m2.reserved,
      lib_of(reinterpret_cast<void*>(mem)), lib_of(reinterpret_cast<void*>(mem2)));
}

// peerrace:ITERS: a thread allocating and freeing on device 1 (sizes 1..4 MiB, up to 8 live)
// while another toggles peer access of device 0 to device 1 until it is done; then, with access enabled, every
// live allocation must give device 0 read-write access, and none once disabled.
void step_peerrace(const std::string& s, const std::vector<std::string>& a) {
  const int iters = std::atoi(a.at(1).c_str());
  CUcontext c0 = nullptr;
  CUcontext c1 = nullptr;
  CALL(cuDevicePrimaryCtxRetain, &c0, 0);
  CALL(cuDevicePrimaryCtxRetain, &c1, 1);
  std::vector<CUdeviceptr> live;
  std::atomic<int> errors{0};
  std::atomic<bool> done{false};
  std::thread allocator([&] {
    CALL(cuCtxSetCurrent, c1);
    for (int i = 0; i < iters; ++i) {
      CUdeviceptr p = 0;
      if (CALL(cuMemAlloc, &p, (std::uint64_t{1} + static_cast<unsigned>(i) % 4) << 20) != CUDA_SUCCESS) {
        ++errors;
        continue;
      }
      live.push_back(p);
      if (live.size() > 8) {
        if (CALL(cuMemFree, live.front()) != CUDA_SUCCESS) ++errors;
        live.erase(live.begin());
      }
    }
    done = true;
  });
  std::thread toggler([&] {
    CALL(cuCtxSetCurrent, c0);
    while (!done) {
      if (CALL(cuCtxEnablePeerAccess, c1, 0) != CUDA_SUCCESS) ++errors;
      if (CALL(cuCtxDisablePeerAccess, c1) != CUDA_SUCCESS) ++errors;
    }
  });
  allocator.join();
  toggler.join();
  auto count_access = [&](unsigned long long want) {
    int bad = 0;
    for (CUdeviceptr p : live) {
      CUmemLocation loc{};
      loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
      loc.id = 0;
      unsigned long long flags = 99;
      if (CALL(cuMemGetAccess, &flags, &loc, p) != CUDA_SUCCESS || flags != want) ++bad;
    }
    return bad;
  };
  // The toggler ended with access disabled: no allocation may still give device 0 access.
  const int bad_after_race = count_access(CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CALL(cuCtxSetCurrent, c0);
  CUresult rc = CALL(cuCtxEnablePeerAccess, c1, 0);
  const int bad_enabled = count_access(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  if (rc == CUDA_SUCCESS) rc = CALL(cuCtxDisablePeerAccess, c1);
  const int bad_disabled = count_access(CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CALL(cuCtxSetCurrent, c1);
  for (CUdeviceptr p : live) CALL(cuMemFree, p);
  out("%s rc=%d errors=%d live=%zu bad_after_race=%d bad_enabled=%d bad_disabled=%d", s.c_str(), rc, errors.load(),
      live.size(), bad_after_race, bad_enabled, bad_disabled);
}

void step_threads(const std::string& s, const std::vector<std::string>& a) {
  const int threads = std::atoi(a.at(1).c_str());
  const int iters = std::atoi(a.at(2).c_str());
  const std::uint64_t size = size_of(a.at(3));
  CUcontext ctx = nullptr;
  CALL(cuDevicePrimaryCtxRetain, &ctx, 0);
  std::atomic<int> errors{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (CALL(cuCtxSetCurrent, ctx) != CUDA_SUCCESS) ++errors;
      for (int i = 0; i < iters; ++i) {
        CUdeviceptr p = 0;
        if (CALL(cuMemAlloc, &p, size) != CUDA_SUCCESS) {
          ++errors;
          continue;
        }
        const auto byte = static_cast<unsigned char>(t + 1);
        if (CALL(cuMemsetD8, p, byte, size) != CUDA_SUCCESS) ++errors;
        unsigned char check[64];
        if (CALL(cuMemcpyDtoH, check, p + size - sizeof check, sizeof check) != CUDA_SUCCESS) {
          ++errors;
        }
        for (unsigned char c : check) {
          if (c != byte) {
            ++overlaps;
            break;
          }
        }
        if (CALL(cuMemFree, p) != CUDA_SUCCESS) ++errors;
      }
    });
  }
  for (auto& th : pool) th.join();
  out("%s rc=%d errors=%d overlaps=%d", s.c_str(), errors.load() == 0 ? 0 : 1, errors.load(), overlaps.load());
}

// stress:T:ITERS:MAXSIZE — T threads each allocate ITERS buffers of random size (1 MiB ..
// MAXSIZE), write and verify a per-thread pattern, and free them. Refusals with
// CUDA_ERROR_OUT_OF_MEMORY are expected near the limit and counted apart from errors.
void step_stress(const std::string& s, const std::vector<std::string>& a) {
  const int threads = std::atoi(a.at(1).c_str());
  const int iters = std::atoi(a.at(2).c_str());
  const std::uint64_t max_mib = std::max<std::uint64_t>(1, size_of(a.at(3)) >> 20);
  CUcontext ctx = nullptr;
  CALL(cuDevicePrimaryCtxRetain, &ctx, 0);
  std::atomic<int> ok{0}, refused{0}, errors{0}, overlaps{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (CALL(cuCtxSetCurrent, ctx) != CUDA_SUCCESS) ++errors;
      unsigned seed = static_cast<unsigned>(::getpid()) * 7919u + static_cast<unsigned>(t);
      for (int i = 0; i < iters; ++i) {
        seed = seed * 1103515245u + 12345u;
        const std::uint64_t size = (1 + (seed >> 8) % max_mib) << 20;
        CUdeviceptr p = 0;
        const CUresult rc = CALL(cuMemAlloc, &p, size);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
          ++refused;
          continue;
        }
        if (rc != CUDA_SUCCESS) {
          ++errors;
          continue;
        }
        const auto byte = static_cast<unsigned char>(t * 16 + i % 16 + 1);
        if (CALL(cuMemsetD8, p, byte, size) != CUDA_SUCCESS) ++errors;
        unsigned char head[64], tail[64];
        if (CALL(cuMemcpyDtoH, head, p, sizeof head) != CUDA_SUCCESS ||
            CALL(cuMemcpyDtoH, tail, p + size - sizeof tail, sizeof tail) != CUDA_SUCCESS) {
          ++errors;
        }
        for (std::size_t k = 0; k < sizeof head; ++k) {
          if (head[k] != byte || tail[k] != byte) {
            ++overlaps;
            break;
          }
        }
        if (CALL(cuMemFree, p) != CUDA_SUCCESS) ++errors;
        ++ok;
      }
    });
  }
  for (auto& th : pool) th.join();
  out("%s rc=%d ok=%d refused=%d errors=%d overlaps=%d", s.c_str(), errors.load() == 0 && overlaps.load() == 0 ? 0 : 1,
      ok.load(), refused.load(), errors.load(), overlaps.load());
}

// Byte `i` (offset from an allocation's pointer) of the pattern of `seed`: byte `i & 7` of one
// 64-bit word per 8 bytes, so the pattern is made a word at a time (a test tenant is built
// without optimization, and under the sanitizers, where a loop per byte over hundreds of MiB
// takes seconds).
std::vector<unsigned char> pattern(std::uint64_t seed, std::uint64_t off, std::uint64_t size) {
  std::vector<unsigned char> v(size);
  std::uint64_t i = 0;
  while (i < size) {
    const std::uint64_t at = off + i;
    std::uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull + (at >> 3);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    unsigned char word[8];
    for (int b = 0; b < 8; ++b) word[b] = static_cast<unsigned char>(x >> (8 * b));
    const std::uint64_t first = at & 7;
    const std::uint64_t n = std::min<std::uint64_t>(8 - first, size - i);
    std::memcpy(v.data() + i, word + first, n);
    i += n;
  }
  return v;
}

// How many of the `size` bytes at `got` differ from `want` (memcmp per 64 KiB block; only a
// block that differs is counted byte by byte).
std::uint64_t count_differing(const unsigned char* got, const unsigned char* want, std::uint64_t size) {
  constexpr std::uint64_t kBlock = 64 * 1024;
  std::uint64_t bad = 0;
  for (std::uint64_t at = 0; at < size; at += kBlock) {
    const std::uint64_t n = std::min(kBlock, size - at);
    if (std::memcmp(got + at, want + at, n) == 0) continue;
    for (std::uint64_t i = at; i < at + n; ++i) bad += got[i] != want[i] ? 1 : 0;
  }
  return bad;
}

// How many of the `size` bytes at `got` are not `byte`.
std::uint64_t count_not(const unsigned char* got, unsigned char byte, std::uint64_t size) {
  const std::vector<unsigned char> want(std::min<std::uint64_t>(size, 64 * 1024), byte);
  std::uint64_t bad = 0;
  for (std::uint64_t at = 0; at < size; at += want.size()) {
    bad += count_differing(got + at, want.data(), std::min<std::uint64_t>(want.size(), size - at));
  }
  return bad;
}

// The address of the Unix socket at `path`.
sockaddr_un unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  return addr;
}

// Room for one SCM_RIGHTS descriptor, and a message of the one byte in `iov` with that room.
struct FdControl {
  alignas(cmsghdr) char bytes[CMSG_SPACE(sizeof(int))];
};
msghdr one_fd_message(iovec& iov, FdControl& control) {
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.bytes;
  msg.msg_controllen = sizeof control.bytes;
  return msg;
}

// One descriptor over a Unix stream socket (SCM_RIGHTS), as NCCL's proxy passes cuMem fds.
bool send_fd(const std::string& path, int fd) {
  sockaddr_un addr = unix_address(path);
  for (int i = 0; i < 3000; ++i) {
    const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) return false;
    if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      char byte = 'F';
      iovec iov{&byte, 1};
      FdControl control{};
      msghdr msg = one_fd_message(iov, control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
      const bool ok = ::sendmsg(sock, &msg, 0) == 1;
      close(sock);
      return ok;
    }
    close(sock);
    usleep(10000);
  }
  return false;
}

int recv_fd(const std::string& path) {
  sockaddr_un addr = unix_address(path);
  const int ls = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) return -1;
  ::unlink(path.c_str());
  if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(ls, 1) != 0) {
    close(ls);
    return -1;
  }
  const int conn = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  close(ls);
  ::unlink(path.c_str());
  if (conn < 0) return -1;
  char byte = 0;
  iovec iov{&byte, 1};
  FdControl control{};
  msghdr msg = one_fd_message(iov, control);
  int fd = -1;
  if (::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC) == 1) {
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c != nullptr && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  }
  close(conn);
  return fd;
}

struct ShareResult {
  std::uint64_t chunk_bytes, shared_bytes, merged_bytes, copied_bytes;
};

// An entry point the TENANT_API list does not name, resolved like the others (cached).
template <class Pfn>
Pfn extra(const char* base, int version) {
  static std::map<std::string, void*> cache;
  const std::string key = std::string(base) + "@" + std::to_string(version);
  if (auto it = cache.find(key); it != cache.end()) return reinterpret_cast<Pfn>(it->second);
  void* p = nullptr;
  if (g_direct) {
    p = dlsym(RTLD_DEFAULT, base);
  } else if (g_gpa1 != nullptr && g_gpa1(base, &p, version, g_flags) != CUDA_SUCCESS) {
    g_gpa1(base, &p, version, CU_GET_PROC_ADDRESS_DEFAULT);
  }
  cache[key] = p;
  return reinterpret_cast<Pfn>(p);
}
#define XCALL(base, version, ...)                                    \
  (extra<PFN_##base##_v##version>(#base, version) != nullptr         \
       ? extra<PFN_##base##_v##version>(#base, version)(__VA_ARGS__) \
       : static_cast<CUresult>(-1))

std::map<std::string, void*> handles;  // pools, graphs, execs by name

template <class T>
T handle_of(const std::string& n) {
  return static_cast<T>(handles.count(n) != 0 ? handles[n] : nullptr);
}

// Prints step `s`'s result; on success `h` becomes the handle called `name`.
void keep_handle(const std::string& s, const std::string& name, CUresult rc, void* h) {
  if (rc == CUDA_SUCCESS) handles[name] = h;
  out("%s rc=%d", s.c_str(), rc);
}

// Step `s`: `create(&h)` makes a handle; on success it is called `name`.
template <class H, class Create>
void make_handle(const std::string& s, const std::string& name, Create create) {
  H h = nullptr;
  const CUresult rc = create(&h);
  keep_handle(s, name, rc, h);
}

// The properties of a pool of pinned device-0 memory (explicit pools and graph allocations).
CUmemPoolProps device0_pool_props() {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  return props;
}

// The properties of pinned memory on `device`, for cuMemCreate.
CUmemAllocationProp pinned_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Step `s` = create:<name>:<size>...: cuMemCreate with `prop`; the handle is called <name>.
void create_named(const std::string& s, const std::vector<std::string>& a, const CUmemAllocationProp& prop) {
  CUmemGenericAllocationHandle h = 0;
  const std::uint64_t size = size_of(a.at(2));
  const CUresult rc = CALL(cuMemCreate, &h, size, &prop, 0);
  if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{h, size};
  out("%s rc=%d handle=%llu", s.c_str(), rc, static_cast<unsigned long long>(h));
}

// The counted-path steps (see the header); false if `op` is not one of them.
bool run_counted_step(const std::string& s, const std::vector<std::string>& a) {
  const std::string& op = a[0];
  if (op == "createx") {
    CUmemAllocationProp prop = pinned_prop(0);
    if (a.at(3) == "rdma") prop.allocFlags.gpuDirectRDMACapable = 1;
    if (a.at(3) == "compress") prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    create_named(s, a, prop);
  } else if (op == "alloc1") {
    CUdeviceptr_v1 p = 0;
    const CUresult rc = XCALL(cuMemAlloc, 2000, &p, static_cast<unsigned>(size_of(a.at(2))));
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{p, size_of(a.at(2))};
    out("%s rc=%d ptr=0x%x", s.c_str(), rc, p);
  } else if (op == "pool") {
    CUmemPoolProps props = device0_pool_props();
    CUmemoryPool pool = nullptr;
    CUresult rc = XCALL(cuMemPoolCreate, 11020, &pool, &props);
    if (rc == CUDA_SUCCESS && a.size() > 2) {
      cuuint64_t threshold = size_of(a[2]);
      rc = XCALL(cuMemPoolSetAttribute, 11020, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    }
    keep_handle(s, a.at(1), rc, pool);
  } else if (op == "defpool") {
    make_handle<CUmemoryPool>(s, a.at(1),
                              [](CUmemoryPool* pool) { return XCALL(cuDeviceGetDefaultMemPool, 11020, pool, 0); });
  } else if (op == "palloc") {
    CUdeviceptr p = 0;
    const std::uint64_t size = size_of(a.at(3));
    const CUresult rc = XCALL(cuMemAllocFromPoolAsync, 11020, &p, size, handle_of<CUmemoryPool>(a.at(2)), stream());
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{p, size};
    out("%s rc=%d ptr=0x%llx", s.c_str(), rc, static_cast<unsigned long long>(p));
  } else if (op == "pfree" || op == "capfree") {
    out("%s rc=%d", s.c_str(), CALL(cuMemFreeAsync, var(a.at(1)), stream()));
  } else if (op == "ptrim") {
    out("%s rc=%d", s.c_str(), XCALL(cuMemPoolTrimTo, 11020, handle_of<CUmemoryPool>(a.at(1)), size_of(a.at(2))));
  } else if (op == "pdestroy") {
    out("%s rc=%d", s.c_str(), XCALL(cuMemPoolDestroy, 11020, handle_of<CUmemoryPool>(a.at(1))));
  } else if (op == "pattr") {
    cuuint64_t reserved = 0, in_use = 0;
    CUresult rc = XCALL(cuMemPoolGetAttribute, 11020, handle_of<CUmemoryPool>(a.at(1)),
                        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    if (rc == CUDA_SUCCESS) {
      rc = XCALL(cuMemPoolGetAttribute, 11020, handle_of<CUmemoryPool>(a.at(1)), CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                 &in_use);
    }
    out("%s rc=%d reserved=%llu used=%llu", s.c_str(), rc, static_cast<unsigned long long>(reserved),
        static_cast<unsigned long long>(in_use));
  } else if (op == "capture") {
    out("%s rc=%d", s.c_str(), XCALL(cuStreamBeginCapture, 10010, stream(), CU_STREAM_CAPTURE_MODE_GLOBAL));
  } else if (op == "capalloc") {
    CUdeviceptr p = 0;
    const CUresult rc = CALL(cuMemAllocAsync, &p, size_of(a.at(2)), stream());
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{p, size_of(a.at(2))};
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "endcapture") {
    make_handle<CUgraph>(s, a.at(1), [](CUgraph* g) { return XCALL(cuStreamEndCapture, 10000, stream(), g); });
  } else if (op == "graph") {
    make_handle<CUgraph>(s, a.at(1), [](CUgraph* g) { return XCALL(cuGraphCreate, 10000, g, 0); });
  } else if (op == "gnalloc") {
    CUDA_MEM_ALLOC_NODE_PARAMS params{};
    params.poolProps = device0_pool_props();
    params.bytesize = size_of(a.at(3));
    CUgraphNode n = nullptr;
    const CUresult rc = XCALL(cuGraphAddMemAllocNode, 11040, &n, handle_of<CUgraph>(a.at(1)), nullptr, 0, &params);
    if (rc == CUDA_SUCCESS) vars[a.at(2)] = Named{params.dptr, params.bytesize};
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "gnfree") {
    CUgraphNode n = nullptr;
    out("%s rc=%d", s.c_str(),
        XCALL(cuGraphAddMemFreeNode, 11040, &n, handle_of<CUgraph>(a.at(1)), nullptr, 0, var(a.at(2))));
  } else if (op == "ginst" || op == "ginstup" || op == "ginstaf" || op == "ginst11") {
    CUgraphExec e = nullptr;
    CUresult rc;
    if (op == "ginst11") {
      rc = XCALL(cuGraphInstantiate, 11000, &e, handle_of<CUgraph>(a.at(2)), nullptr, nullptr, 0);
    } else if (op == "ginst" || op == "ginstaf") {
      const unsigned long long flags = op == "ginstaf" ? CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH : 0;
      rc = XCALL(cuGraphInstantiateWithFlags, 11040, &e, handle_of<CUgraph>(a.at(2)), flags);
    } else {
      CUDA_GRAPH_INSTANTIATE_PARAMS params{};
      params.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
      params.hUploadStream = stream();
      rc = XCALL(cuGraphInstantiateWithParams, 12000, &e, handle_of<CUgraph>(a.at(2)), &params);
    }
    keep_handle(s, a.at(1), rc, e);
  } else if (op == "glaunch") {
    out("%s rc=%d", s.c_str(), XCALL(cuGraphLaunch, 10000, handle_of<CUgraphExec>(a.at(1)), stream()));
  } else if (op == "gupload") {
    out("%s rc=%d", s.c_str(), XCALL(cuGraphUpload, 11010, handle_of<CUgraphExec>(a.at(1)), stream()));
  } else if (op == "gexecdestroy") {
    out("%s rc=%d", s.c_str(), XCALL(cuGraphExecDestroy, 10000, handle_of<CUgraphExec>(a.at(1))));
  } else if (op == "gtrim") {
    out("%s rc=%d", s.c_str(), XCALL(cuDeviceGraphMemTrim, 11040, 0));
  } else if (op == "procmem") {
    // This process's memory as the simulator's NVML attributes it (not virtualized by the hook).
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    auto init = lib != nullptr ? reinterpret_cast<PFN_nvmlInit_v2>(dlsym(lib, "nvmlInit_v2")) : nullptr;
    auto get = lib != nullptr
                   ? reinterpret_cast<PFN_nvmlDeviceGetHandleByIndex_v2>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"))
                   : nullptr;
    auto procs = lib != nullptr ? reinterpret_cast<PFN_nvmlDeviceGetComputeRunningProcesses_v3>(
                                      dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"))
                                : nullptr;
    if (init == nullptr || get == nullptr || procs == nullptr) {
      out("%s rc=-1 error=missing-symbols", s.c_str());
      return true;
    }
    int rc = init();
    nvmlDevice_t dev = nullptr;
    if (rc == NVML_SUCCESS) rc = get(0, &dev);
    nvmlProcessInfo_t infos[64];
    unsigned n = 64;
    if (rc == NVML_SUCCESS) rc = procs(dev, &n, infos);
    unsigned long long bytes = 0;
    for (unsigned i = 0; rc == NVML_SUCCESS && i < n; ++i) {
      if (infos[i].pid == static_cast<unsigned>(::getpid())) bytes = infos[i].usedGpuMemory;
    }
    out("%s rc=%d bytes=%llu", s.c_str(), rc, bytes);
  } else if (op == "gattr") {
    cuuint64_t reserved = 0, in_use = 0;
    CUresult rc = XCALL(cuDeviceGetGraphMemAttribute, 11040, 0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
    if (rc == CUDA_SUCCESS)
      rc = XCALL(cuDeviceGetGraphMemAttribute, 11040, 0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &in_use);
    out("%s rc=%d reserved=%llu used=%llu", s.c_str(), rc, static_cast<unsigned long long>(reserved),
        static_cast<unsigned long long>(in_use));
  } else {
    return false;
  }
  return true;
}

void run_step(const std::string& s) {
  // "<step>#tag": the tag only makes repeated steps distinguishable in the output.
  const auto a = split(s.substr(0, s.find('#')));
  const std::string& op = a[0];
  if (op == "init" || op == "init-only") {
    CUresult rc = CALL(cuInit, 0);
    if (rc == CUDA_SUCCESS && op == "init") {
      CUcontext ctx = nullptr;
      rc = CALL(cuDevicePrimaryCtxRetain, &ctx, 0);
      if (rc == CUDA_SUCCESS) rc = CALL(cuCtxSetCurrent, ctx);
    }
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "noctx") {
    out("%s rc=%d", s.c_str(), CALL(cuCtxSetCurrent, nullptr));
  } else if (op == "alloc" || op == "async" || op == "managed") {
    CUdeviceptr p = 0;
    const std::uint64_t size = size_of(a.at(2));
    CUresult rc;
    if (op == "alloc") {
      rc = CALL(cuMemAlloc, &p, size);
    } else if (op == "async") {
      rc = CALL(cuMemAllocAsync, &p, size, stream());
    } else {
      rc = CALL(cuMemAllocManaged, &p, size, CU_MEM_ATTACH_GLOBAL);
    }
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{p, size};
    out("%s rc=%d ptr=0x%llx", s.c_str(), rc, static_cast<unsigned long long>(p));
  } else if (op == "free") {
    out("%s rc=%d", s.c_str(), CALL(cuMemFree, var(a.at(1))));
  } else if (op == "freeasync") {
    out("%s rc=%d", s.c_str(), CALL(cuMemFreeAsync, var(a.at(1)), stream()));
  } else if (op == "fill") {
    const CUdeviceptr p = var(a.at(1));
    const std::uint64_t size = size_of(a.at(2));
    const auto byte = static_cast<unsigned char>(std::atoi(a.at(3).c_str()));
    CUresult rc = CALL(cuMemsetD8, p, byte, size);
    bool ok = rc == CUDA_SUCCESS;
    if (ok) {
      std::vector<unsigned char> back(size);
      rc = CALL(cuMemcpyDtoH, back.data(), p, size);
      ok = rc == CUDA_SUCCESS && count_not(back.data(), byte, size) == 0;
    }
    out("%s rc=%d ok=%d", s.c_str(), rc, ok ? 1 : 0);
  } else if (op == "check") {
    // Reads without writing: every byte must equal BYTE (e.g. 0 after a scrub).
    const CUdeviceptr p = var(a.at(1));
    const std::uint64_t size = size_of(a.at(2));
    const auto byte = static_cast<unsigned char>(std::atoi(a.at(3).c_str()));
    std::vector<unsigned char> back(size);
    const CUresult rc = CALL(cuMemcpyDtoH, back.data(), p, size);
    const std::uint64_t bad = count_not(back.data(), byte, size);
    out("%s rc=%d ok=%d bad=%llu", s.c_str(), rc, rc == CUDA_SUCCESS && bad == 0 ? 1 : 0,
        static_cast<unsigned long long>(bad));
  } else if (op == "pitch") {
    CUdeviceptr p = 0;
    size_t pitch = 0;
    const CUresult rc = CALL(cuMemAllocPitch, &p, &pitch, size_of(a.at(2)), size_of(a.at(3)),
                             static_cast<unsigned>(std::atoi(a.at(4).c_str())));
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{p, pitch * size_of(a.at(3))};
    out("%s rc=%d pitch=%zu", s.c_str(), rc, pitch);
  } else if (op == "info") {
    size_t f = 0;
    size_t t = 0;
    const CUresult rc = CALL(cuMemGetInfo, &f, &t);
    out("%s rc=%d free=%zu total=%zu", s.c_str(), rc, f, t);
  } else if (op == "asyncloop") {
    // ITERS times: cuMemAllocAsync of SIZE on the tenant's stream, cuMemFreeAsync, then
    // cuStreamSynchronize; failures= counts allocations refused although the previous one was
    // freed and its stream synchronized.
    const int iters = std::atoi(a.at(1).c_str());
    const std::uint64_t size = size_of(a.at(2));
    int failures = 0;
    CUresult last = CUDA_SUCCESS;
    for (int i = 0; i < iters; ++i) {
      CUdeviceptr p = 0;
      CUresult rc = CALL(cuMemAllocAsync, &p, size, stream());
      if (rc != CUDA_SUCCESS) {
        ++failures;
        last = rc;
        continue;
      }
      if ((rc = CALL(cuMemFreeAsync, p, stream())) == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream());
      if (rc != CUDA_SUCCESS) last = rc;
    }
    out("%s rc=%d failures=%d", s.c_str(), last, failures);
  } else if (op == "infoloop") {
    // cuMemGetInfo N times: the last answer and how many distinct free figures were seen.
    const int n = std::atoi(a.at(1).c_str());
    size_t f = 0;
    size_t t = 0;
    CUresult rc = CUDA_SUCCESS;
    std::vector<size_t> seen;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n && rc == CUDA_SUCCESS; ++i) {
      rc = CALL(cuMemGetInfo, &f, &t);
      if (std::find(seen.begin(), seen.end(), f) == seen.end()) seen.push_back(f);
    }
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    out("%s rc=%d free=%zu total=%zu distinct=%zu ms=%lld", s.c_str(), rc, f, t, seen.size(),
        static_cast<long long>(ms));
  } else if (op == "totalmem") {
    size_t b = 0;
    const CUresult rc = CALL(cuDeviceTotalMem, &b, a.size() > 1 ? std::atoi(a[1].c_str()) : g_device);
    out("%s rc=%d bytes=%zu", s.c_str(), rc, b);
  } else if (op == "range") {
    const std::uint64_t p = var(a.at(1));
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult rc = CALL(cuMemGetAddressRange, &base, &size, p + size_of(a.at(2)));
    out("%s rc=%d base_off=%lld size=%zu", s.c_str(), rc, static_cast<long long>(base) - static_cast<long long>(p),
        size);
  } else if (op == "attr") {
    const std::uint64_t p = var(a.at(1));
    const CUdeviceptr q = p + size_of(a.at(2));
    CUdeviceptr start = 0;
    size_t size = 0;
    CUresult rc = CALL(cuPointerGetAttribute, &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q);
    if (rc == CUDA_SUCCESS) rc = CALL(cuPointerGetAttribute, &size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, q);
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    int ordinal = -1;
    CUdeviceptr mstart = 0;
    size_t msize = 0;
    void* data[3] = {&ordinal, &mstart, &msize};
    const CUresult rc2 = CALL(cuPointerGetAttributes, 3, attrs, data, q);
    out("%s rc=%d start_off=%lld size=%zu multi_rc=%d ordinal=%d multi_start_off=%lld "
        "multi_size=%zu",
        s.c_str(), rc, static_cast<long long>(start) - static_cast<long long>(p), size, rc2, ordinal,
        static_cast<long long>(mstart) - static_cast<long long>(p), msize);
  } else if (op == "create") {
    CUmemAllocationProp prop = pinned_prop(g_device);
    prop.requestedHandleTypes =
        a.size() > 3 && a[3] == "nofd" ? CU_MEM_HANDLE_TYPE_NONE : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    create_named(s, a, prop);
  } else if (op == "reserve") {
    CUdeviceptr p = 0;
    const std::uint64_t size = size_of(a.at(2));
    const CUresult rc = CALL(cuMemAddressReserve, &p, size, 0, 0, 0);
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{p, size};
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "map") {
    const CUdeviceptr at = var(a.at(1)) + size_of(a.at(2));
    const Named h = vars[a.at(3)];
    CUresult rc = CALL(cuMemMap, at, h.size, 0, h.value, 0);
    if (rc == CUDA_SUCCESS) {
      CUmemAccessDesc d{};
      d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      d.location.id = g_device;
      d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      rc = CALL(cuMemSetAccess, at, h.size, &d, 1);
    }
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "unmap") {
    out("%s rc=%d", s.c_str(), CALL(cuMemUnmap, var(a.at(1)) + size_of(a.at(2)), size_of(a.at(3))));
  } else if (op == "addrfree") {
    out("%s rc=%d", s.c_str(), CALL(cuMemAddressFree, var(a.at(1)), vars[a.at(1)].size));
  } else if (op == "retain") {
    CUmemGenericAllocationHandle h = 0;
    const CUresult rc = CALL(cuMemRetainAllocationHandle, &h, reinterpret_cast<void*>(var(a.at(2)) + size_of(a.at(3))));
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{h, 0};
    out("%s rc=%d handle=%llu", s.c_str(), rc, static_cast<unsigned long long>(h));
  } else if (op == "release") {
    out("%s rc=%d", s.c_str(), CALL(cuMemRelease, var(a.at(1))));
  } else if (op == "props") {
    CUmemAllocationProp prop{};
    const CUresult rc = CALL(cuMemGetAllocationPropertiesFromHandle, &prop, var(a.at(1)));
    out("%s rc=%d type=%d loc_type=%d loc_id=%d handle_types=%d", s.c_str(), rc, static_cast<int>(prop.type),
        static_cast<int>(prop.location.type), prop.location.id, static_cast<int>(prop.requestedHandleTypes));
  } else if (op == "export") {
    int fd = -1;
    CUresult rc = CALL(cuMemExportToShareableHandle, &fd, var(a.at(1)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    int same = 0;
    CUresult import_rc = static_cast<CUresult>(-1);
    if (rc == CUDA_SUCCESS && a.size() > 3) {
      // The descriptor must be the very memory mapped at V+OFF: write through the mapping,
      // read through the descriptor (the simulator's handles are memfds).
      const CUdeviceptr at = var(a.at(2)) + size_of(a.at(3));
      const CUresult fill = CALL(cuMemsetD8, at, 0x5a, 4096);
      void* m = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
      if (fill == CUDA_SUCCESS && m != MAP_FAILED) {
        same = static_cast<unsigned char*>(m)[0] == 0x5a && static_cast<unsigned char*>(m)[4095] == 0x5a;
        munmap(m, 4096);
      }
      CUmemGenericAllocationHandle imported = 0;
      import_rc =
          CALL(cuMemImportFromShareableHandle, &imported, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (import_rc == CUDA_SUCCESS) CALL(cuMemRelease, imported);
    }
    if (fd >= 0) close(fd);
    out("%s rc=%d fd_ok=%d same_memory=%d import_rc=%d", s.c_str(), rc, fd >= 0 ? 1 : 0, same, import_rc);
  } else if (op == "kfill" || op == "kfillstream") {
    const CUdeviceptr p = var(a.at(1)) + static_cast<std::uint64_t>(offset_of(a.at(2)));
    const unsigned value = a.size() > 4 ? static_cast<unsigned>(std::strtoul(a[4].c_str(), nullptr, 0)) : 0xabcdu;
    out("%s rc=%d", s.c_str(), launch_fill(p, size_of(a.at(3)), value, op == "kfillstream" ? stream() : nullptr));
  } else if (op == "sync") {
    out("%s rc=%d", s.c_str(), CALL(cuCtxSynchronize));
  } else if (op == "streamsync") {
    out("%s rc=%d", s.c_str(), CALL(cuStreamSynchronize, stream()));
  } else if (op == "memset") {
    const CUdeviceptr p = var(a.at(1)) + static_cast<std::uint64_t>(offset_of(a.at(2)));
    out("%s rc=%d", s.c_str(),
        CALL(cuMemsetD8, p, static_cast<unsigned char>(std::atoi(a.at(4).c_str())), size_of(a.at(3))));
  } else if (op == "memset32async") {
    const CUdeviceptr p = var(a.at(1)) + static_cast<std::uint64_t>(offset_of(a.at(2)));
    out("%s rc=%d", s.c_str(),
        CALL(cuMemsetD32Async, p, static_cast<unsigned>(std::atoi(a.at(4).c_str())), size_of(a.at(3)), stream()));
  } else if (op == "dtod") {
    const CUdeviceptr p = var(a.at(1)) + static_cast<std::uint64_t>(offset_of(a.at(2)));
    out("%s rc=%d", s.c_str(), CALL(cuMemcpyDtoD, p, var(a.at(3)), size_of(a.at(4))));
  } else if (op == "layout") {
    const std::uint64_t p = var(a.at(1));
    const std::uint64_t chunk = std::uint64_t{2} << 20;
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult rc = CALL(cuMemGetAddressRange, &base, &size, p);
    out("%s rc=%d align=%llu tail=%llu end=%llu range_base_off=%lld range_size=%zu", s.c_str(), rc,
        static_cast<unsigned long long>(p % 256),
        static_cast<unsigned long long>((chunk - (p + vars[a.at(1)].size) % chunk) % chunk),
        static_cast<unsigned long long>(p + vars[a.at(1)].size),
        static_cast<long long>(base) - static_cast<long long>(p), size);
  } else if (op == "upload" || op == "verify" || op == "uploadasync") {
    const std::uint64_t seed = std::strtoull(a.at(2).c_str(), nullptr, 0);
    const std::uint64_t size = size_of(a.at(3));
    const std::uint64_t off = a.size() > 4 ? size_of(a[4]) : 0;
    const CUdeviceptr p = var(a.at(1)) + off;
    const auto want = pattern(seed, off, size);
    if (op == "upload") {
      out("%s rc=%d", s.c_str(), CALL(cuMemcpyHtoD, p, want.data(), size));
    } else if (op == "uploadasync") {
      // `want` must outlive the copy: the tenant synchronizes (streamsync/sync) in a later step,
      // so keep the buffer alive until the process exits.
      static std::vector<std::vector<unsigned char>> keep;
      keep.push_back(want);
      out("%s rc=%d", s.c_str(), CALL(cuMemcpyHtoDAsync, p, keep.back().data(), size, stream()));
    } else {
      std::vector<unsigned char> back(size);
      const CUresult rc = CALL(cuMemcpyDtoH, back.data(), p, size);
      const std::uint64_t bad = count_differing(back.data(), want.data(), size);
      out("%s rc=%d ok=%d bad=%llu", s.c_str(), rc, rc == CUDA_SUCCESS && bad == 0 ? 1 : 0,
          static_cast<unsigned long long>(bad));
    }
  } else if (op == "poke") {
    // Flips every bit of one byte (read, complement, write).
    const CUdeviceptr p = var(a.at(1)) + size_of(a.at(2));
    unsigned char byte = 0;
    CUresult rc = CALL(cuMemcpyDtoH, &byte, p, 1);
    byte = static_cast<unsigned char>(~byte);
    if (rc == CUDA_SUCCESS) rc = CALL(cuMemcpyHtoD, p, &byte, 1);
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "ctx") {
    const int dev = std::atoi(a.at(1).c_str());
    CUcontext ctx = nullptr;
    CUresult rc = CALL(cuDevicePrimaryCtxRetain, &ctx, dev);
    if (rc == CUDA_SUCCESS) rc = CALL(cuCtxSetCurrent, ctx);
    if (rc == CUDA_SUCCESS) g_device = dev;
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "peer" || op == "unpeer") {
    CUcontext peer = nullptr;
    CUresult rc = CALL(cuDevicePrimaryCtxRetain, &peer, std::atoi(a.at(1).c_str()));
    if (rc == CUDA_SUCCESS) {
      rc = op == "peer" ? CALL(cuCtxEnablePeerAccess, peer, 0) : CALL(cuCtxDisablePeerAccess, peer);
    }
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "access") {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = std::atoi(a.at(2).c_str());
    unsigned long long flags = 0;
    const CUresult rc = CALL(cuMemGetAccess, &flags, &loc, var(a.at(1)));
    out("%s rc=%d flags=%llu", s.c_str(), rc, flags);
  } else if (op == "sendfd") {
    int fd = -1;
    CUresult rc = CALL(cuMemExportToShareableHandle, &fd, var(a.at(1)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    bool sent = false;
    if (rc == CUDA_SUCCESS) {
      sent = send_fd(a.at(2), fd);
      close(fd);
    }
    out("%s rc=%d sent=%d", s.c_str(), rc, sent ? 1 : 0);
  } else if (op == "recvfd") {
    const int fd = recv_fd(a.at(2));
    CUmemGenericAllocationHandle h = 0;
    CUresult rc = static_cast<CUresult>(-1);
    if (fd >= 0) {
      rc = CALL(cuMemImportFromShareableHandle, &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      close(fd);  // the importer keeps the memory through its handle (as NCCL does)
    }
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{h, size_of(a.at(3))};
    out("%s rc=%d received=%d", s.c_str(), rc, fd >= 0 ? 1 : 0);
  } else if (op == "touch") {
    const int fd = ::open(a.at(1).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    out("%s rc=%d", s.c_str(), fd >= 0 ? 0 : -1);
  } else if (op == "waitfile") {
    int waited = 0;
    while (::access(a.at(1).c_str(), F_OK) != 0 && waited < 30000) {
      usleep(10000);
      waited += 10;
    }
    out("%s rc=%d", s.c_str(), ::access(a.at(1).c_str(), F_OK) == 0 ? 0 : -1);
  } else if (op == "reclaim") {
    using RegisterFn = int (*)(std::uint64_t(*)(void*, int, std::uint64_t), void*);
    auto fn = reinterpret_cast<RegisterFn>(dlsym(RTLD_DEFAULT, "vlake_reclaim_register"));
    if (fn == nullptr) {
      out("%s rc=-1 error=no-vlake_reclaim_register", s.c_str());
      return;
    }
    g_reclaim_ptr = var(a.at(1));
    CALL(cuCtxGetCurrent, &g_reclaim_ctx);
    out("%s rc=%d", s.c_str(), fn(reclaim_callback, nullptr));
  } else if (op == "reclaimwait") {
    using CountFn = std::uint64_t (*)();
    auto count = reinterpret_cast<CountFn>(dlsym(RTLD_DEFAULT, "vlake_reclaim_count"));
    const long ms = std::stol(a.at(1));
    for (long waited = 0; count != nullptr && count() == 0 && waited < ms; waited += 10) usleep(10000);
    out("%s count=%llu freed_rc=%d", s.c_str(), static_cast<unsigned long long>(count != nullptr ? count() : 0),
        g_reclaim_rc.load());
  } else if (op == "share") {
    using ShareFn = int (*)(const void*, size_t, ShareResult*);
    auto fn = reinterpret_cast<ShareFn>(dlsym(RTLD_DEFAULT, "vlake_share_readonly_ex"));
    if (fn == nullptr) {
      out("%s rc=-1 error=no-vlake_share_readonly_ex", s.c_str());
      return;
    }
    ShareResult r{};
    const std::uint64_t p = var(a.at(1)) + size_of(a.at(2));
    const int rc = fn(reinterpret_cast<const void*>(p), size_of(a.at(3)), &r);
    out("%s rc=%d shared=%llu merged=%llu copied=%llu chunk=%llu", s.c_str(), rc,
        static_cast<unsigned long long>(r.shared_bytes), static_cast<unsigned long long>(r.merged_bytes),
        static_cast<unsigned long long>(r.copied_bytes), static_cast<unsigned long long>(r.chunk_bytes));
  } else if (op == "ipcget") {
    CUipcMemHandle h{};
    const CUresult rc = CALL(cuIpcGetMemHandle, &h, var(a.at(1)) + (a.size() > 3 ? size_of(a.at(3)) : 0));
    if (rc == CUDA_SUCCESS) {
      const std::string tmp = a.at(2) + ".tmp";
      FILE* f = std::fopen(tmp.c_str(), "wb");
      const bool ok = f != nullptr && std::fwrite(&h, sizeof h, 1, f) == 1;
      if (f != nullptr) std::fclose(f);
      if (!ok || std::rename(tmp.c_str(), a.at(2).c_str()) != 0) std::fprintf(stderr, "ipcget: cannot write\n");
    }
    out("%s rc=%d", s.c_str(), rc);
  } else if (op == "ipcopen") {
    CUipcMemHandle h{};
    bool read = false;
    for (int i = 0; i < 2000 && !read; ++i) {
      if (FILE* f = std::fopen(a.at(2).c_str(), "rb")) {
        read = std::fread(&h, sizeof h, 1, f) == 1;
        std::fclose(f);
      }
      if (!read) usleep(10000);
    }
    CUdeviceptr p = 0;
    const CUresult rc =
        read ? CALL(cuIpcOpenMemHandle, &p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) : static_cast<CUresult>(-1);
    if (rc == CUDA_SUCCESS) vars[a.at(1)] = Named{p, 0};
    out("%s rc=%d ptr=0x%llx", s.c_str(), rc, static_cast<unsigned long long>(p));
  } else if (op == "ipcclose") {
    out("%s rc=%d", s.c_str(), CALL(cuIpcCloseMemHandle, var(a.at(1))));
  } else if (op == "kstress") {
    step_kstress(s, a);
  } else if (op == "nvml") {
    step_nvml(s, a.size() > 1 ? static_cast<unsigned>(std::atoi(a[1].c_str())) : 0);
  } else if (op == "peerrace") {
    step_peerrace(s, a);
  } else if (op == "threads") {
    step_threads(s, a);
  } else if (op == "laterfree") {
    const CUdeviceptr p = var(a.at(1));
    const int delay = std::atoi(a.at(2).c_str());
    CUcontext ctx = nullptr;
    (void)CALL(cuCtxGetCurrent, &ctx);
    std::thread([s, p, delay, ctx] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      (void)CALL(cuCtxSetCurrent, ctx);
      const auto t0 = std::chrono::steady_clock::now();
      const CUresult rc = CALL(cuMemFree, p);
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
      out("%s rc=%d ms=%lld", s.c_str(), rc, static_cast<long long>(ms));
    }).detach();
  } else if (op == "stress") {
    step_stress(s, a);
  } else if (op == "calls") {
    using CountFn = unsigned long long (*)(const char*);
    auto fn = g_lib != nullptr ? reinterpret_cast<CountFn>(dlsym(g_lib, "vlake_sim_call_count")) : nullptr;
    out("%s rc=%d count=%llu", s.c_str(), fn != nullptr ? 0 : -1, fn != nullptr ? fn(a.at(1).c_str()) : 0ULL);
  } else if (op == "ctxcreate") {
    // cuCtxCreate on the current device (a context of its own): the ABI named by the exported
    // symbol, resolved like every entry point (cuGetProcAddress by base name and its version).
    const std::string how = a.size() > 2 ? a[2] : "cuCtxCreate_v2";
    CUcontext c = nullptr;
    CUresult rc = static_cast<CUresult>(-1);
    if (how == "cuCtxCreate_v2") {
      rc = XCALL(cuCtxCreate, 3020, &c, 0, g_device);
    } else if (how == "cuCtxCreate_v3") {
      rc = XCALL(cuCtxCreate, 11040, &c, nullptr, 0, 0, g_device);
    } else if (how == "cuCtxCreate_v4") {
      CUctxCreateParams params{};
      rc = XCALL(cuCtxCreate, 12050, &c, &params, 0, g_device);
    }
    keep_handle(s, a.at(1), rc, c);
  } else if (op == "ctxdestroy") {
    out("%s rc=%d", s.c_str(), XCALL(cuCtxDestroy, 4000, handle_of<CUcontext>(a.at(1))));
  } else if (op == "greenctx") {
    // A green context of all the device's SMs (the simulator takes any description).
    CUdevResource sm{};
    CUdevResourceDesc desc = nullptr;
    if (XCALL(cuDeviceGetDevResource, 12040, g_device, &sm, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS) {
      (void)XCALL(cuDevResourceGenerateDesc, 12040, &desc, &sm, 1);
    }
    CUgreenCtx g = nullptr;
    const CUresult rc = XCALL(cuGreenCtxCreate, 12040, &g, desc, g_device, CU_GREEN_CTX_DEFAULT_STREAM);
    keep_handle(s, a.at(1), rc, g);
  } else if (op == "greendestroy") {
    out("%s rc=%d", s.c_str(), XCALL(cuGreenCtxDestroy, 12040, handle_of<CUgreenCtx>(a.at(1))));
  } else if (op == "sleep") {
    usleep(static_cast<useconds_t>(std::atoi(a.at(1).c_str())) * 1000);
    out("%s rc=0", s.c_str());
  } else if (op == "where") {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st{};
    const cuuint64_t flags = a.size() > 3 && a[3] == "ptds" ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    const CUresult rc = g_gpa2 != nullptr ? g_gpa2(a.at(1).c_str(), &p, std::atoi(a.at(2).c_str()), flags, &st)
                                          : static_cast<CUresult>(-1);
    const CUresult rc1 =
        g_gpa1 != nullptr ? g_gpa1(a.at(1).c_str(), &p, std::atoi(a.at(2).c_str()), flags) : static_cast<CUresult>(-1);
    out("%s rc=%d status=%d v1_rc=%d lib=%s", s.c_str(), rc, static_cast<int>(st), rc1, lib_of(p));
  } else if (op == "dlsym-next") {
    // Resolved relative to this executable: the next definition after it in the search order.
    void* p = dlsym(RTLD_NEXT, a.at(1).c_str());
    out("%s rc=0 lib=%s", s.c_str(), lib_of(p));
  } else if (op == "dlsym") {
    void* p = dlsym(g_lib != nullptr ? g_lib : RTLD_DEFAULT, a.at(1).c_str());
    out("%s rc=0 lib=%s", s.c_str(), lib_of(p));
  } else if (!run_counted_step(s, a)) {
    out("%s rc=-1 error=unknown-step", s.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    if (std::strcmp(argv[i], "--direct") == 0) g_direct = true;
    if (std::strcmp(argv[i], "--ptds") == 0) g_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  }
  if (!resolve_all()) {
    out("resolve rc=-1 error=%s", dlerror());
    return 2;
  }
  out("resolve rc=0 gpa2_lib=%s gpa1_lib=%s alloc_lib=%s memcpy_lib=%s", lib_of(reinterpret_cast<void*>(g_gpa2)),
      lib_of(reinterpret_cast<void*>(g_gpa1)), lib_of(reinterpret_cast<void*>(api.cuMemAlloc)),
      lib_of(reinterpret_cast<void*>(api.cuMemcpyDtoH)));
  for (; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "fork") {
      std::fflush(stdout);
      const pid_t pid = fork();
      if (pid == 0) {
        g_prefix = "child ";
        for (++i; i < argc && std::string(argv[i]) != "endfork"; ++i) run_step(argv[i]);
        std::fflush(stdout);
        _exit(0);
      }
      while (i < argc && std::string(argv[i]) != "endfork") ++i;
      int status = 0;
      waitpid(pid, &status, 0);
      out("fork rc=%d", WIFEXITED(status) ? WEXITSTATUS(status) : 128);
      continue;
    }
    run_step(s);
  }
  return 0;
}
