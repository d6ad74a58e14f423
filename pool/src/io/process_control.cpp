#include "process_control.hpp"

#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vlake/common/proc.hpp"
#include "vlake/common/unique_fd.hpp"

namespace vlake::pool {

int pidfd_open(std::uint32_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0)); }

bool kill_process(std::uint32_t pid, std::uint64_t start_time) {
  UniqueFd fd(pidfd_open(pid));
  if (!fd || process_start_time(pid) != start_time) return false;
  return ::syscall(SYS_pidfd_send_signal, fd.get(), SIGKILL, nullptr, 0) == 0;
}

bool pidfd_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

std::vector<gid_t> supplementary_groups(uid_t uid, gid_t gid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* res = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &res) != 0 || res == nullptr) return {gid};
  int n = 64;
  std::vector<gid_t> groups(static_cast<std::size_t>(n));
  for (int attempt = 0; attempt < 4; ++attempt) {
    int count = n;
    if (::getgrouplist(pw.pw_name, gid, groups.data(), &count) >= 0) {
      groups.resize(static_cast<std::size_t>(count));
      return groups;
    }
    n = count + 16;
    groups.resize(static_cast<std::size_t>(n));
  }
  return {gid};
}

}  // namespace vlake::pool
