// Loading the real libcuda.so.1 (see real.hpp).
#include <dlfcn.h>

#include <mutex>

#include "guarded_once.hpp"
#include "log.hpp"
#include "real.hpp"

namespace vlake::hook {

namespace {

UsedApi g_used;
std::once_flag g_once;
std::atomic<bool> g_loaded{false};
thread_local bool t_loading = false;

template <Row R>
void fill_row(void* lib, DlsymFn sym) {
  if (g_real_slot<R>[0].load() == nullptr) {
    if (void* p = sym(lib, RowInfo<R>::kSymbol); p != nullptr) remember_real<R>(p, false);
  }
}

void load_once() {
  const DlsymFn sym = real_dlsym();
  if (sym == nullptr) {
    log(LogLevel::error, "cannot resolve the C library's dlsym; passing CUDA calls through");
    return;
  }
  // RTLD_LOCAL: the hook must not change what the application's own lookups see.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    log(LogLevel::warn, "cannot load libcuda.so.1 (%s)", err != nullptr ? err : "unknown error");
    return;
  }
#define VLAKE_HOOK(base, symbol, version) fill_row<Row::symbol>(lib, sym);
#include "hooked.def"
#define VLAKE_HOOK(base, symbol, version)
#define VLAKE_HOOK_PTSZ(base, symbol, ptsz_symbol, version)                                  \
  if (g_real_slot<Row::symbol>[1].load() == nullptr) {                                       \
    if (void* p = sym(lib, #ptsz_symbol); p != nullptr) remember_real<Row::symbol>(p, true); \
  }
#include "hooked.def"
#define VLAKE_USED(symbol) g_used.symbol = reinterpret_cast<decltype(&::symbol)>(sym(lib, #symbol));
#include "used.def"
  g_loaded.store(true, std::memory_order_release);
}

}  // namespace

bool load_driver() noexcept {
  if (g_loaded.load(std::memory_order_acquire)) return true;
  // Re-entered from inside dlopen: nothing is loaded yet.
  if (!call_once_guarded(g_once, t_loading, load_once)) return false;
  return g_loaded.load(std::memory_order_acquire);
}

const UsedApi& used() noexcept {
  load_driver();
  return g_used;
}

}  // namespace vlake::hook
