// Hidden definitions of the glibc symbols that the hook's code and its static libstdc++/libgcc
// would otherwise need under a version newer than the floor, glibc 2.17 (glibc_floor.hpp says
// why and how). Compiled into libvlake-hook.so only, in its portable build (hook/CMakeLists.txt).
// A symbol is listed here because the built library needed it (the floor test names any new one).
#include "glibc_floor.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#define VLAKE_GLIBC_FIRST "GLIBC_2.2.5"  // the first version of every x86-64 symbol
#define VLAKE_GLIBC_2_3_3 "GLIBC_2.3.3"
#define VLAKE_GLIBC_2_12 "GLIBC_2.12"
#elif defined(__aarch64__)
#define VLAKE_GLIBC_FIRST "GLIBC_2.17"  // AArch64's first glibc: every older symbol is 2.17 there
#define VLAKE_GLIBC_2_3_3 "GLIBC_2.17"
#define VLAKE_GLIBC_2_12 "GLIBC_2.17"
#else
#error "the glibc floor is defined for x86-64 and AArch64 (hook/CMakeLists.txt leaves it out elsewhere)"
#endif

#define VLAKE_HIDDEN __attribute__((visibility("hidden")))

// VLAKE_PINNED(ret, name, version, (params), (args) [, noexcept]): defines `name`, hidden, as a
// call of glibc's `name@version` (declared under a name of its own, bound to that version with
// .symver). The exception specification is glibc's declaration's (__THROW is noexcept in C++).
#define VLAKE_PINNED(ret, name, version, params, args, ...)    \
  extern "C" ret vlake_glibc_##name params __VA_ARGS__;        \
  __asm__(".symver vlake_glibc_" #name "," #name "@" version); \
  extern "C" VLAKE_HIDDEN ret name params __VA_ARGS__ { return vlake_glibc_##name args; }

// The dynamic loader's interface: in libdl.so.2 before glibc 2.34, in libc since (new default
// version GLIBC_2.34; the old one is kept).
VLAKE_PINNED(void*, dlopen, VLAKE_GLIBC_FIRST, (const char* file, int mode), (file, mode), noexcept)
VLAKE_PINNED(int, dlclose, VLAKE_GLIBC_FIRST, (void* handle), (handle), noexcept)
VLAKE_PINNED(char*, dlerror, VLAKE_GLIBC_FIRST, (), (), noexcept)
VLAKE_PINNED(void*, dlvsym, VLAKE_GLIBC_FIRST, (void* handle, const char* name, const char* version),
             (handle, name, version), noexcept)
VLAKE_PINNED(int, dladdr, VLAKE_GLIBC_FIRST, (const void* address, Dl_info* info), (address, info), noexcept)
VLAKE_PINNED(int, dladdr1, VLAKE_GLIBC_2_3_3, (const void* address, Dl_info* info, void** extra, int flags),
             (address, info, extra, flags), noexcept)

// Threads: in libpthread.so.0 before glibc 2.34 (pthread_sigmask before 2.32), in libc since.
// pthread_join and pthread_once are cancellation points (no __THROW): they may unwind.
VLAKE_PINNED(int, pthread_create, VLAKE_GLIBC_FIRST,
             (pthread_t * thread, const pthread_attr_t* attr, void* (*start)(void*), void* arg),
             (thread, attr, start, arg), noexcept)
VLAKE_PINNED(int, pthread_join, VLAKE_GLIBC_FIRST, (pthread_t thread, void** result), (thread, result))
VLAKE_PINNED(int, pthread_detach, VLAKE_GLIBC_FIRST, (pthread_t thread), (thread), noexcept)
VLAKE_PINNED(int, pthread_once, VLAKE_GLIBC_FIRST, (pthread_once_t * once, void (*init)()), (once, init))
VLAKE_PINNED(int, pthread_key_create, VLAKE_GLIBC_FIRST, (pthread_key_t * key, void (*destructor)(void*)),
             (key, destructor), noexcept)
// libstdc++'s gthreads test this one (weakly) to learn whether threads are available.
VLAKE_PINNED(int, __pthread_key_create, VLAKE_GLIBC_FIRST, (pthread_key_t * key, void (*destructor)(void*)),
             (key, destructor), noexcept)
VLAKE_PINNED(int, pthread_key_delete, VLAKE_GLIBC_FIRST, (pthread_key_t key), (key), noexcept)
VLAKE_PINNED(void*, pthread_getspecific, VLAKE_GLIBC_FIRST, (pthread_key_t key), (key), noexcept)
// glibc declares pthread_setspecific access(none, 2): GCC then takes `value` for unread memory
// and warns when it is handed on to a function declared without that attribute.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
VLAKE_PINNED(int, pthread_setspecific, VLAKE_GLIBC_FIRST, (pthread_key_t key, const void* value), (key, value),
             noexcept)
#pragma GCC diagnostic pop
VLAKE_PINNED(int, pthread_mutex_trylock, VLAKE_GLIBC_FIRST, (pthread_mutex_t * mutex), (mutex), noexcept)
VLAKE_PINNED(int, pthread_sigmask, VLAKE_GLIBC_FIRST, (int how, const sigset_t* set, sigset_t* old), (how, set, old),
             noexcept)
VLAKE_PINNED(int, pthread_setname_np, VLAKE_GLIBC_2_12, (pthread_t thread, const char* name), (thread, name), noexcept)

#if defined(__x86_64__)
// memcpy@GLIBC_2.14 differs from the first one only for overlapping buffers, which memcpy does
// not allow: the first is memmove. Written out because GCC's built-in declaration of memcpy
// refuses a visibility attribute; -fvisibility=hidden and the version script keep it local.
extern "C" void* vlake_glibc_memcpy(void* dest, const void* src, size_t n) noexcept;
__asm__(".symver vlake_glibc_memcpy,memcpy@" VLAKE_GLIBC_FIRST);
extern "C" void* memcpy(void* dest, const void* src, size_t n) noexcept { return vlake_glibc_memcpy(dest, src, n); }
#endif

// glibc 2.38 and newer headers turn strtol, sscanf and their kin into __isoc23_* functions
// (version GLIBC_2.38: they also read C23's 0b prefix) in C++, and the static libstdc++ of such a
// system calls them too. Defined here as the first versions, which the hook never needs the 0b
// prefix of; on older build systems nothing refers to them.
#define VLAKE_ISOC23(ret, name, params, args)                                \
  extern "C" ret vlake_glibc_c99_##name params noexcept;                     \
  __asm__(".symver vlake_glibc_c99_" #name "," #name "@" VLAKE_GLIBC_FIRST); \
  extern "C" VLAKE_HIDDEN ret __isoc23_##name params noexcept { return vlake_glibc_c99_##name args; }
VLAKE_ISOC23(long, strtol, (const char* s, char** end, int base), (s, end, base))
VLAKE_ISOC23(unsigned long, strtoul, (const char* s, char** end, int base), (s, end, base))
VLAKE_ISOC23(long long, strtoll, (const char* s, char** end, int base), (s, end, base))
VLAKE_ISOC23(unsigned long long, strtoull, (const char* s, char** end, int base), (s, end, base))
VLAKE_ISOC23(int, vsscanf, (const char* s, const char* format, va_list ap), (s, format, ap))
extern "C" VLAKE_HIDDEN int __isoc23_sscanf(const char* s, const char* format, ...) noexcept {
  va_list ap;
  va_start(ap, format);
  const int n = vlake_glibc_c99_vsscanf(s, format, ap);
  va_end(ap);
  return n;
}

namespace {

// A glibc function the running glibc may lack: looked up once with dlvsym (RTLD_DEFAULT finds
// glibc's, never the hidden definitions here); null where it is missing. Constant-initialized,
// so usable before any constructor has run; concurrent first calls look it up twice, harmlessly.
template <class Fn>
class RuntimeSymbol {
 public:
  constexpr RuntimeSymbol(const char* name, const char* version) noexcept : name_(name), version_(version) {}
  Fn get() noexcept {
    if (!resolved_.load(std::memory_order_acquire)) {
      fn_.store(reinterpret_cast<Fn>(::dlvsym(RTLD_DEFAULT, name_, version_)), std::memory_order_relaxed);
      resolved_.store(true, std::memory_order_release);
    }
    return fn_.load(std::memory_order_relaxed);
  }

 private:
  const char* name_;
  const char* version_;
  std::atomic<Fn> fn_{nullptr};
  std::atomic<bool> resolved_{false};
};

using ClockwaitFn = int (*)(pthread_cond_t*, pthread_mutex_t*, clockid_t, const timespec*);
RuntimeSymbol<ClockwaitFn> g_clockwait{"pthread_cond_clockwait", "GLIBC_2.30"};

#ifdef DLFO_STRUCT_HAS_EH_DBASE
using FindObjectFn = int (*)(void*, dl_find_object*) noexcept;
RuntimeSymbol<FindObjectFn> g_find_object{"_dl_find_object", "GLIBC_2.35"};
#endif

// Looks both up when the library is loaded, so that the unwinder's first _dl_find_object call
// does not take the loader's lock.
__attribute__((constructor)) void resolve_optional_functions() {
  (void)g_clockwait.get();
#ifdef DLFO_STRUCT_HAS_EH_DBASE
  (void)g_find_object.get();
#endif
}

}  // namespace

#if __GLIBC_PREREQ(2, 30)
// Not in glibc before 2.30: the system call.
extern "C" VLAKE_HIDDEN pid_t gettid() noexcept { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Not in glibc before 2.30 (std::condition_variable's waits on steady_clock call it).
extern "C" VLAKE_HIDDEN int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex, clockid_t clock,
                                                   const timespec* abstime) {
  if (const ClockwaitFn real = g_clockwait.get()) return real(cond, mutex, clock, abstime);
  return vlake::hook::glibc_floor::cond_clockwait_by_timedwait(cond, mutex, clock, abstime);
}
#endif

#if __GLIBC_PREREQ(2, 25)
// Not in glibc before 2.25 (std::random_device, in the static libstdc++).
extern "C" VLAKE_HIDDEN int getentropy(void* buffer, size_t length) {
  if (length > 256) {
    errno = EIO;
    return -1;
  }
  return vlake::hook::glibc_floor::fill_random(buffer, length);
}
#endif

#if __GLIBC_PREREQ(2, 36)
// Not in glibc before 2.36 (std::random_device). As glibc's, it cannot fail: no entropy aborts.
extern "C" VLAKE_HIDDEN uint32_t arc4random() noexcept {
  uint32_t value = 0;
  if (vlake::hook::glibc_floor::fill_random(&value, sizeof value) != 0) ::abort();
  return value;
}
#endif

#if __GLIBC_PREREQ(2, 32)
// Not in glibc before 2.32; libstdc++'s inline code reads it to skip atomic operations in a
// process that has never had a second thread. 0: never skip (always correct).
extern "C" {
VLAKE_HIDDEN char __libc_single_threaded = 0;
}
#endif

#ifdef DLFO_STRUCT_HAS_EH_DBASE
// Not in glibc before 2.35; the static libgcc unwinder finds unwind tables with it.
extern "C" VLAKE_HIDDEN int _dl_find_object(void* address, dl_find_object* result) noexcept {
  if (const FindObjectFn real = g_find_object.get()) return real(address, result);
  return vlake::hook::glibc_floor::find_object_by_phdr(address, result);
}
#endif
