// The X-macro expansions of hooked.def: exported trampolines, their typed dispatch to the
// on_<symbol> implementations, and the cuGetProcAddress table (see hooked.def).
#include "exports.hpp"

#include <cstring>
#include <new>
#include <type_traits>

#include "gate.hpp"
#include "hook.hpp"

namespace vlake::hook {
namespace {

template <class Pfn>
struct PrependBool;
template <class... A>
struct PrependBool<CUresult (*)(A...)> {
  using type = CUresult (*)(bool, A...);
};

// Handler<R>::fn is on_<symbol>, checked to take (bool ptds, <the PFN's parameters>).
template <Row R>
struct Handler;
#define VLAKE_HOOK(base, symbol, version)                                                                        \
  template <>                                                                                                    \
  struct Handler<Row::symbol> {                                                                                  \
    static constexpr auto fn = &on_##symbol;                                                                     \
    static_assert(std::is_same_v<std::remove_const_t<decltype(fn)>, PrependBool<PFN_##base##_v##version>::type>, \
                  "on_" #symbol " must take (bool ptds, <PFN_" #base "_v" #version " params>)");                 \
  };
#include "hooked.def"

}  // namespace

// Tramp<R, P>::call has exactly row R's type; it is the function the application receives.
template <Row R, bool P, class Pfn = typename RowInfo<R>::Pfn>
struct Tramp;
template <Row R, bool P, class... A>
struct Tramp<R, P, CUresult (*)(A...)> {
  static CUresult call(A... args) {  // catches everything itself
    const tier::EntryMark mark;      // counted inside a hooked call; waits while a move runs
    try {
      return Handler<R>::fn(P, args...);
    } catch (const std::bad_alloc&) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    } catch (...) {
      return CUDA_ERROR_UNKNOWN;
    }
  }
};

namespace {

#define VLAKE_HOOK(base, symbol, version)                                  \
  static_assert(std::is_same_v<decltype(&Tramp<Row::symbol, false>::call), \
                               std::add_pointer_t<std::remove_pointer_t<PFN_##base##_v##version>>>);
#include "hooked.def"

struct ProcRow {
  const char* base;
  int version;
  void* wrapper[2];
  void (*remember)(void*, bool) noexcept;
};

const ProcRow kProcRows[] = {
#define VLAKE_HOOK(base, symbol, version)                             \
  ProcRow{#base,                                                      \
          version,                                                    \
          {reinterpret_cast<void*>(&Tramp<Row::symbol, false>::call), \
           reinterpret_cast<void*>(&Tramp<Row::symbol, true>::call)}, \
          &remember_real<Row::symbol>},
#include "hooked.def"
};

const Interposed kExports[] = {
#define VLAKE_HOOK(base, symbol, version)                                                                            \
  Interposed{#symbol, reinterpret_cast<void*>(&Tramp<Row::symbol, false>::call), &remember_real<Row::symbol>, false, \
             false},
#define VLAKE_HOOK_PTSZ(base, symbol, ptsz_symbol, version)                                                       \
  Interposed{#ptsz_symbol, reinterpret_cast<void*>(&Tramp<Row::symbol, true>::call), &remember_real<Row::symbol>, \
             true, false},
#include "hooked.def"
};

// The driver's answer for `symbol` at `version`, or nullptr.
void* driver_lookup(const char* symbol, int version, cuuint64_t flags) {
  void* p = nullptr;
  if (auto v2 = real_fn<Row::cuGetProcAddress_v2>(false)) {
    CUdriverProcAddressQueryResult st{};
    if (v2(symbol, &p, version, flags, &st) != CUDA_SUCCESS) return nullptr;
    return p;
  }
  if (auto v1 = real_fn<Row::cuGetProcAddress>(false)) {
    if (v1(symbol, &p, version, flags) != CUDA_SUCCESS) return nullptr;
    return p;
  }
  return nullptr;
}

// The driver resolved `symbol`@version (flags) to `real`: the hook's wrapper when it intercepts
// that ABI, else `real` unchanged.
void* substitute(const char* symbol, void* real, int version, cuuint64_t flags) {
  const ProcRow* best = nullptr;
  for (const ProcRow& r : kProcRows) {
    if (std::strcmp(r.base, symbol) != 0 || r.version > version) continue;
    if (best == nullptr || r.version > best->version) best = &r;
  }
  if (best == nullptr) return real;
  // The driver may know a newer ABI of this name than the hook's row: then `version` resolves
  // to another function than the row's own version does, and the hook stays out of the way.
  if (best->version != version && driver_lookup(symbol, best->version, flags) != real) {
    log(LogLevel::debug, "%s@%d: the driver has a newer ABI than the hook; not intercepted", symbol, version);
    return real;
  }
  const bool ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  best->remember(real, ptds);
  return best->wrapper[ptds ? 1 : 0];
}

bool substitution_off() {
  State* s = state();
  return s != nullptr && s->passthrough;
}

}  // namespace

CUresult on_cuGetProcAddress(bool ptds, const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  const CUresult rc = pass<Row::cuGetProcAddress>(ptds, symbol, pfn, cudaVersion, flags);
  if (rc != CUDA_SUCCESS || symbol == nullptr || pfn == nullptr || *pfn == nullptr) return rc;
  if (!substitution_off()) *pfn = substitute(symbol, *pfn, cudaVersion, flags);
  return rc;
}

CUresult on_cuGetProcAddress_v2(bool ptds, const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                CUdriverProcAddressQueryResult* symbolStatus) {
  const CUresult rc = pass<Row::cuGetProcAddress_v2>(ptds, symbol, pfn, cudaVersion, flags, symbolStatus);
  if (rc != CUDA_SUCCESS || symbol == nullptr || pfn == nullptr || *pfn == nullptr) return rc;
  if (!substitution_off()) *pfn = substitute(symbol, *pfn, cudaVersion, flags);
  return rc;
}

const Interposed* find_interposed(const char* name) noexcept {
  if (name == nullptr) return nullptr;
  if (name[0] == 'c' && name[1] == 'u') {
    for (const Interposed& e : kExports) {
      if (std::strcmp(e.name, name) == 0) return &e;
    }
    return nullptr;
  }
  if (std::strncmp(name, "nvml", 4) == 0) return find_nvml_interposed(name);
  return nullptr;
}

}  // namespace vlake::hook

// ---- The exported symbols ---------------------------------------------------------------------
// Each is a GNU indirect function whose resolver returns the row's trampoline: the symbol has
// the driver's exact prototype (declared from the PFN type, so a mismatch with cuda.h does not
// compile) without the parameter list being spelled out per row.
#define VLAKE_HOOK(base, symbol, version)                                                                 \
  extern "C" PFN_##base##_v##version vlake_resolve_##symbol() {                                           \
    return &vlake::hook::Tramp<vlake::hook::Row::symbol, false>::call;                                    \
  }                                                                                                       \
  extern "C" __attribute__((visibility("default"))) std::remove_pointer_t<PFN_##base##_v##version> symbol \
      __attribute__((ifunc("vlake_resolve_" #symbol)));                                                   \
  static_assert(std::is_same_v<decltype(&::symbol), PFN_##base##_v##version>);
#define VLAKE_HOOK_PTSZ(base, symbol, ptsz_symbol, version)                                      \
  extern "C" vlake::hook::RowInfo<vlake::hook::Row::symbol>::Pfn vlake_resolve_##ptsz_symbol() { \
    return &vlake::hook::Tramp<vlake::hook::Row::symbol, true>::call;                            \
  }                                                                                              \
  extern "C" __attribute__((visibility("default")))                                              \
  std::remove_pointer_t<vlake::hook::RowInfo<vlake::hook::Row::symbol>::Pfn>                     \
      ptsz_symbol __attribute__((ifunc("vlake_resolve_" #ptsz_symbol)));
#include "hooked.def"
