#include "vlake/pool/features/contexts/context_book.hpp"

namespace vlake::pool {

Bytes ContextBook::size(DeviceOrdinal d) const {
  if (fixed_) return *fixed_;
  if (auto it = daemon_.find(d.value()); it != daemon_.end()) return it->second;
  return fallback_;
}

const char* ContextBook::source(DeviceOrdinal d) const {
  if (fixed_) return "fixed";
  if (daemon_.count(d.value()) != 0) return "daemon";
  return "default";
}

void ContextBook::admit(std::uint64_t session, TenantId t, DeviceOrdinal d) {
  Entry& e = entries_[{session, d.value()}];
  e.tenant = t;
  ++e.contexts;
}

bool ContextBook::release(std::uint64_t session, DeviceOrdinal d) {
  auto it = entries_.find({session, d.value()});
  if (it == entries_.end() || it->second.contexts == 0) return false;
  if (--it->second.contexts == 0) entries_.erase(it);
  return true;
}

std::optional<TenantId> ContextBook::forget(std::uint64_t session) {
  std::optional<TenantId> t;
  for (auto it = entries_.lower_bound({session, INT32_MIN}); it != entries_.end() && it->first.first == session;) {
    t = it->second.tenant;
    it = entries_.erase(it);
  }
  return t;
}

void ContextBook::move(std::uint64_t session, TenantId to) {
  for (auto it = entries_.lower_bound({session, INT32_MIN}); it != entries_.end() && it->first.first == session; ++it) {
    it->second.tenant = to;
  }
}

std::uint32_t ContextBook::contexts(std::uint64_t session, DeviceOrdinal d) const {
  auto it = entries_.find({session, d.value()});
  return it == entries_.end() ? 0 : it->second.contexts;
}

std::uint32_t ContextBook::contexts_of(TenantId t, DeviceOrdinal d) const {
  std::uint32_t n = 0;
  for (const auto& [key, e] : entries_) {
    if (key.second == d.value() && e.tenant == t) n += e.contexts;
  }
  return n;
}

void ContextBook::observe(std::uint64_t session, DeviceOrdinal d, bool listed, Bytes figure) {
  auto it = entries_.find({session, d.value()});
  if (it == entries_.end()) return;
  it->second.figure = listed ? figure : Bytes{0};
}

void ContextBook::observe_daemon(DeviceOrdinal d, Bytes context) {
  // The least seen: a handle being built off the loop shows in NVML before the pool counts it.
  const auto [it, fresh] = daemon_.emplace(d.value(), context);
  if (!fresh && context < it->second) it->second = context;
}

void ContextBook::measured(TenantId t, DeviceOrdinal d, Bytes nonpool) { nonpool_[{t.value(), d.value()}] = nonpool; }

Bytes ContextBook::extra(TenantId t, DeviceOrdinal d) const {
  const std::uint64_t per = size(d).value();
  std::uint64_t sum = 0;
  for (const auto& [key, e] : entries_) {
    if (key.second != d.value() || e.tenant != t) continue;
    const std::uint64_t admitted = per * e.contexts;
    if (admitted > e.figure.value()) sum += admitted - e.figure.value();
  }
  return Bytes{sum};
}

Bytes ContextBook::charge(TenantId t, DeviceOrdinal d) const {
  auto it = nonpool_.find({t.value(), d.value()});
  return (it == nonpool_.end() ? Bytes{0} : it->second) + extra(t, d);
}

}  // namespace vlake::pool
