#include "vlake/ctl/state_source.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "vlake/common/proc.hpp"
#include "vlake/common/unique_fd.hpp"

namespace vlake::ctl {

namespace st = vlake::state;

namespace {

std::string prefix(const std::string& name) {
  return "cannot read vlaked state '" + name + "' (" + st::segment_path(name) + "): ";
}

std::string user_name(uid_t uid) {
  if (const passwd* p = ::getpwuid(uid)) return p->pw_name;
  return std::to_string(uid);
}

std::string group_name(gid_t gid) {
  if (const group* g = ::getgrgid(gid)) return g->gr_name;
  return std::to_string(gid);
}

std::string mode_string(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

[[noreturn]] void permission_denied(const std::string& name, const std::string& path) {
  std::string detail;
  struct stat sb {};
  std::string group;
  if (::stat(path.c_str(), &sb) == 0) {
    group = group_name(sb.st_gid);
    detail = " (mode " + mode_string(sb.st_mode) + ", owner " + user_name(sb.st_uid) + ", group " + group + ")";
  }
  std::string how = "run as root";
  if (!group.empty() && (sb.st_mode & S_IRGRP) != 0) how += " or as a member of group '" + group + "'";
  throw StateAccessError(StateAccessError::Kind::permission,
                         prefix(name) + "permission denied" + detail + " — vlakectl only needs read access: " + how +
                             ", or have the operator make the segment readable to you (see 'Unprivileged use' in "
                             "docs/vlakectl.md)");
}

void check_header(const std::string& name) {
  const std::string path = st::segment_path(name);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    const int e = errno;
    if (e == ENOENT) {
      throw StateAccessError(StateAccessError::Kind::missing,
                             prefix(name) + "no such segment — is vlaked running? (--state " + name + ")");
    }
    if (e == EACCES || e == EPERM) permission_denied(name, path);
    throw StateAccessError(StateAccessError::Kind::other, prefix(name) + std::strerror(e));
  }
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0) {
    throw StateAccessError(StateAccessError::Kind::other, prefix(name) + std::strerror(errno));
  }
  const auto size = static_cast<std::uint64_t>(sb.st_size);
  st::Header h{};
  if (size < sizeof h || ::pread(fd.get(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
    throw StateAccessError(StateAccessError::Kind::layout,
                           prefix(name) + "only " + std::to_string(size) +
                               " bytes, not a vlake state segment (is vlaked still starting?)");
  }
  if (h.magic != st::kMagic) {
    throw StateAccessError(StateAccessError::Kind::layout,
                           prefix(name) + "not a vlake state segment (bad magic; is vlaked still starting?)");
  }
  if (h.layout_version != st::kLayoutVersion || h.header_bytes != sizeof(st::Header) ||
      h.total_bytes != sizeof(st::State) || size != sizeof(st::State)) {
    throw StateAccessError(StateAccessError::Kind::layout,
                           prefix(name) + "the segment has layout version " + std::to_string(h.layout_version) + " (" +
                               std::to_string(size) + " bytes); this vlakectl reads layout version " +
                               std::to_string(st::kLayoutVersion) + " (" + std::to_string(sizeof(st::State)) +
                               " bytes) — use the vlakectl built with the running vlaked");
  }
}

}  // namespace

StateSource::StateSource(const std::string& name) : name_(name) {
  check_header(name);
  try {
    reader_ = std::make_unique<st::StateReader>(name);
  } catch (const st::StateError& e) {
    // Raced with the daemon (removed or recreated between the check and the mapping).
    throw StateAccessError(StateAccessError::Kind::other, prefix(name) + e.what());
  }
}

StateSource::~StateSource() = default;

std::unique_ptr<st::State> StateSource::snapshot() const {
  try {
    return reader_->snapshot();
  } catch (const st::StateError& e) {
    throw StateAccessError(StateAccessError::Kind::other, prefix(name_) + e.what());
  }
}

bool process_alive(std::uint32_t pid, std::uint64_t start_time) {
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  if (start_time == 0) return true;
  const std::uint64_t now = process_start_time(pid);
  return now == 0 || now == start_time;  // 0: cannot tell (no /proc): trust kill()
}

}  // namespace vlake::ctl
