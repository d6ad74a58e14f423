#include "vlake/pool/holder_scan.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>

namespace vlake::pool {

namespace {

struct Target {
  dev_t dev = 0;
  ino_t ino = 0;
  dev_t rdev = 0;
  bool valid = false;
};

bool parse_number(const char* s, long& out) {
  if (*s < '0' || *s > '9') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtol(s, &end, 10);
  return errno == 0 && end != nullptr && *end == '\0';
}

struct DirCloser {
  void operator()(DIR* d) const noexcept { ::closedir(d); }
};

}  // namespace

std::vector<std::uint32_t> scan_holders(const std::vector<int>& fds, HolderScanStats* stats) {
  std::vector<std::uint32_t> holders(fds.size(), 0);
  std::vector<Target> mine(fds.size());
  bool any = false;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    struct stat st {};
    if (fds[i] >= 0 && ::fstat(fds[i], &st) == 0) {
      mine[i] = Target{st.st_dev, st.st_ino, st.st_rdev, true};
      any = true;
    }
  }
  if (!any) return holders;
  const pid_t self = ::getpid();
  std::unique_ptr<DIR, DirCloser> proc(::opendir("/proc"));
  if (!proc) return holders;
  std::vector<bool> held_by_this(fds.size());
  while (const dirent* e = ::readdir(proc.get())) {
    long pid = 0;
    if (!parse_number(e->d_name, pid) || pid == self || pid <= 0) continue;
    const std::string dir = std::string("/proc/") + e->d_name + "/fd";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      if ((errno == EACCES || errno == EPERM) && stats != nullptr) stats->fd_dir_denied = true;
      continue;  // gone, a kernel thread, or not ours to read
    }
    std::unique_ptr<DIR, DirCloser> fdir(::fdopendir(dfd));
    if (!fdir) {
      ::close(dfd);
      continue;
    }
    if (stats != nullptr) ++stats->processes;
    held_by_this.assign(fds.size(), false);
    while (const dirent* f = ::readdir(fdir.get())) {
      long theirs = 0;
      if (!parse_number(f->d_name, theirs)) continue;
      struct stat st {};
      if (::fstatat(::dirfd(fdir.get()), f->d_name, &st, 0) != 0) continue;  // closed meanwhile
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (!mine[i].valid || held_by_this[i] || mine[i].dev != st.st_dev || mine[i].ino != st.st_ino ||
            mine[i].rdev != st.st_rdev) {
          continue;
        }
        if (stats != nullptr) ++stats->candidates;
        const long r = ::syscall(SYS_kcmp, self, static_cast<pid_t>(pid), KCMP_FILE, fds[i], theirs);
        if (r == 0) {
          held_by_this[i] = true;
        } else if (r < 0 && (errno == EPERM || errno == EACCES || errno == ENOSYS)) {
          held_by_this[i] = true;  // cannot rule it out
          if (stats != nullptr) stats->kcmp_denied = true;
        }
        // r > 0: another description; ESRCH/EBADF: gone meanwhile
      }
    }
    for (std::size_t i = 0; i < fds.size(); ++i) holders[i] += held_by_this[i] ? 1 : 0;
  }
  return holders;
}

HolderScan make_holder_scan(const Logger& log) {
  auto warned = std::make_shared<std::pair<bool, bool>>(false, false);
  return [&log, warned](const std::vector<int>& fds) {
    HolderScanStats stats;
    std::vector<std::uint32_t> out = scan_holders(fds, &stats);
    if (stats.kcmp_denied && !warned->first) {
      warned->first = true;
      log.warn(
          "holder scan: kcmp(KCMP_FILE) refused; descriptors it could not check count as held (run vlaked as "
          "root with kcmp available)");
    }
    if (stats.fd_dir_denied && !warned->second) {
      warned->second = true;
      log.warn(
          "holder scan: some processes' descriptor tables are unreadable; descriptors they hold are not seen (run "
          "vlaked as root)");
    }
    return out;
  };
}

}  // namespace vlake::pool
