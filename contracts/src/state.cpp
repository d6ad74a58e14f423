#include "vlake/contracts/state.hpp"

#include <sys/file.h>
#include <sys/stat.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace bip = boost::interprocess;

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

std::string segment_path(const std::string& name) { return "/dev/shm/" + name; }

namespace {
// The pid recorded by the daemon that holds a segment, for the error message (0 if unknown).
std::uint32_t peek_daemon_pid(const bip::shared_memory_object& shm) {
  try {
    bip::mapped_region r(shm, bip::read_only, 0, sizeof(Header));
    const auto* h = static_cast<const Header*>(r.get_address());
    return h->magic == kMagic ? h->daemon_pid : 0;
  } catch (const bip::interprocess_exception&) {
    return 0;
  }
}
}  // namespace

StateSegment::StateSegment(const std::string& name, unsigned mode, long gid) : name_(name) {
  try {
    try {
      shm_ = std::make_unique<bip::shared_memory_object>(bip::create_only, name.c_str(), bip::read_write,
                                                         bip::permissions(0644));
      origin_ = Origin::created;
    } catch (const bip::interprocess_exception& e) {
      if (e.get_error_code() != bip::already_exists_error) throw;
      shm_ = std::make_unique<bip::shared_memory_object>(bip::open_only, name.c_str(), bip::read_write);
      origin_ = Origin::resumed;
    }
    // One writer per segment, before anything is touched: a second daemon (other socket, same
    // --state) must not reset or write a live segment.
    const int fd = shm_->get_mapping_handle().handle;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      throw StateError("state segment " + segment_path(name) + " is in use by another vlaked (pid " +
                       std::to_string(peek_daemon_pid(*shm_)) + "); give this daemon its own --state");
    }
    if (::fchmod(fd, static_cast<mode_t>(mode)) != 0 ||
        (gid >= 0 && ::fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0)) {
      throw StateError("cannot set mode/group of state segment " + segment_path(name) + ": " + std::strerror(errno));
    }
    bip::offset_t size = 0;
    if (!shm_->get_size(size)) size = 0;
    if (origin_ == Origin::resumed && size == 0) origin_ = Origin::created;  // died while creating
    if (origin_ == Origin::created) shm_->truncate(static_cast<bip::offset_t>(sizeof(State)));
    region_ = std::make_unique<bip::mapped_region>(*shm_, bip::read_write);
    if (origin_ == Origin::resumed) check_existing(name, region_->get_address(), region_->get_size());
  } catch (const bip::interprocess_exception& e) {
    throw StateError("cannot open state segment " + segment_path(name) + ": " + e.what());
  }
  state_ = static_cast<State*>(region_->get_address());
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

StateSegment::~StateSegment() = default;

void StateSegment::remove() noexcept { bip::shared_memory_object::remove(name_.c_str()); }

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
  try {
    shm_ = std::make_unique<bip::shared_memory_object>(bip::open_only, name.c_str(), bip::read_only);
    region_ = std::make_unique<bip::mapped_region>(*shm_, bip::read_only);
  } catch (const bip::interprocess_exception& e) {
    throw StateError("cannot open state segment " + segment_path(name) + ": " + e.what());
  }
  check_existing(name, region_->get_address(), region_->get_size());
  state_ = static_cast<const State*>(region_->get_address());
}

StateReader::~StateReader() = default;

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

}  // namespace vlake::state
