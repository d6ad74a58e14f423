// The hook's glibc floor: libvlake-hook.so loads on glibc 2.17 and newer (docs/hook.md, "Old
// images"), wherever it was built.
//
// How
// - libstdc++ and libgcc are linked in statically (hook/CMakeLists.txt), so the library needs no
//   GLIBCXX_*, CXXABI_* or GCC_* symbol version; the version script keeps all of their symbols
//   local.
// - glibc_floor.cpp defines, hidden inside the library, every glibc function or variable that the
//   hook's code or the static libstdc++/libgcc reference under a version newer than 2.17:
//   * functions that older glibc has under an older version (pthread_*, dl*: moved into libc at
//     2.34; memcpy: 2.14 on x86-64) forward to that older version, bound with `.symver`;
//   * functions that glibc 2.17 lacks (gettid, getentropy, arc4random, pthread_cond_clockwait,
//     _dl_find_object) use glibc's own where the running glibc has it (looked up with dlvsym)
//     and otherwise the fallbacks below;
//   * __libc_single_threaded is a hidden variable that always says "maybe multi-threaded", so
//     libstdc++'s inline reference counting always uses atomic operations.
//   Every reference inside the library binds to these definitions at link time; none is exported.
// - libdl.so.2 and libpthread.so.0 stay NEEDED: before glibc 2.34 the dl* and most pthread_*
//   functions live there (on newer glibc they are empty libraries that still exist).
// - tests/hook/test_exports.cpp reads the built library (readelf) and fails on any required
//   version above the floor, any GLIBCXX/CXXABI/GCC version and any NEEDED library outside glibc.
//
// The fallbacks (glibc_fallback.cpp) are plain functions with their own names, compiled into the
// unit tests as well. None throws; none allocates.
#pragma once

#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#include <cstddef>

namespace vlake::hook::glibc_floor {

// Fills [buffer, buffer + length) with random bytes from the kernel: getrandom(2), or
// /dev/urandom where the kernel lacks getrandom. Returns 0, or -1 with errno set (nothing
// guaranteed about the buffer then). Retries interrupted and partial reads.
int fill_random(void* buffer, std::size_t length) noexcept;

// pthread_cond_clockwait() over pthread_cond_timedwait() for glibc < 2.30, where the condition
// variable measures time on CLOCK_REALTIME (the default attribute; std::condition_variable's).
// CLOCK_REALTIME waits as given; CLOCK_MONOTONIC is converted to the realtime instant as far from
// now as `abstime` is from the monotonic now (a realtime clock step during the wait moves the
// deadline: callers that re-check their own clock, as libstdc++ does, wait again). Other clocks
// and tv_nsec outside [0, 1e9): EINVAL without waiting. Returns 0, ETIMEDOUT or the error of
// pthread_cond_timedwait; `mutex` (locked by the caller) is held on return in every case.
int cond_clockwait_by_timedwait(pthread_cond_t* cond, pthread_mutex_t* mutex, clockid_t clock, const timespec* abstime);

#ifdef DLFO_STRUCT_HAS_EH_DBASE
// _dl_find_object() over dl_iterate_phdr() and dladdr1() for glibc < 2.35 (what the static
// libgcc unwinder of GCC 12+ calls to find a frame's unwind tables): for the loaded object whose
// PT_LOAD segments contain `address`, fills map_start/map_end (the lowest and highest address of
// those segments), eh_frame (its PT_GNU_EH_FRAME, null without one), link_map and flags 0, and
// returns 0; -1 when no loaded object contains the address.
int find_object_by_phdr(void* address, dl_find_object* result) noexcept;
#endif

}  // namespace vlake::hook::glibc_floor
