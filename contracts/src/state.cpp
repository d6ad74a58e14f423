#include "vlake/contracts/state.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vlake/common/unique_fd.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace vlake::state {

namespace {

std::string reset_hint(const std::string& name) {
  return "; if no tenant process holds GPU memory from vlake, stop vlaked and remove " + segment_path(name) +
         " (or start with another --state) to reset";
}

void check_existing(const std::string& name, const void* base, std::size_t size) {
  if (size < sizeof(Header)) {
    throw StateError("state segment " + segment_path(name) + " is " + std::to_string(size) +
                     " bytes, too small to be a vlake state segment" + reset_hint(name));
  }
  Header h;
  std::memcpy(&h, base, sizeof h);
  if (h.magic != kMagic) {
    throw StateError("state segment " + segment_path(name) + " is not a vlake state segment (bad magic)" +
                     reset_hint(name));
  }
  if (h.layout_version != kLayoutVersion || h.header_bytes != sizeof(Header) || h.total_bytes != sizeof(State) ||
      size != sizeof(State)) {
    throw StateError("state segment " + segment_path(name) + " has layout version " + std::to_string(h.layout_version) +
                     " (" + std::to_string(size) + " bytes); this vlaked uses layout version " +
                     std::to_string(kLayoutVersion) + " (" + std::to_string(sizeof(State)) + " bytes)" +
                     reset_hint(name));
  }
}

std::uint64_t load_generation(const State* s) noexcept {
  return __atomic_load_n(&s->header.generation, __ATOMIC_ACQUIRE);
}

}  // namespace

std::string state_dir() {
  const char* e = std::getenv(kStateDirEnv);
  return e != nullptr && *e != '\0' ? std::string(e) : std::string(kDefaultStateDir);
}

std::string check_state_spec(const std::string& spec) {
  if (spec.empty()) return "an empty state name";
  if (spec[0] == '/') {
    if (spec.size() > 4000) return "a state path of more than 4000 characters";
    if (spec.back() == '/') return "'" + spec + "' names a directory, not a file";
    return "";
  }
  if (spec.find('/') != std::string::npos) {
    return "'" + spec + "' is neither a name (no '/') nor an absolute path";
  }
  if (spec.size() > 200) return "a state name of more than 200 characters";
  if (spec == "." || spec == "..") return "'" + spec + "' is not a file name";
  return "";
}

std::string segment_path(const std::string& spec) {
  if (!spec.empty() && spec[0] == '/') return spec;
  std::string dir = state_dir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir == "/" ? "/" + spec : dir + "/" + spec;
}

namespace {

std::string octal(unsigned mode);

// The directory a segment path is in ("/" for "/x").
std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

std::string unsafe_dir(const std::string& dir, const std::string& what, const std::string& fix) {
  return "state directory " + dir + " is unsafe: " + what +
         ", so another local user could create, replace or plant the state segment there; " + fix +
         ", or use the default " + kDefaultStateDir + " (--state NAME, $" + kStateDirEnv + ")";
}

}  // namespace

void check_state_dir(const std::string& dir, unsigned owner) {
  if (dir.empty() || dir[0] != '/') throw StateError("state directory '" + dir + "' is not an absolute path");
  char* resolved = ::realpath(dir.c_str(), nullptr);
  if (resolved == nullptr) {
    throw StateError("cannot use state directory " + dir + ": " + std::strerror(errno));
  }
  const std::string real(resolved);
  std::free(resolved);
  // "/", "/run", "/run/vlake", ...: every directory whose owner could rename what is below it.
  std::vector<std::string> chain{"/"};
  for (std::size_t i = 1; i <= real.size(); ++i) {
    if (i == real.size() || real[i] == '/') {
      if (i > 1) chain.push_back(real.substr(0, i));
    }
  }
  for (std::size_t i = 0; i < chain.size(); ++i) {
    const std::string& p = chain[i];
    const bool last = i + 1 == chain.size();
    struct stat sb {};
    if (::lstat(p.c_str(), &sb) != 0) throw StateError("cannot stat " + p + ": " + std::strerror(errno));
    if (!S_ISDIR(sb.st_mode)) throw StateError("state directory " + dir + ": " + p + " is not a directory");
    if (sb.st_uid != 0 && sb.st_uid != owner) {
      throw StateError(unsafe_dir(
          dir, p + " is owned by uid " + std::to_string(sb.st_uid) + ", neither root nor uid " + std::to_string(owner),
          "give it to root (chown root " + p + ")"));
    }
    const bool others_write = (sb.st_mode & 022) != 0;
    if (others_write && (last || (sb.st_mode & S_ISVTX) == 0)) {
      throw StateError(unsafe_dir(dir, p + " has mode " + octal(sb.st_mode) + " (group or others may write it)",
                                  "remove that write permission (chmod go-w " + p + ")"));
    }
  }
}

void prepare_state_dir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') throw StateError("state directory '" + dir + "' is not an absolute path");
  // mkdir -p, 0755 whatever the umask (readers such as vlakectl must reach the file).
  for (std::size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    const std::string p = dir.substr(0, i);
    if (::mkdir(p.c_str(), 0755) == 0) {
      if (::chmod(p.c_str(), 0755) != 0) {
        throw StateError("cannot set mode 0755 on state directory " + p + ": " + std::strerror(errno));
      }
    } else if (errno != EEXIST) {
      throw StateError("cannot create state directory " + p + ": " + std::strerror(errno));
    }
  }
  check_state_dir(dir, static_cast<unsigned>(::geteuid()));
}

namespace {

// The pid recorded by the daemon that holds a segment, for the error message (0 if unknown).
std::uint32_t peek_daemon_pid(int fd) {
  Header h{};
  if (::pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return 0;
  return h.magic == kMagic ? h.daemon_pid : 0;
}

std::string octal(unsigned mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777u);
  return buf;
}

// An existing segment is resumed only when nobody but this daemon's user can have written it:
// a regular file, owned by the effective uid, without group/other write permission, with no
// second name. Anything else may be a file a local user planted (and still maps writable).
void check_trusted(const std::string& name, int fd) {
  const std::string path = segment_path(name);
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) throw StateError("cannot stat state segment " + path + ": " + std::strerror(errno));
  const std::string untrusted =
      "; vlaked only resumes a segment it created. If no tenant process holds GPU memory from vlake, stop vlaked, "
      "remove " +
      path + " and start it again (or start with another --state)";
  if (!S_ISREG(sb.st_mode)) throw StateError("state segment " + path + " is not a regular file" + untrusted);
  if (sb.st_uid != ::geteuid()) {
    throw StateError("state segment " + path + " is owned by uid " + std::to_string(sb.st_uid) +
                     ", not by vlaked's uid " + std::to_string(::geteuid()) +
                     ": another user created it and may hold a writable mapping of it" + untrusted);
  }
  if ((sb.st_mode & 022) != 0) {
    throw StateError("state segment " + path + " has mode " + octal(sb.st_mode) +
                     ": group or others may write it, and a process that opened it may still hold a writable "
                     "mapping" +
                     untrusted);
  }
  if (sb.st_nlink != 1) {
    throw StateError("state segment " + path + " has " + std::to_string(sb.st_nlink) +
                     " hard links: another name reaches the same memory" + untrusted);
  }
}

}  // namespace

StateSegment::StateSegment(const std::string& name, unsigned mode, long gid) : name_(name) {
  if (const std::string bad = check_state_spec(name); !bad.empty()) throw StateError("--state: " + bad);
  const std::string path = segment_path(name);
  prepare_state_dir(parent_of(path));
  if (mode > 0777 || (mode & 0600) != 0600 || (mode & 022) != 0) {
    throw StateError("state segment mode " + octal(mode) + " must give the owner read-write and nobody else write");
  }
  // Create exclusively: a name that already exists (a file, a symlink, a FIFO) is never
  // created through; it is opened without following a symlink and checked before use.
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  origin_ = Origin::created;
  if (!fd) {
    if (errno != EEXIST) throw StateError("cannot create state segment " + path + ": " + std::strerror(errno));
    fd.reset(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd) {
      if (errno == ELOOP) {
        throw StateError("state segment " + path +
                         " is a symbolic link; vlaked never follows one there. Remove the link (rm " + path +
                         ") and start vlaked again");
      }
      throw StateError("cannot open state segment " + path + ": " + std::strerror(errno) +
                       "; remove it when no tenant process holds GPU memory from vlake");
    }
    origin_ = Origin::resumed;
    check_trusted(name, fd.get());
  }
  // One writer per segment, before anything is touched: a second daemon (other socket, same
  // --state) must not reset or write a live segment.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    throw StateError("state segment " + path + " is in use by another vlaked (pid " +
                     std::to_string(peek_daemon_pid(fd.get())) + "); give this daemon its own --state");
  }
  // The configured mode and group, on creation (whatever the umask) and on resume.
  if (::fchmod(fd.get(), static_cast<mode_t>(mode)) != 0 ||
      (gid >= 0 && ::fchown(fd.get(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0)) {
    throw StateError("cannot set mode/group of state segment " + path + ": " + std::strerror(errno));
  }
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0) throw StateError("cannot stat state segment " + path + ": " + std::strerror(errno));
  if (origin_ == Origin::resumed && sb.st_size == 0) origin_ = Origin::created;  // died while creating
  std::size_t size = static_cast<std::size_t>(sb.st_size);
  if (origin_ == Origin::created) {
    if (::ftruncate(fd.get(), static_cast<off_t>(sizeof(State))) != 0) {
      throw StateError("cannot size state segment " + path + ": " + std::strerror(errno));
    }
    size = sizeof(State);
  } else if (size < sizeof(Header)) {
    check_existing(name, nullptr, size);  // throws: too small
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) throw StateError("cannot map state segment " + path + ": " + std::strerror(errno));
  base_ = base;
  mapped_ = size;
  fd_ = fd.release();
  try {
    if (origin_ == Origin::resumed) check_existing(name, base_, mapped_);
  } catch (...) {
    release();
    throw;
  }
  state_ = static_cast<State*>(base_);
  if (origin_ == Origin::created) {
    std::memset(static_cast<void*>(state_), 0, sizeof(State));
    Header& h = state_->header;
    h.layout_version = kLayoutVersion;
    h.header_bytes = sizeof(Header);
    h.total_bytes = sizeof(State);
    h.next_session_id = 1;
    h.next_grant_id = 1;
    h.max_tenants = kMaxTenants;
    h.max_sessions = kMaxSessions;
    h.max_grants = kMaxGrants;
    h.max_devices = kMaxDevices;
    h.max_namespaces = kMaxNamespaces;
    // The magic goes last: a reader never sees a half-initialized segment as valid.
    __atomic_store_n(&h.magic, kMagic, __ATOMIC_RELEASE);
  } else if ((state_->header.generation & 1) != 0) {
    // The previous daemon died inside a write bracket; its record edits are individually
    // complete (single thread, each field written once), so just close the bracket.
    ++state_->header.generation;
  }
}

void StateSegment::release() noexcept {
  if (base_ != nullptr) ::munmap(base_, mapped_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  mapped_ = 0;
  fd_ = -1;
  state_ = nullptr;
}

StateSegment::~StateSegment() { release(); }

void StateSegment::remove() noexcept { ::unlink(segment_path(name_).c_str()); }

StateSegment::Write::Write(StateSegment& s) noexcept : s_(s) {
  if (s_.depth_++ == 0) {
    std::uint64_t* g = &s_.state_->header.generation;
    __atomic_store_n(g, __atomic_load_n(g, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
  }
}

StateSegment::Write::~Write() {
  if (--s_.depth_ == 0) {
    std::uint64_t* g = &s_.state_->header.generation;
    __atomic_store_n(g, __atomic_load_n(g, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
  }
}

StateReader::StateReader(const std::string& name) {
  if (const std::string bad = check_state_spec(name); !bad.empty()) throw StateError("--state: " + bad);
  const std::string path = segment_path(name);
  const std::string dir = parent_of(path);
  struct stat db {};
  if (::stat(dir.c_str(), &db) != 0) {
    throw StateError("cannot open state segment " + path + ": " + dir + ": " + std::strerror(errno));
  }
  // Whoever owns a directory nobody else can write in is who wrote the segment.
  check_state_dir(dir, static_cast<unsigned>(db.st_uid));
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) throw StateError("cannot open state segment " + path + ": " + std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0) throw StateError("cannot stat state segment " + path + ": " + std::strerror(errno));
  if (!S_ISREG(sb.st_mode)) throw StateError("state segment " + path + " is not a regular file");
  if (sb.st_uid != db.st_uid && sb.st_uid != 0) {
    throw StateError("state segment " + path + " is owned by uid " + std::to_string(sb.st_uid) +
                     ", not by the owner of " + dir + " (uid " + std::to_string(db.st_uid) + ") or root");
  }
  if ((sb.st_mode & 022) != 0) {
    throw StateError("state segment " + path + " has mode " + octal(sb.st_mode) + ": group or others may write it");
  }
  const auto size = static_cast<std::size_t>(sb.st_size);
  if (size < sizeof(Header)) check_existing(name, nullptr, size);  // throws: too small
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) throw StateError("cannot map state segment " + path + ": " + std::strerror(errno));
  base_ = base;
  mapped_ = size;
  try {
    check_existing(name, base_, mapped_);
  } catch (...) {
    ::munmap(base, size);
    throw;
  }
  state_ = static_cast<const State*>(base_);
}

StateReader::~StateReader() {
  if (base_ != nullptr) ::munmap(const_cast<void*>(base_), mapped_);
}

std::unique_ptr<State> StateReader::snapshot() const {
  auto out = std::make_unique<State>();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (unsigned spin = 0;; ++spin) {
    const std::uint64_t g1 = load_generation(state_);
    if ((g1 & 1) == 0) {
      std::memcpy(static_cast<void*>(out.get()), static_cast<const void*>(state_), sizeof(State));
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (__atomic_load_n(&state_->header.generation, __ATOMIC_RELAXED) == g1) return out;
    }
    if (spin > 64) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw StateError("state segment: no consistent snapshot within 1 s (writer stuck?)");
      }
      std::this_thread::yield();
    }
  }
}

const char* refusal_reason_name(std::uint32_t reason) noexcept {
  static constexpr const char* kNames[kRefusalReasons] = {"tenant_limit",  "namespace_limit", "guarantee",
                                                          "out_of_memory", "limit_reached",   "unknown_device",
                                                          "internal",      "restore_timeout"};
  return reason >= 1 && reason <= kRefusalReasons ? kNames[reason - 1] : "unknown";
}

const char* over_reason_name(std::uint32_t reason) noexcept {
  switch (reason) {
    case kOverLowered: return "limit_lowered";
    case kOverContexts: return "contexts";
    case kOverOutside: return "outside_vlake";
    default: return "";
  }
}

namespace {

template <typename Record, std::size_t N>
std::vector<const Record*> in_seq_order(const Record (&ring)[N]) {
  std::vector<const Record*> out;
  out.reserve(N);
  for (const Record& r : ring) {
    if (r.seq != 0) out.push_back(&r);
  }
  std::sort(out.begin(), out.end(), [](const Record* a, const Record* b) { return a->seq < b->seq; });
  return out;
}

}  // namespace

std::vector<const GuardEventRecord*> ring_order(const GuardLog& log) { return in_seq_order(log.events); }
std::vector<const RefusalRecord*> ring_order(const RefusalLog& log) { return in_seq_order(log.refusals); }

}  // namespace vlake::state
