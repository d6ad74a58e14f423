#include "vlake/contracts/allocation.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <system_error>

#include "vlake/common/excerpt.hpp"
#include "vlake/common/proc.hpp"

namespace vlake::alloc {
namespace {

std::map<std::string, std::string> parse_kv(const std::string& text, const std::string& what) {
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw FormatError(what + ":" + std::to_string(n) + ": expected key=value, got '" + excerpt(line) + "'");
    }
    kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  auto v = kv.find("version");
  if (v == kv.end()) throw FormatError(what + ": no version");
  if (v->second != std::to_string(kFormatVersion)) {
    throw FormatError(what + ": unsupported version '" + excerpt(v->second) + "' (expected " +
                      std::to_string(kFormatVersion) + ")");
  }
  return kv;
}

const std::string& need(const std::map<std::string, std::string>& kv, const char* key, const std::string& what) {
  auto it = kv.find(key);
  if (it == kv.end() || it->second.empty()) throw FormatError(what + ": missing " + key);
  return it->second;
}

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 19) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// <root>/records: created with its parents (0755); an existing one is kept.
void mkdir_records(const std::string& dir) { mkdir_p(dir, 0755); }

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

std::uint32_t fnv1a32(std::string_view s) {
  std::uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

}  // namespace

bool valid_id(std::string_view id) noexcept {
  if (id.size() != 16) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string new_id() {
  std::uint8_t b[8];
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t r = ::getrandom(b + got, sizeof b - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "getrandom");
    }
    got += static_cast<std::size_t>(r);
  }
  char out[17];
  for (std::size_t i = 0; i < sizeof b; ++i) std::snprintf(out + 2 * i, 3, "%02x", b[i]);
  return std::string(out, 16);
}

std::string format_allocation(const Allocation& a) {
  std::string ids;
  for (const auto& d : a.device_ids) ids += (ids.empty() ? "" : ",") + d;
  return "version=" + std::to_string(kFormatVersion) + "\nid=" + a.id + "\ngpu_uuid=" + a.gpu_uuid +
         "\ndevice_ids=" + ids + "\nbytes=" + std::to_string(a.bytes.value()) +
         "\ncreated=" + std::to_string(a.created) + "\n";
}

Allocation parse_allocation(const std::string& text, const std::string& what) {
  const auto kv = parse_kv(text, what);
  Allocation a;
  a.id = need(kv, "id", what);
  if (!valid_id(a.id)) throw FormatError(what + ": bad id '" + excerpt(a.id) + "'");
  a.gpu_uuid = need(kv, "gpu_uuid", what);
  if (a.gpu_uuid.rfind("GPU-", 0) != 0 || !Uuid::parse(a.gpu_uuid)) {
    throw FormatError(what + ": bad gpu_uuid '" + excerpt(a.gpu_uuid) + "'");
  }
  const std::string& ids = need(kv, "device_ids", what);
  std::size_t start = 0;
  while (start <= ids.size()) {
    const auto comma = ids.find(',', start);
    const std::string one = ids.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!one.empty()) a.device_ids.push_back(one);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const std::string& bytes = need(kv, "bytes", what);
  if (!all_digits(bytes)) throw FormatError(what + ": bad bytes '" + excerpt(bytes) + "'");
  a.bytes = Bytes{std::stoull(bytes)};
  auto c = kv.find("created");
  if (c != kv.end() && all_digits(c->second)) a.created = std::stoll(c->second);
  return a;
}

std::string format_owner(const Owner& o) {
  return "version=" + std::to_string(kFormatVersion) + "\nnamespace=" + o.ns + "\npod=" + o.pod +
         "\ncontainer=" + o.container + "\n";
}

Owner parse_owner(const std::string& text, const std::string& what) {
  const auto kv = parse_kv(text, what);
  Owner o{need(kv, "namespace", what), need(kv, "pod", what), need(kv, "container", what)};
  for (const std::string* s : {&o.ns, &o.pod, &o.container}) {
    if (s->find('/') != std::string::npos) throw FormatError(what + ": '/' in '" + excerpt(*s) + "'");
  }
  return o;
}

std::optional<std::pair<std::string, std::uint32_t>> split_device_id(std::string_view id) {
  const auto sep = id.rfind("::");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  const std::string_view n = id.substr(sep + 2);
  if (!all_digits(n) || n.size() > 9) return std::nullopt;
  return std::make_pair(std::string(id.substr(0, sep)), static_cast<std::uint32_t>(std::stoul(std::string(n))));
}

std::string device_id(const std::string& gpu_uuid, std::uint32_t n) { return gpu_uuid + "::" + std::to_string(n); }

std::string tenant_name(const std::string& id, const std::optional<Owner>& owner) {
  if (!owner) return "alloc:" + id;
  std::string name = "pod:" + owner->ns + "/" + owner->pod + "/" + owner->container;
  if (name.size() <= kMaxTenantName) return name;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "~%08x", fnv1a32(name));
  const std::size_t fixed = 4 + owner->ns.size() + 1 + 1 + owner->container.size() + 9;
  std::string pod = owner->pod;
  if (fixed < kMaxTenantName) {
    pod = pod.substr(0, kMaxTenantName - fixed) + suffix;
    return "pod:" + owner->ns + "/" + pod + "/" + owner->container;
  }
  return (name.substr(0, kMaxTenantName - 9) + suffix);
}

std::optional<Owner> owner_from_tenant_name(std::string_view name) {
  if (name.substr(0, 4) != "pod:") return std::nullopt;
  name.remove_prefix(4);
  const auto a = name.find('/');
  if (a == std::string_view::npos) return std::nullopt;
  const auto b = name.find('/', a + 1);
  if (b == std::string_view::npos) return std::nullopt;
  return Owner{std::string(name.substr(0, a)), std::string(name.substr(a + 1, b - a - 1)),
               std::string(name.substr(b + 1))};
}

std::optional<std::string> read_bounded(const std::string& path, std::size_t cap) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    if (errno == ELOOP) throw FormatError(path + ": a symbolic link, not a regular file");
    throw FormatError(path + ": cannot open: " + std::strerror(errno));
  }
  const FdCloser closer{fd};
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) throw FormatError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(sb.st_mode)) throw FormatError(path + ": not a regular file");
  if (sb.st_size < 0 || static_cast<std::uint64_t>(sb.st_size) > cap) {
    throw FormatError(path + ": " + std::to_string(sb.st_size) + " bytes, more than the " + std::to_string(cap) +
                      " allowed");
  }
  // The size may change under us: read at most cap + 1 bytes and refuse a file that grew.
  std::string out(cap + 1, '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw FormatError(path + ": cannot read: " + std::strerror(errno));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  if (got > cap) throw FormatError(path + ": more than the " + std::to_string(cap) + " bytes allowed");
  out.resize(got);
  return out;
}

std::string records_dir(const std::string& root) { return root + "/" + kRecordsDir; }
std::string allocation_record_name(const std::string& id) { return id + "." + kAllocationFile; }
std::string owner_record_name(const std::string& id) { return id + "." + kOwnerFile; }

std::optional<Allocation> read_allocation_record(const std::string& root, const std::string& id) {
  const std::string path = records_dir(root) + "/" + allocation_record_name(id);
  auto text = read_bounded(path);
  if (!text) return std::nullopt;
  Allocation a = parse_allocation(*text, path);
  if (a.id != id) throw FormatError(path + ": names allocation '" + a.id + "'");
  return a;
}

std::optional<Owner> read_owner_record(const std::string& root, const std::string& id) {
  const std::string path = records_dir(root) + "/" + owner_record_name(id);
  auto text = read_bounded(path);
  if (!text) return std::nullopt;
  return parse_owner(*text, path);
}

void write_allocation_record(const std::string& root, const Allocation& a) {
  const std::string dir = records_dir(root);
  mkdir_records(dir);
  write_file_atomic(dir, allocation_record_name(a.id), format_allocation(a));
}

void write_owner_record(const std::string& root, const std::string& id, const Owner& o) {
  const std::string dir = records_dir(root);
  mkdir_records(dir);
  write_file_atomic(dir, owner_record_name(id), format_owner(o));
}

bool remove_records(const std::string& root, const std::string& id) {
  bool ok = true;
  int err = 0;
  for (const std::string& name : {allocation_record_name(id), owner_record_name(id)}) {
    if (::unlink((records_dir(root) + "/" + name).c_str()) != 0 && errno != ENOENT) {
      ok = false;
      err = errno;
    }
  }
  if (!ok) errno = err;
  return ok;
}

std::optional<Allocation> read_allocation(const std::string& dir) {
  const std::string path = dir + "/" + kAllocationFile;
  auto text = read_bounded(path);
  if (!text) return std::nullopt;
  return parse_allocation(*text, path);
}

std::optional<Owner> read_owner(const std::string& dir) {
  const std::string path = dir + "/" + kOwnerFile;
  auto text = read_bounded(path);
  if (!text) return std::nullopt;
  return parse_owner(*text, path);
}

void write_file_atomic(const std::string& dir, const std::string& name, const std::string& content) {
  const std::string tmp = dir + "/." + name + ".tmp";
  const std::string dst = dir + "/" + name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + tmp);
  std::size_t off = 0;
  while (off < content.size()) {
    const ssize_t w = ::write(fd, content.data() + off, content.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::system_error(e, std::generic_category(), "write " + tmp);
    }
    off += static_cast<std::size_t>(w);
  }
  ::fchmod(fd, 0644);
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw std::system_error(e, std::generic_category(), "rename " + tmp + " -> " + dst);
  }
}

bool remove_tree(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return errno == ENOENT;
  bool ok = true;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    const std::string p = dir + "/" + n;
    struct stat sb {};
    if (::lstat(p.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) {
      ok = remove_tree(p) && ok;
    } else if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
      ok = false;
    }
  }
  ::closedir(d);
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) ok = false;
  return ok;
}

}  // namespace vlake::alloc
