// Logger::is_journal_stream (log.hpp): apart from log.cpp, which the hook compiles in: fstat
// would raise the hook's glibc floor (GLIBC_2.33), and the hook never makes a Logger.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "vlake/common/log.hpp"

namespace vlake {

bool Logger::is_journal_stream(int fd) noexcept {
  const int saved = errno;
  const char* v = std::getenv("JOURNAL_STREAM");
  struct stat st {};
  bool yes = false;
  if (v != nullptr && ::fstat(fd, &st) == 0) {
    unsigned long long dev = 0;
    unsigned long long ino = 0;
    if (std::sscanf(v, "%llu:%llu", &dev, &ino) == 2) {
      yes = dev == static_cast<unsigned long long>(st.st_dev) && ino == static_cast<unsigned long long>(st.st_ino);
    }
  }
  errno = saved;
  return yes;
}

}  // namespace vlake
