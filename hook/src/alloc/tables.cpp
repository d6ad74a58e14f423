#include "tables.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace vlake::hook {

// ---- AllocTable ---------------------------------------------------------------------------------

void AllocTable::insert(LogicalAlloc a) {
  std::lock_guard lock(mu_);
  const std::uint64_t base = a.base;
  by_base_.insert_or_assign(base, std::move(a));
}

namespace {

LogicalAlloc without_handles(const LogicalAlloc& a) {
  LogicalAlloc out;
  out.base = a.base;
  out.reserved = a.reserved;
  out.mapped = a.mapped;
  out.ptr = a.ptr;
  out.requested = a.requested;
  out.grant_id = a.grant_id;
  out.device = a.device;
  out.created = a.created;
  out.peers = a.peers;
  return out;
}

template <class Map>
auto containing(Map& m, std::uint64_t addr) -> decltype(m.begin()) {
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return m.end();
  --it;
  if (addr - it->second.base >= it->second.reserved) return m.end();
  return it;
}

}  // namespace

std::optional<LogicalAlloc> AllocTable::take(std::uint64_t ptr) {
  std::lock_guard lock(mu_);
  auto it = containing(by_base_, ptr);
  if (it == by_base_.end() || it->second.ptr != ptr) return std::nullopt;
  LogicalAlloc a = std::move(it->second);
  by_base_.erase(it);
  return a;
}

std::optional<std::uint32_t> AllocTable::set_peers(std::uint64_t base, std::uint32_t peers) {
  std::lock_guard lock(mu_);
  auto it = by_base_.find(base);
  if (it == by_base_.end()) return std::nullopt;
  return std::exchange(it->second.peers, peers);
}

std::vector<LogicalAlloc> AllocTable::retag(int device, std::uint32_t peers) {
  std::lock_guard lock(mu_);
  std::vector<LogicalAlloc> out;
  for (auto& [base, a] : by_base_) {
    if (a.device != device || a.peers == peers) continue;
    out.push_back(without_handles(a));
    a.peers = peers;
  }
  return out;
}

std::optional<LogicalAlloc> AllocTable::find(std::uint64_t addr) const {
  std::lock_guard lock(mu_);
  auto it = containing(by_base_, addr);
  if (it == by_base_.end()) return std::nullopt;
  return without_handles(it->second);
}

std::optional<LogicalAlloc> AllocTable::find_grant(std::uint64_t grant_id) const {
  std::lock_guard lock(mu_);
  for (const auto& [base, a] : by_base_) {
    if (a.grant_id == grant_id) return a;
  }
  return std::nullopt;
}

bool AllocTable::replace_handles(std::uint64_t base, std::uint64_t grant_id, std::vector<std::uint64_t> handles,
                                 bool on_host) {
  std::lock_guard lock(mu_);
  auto it = by_base_.find(base);
  if (it == by_base_.end() || it->second.grant_id != grant_id) return false;
  it->second.handles = std::move(handles);
  it->second.on_host = on_host;
  return true;
}

std::vector<CUcontext> AllocTable::contexts() const {
  std::lock_guard lock(mu_);
  std::vector<CUcontext> out;
  for (const auto& [base, a] : by_base_) {
    if (a.ctx != nullptr && std::find(out.begin(), out.end(), a.ctx) == out.end()) out.push_back(a.ctx);
  }
  return out;
}

std::size_t AllocTable::size() const {
  std::lock_guard lock(mu_);
  return by_base_.size();
}

std::size_t AllocTable::count(int device) const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto& [base, a] : by_base_) n += a.device == device ? 1 : 0;
  return n;
}

std::vector<LogicalAlloc> AllocTable::newest(int device, std::size_t n) const {
  std::vector<LogicalAlloc> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& [base, a] : by_base_) {
      if (a.device == device) out.push_back(without_handles(a));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const LogicalAlloc& x, const LogicalAlloc& y) { return x.created > y.created; });
  if (out.size() > n) out.resize(n);
  return out;
}

void AllocTable::clear_after_fork() noexcept { clear_and_unlock(by_base_); }

// ---- CreateTable --------------------------------------------------------------------------------

void CreateTable::add(std::uint64_t handle, std::uint64_t grant_id, std::uint64_t size, const CUmemAllocationProp& prop,
                      UniqueFd fd) {
  std::lock_guard lock(mu_);
  Grant g;
  g.handle = handle;
  g.size = size;
  g.prop = prop;
  g.refs = 1;
  g.fd = std::move(fd);
  grants_.insert_or_assign(grant_id, std::move(g));
  live_[handle] = grant_id;
}

void CreateTable::add_counted(std::uint64_t handle, std::uint64_t grant_id, std::uint64_t size) {
  std::lock_guard lock(mu_);
  Grant g;
  g.handle = handle;
  g.size = size;
  g.refs = 1;
  g.counted = true;
  grants_.insert_or_assign(grant_id, std::move(g));
  live_[handle] = grant_id;
}

bool CreateTable::owns(std::uint64_t handle) const {
  std::lock_guard lock(mu_);
  return live_.count(handle) != 0;
}

bool CreateTable::serves(std::uint64_t handle) const {
  std::lock_guard lock(mu_);
  auto live = live_.find(handle);
  return live != live_.end() && !grants_.at(live->second).counted;
}

std::optional<FinishedGrant> CreateTable::finish_if_done(std::uint64_t grant_id) {
  auto it = grants_.find(grant_id);
  if (it == grants_.end() || it->second.refs > 0 || it->second.mappings > 0) return std::nullopt;
  FinishedGrant f{grant_id, it->second.exported};
  grants_.erase(it);  // closes the kept descriptor
  return f;
}

std::optional<FinishedGrant> CreateTable::released(std::uint64_t handle, bool& ours) {
  std::lock_guard lock(mu_);
  auto live = live_.find(handle);
  ours = live != live_.end();
  if (!ours) return std::nullopt;
  const std::uint64_t grant_id = live->second;
  Grant& g = grants_.at(grant_id);
  if (--g.refs <= 0) {
    g.refs = 0;
    live_.erase(live);
  }
  return finish_if_done(grant_id);
}

void CreateTable::mapped(std::uint64_t va, std::uint64_t size, std::uint64_t handle) {
  std::lock_guard lock(mu_);
  auto live = live_.find(handle);
  if (live == live_.end()) return;
  ++grants_.at(live->second).mappings;
  mappings_.insert_or_assign(va, Mapping{size, live->second});
}

std::vector<FinishedGrant> CreateTable::unmapped(std::uint64_t va, std::uint64_t size) {
  std::lock_guard lock(mu_);
  std::vector<std::uint64_t> touched;
  const std::uint64_t end = va + size < va ? UINT64_MAX : va + size;
  for (auto it = mappings_.lower_bound(va); it != mappings_.end() && it->first < end;) {
    auto g = grants_.find(it->second.grant_id);
    if (g != grants_.end()) {
      --g->second.mappings;
      touched.push_back(it->second.grant_id);
    }
    it = mappings_.erase(it);
  }
  std::vector<FinishedGrant> done;
  for (std::uint64_t id : touched) {
    if (auto f = finish_if_done(id)) done.push_back(*f);
  }
  return done;
}

bool CreateTable::retained(std::uint64_t addr, std::uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = mappings_.upper_bound(addr);
  if (it == mappings_.begin()) return false;
  --it;
  if (addr - it->first >= it->second.size) return false;
  auto g = grants_.find(it->second.grant_id);
  if (g == grants_.end() || g->second.handle != handle) return false;
  if (g->second.refs++ == 0) live_[handle] = g->first;
  return true;
}

bool CreateTable::add_reference(std::uint64_t handle) {
  std::lock_guard lock(mu_);
  auto live = live_.find(handle);
  if (live == live_.end()) return false;
  ++grants_.at(live->second).refs;
  return true;
}

std::optional<int> CreateTable::export_fd(std::uint64_t handle) {
  std::lock_guard lock(mu_);
  auto live = live_.find(handle);
  if (live == live_.end()) return std::nullopt;
  Grant& g = grants_.at(live->second);
  if (!g.fd) {
    errno = EBADF;
    return -1;
  }
  const int fd = ::dup(g.fd.get());
  if (fd >= 0) g.exported = true;
  return fd;
}

std::optional<CUmemAllocationProp> CreateTable::props(std::uint64_t handle) const {
  std::lock_guard lock(mu_);
  auto live = live_.find(handle);
  if (live == live_.end() || grants_.at(live->second).counted) return std::nullopt;
  return grants_.at(live->second).prop;
}

std::size_t CreateTable::grants() const { return locked_size(grants_); }

void CreateTable::clear_after_fork() noexcept { clear_and_unlock(grants_, live_, mappings_); }

// ---- ManagedTable -------------------------------------------------------------------------------

void ManagedTable::insert(std::uint64_t ptr, std::uint64_t grant_id) {
  std::lock_guard lock(mu_);
  grants_.insert_or_assign(ptr, grant_id);
}

std::optional<std::uint64_t> ManagedTable::take(std::uint64_t ptr) {
  std::lock_guard lock(mu_);
  auto it = grants_.find(ptr);
  if (it == grants_.end()) return std::nullopt;
  const std::uint64_t id = it->second;
  grants_.erase(it);
  return id;
}

void ManagedTable::clear_after_fork() noexcept { clear_and_unlock(grants_); }

}  // namespace vlake::hook
