// Fallbacks for glibc functions newer than the hook's floor (glibc_floor.hpp).
#include "glibc_floor.hpp"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace vlake::hook::glibc_floor {

namespace {

constexpr long kNanosPerSecond = 1'000'000'000;

int read_urandom(unsigned char* out, std::size_t length) noexcept {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  while (length > 0) {
    const ssize_t n = ::read(fd, out, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = n == 0 ? EIO : errno;
      ::close(fd);
      errno = saved;
      return -1;
    }
    out += n;
    length -= static_cast<std::size_t>(n);
  }
  ::close(fd);
  return 0;
}

}  // namespace

int fill_random(void* buffer, std::size_t length) noexcept {
  auto* out = static_cast<unsigned char*>(buffer);
  while (length > 0) {
    const long n = ::syscall(SYS_getrandom, out, length, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ENOSYS) return read_urandom(out, length);  // kernel before 3.17
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return -1;
    }
    out += n;
    length -= static_cast<std::size_t>(n);
  }
  return 0;
}

int cond_clockwait_by_timedwait(pthread_cond_t* cond, pthread_mutex_t* mutex, clockid_t clock,
                                const timespec* abstime) {
  if (abstime->tv_nsec < 0 || abstime->tv_nsec >= kNanosPerSecond) return EINVAL;
  if (clock == CLOCK_REALTIME) return ::pthread_cond_timedwait(cond, mutex, abstime);
  if (clock != CLOCK_MONOTONIC) return EINVAL;
  timespec mono{};
  timespec real{};
  ::clock_gettime(CLOCK_MONOTONIC, &mono);
  ::clock_gettime(CLOCK_REALTIME, &real);
  // realtime deadline = realtime now + (abstime - monotonic now), normalized.
  long long sec = static_cast<long long>(real.tv_sec) + (static_cast<long long>(abstime->tv_sec) - mono.tv_sec);
  long long nsec = static_cast<long long>(real.tv_nsec) + (abstime->tv_nsec - mono.tv_nsec);
  while (nsec < 0) {
    nsec += kNanosPerSecond;
    --sec;
  }
  while (nsec >= kNanosPerSecond) {
    nsec -= kNanosPerSecond;
    ++sec;
  }
  if (sec < 0) {  // long past: the epoch is as good a deadline
    sec = 0;
    nsec = 0;
  }
  timespec deadline{};
  deadline.tv_sec = static_cast<time_t>(sec);
  deadline.tv_nsec = static_cast<long>(nsec);
  return ::pthread_cond_timedwait(cond, mutex, &deadline);
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE
#if DLFO_STRUCT_HAS_EH_DBASE || DLFO_STRUCT_HAS_EH_COUNT
#error "find_object_by_phdr fills neither dlfo_eh_dbase nor dlfo_eh_count (x86-64 and AArch64 have neither)"
#endif
namespace {

struct Search {
  std::uintptr_t address = 0;
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  void* eh_frame = nullptr;
  bool found = false;
};

int visit(dl_phdr_info* info, std::size_t, void* arg) noexcept {
  auto* s = static_cast<Search*>(arg);
  std::uintptr_t start = UINTPTR_MAX;
  std::uintptr_t end = 0;
  bool contains = false;
  void* eh_frame = nullptr;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD) {
      const std::uintptr_t hi = lo + ph.p_memsz;
      if (lo < start) start = lo;
      if (hi > end) end = hi;
      if (s->address >= lo && s->address < hi) contains = true;
    } else if (ph.p_type == PT_GNU_EH_FRAME) {
      eh_frame = reinterpret_cast<void*>(lo);
    }
  }
  if (!contains) return 0;
  s->start = start;
  s->end = end;
  s->eh_frame = eh_frame;
  s->found = true;
  return 1;  // stop
}

}  // namespace

int find_object_by_phdr(void* address, dl_find_object* result) noexcept {
  Search s;
  s.address = reinterpret_cast<std::uintptr_t>(address);
  ::dl_iterate_phdr(&visit, &s);
  if (!s.found) return -1;
  Dl_info info{};
  void* map = nullptr;
  if (::dladdr1(address, &info, &map, RTLD_DL_LINKMAP) == 0) map = nullptr;
  *result = dl_find_object{};
  result->dlfo_flags = 0;
  result->dlfo_map_start = reinterpret_cast<void*>(s.start);
  result->dlfo_map_end = reinterpret_cast<void*>(s.end);
  result->dlfo_link_map = static_cast<link_map*>(map);
  result->dlfo_eh_frame = s.eh_frame;
  return 0;
}
#endif

}  // namespace vlake::hook::glibc_floor
