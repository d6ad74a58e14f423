// Measures, on a machine with a real GPU, the driver and NVML answers that the simulator copies
// (pitch rounding, managed/async allocations, per-thread proc addresses, NVML buffer protocol).
// Not part of the build. On a GPU machine:
//   g++ -std=c++20 -O1 -I/usr/local/cuda/include -Icommon/include sim/tools/measure_driver.cpp
//       -ldl -o /tmp/measure && /tmp/measure
// Prints "key=value" lines; docs/simulator.md records what they showed.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "vlake/common/nvml_api.hpp"

namespace {

void* cu = nullptr;

template <class F>
F get(const char* name) {
  return reinterpret_cast<F>(::dlsym(cu, name));
}

#define CU(name) static const auto p_##name = get<decltype(&::name)>(#name)

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cu = ::dlopen("libcuda.so.1", RTLD_NOW);
  if (cu == nullptr) {
    std::printf("no libcuda: %s\n", ::dlerror());
    return 1;
  }
  const char* names[] = {"cuMemAllocAsync",           "cuMemAllocAsync_ptsz",      "cuMemFreeAsync",
                         "cuMemFreeAsync_ptsz",       "cuMemAllocPitch_v2",        "cuMemAllocManaged",
                         "cuMemcpyHtoD_v2_ptds",      "cuMemcpyDtoH_v2_ptds",      "cuMemcpyDtoD_v2_ptds",
                         "cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyDtoDAsync_v2_ptsz",
                         "cuMemsetD8_v2_ptds",        "cuMemsetD32_v2_ptds",       "cuMemsetD8Async_ptsz",
                         "cuMemsetD32Async_ptsz",     "cuStreamSynchronize_ptsz",  "cuStreamQuery_ptsz",
                         "cuStreamWaitEvent_ptsz",    "cuEventRecord_ptsz",        "cuLaunchKernel_ptsz",
                         "cuStreamDestroy_v2_ptsz",   "cuStreamCreate_ptsz",       "cuMemAlloc_v2_ptds",
                         "cuMemGetInfo_v2_ptds"};
  for (const char* n : names) std::printf("sym.%s=%d\n", n, ::dlsym(cu, n) != nullptr ? 1 : 0);

  CU(cuInit);
  CU(cuDevicePrimaryCtxRetain);
  CU(cuCtxSetCurrent);
  CU(cuDeviceGetAttribute);
  CU(cuMemAllocPitch_v2);
  CU(cuMemGetAddressRange_v2);
  CU(cuMemFree_v2);
  CU(cuMemGetInfo_v2);
  CU(cuMemAllocManaged);
  CU(cuPointerGetAttribute);
  CU(cuMemsetD8_v2);
  CU(cuMemAllocAsync);
  CU(cuMemFreeAsync);
  CU(cuStreamSynchronize);
  CU(cuGetProcAddress_v2);
  CU(cuMemAlloc_v2);
  CU(cuDeviceGetUuid_v2);
  std::printf("init=%d\n", p_cuInit(0));
  CUcontext ctx = nullptr;
  p_cuDevicePrimaryCtxRetain(&ctx, 0);
  p_cuCtxSetCurrent(ctx);
  const struct {
    const char* n;
    CUdevice_attribute a;
  } attrs[] = {
      {"TEXTURE_PITCH_ALIGNMENT", CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT},
      {"TEXTURE_ALIGNMENT", CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT},
      {"MEMORY_POOLS_SUPPORTED", CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED},
      {"MANAGED_MEMORY", CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY},
      {"CONCURRENT_MANAGED_ACCESS", CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS},
      {"MEMPOOL_SUPPORTED_HANDLE_TYPES", CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES},
      {"MAX_PITCH", CU_DEVICE_ATTRIBUTE_MAX_PITCH},
  };
  for (const auto& a : attrs) {
    int v = -1;
    const CUresult rc = p_cuDeviceGetAttribute(&v, a.a, 0);
    std::printf("attr.%s=%d rc=%d\n", a.n, v, rc);
  }
  auto used = [&]() {
    size_t f = 0, t = 0;
    p_cuMemGetInfo_v2(&f, &t);
    return static_cast<long long>(t - f);
  };
  std::printf("used.start=%lld\n", used());

  // Pitch.
  const unsigned elems[] = {1, 2, 3, 4, 8, 16, 32};
  const size_t widths[] = {0, 1, 100, 128, 511, 512, 513, 1000, 4096, 5000, 65536};
  for (unsigned e : elems) {
    for (size_t w : widths) {
      CUdeviceptr p = 0;
      size_t pitch = 0;
      const CUresult rc = p_cuMemAllocPitch_v2(&p, &pitch, w, 10, e);
      CUdeviceptr base = 0;
      size_t sz = 0;
      if (rc == CUDA_SUCCESS) p_cuMemGetAddressRange_v2(&base, &sz, p);
      std::printf("pitch e=%u w=%zu h=10 rc=%d pitch=%zu align512=%d range=%zu\n", e, w, rc, pitch,
                  static_cast<int>(p % 512 == 0), sz);
      if (rc == CUDA_SUCCESS) p_cuMemFree_v2(p);
    }
  }
  {
    CUdeviceptr p = 0;
    size_t pitch = 0;
    std::printf("pitch.h0 rc=%d\n", p_cuMemAllocPitch_v2(&p, &pitch, 512, 0, 4));
    std::printf("pitch.nullpitch rc=%d\n", p_cuMemAllocPitch_v2(&p, nullptr, 512, 4, 4));
    const long long u0 = used();
    const CUresult rc = p_cuMemAllocPitch_v2(&p, &pitch, 5000, 1000, 4);
    std::printf("pitch.big rc=%d pitch=%zu delta=%lld\n", rc, pitch, used() - u0);
    p_cuMemFree_v2(p);
  }

  // Managed (64 MiB only).
  {
    const long long u0 = used();
    CUdeviceptr p = 0;
    CUresult rc = p_cuMemAllocManaged(&p, 64u << 20, CU_MEM_ATTACH_GLOBAL);
    std::printf("managed rc=%d delta_alloc=%lld\n", rc, used() - u0);
    if (rc == CUDA_SUCCESS) {
      p_cuMemsetD8_v2(p, 1, 64u << 20);
      p_cuStreamSynchronize(nullptr);
      std::printf("managed delta_touched=%lld\n", used() - u0);
      unsigned mt = 99;
      int im = -1, ord = -9, ipc = -1;
      void* hp = nullptr;
      CUcontext c = nullptr;
      size_t rs = 0;
      {
        const auto rc_ = p_cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
        std::printf("managed.memtype rc=%d v=%u\n", rc_, mt);
      }
      {
        const auto rc_ = p_cuPointerGetAttribute(&im, CU_POINTER_ATTRIBUTE_IS_MANAGED, p);
        std::printf("managed.is_managed rc=%d v=%d\n", rc_, im);
      }
      {
        const auto rc_ = p_cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
        std::printf("managed.ordinal rc=%d v=%d\n", rc_, ord);
      }
      {
        const auto rc_ = p_cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
        std::printf("managed.ipc rc=%d v=%d\n", rc_, ipc);
      }
      {
        const auto rc_ = p_cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, p);
        std::printf("managed.hostptr rc=%d same=%d\n", rc_, static_cast<int>(reinterpret_cast<CUdeviceptr>(hp) == p));
      }
      {
        const auto rc_ = p_cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p);
        std::printf("managed.ctx rc=%d same=%d\n", rc_, static_cast<int>(c == ctx));
      }
      {
        const auto rc_ = p_cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
        std::printf("managed.rangesize rc=%d v=%zu\n", rc_, rs);
      }
      std::printf("managed.free rc=%d\n", p_cuMemFree_v2(p));
      std::printf("managed delta_freed=%lld\n", used() - u0);
    }
    std::printf("managed.flags0 rc=%d\n", p_cuMemAllocManaged(&p, 2u << 20, 0));
    std::printf("managed.size0 rc=%d\n", p_cuMemAllocManaged(&p, 0, CU_MEM_ATTACH_GLOBAL));
    rc = p_cuMemAllocManaged(&p, 2u << 20, CU_MEM_ATTACH_HOST);
    std::printf("managed.host rc=%d\n", rc);
    if (rc == CUDA_SUCCESS) p_cuMemFree_v2(p);
  }

  // Async.
  {
    const long long u0 = used();
    CUdeviceptr p = 0;
    CUresult rc = p_cuMemAllocAsync(&p, 32u << 20, nullptr);
    p_cuStreamSynchronize(nullptr);
    std::printf("async rc=%d delta=%lld\n", rc, used() - u0);
    void* pool = nullptr;
    int ipc = -1;
    CUdeviceptr base = 0;
    size_t sz = 0;
    {
      const auto rc_ = p_cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p);
      std::printf("async.pool rc=%d nonnull=%d\n", rc_, static_cast<int>(pool != nullptr));
    }
    {
      const auto rc_ = p_cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
      std::printf("async.ipc rc=%d v=%d\n", rc_, ipc);
    }
    {
      const auto rc_ = p_cuMemGetAddressRange_v2(&base, &sz, p);
      std::printf("async.range rc=%d size=%zu\n", rc_, sz);
    }
    std::printf("async.free rc=%d\n", p_cuMemFreeAsync(p, nullptr));
    {
      const auto rc_ = p_cuStreamSynchronize(nullptr);
      std::printf("async.sync rc=%d delta_after_free=%lld\n", rc_, used() - u0);
    }
    rc = p_cuMemAllocAsync(&p, 1000, nullptr);
    std::printf("async.small rc=%d\n", rc);
    std::printf("async.small.memfree rc=%d\n", p_cuMemFree_v2(p));
    p = 0x77;
    {
      const auto rc_ = p_cuMemAllocAsync(&p, 0, nullptr);
      std::printf("async.size0 rc=%d p=%llx\n", rc_, static_cast<unsigned long long>(p));
    }
    {
      const auto rc_ = p_cuMemAlloc_v2(&p, 0);
      std::printf("alloc.size0 rc=%d\n", rc_);
    }
    CUdeviceptr q = 0;
    p_cuMemAlloc_v2(&q, 1 << 20);
    std::printf("async.free_classic rc=%d\n", p_cuMemFreeAsync(q, nullptr));
    p_cuStreamSynchronize(nullptr);
    std::printf("async.free_unknown rc=%d\n", p_cuMemFreeAsync(0x1234000, nullptr));
    std::printf("async.free_null rc=%d\n", p_cuMemFreeAsync(0, nullptr));
  }

  // Proc addresses.
  {
    const struct {
      const char* n;
      int v;
      const char* plain;
      const char* pt;
    } rows[] = {
        {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
        {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
        {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"},
        {"cuMemcpyHtoD", 7000, "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"},
        {"cuMemcpyHtoD", 13000, "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"},
        {"cuMemsetD8Async", 7000, "cuMemsetD8Async", "cuMemsetD8Async_ptsz"},
        {"cuStreamSynchronize", 7000, "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
        {"cuMemAllocAsync", 13000, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
        {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"},
        {"cuStreamSynchronize", 2000, "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
        {"cuLaunchKernel", 4000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
        {"cuMemAlloc", 3020, "cuMemAlloc_v2", "cuMemAlloc_v2"},
        {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", "cuMemAllocPitch_v2"},
        {"cuMemAllocManaged", 6000, "cuMemAllocManaged", "cuMemAllocManaged"},
    };
    for (const auto& r : rows) {
      for (cuuint64_t fl : {cuuint64_t{0}, cuuint64_t{CU_GET_PROC_ADDRESS_LEGACY_STREAM},
                            cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}}) {
        void* fn = nullptr;
        CUdriverProcAddressQueryResult st{};
        const CUresult rc = p_cuGetProcAddress_v2(r.n, &fn, r.v, fl, &st);
        std::printf("proc %s@%d flags=%llu rc=%d st=%d plain=%d pt=%d null=%d\n", r.n, r.v,
                    static_cast<unsigned long long>(fl), rc, static_cast<int>(st),
                    static_cast<int>(fn == ::dlsym(cu, r.plain)), static_cast<int>(fn == ::dlsym(cu, r.pt)),
                    static_cast<int>(fn == nullptr));
      }
    }
    void* fn = &fn;
    CUdriverProcAddressQueryResult st{};
    CUresult rc = p_cuGetProcAddress_v2("cuNoSuchThing", &fn, 13000, 0, &st);
    std::printf("proc.unknown rc=%d st=%d null=%d\n", rc, static_cast<int>(st), fn == nullptr);
    rc = p_cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11010, 0, &st);
    std::printf("proc.tooold rc=%d st=%d null=%d\n", rc, static_cast<int>(st), fn == nullptr);
  }

  // NVML.
  void* nv = ::dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (nv == nullptr) {
    std::printf("no nvml\n");
    return 0;
  }
  auto N = [&](const char* n) { return ::dlsym(nv, n); };
  using Fv = nvmlReturn_t (*)();
  using Fu = nvmlReturn_t (*)(unsigned);
  using Fcnt = nvmlReturn_t (*)(unsigned*);
  using Fstr = nvmlReturn_t (*)(char*, unsigned);
  using Fidx = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
  using Fuuid = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
  using Fdstr = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
  using Fdidx = nvmlReturn_t (*)(nvmlDevice_t, unsigned*);
  using Fmem = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
  using Fmem2 = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*);
  using Fproc = nvmlReturn_t (*)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*);
  using Ferr = const char* (*)(nvmlReturn_t);
  auto init = reinterpret_cast<Fv>(N("nvmlInit_v2"));
  auto initf = reinterpret_cast<Fu>(N("nvmlInitWithFlags"));
  auto shut = reinterpret_cast<Fv>(N("nvmlShutdown"));
  auto count = reinterpret_cast<Fcnt>(N("nvmlDeviceGetCount_v2"));
  auto drv = reinterpret_cast<Fstr>(N("nvmlSystemGetDriverVersion"));
  auto byidx = reinterpret_cast<Fidx>(N("nvmlDeviceGetHandleByIndex_v2"));
  auto byuuid = reinterpret_cast<Fuuid>(N("nvmlDeviceGetHandleByUUID"));
  auto uuid = reinterpret_cast<Fdstr>(N("nvmlDeviceGetUUID"));
  auto name = reinterpret_cast<Fdstr>(N("nvmlDeviceGetName"));
  auto index = reinterpret_cast<Fdidx>(N("nvmlDeviceGetIndex"));
  auto mem = reinterpret_cast<Fmem>(N("nvmlDeviceGetMemoryInfo"));
  auto mem2 = reinterpret_cast<Fmem2>(N("nvmlDeviceGetMemoryInfo_v2"));
  auto procs = reinterpret_cast<Fproc>(N("nvmlDeviceGetComputeRunningProcesses_v3"));
  auto err = reinterpret_cast<Ferr>(N("nvmlErrorString"));
  for (int c : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 15, 17, 25, 999, 12345, -1}) {
    std::printf("nvml.err %d='%s'\n", c, err(c));
  }
  unsigned n = 77;
  {
    const auto rc_ = count(&n);
    std::printf("nvml.preinit count rc=%d n=%u\n", rc_, n);
  }
  std::printf("nvml.preinit shutdown rc=%d\n", shut());
  char buf[128];
  std::printf("nvml.preinit drv rc=%d\n", drv(buf, sizeof buf));
  std::printf("nvml.init rc=%d\n", init());
  std::printf("nvml.initflags0 rc=%d\n", initf(0));
  std::printf("nvml.initflags99 rc=%d\n", initf(99));
  std::printf("nvml.shutdown1 rc=%d\n", shut());
  std::printf("nvml.after1shutdown count rc=%d\n", count(&n));
  {
    const auto rc_ = count(&n);
    std::printf("nvml.count rc=%d n=%u\n", rc_, n);
  }
  std::printf("nvml.count null rc=%d\n", count(nullptr));
  std::memset(buf, 0, sizeof buf);
  {
    const auto rc_ = drv(buf, sizeof buf);
    std::printf("nvml.drv rc=%d '%s'\n", rc_, buf);
  }
  std::printf("nvml.drv len5 rc=%d\n", drv(buf, 5));
  nvmlDevice_t d = nullptr, d2 = nullptr;
  std::printf("nvml.byidx rc=%d\n", byidx(0, &d));
  std::printf("nvml.byidx99 rc=%d\n", byidx(99, &d2));
  std::printf("nvml.byidx null rc=%d\n", byidx(0, nullptr));
  char u[96] = {};
  {
    const auto rc_ = uuid(d, u, sizeof u);
    std::printf("nvml.uuid rc=%d '%s'\n", rc_, u);
  }
  std::printf("nvml.uuid len10 rc=%d\n", uuid(d, buf, 10));
  std::printf("nvml.uuid len41 rc=%d\n", uuid(d, buf, 41));
  std::printf("nvml.uuid nulldev rc=%d\n", uuid(nullptr, buf, sizeof buf));
  CUuuid cu_u{};
  p_cuDeviceGetUuid_v2(&cu_u, 0);
  std::printf("cu.uuid=");
  for (char b : cu_u.bytes) std::printf("%02x", static_cast<unsigned>(static_cast<unsigned char>(b)));
  std::printf("\n");
  {
    const auto rc_ = byuuid(u, &d2);
    std::printf("nvml.byuuid rc=%d same=%d\n", rc_, d2 == d);
  }
  std::printf("nvml.byuuid bad rc=%d\n", byuuid("GPU-00000000-0000-0000-0000-000000000000", &d2));
  std::printf("nvml.byuuid junk rc=%d\n", byuuid("junk", &d2));
  unsigned ix = 99;
  {
    const auto rc_ = index(d, &ix);
    std::printf("nvml.index rc=%d v=%u\n", rc_, ix);
  }
  {
    const auto rc_ = name(d, buf, sizeof buf);
    std::printf("nvml.name rc=%d '%s'\n", rc_, buf);
  }
  std::printf("nvml.name len4 rc=%d\n", name(d, buf, 4));
  nvmlMemory_t m{};
  nvmlMemory_v2_t m2{};
  m2.version = static_cast<unsigned>(sizeof(nvmlMemory_v2_t) | (3u << 24));
  std::printf("nvml.mem2 v3 rc=%d\n", mem2(d, &m2));
  m2.version = static_cast<unsigned>(32u | (2u << 24));
  std::printf("nvml.mem2 v2size32 rc=%d\n", mem2(d, &m2));
  std::printf("nvml.byuuid null rc=%d\n", byuuid(nullptr, &d2));
  std::printf("nvml.byuuid nullout rc=%d\n", byuuid(u, nullptr));
  std::printf("nvml.name len22 rc=%d\n", name(d, buf, 22));
  std::printf("nvml.name len21 rc=%d\n", name(d, buf, 21));
  std::printf("nvml.index null rc=%d\n", index(d, nullptr));
  std::printf("nvml.mem nulldev rc=%d\n", mem(nullptr, &m));
  {
    const auto rc_ = mem(d, &m);
    std::printf("nvml.mem rc=%d total=%llu free=%llu used=%llu\n", rc_, m.total, m.free, m.used);
  }
  m2.version = VLAKE_NVML_MEMORY_V2;
  {
    const auto rc_ = mem2(d, &m2);
    std::printf("nvml.mem2 rc=%d total=%llu reserved=%llu free=%llu used=%llu\n", rc_, m2.total, m2.reserved, m2.free,
                m2.used);
  }
  m2.version = 0;
  std::printf("nvml.mem2 v0 rc=%d\n", mem2(d, &m2));
  m2.version = static_cast<unsigned>(sizeof(nvmlMemory_v2_t) | (1u << 24));
  std::printf("nvml.mem2 v1 rc=%d\n", mem2(d, &m2));
  std::printf("nvml.mem null rc=%d\n", mem(d, nullptr));
  std::printf("cu.used=%lld\n", used());
  unsigned pc = 0;
  {
    const auto rc_ = procs(d, &pc, nullptr);
    std::printf("nvml.procs count0 rc=%d n=%u\n", rc_, pc);
  }
  nvmlProcessInfo_t infos[16];
  pc = 16;
  {
    const auto rc_ = procs(d, &pc, infos);
    std::printf("nvml.procs rc=%d n=%u\n", rc_, pc);
  }
  for (unsigned i = 0; i < pc && i < 16; ++i) {
    std::printf("nvml.proc pid=%u self=%d used=%llu gi=%u ci=%u\n", infos[i].pid,
                static_cast<int>(infos[i].pid == static_cast<unsigned>(::getpid())), infos[i].usedGpuMemory,
                infos[i].gpuInstanceId, infos[i].computeInstanceId);
  }
  pc = 1;
  {
    const auto rc_ = procs(d, &pc, nullptr);
    std::printf("nvml.procs n1 null rc=%d n=%u\n", rc_, pc);
  }
  std::printf("nvml.procs nullcount rc=%d\n", procs(d, nullptr, infos));
  std::printf("nvml.shutdown2 rc=%d\n", shut());
  std::printf("nvml.after2shutdown count rc=%d\n", count(&n));
  std::printf("nvml.shutdown3 rc=%d\n", shut());
  std::printf("nvml.after3shutdown count rc=%d\n", count(&n));
  std::printf("nvml.shutdown4 rc=%d\n", shut());
  std::printf("nvml.reinit rc=%d\n", init());
  {
    const auto rc_ = count(&n);
    std::printf("nvml.reinit count rc=%d n=%u\n", rc_, n);
  }
  std::printf("nvml.errnull='%s'\n", err(NVML_SUCCESS));
  return 0;
}
