#include "vlake/common/proc.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace vlake {

std::optional<ProcStat> read_proc_stat(std::uint32_t pid) noexcept {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%u/stat", static_cast<unsigned>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  // The command name (field 2) is at most 16 bytes, so the first 22 fields fit easily.
  char buf[1024];
  ssize_t n = -1;
  do {
    n = ::read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may contain spaces and ')'
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') return std::nullopt;
  p += 2;
  ProcStat s;
  s.state = *p;
  // Field 3 is the state; field 22 is the start time: skip 19 more separators.
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return std::nullopt;
    ++p;
  }
  if (*p < '0' || *p > '9') return std::nullopt;
  for (; *p >= '0' && *p <= '9'; ++p) s.start_time = s.start_time * 10 + static_cast<std::uint64_t>(*p - '0');
  return s;
}

std::uint64_t process_start_time(std::uint32_t pid) noexcept {
  const std::optional<ProcStat> s = read_proc_stat(pid);
  return s ? s->start_time : 0;
}

void mkdir_p(const std::string& dir, mode_t mode) {
  if (dir.empty()) return;
  struct stat sb {};
  if (::stat(dir.c_str(), &sb) == 0) return;
  const auto slash =
      dir.find_last_not_of('/') == std::string::npos ? std::string::npos : dir.rfind('/', dir.find_last_not_of('/'));
  if (slash != std::string::npos && slash > 0) mkdir_p(dir.substr(0, slash), mode);
  if (::mkdir(dir.c_str(), mode) != 0) {
    if (errno == EEXIST) return;  // created meanwhile by someone else: theirs, left alone
    throw std::system_error(errno, std::generic_category(), "mkdir " + dir);
  }
  if (::chmod(dir.c_str(), mode) != 0) throw std::system_error(errno, std::generic_category(), "chmod " + dir);
}

}  // namespace vlake
