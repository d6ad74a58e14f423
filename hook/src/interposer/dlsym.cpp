// The dlsym override (see docs/hook.md, "How programs reach the driver").
//
// Programs (cudart, JAX, nvidia-smi) find the driver with dlsym(<libcuda or libnvidia-ml
// handle>, name). For the names the hook intercepts, when the real lookup lands in libcuda.so* or
// libnvidia-ml.so*, the override returns the hook's wrapper and remembers the real function;
// every other lookup gets the real answer untouched.
//
// glibc's dlsym resolves RTLD_NEXT relative to its caller's return address. So that lookups the
// hook does not intercept keep their caller's view, the exported `dlsym` is a small assembly
// trampoline: it asks vlake_dlsym_select() which function should answer and *jumps* to it with
// the original arguments and return address — glibc's dlsym itself for every name the hook does
// not intercept. For intercepted names the hook looks up itself; RTLD_NEXT is then answered
// from the caller's position (the first object loaded after the caller that defines the name),
// so a second interposer stacked after the hook still reaches the driver, and the executable
// reaches the hook.
//
// Sanitizer builds: a sanitizer runtime resolves the functions it intercepts with
// dlsym(RTLD_NEXT, name) while it starts, before its shadow memory exists, and that call reaches
// this dlsym (the preloaded hook comes before the runtime). So everything the trampoline runs
// for a name that is not a driver or NVML name is kept out of instrumentation
// (VLAKE_UNINSTRUMENTED: no shadow access, no std::atomic member call), reads its thread-local
// flag without __tls_get_addr (which the runtime intercepts: initial-exec TLS) and answers with
// glibc's dlsym; no sanitizer runtime looks up a cu* or nvml* name.
#include <dlfcn.h>
#include <link.h>

#include <cstring>

#include "exports.hpp"
#include "real.hpp"

#define VLAKE_UNINSTRUMENTED __attribute__((no_sanitize("address", "thread")))

namespace vlake::hook {

namespace {

DlsymFn g_real_dlsym = nullptr;  // glibc's dlsym once resolved; __atomic_* access only
// Initial-exec: an access is a plain %fs-relative load, the library being loaded at start-up.
__attribute__((tls_model("initial-exec"))) thread_local bool t_resolving = false;
thread_local const void* t_caller = nullptr;  // return address of the dlsym call being answered

void* no_dlsym(void*, const char*) { return nullptr; }

bool in_library(void* fn, const char* prefix) {
  Dl_info info{};
  if (::dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* base = std::strrchr(info.dli_fname, '/');
  base = base != nullptr ? base + 1 : info.dli_fname;
  return std::strncmp(base, prefix, std::strlen(prefix)) == 0;
}

link_map* object_of(const void* address) {
  Dl_info info{};
  void* extra = nullptr;
  if (::dladdr1(address, &info, &extra, RTLD_DL_LINKMAP) == 0) return nullptr;
  return static_cast<link_map*>(extra);
}

// dlsym(RTLD_NEXT, name) as seen from `caller`: the first object after the caller's, in load
// order, that defines `name` itself.
void* next_after(DlsymFn real, const void* caller, const char* name) {
  link_map* from = caller != nullptr ? object_of(caller) : nullptr;
  if (from == nullptr) return real(RTLD_NEXT, name);
  for (link_map* m = from->l_next; m != nullptr; m = m->l_next) {
    if (m->l_name == nullptr || m->l_name[0] == '\0') continue;
    void* h = ::dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);  // a handle of the loaded object
    if (h == nullptr) continue;                              // (e.g. the vDSO)
    void* p = real(h, name);
    ::dlclose(h);
    if (p != nullptr && object_of(p) == m) return p;
  }
  return nullptr;
}

void* intercepted_dlsym(void* handle, const char* name) {
  const DlsymFn real = real_dlsym();
  void* found = handle == RTLD_NEXT ? next_after(real, t_caller, name) : real(handle, name);
  if (found == nullptr) return found;
  const Interposed* e = find_interposed(name);
  if (e == nullptr) return found;
  if (!in_library(found, e->nvml ? "libnvidia-ml.so" : "libcuda.so")) return found;
  e->remember(found, e->ptds);
  return e->wrapper;
}

}  // namespace

VLAKE_UNINSTRUMENTED DlsymFn real_dlsym() noexcept {
  DlsymFn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
  if (f != nullptr || t_resolving) return f;
  t_resolving = true;
  void* p = ::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (p == nullptr) p = ::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  t_resolving = false;
  f = reinterpret_cast<DlsymFn>(p);
  if (f != nullptr) __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
  return f;
}

// Resolves glibc's dlsym when the library is loaded, so that a dlsym call made from inside
// dlvsym (e.g. by a malloc interposer) cannot find it unresolved. No CUDA call, no connection.
__attribute__((constructor)) void warm_real_dlsym() { (void)real_dlsym(); }

}  // namespace vlake::hook

// Chooses the function that answers dlsym(handle, name): called by the assembly trampoline below
// with the caller's arguments and return address; never throws. Only names that start with "cu"
// or "nvml" reach instrumented code (find_interposed).
extern "C" __attribute__((used)) VLAKE_UNINSTRUMENTED void* vlake_dlsym_select(void* handle, const char* name,
                                                                               const void* caller) {
  (void)handle;
  using namespace vlake::hook;
  const DlsymFn real = real_dlsym();
  if (real == nullptr) return reinterpret_cast<void*>(&no_dlsym);
  const bool driver_or_nvml =
      name != nullptr &&
      ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l'));
  if (!driver_or_nvml || find_interposed(name) == nullptr) return reinterpret_cast<void*>(real);
  t_caller = caller;
  return reinterpret_cast<void*>(&intercepted_dlsym);
}

#if defined(__x86_64__)
// dlsym: save the arguments, call the selector (with the return address as third argument),
// restore them and tail-jump to its answer.
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  movq 24(%rsp), %rdx
  call vlake_dlsym_select
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  jmp *%rax
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#else
// Other architectures: a plain call (RTLD_NEXT lookups then resolve relative to the hook).
extern "C" __attribute__((visibility("default"))) VLAKE_UNINSTRUMENTED void* dlsym(void* handle, const char* name) {
  auto fn = reinterpret_cast<vlake::hook::DlsymFn>(vlake_dlsym_select(handle, name, __builtin_return_address(0)));
  return fn(handle, name);
}
#endif
