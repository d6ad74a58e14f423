#include "vlake/pool/proc_identity.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "vlake/common/proc.hpp"
#include "vlake/contracts/allocation.hpp"

namespace vlake::pool {

namespace {

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t i = s.find(sep, start);
    out.push_back(s.substr(start, i == std::string_view::npos ? std::string_view::npos : i - start));
    if (i == std::string_view::npos) return out;
    start = i + 1;
  }
}

bool uuid_like(std::string_view s) {
  if (s.size() != 36) return false;
  for (char c : s) {
    if (!(std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_')) return false;
  }
  return true;
}

}  // namespace

std::optional<std::pair<std::uint32_t, std::uint32_t>> parse_status_ids(std::string_view status) {
  std::optional<std::uint32_t> uid, gid;
  for (std::string_view line : split(status, '\n')) {
    const bool u = line.starts_with("Uid:");
    if (!u && !line.starts_with("Gid:")) continue;
    // "Uid:\treal\teffective\tsaved\tfs"
    std::istringstream in{std::string(line.substr(4))};
    unsigned long real = 0, effective = 0;
    if (!(in >> real >> effective)) return std::nullopt;
    (u ? uid : gid) = static_cast<std::uint32_t>(effective);
  }
  if (!uid || !gid) return std::nullopt;
  return std::make_pair(*uid, *gid);
}

std::string pod_uid_from_cgroup(std::string_view cgroup) {
  for (std::string_view line : split(cgroup, '\n')) {
    for (std::string_view part : split(line, '/')) {
      std::string_view cand;
      if (part.starts_with("pod")) {
        cand = part.substr(3);  // cgroupfs: pod<uid>
      } else if (const std::size_t i = part.rfind("-pod"); i != std::string_view::npos && part.ends_with(".slice")) {
        cand = part.substr(i + 4, part.size() - i - 4 - 6);  // systemd: kubepods-<qos>-pod<uid>.slice
      }
      if (!uuid_like(cand)) continue;
      std::string out(cand);
      for (char& c : out) c = c == '_' ? '-' : c;
      return out;
    }
  }
  return {};
}

std::vector<std::string> alloc_ids_from_mountinfo(std::string_view mountinfo) {
  std::vector<std::string> ids;
  for (std::string_view line : split(mountinfo, '\n')) {
    // "<id> <parent> <major:minor> <root> <mount point> ...": the root is the mounted path.
    const std::vector<std::string_view> f = split(line, ' ');
    if (f.size() < 5) continue;
    const std::vector<std::string_view> parts = split(f[3], '/');
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (!alloc::valid_id(parts[i])) continue;
      const bool last = i + 1 == parts.size();
      const bool file =
          i + 2 == parts.size() && (parts[i + 1] == alloc::kPreloadFile || parts[i + 1] == alloc::kSocketFile);
      if (!last && !file) continue;
      const std::string id(parts[i]);
      bool seen = false;
      for (const std::string& x : ids) seen = seen || x == id;
      if (!seen) ids.push_back(id);
    }
  }
  return ids;
}

std::optional<ProcessIdentity> read_process_identity(std::uint32_t pid, bool kubernetes) noexcept {
  try {
    const std::string dir = "/proc/" + std::to_string(pid);
    ProcessIdentity id;
    id.pid = pid;
    id.start_time = process_start_time(pid);
    if (id.start_time == 0) return std::nullopt;
    const std::optional<std::string> status = slurp(dir + "/status");
    if (!status) return std::nullopt;
    const auto ids = parse_status_ids(*status);
    if (!ids) return std::nullopt;
    id.uid = ids->first;
    id.gid = ids->second;
    if (kubernetes) {
      if (const auto cg = slurp(dir + "/cgroup")) id.pod_uid = pod_uid_from_cgroup(*cg);
      if (const auto mi = slurp(dir + "/mountinfo")) id.alloc_ids = alloc_ids_from_mountinfo(*mi);
    }
    // The pid may have been reused while we read: the start time must still match.
    if (process_start_time(pid) != id.start_time) return std::nullopt;
    return id;
  } catch (...) {
    return std::nullopt;
  }
}

bool matches_device_file(std::string_view target, const std::vector<std::string>& files) {
  constexpr std::string_view kDeleted = " (deleted)";
  if (target.ends_with(kDeleted)) target.remove_suffix(kDeleted.size());
  for (const std::string& f : files) {
    if (f.empty()) continue;
    if (f.back() == '*') {
      if (target.starts_with(std::string_view(f).substr(0, f.size() - 1))) return true;
    } else if (target == f) {
      return true;
    }
  }
  return false;
}

namespace {

// True if a line of /proc/<pid>/maps maps a file that matches `files` (the path is the last
// field; anonymous mappings have none).
bool maps_device_file(const std::string& maps_path, const std::vector<std::string>& files) {
  std::ifstream in(maps_path);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    if (matches_device_file(std::string_view(line).substr(slash), files)) return true;
  }
  return false;
}

// True if one of the process's descriptors refers to a file that matches `files`.
bool holds_device_file(const std::string& fd_dir, const std::vector<std::string>& files) {
  DIR* fds = ::opendir(fd_dir.c_str());
  if (fds == nullptr) return false;  // gone, or not ours to read
  bool found = false;
  while (const dirent* f = ::readdir(fds)) {
    if (f->d_name[0] == '.') continue;
    char buf[512];
    const ssize_t n = ::readlink((fd_dir + "/" + f->d_name).c_str(), buf, sizeof buf);
    if (n <= 0 || static_cast<std::size_t>(n) >= sizeof buf) continue;
    if (matches_device_file(std::string_view(buf, static_cast<std::size_t>(n)), files)) {
      found = true;
      break;
    }
  }
  ::closedir(fds);
  return found;
}

}  // namespace

std::vector<std::uint32_t> device_file_users(const std::vector<std::string>& files, std::uint32_t self) noexcept {
  std::vector<std::uint32_t> out;
  if (files.empty()) return out;
  try {
    // "map:<path>" entries are matched against the process's mappings, the others against its
    // descriptors.
    std::vector<std::string> mapped;
    std::vector<std::string> opened;
    for (const std::string& f : files) {
      if (f.rfind("map:", 0) == 0) mapped.push_back(f.substr(4));
      else opened.push_back(f);
    }
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return out;
    while (const dirent* e = ::readdir(proc)) {
      char* end = nullptr;
      const unsigned long pid = std::strtoul(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || pid == 0 || pid == self) continue;
      const std::string dir = "/proc/" + std::string(e->d_name);
      const bool found = (!opened.empty() && holds_device_file(dir + "/fd", opened)) ||
                         (!mapped.empty() && maps_device_file(dir + "/maps", mapped));
      if (found) out.push_back(static_cast<std::uint32_t>(pid));
    }
    ::closedir(proc);
    std::sort(out.begin(), out.end());
  } catch (...) {
    out.clear();
  }
  return out;
}

}  // namespace vlake::pool
