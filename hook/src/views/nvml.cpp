// NVML memory queries, virtualized: nvmlDeviceGetMemoryInfo(_v2) report the tenant's limit and
// usage on that GPU (see docs/hook.md). nvidia-smi resolves them with dlsym on its
// libnvidia-ml handle (the dlsym override hands out these functions); programs linked to NVML
// reach the exported symbols directly.
#include <dlfcn.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <type_traits>

#include "exports.hpp"
#include "hook.hpp"
#include "vlake/common/nvml_api.hpp"

namespace vlake::hook {

namespace {

std::atomic<void*> g_nvml_lib{nullptr};
std::atomic<PFN_nvmlDeviceGetMemoryInfo> g_mem{nullptr};
std::atomic<PFN_nvmlDeviceGetMemoryInfo_v2> g_mem_v2{nullptr};
std::atomic<PFN_nvmlDeviceGetUUID> g_get_uuid{nullptr};

// The NVML library the application uses: the one a remembered function lives in, else
// libnvidia-ml.so.1.
void* nvml_library() {
  if (void* lib = g_nvml_lib.load(std::memory_order_acquire)) return lib;
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (lib != nullptr) g_nvml_lib.store(lib, std::memory_order_release);
  return lib;
}

void remember_library(void* fn) noexcept {
  if (g_nvml_lib.load() != nullptr) return;
  Dl_info info{};
  if (::dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return;
  if (void* lib = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) {
    void* expected = nullptr;
    if (!g_nvml_lib.compare_exchange_strong(expected, lib)) ::dlclose(lib);
  }
}

template <class F>
F resolved(std::atomic<F>& slot, const char* name) {
  if (F f = slot.load(std::memory_order_acquire)) return f;
  void* lib = nvml_library();
  const DlsymFn sym = real_dlsym();
  if (lib == nullptr || sym == nullptr) return nullptr;
  F f = reinterpret_cast<F>(sym(lib, name));
  F expected = nullptr;
  if (f != nullptr && !slot.compare_exchange_strong(expected, f)) return expected;
  return f;
}

template <class F>
void remember(std::atomic<F>& slot, void* fn) noexcept {
  F expected = nullptr;
  slot.compare_exchange_strong(expected, reinterpret_cast<F>(fn));
  remember_library(fn);
}

void remember_mem(void* fn, bool) noexcept { remember(g_mem, fn); }
void remember_mem_v2(void* fn, bool) noexcept { remember(g_mem_v2, fn); }

// The tenant's view of `device`, when the daemon answers for it.
bool tenant_usage(nvmlDevice_t device, UsageResult& u) {
  State* s = state();
  if (s == nullptr || s->passthrough) return false;
  auto get_uuid = resolved(g_get_uuid, "nvmlDeviceGetUUID");
  if (get_uuid == nullptr) return false;
  char text[VLAKE_NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  if (get_uuid(device, text, sizeof text) != NVML_SUCCESS) return false;
  const std::optional<Uuid> uuid = Uuid::parse(text);
  if (!uuid) return false;
  auto r = usage_of(*s, *uuid);
  if (!r || r->status != proto::Status::ok) return false;
  u = *r;
  return true;
}

std::uint64_t saturating_sub(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

// Both memory queries: ask the real NVML, then overwrite the figures with the tenant's view when
// the daemon answers for `device` (the _v2 struct also reports nothing reserved).
template <class F, class Memory>
nvmlReturn_t tenant_memory_info(std::atomic<F>& slot, const char* name, nvmlDevice_t device, Memory* memory) {
  try {
    auto real = resolved(slot, name);
    if (real == nullptr) return NVML_ERROR_UNINITIALIZED;
    const nvmlReturn_t rc = real(device, memory);
    UsageResult u;
    if (rc != NVML_SUCCESS || !tenant_usage(device, u)) return rc;
    memory->total = u.limit;
    if constexpr (std::is_same_v<Memory, nvmlMemory_v2_t>) memory->reserved = 0;
    memory->used = u.used;
    memory->free = saturating_sub(u.limit, u.used);
    return rc;
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

}  // namespace

}  // namespace vlake::hook

extern "C" __attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device,
                                                                                       nvmlMemory_t* memory) {
  return vlake::hook::tenant_memory_info(vlake::hook::g_mem, "nvmlDeviceGetMemoryInfo", device, memory);
}

extern "C" __attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                                                          nvmlMemory_v2_t* memory) {
  return vlake::hook::tenant_memory_info(vlake::hook::g_mem_v2, "nvmlDeviceGetMemoryInfo_v2", device, memory);
}

static_assert(std::is_same_v<decltype(&nvmlDeviceGetMemoryInfo), PFN_nvmlDeviceGetMemoryInfo>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetMemoryInfo_v2), PFN_nvmlDeviceGetMemoryInfo_v2>);

namespace vlake::hook {

const Interposed* find_nvml_interposed(const char* name) noexcept {
  static const Interposed table[] = {
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo), &remember_mem, false, true},
      {"nvmlDeviceGetMemoryInfo_v2", reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo_v2), &remember_mem_v2, false,
       true},
  };
  for (const Interposed& e : table) {
    if (std::strcmp(e.name, name) == 0) return &e;
  }
  return nullptr;
}

}  // namespace vlake::hook
