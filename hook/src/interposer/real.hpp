// The real CUDA driver behind the hook: typed slots for every intercepted entry point
// (hooked.def) and the table of entry points the hook only calls (used.def).
//
// Contract
// - Row names every hooked.def row; RowInfo<R>::Pfn is its cudaTypedefs.h type.
// - real_fn<R>(ptds) is the driver's function for row R: slot 1 is the per-thread-default-stream
//   variant the application asked for through cuGetProcAddress (or the exported _ptsz symbol),
//   slot 0 everything else; an empty slot 1 falls back to slot 0. Slots are filled by
//   load_driver() (dlsym on dlopen("libcuda.so.1")) and by the dlsym/cuGetProcAddress wrappers
//   (the pointer the driver handed out), and are atomics: any thread may read or fill them.
// - load_driver() runs once (thread-safe); it returns false when libcuda.so.1 cannot be loaded.
//   used() is the table of used.def entry points (loaded by load_driver(); null members are
//   missing from the library). Nothing here talks to the daemon or knows a feature of the hook.
// - real_dlsym() is glibc's dlsym (never the hook's override), resolved lazily with dlvsym.
#pragma once

#include <atomic>

#include "vlake/common/cuda_api.hpp"

namespace vlake::hook {

enum class Row : int {
#define VLAKE_HOOK(base, symbol, version) symbol,
#include "hooked.def"
};

inline constexpr int kRowCount = 0
#define VLAKE_HOOK(base, symbol, version) +1
#include "hooked.def"
    ;

template <Row R>
struct RowInfo;
#define VLAKE_HOOK(base, symbol, version)           \
  template <>                                       \
  struct RowInfo<Row::symbol> {                     \
    using Pfn = PFN_##base##_v##version;            \
    static constexpr const char* kBase = #base;     \
    static constexpr const char* kSymbol = #symbol; \
    static constexpr int kVersion = version;        \
  };
#include "hooked.def"

template <Row R>
inline std::atomic<typename RowInfo<R>::Pfn> g_real_slot[2];

template <Row R>
[[nodiscard]] typename RowInfo<R>::Pfn real_fn(bool ptds) noexcept {
  auto f = g_real_slot<R>[ptds ? 1 : 0].load(std::memory_order_acquire);
  if (f == nullptr && ptds) f = g_real_slot<R>[0].load(std::memory_order_acquire);
  return f;
}

// Stores `fn` (a function of row R's type handed out by the driver) unless the slot is set.
template <Row R>
void remember_real(void* fn, bool ptds) noexcept {
  using Pfn = typename RowInfo<R>::Pfn;
  Pfn expected = nullptr;
  g_real_slot<R>[ptds ? 1 : 0].compare_exchange_strong(expected, reinterpret_cast<Pfn>(fn), std::memory_order_acq_rel);
}

struct UsedApi {
#define VLAKE_USED(symbol) decltype(&::symbol) symbol = nullptr;
#include "used.def"
};

bool load_driver() noexcept;
[[nodiscard]] const UsedApi& used() noexcept;

using DlsymFn = void* (*)(void*, const char*);
[[nodiscard]] DlsymFn real_dlsym() noexcept;

// Calls the real function of row R; CUDA_ERROR_NOT_INITIALIZED when the driver has none. No
// feature runs here: the hook's calls go through pass() (swap/pass.hpp).
template <Row R, class... A>
CUresult call_real(bool ptds, A... args) {
  auto f = real_fn<R>(ptds);
  if (f == nullptr) {
    load_driver();
    f = real_fn<R>(ptds);
    if (f == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  }
  return f(args...);
}

}  // namespace vlake::hook
