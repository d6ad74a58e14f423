#include "vlake/pool/accounting.hpp"

#include <algorithm>
#include <utility>

namespace vlake::pool {

const char* to_string(Refusal r) noexcept {
  switch (r) {
    case Refusal::none: return "none";
    case Refusal::tenant_limit: return "tenant limit";
    case Refusal::namespace_limit: return "namespace limit";
    case Refusal::guarantee: return "guarantee of other namespaces";
  }
  return "?";
}

namespace {

// a + b <= limit, without overflow.
bool fits(std::uint64_t held, std::uint64_t n, std::uint64_t limit) { return held <= limit && n <= limit - held; }

std::uint64_t borrowed(std::uint64_t held, std::uint64_t guaranteed) {
  return held > guaranteed ? held - guaranteed : 0;
}

}  // namespace

Accounting::Reservation& Accounting::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    rollback();
    owner_ = std::exchange(o.owner_, nullptr);
    tenant_ = o.tenant_;
    device_ = o.device_;
    bytes_ = o.bytes_;
  }
  return *this;
}

void Accounting::Reservation::commit() noexcept {
  if (owner_ == nullptr) return;
  owner_->finish(*this, true);
  owner_ = nullptr;
}

void Accounting::Reservation::rollback() noexcept {
  if (owner_ == nullptr) return;
  owner_->finish(*this, false);
  owner_ = nullptr;
}

Accounting::NamespaceUsage& Accounting::ns_locked(NamespaceId n, DeviceOrdinal d) {
  return ns_[NsKey{d.value(), n.value()}];
}

NamespaceId Accounting::ns_of_locked(TenantId t) const {
  auto it = tenant_ns_.find(t.value());
  return it == tenant_ns_.end() ? NamespaceId{0} : it->second;
}

void Accounting::set_limit(TenantId t, DeviceOrdinal d, Bytes limit) {
  std::lock_guard lock(mu_);
  map_[Key{t, d}].limit = limit;
}

void Accounting::set_capacity(DeviceOrdinal d, Bytes capacity) {
  std::lock_guard lock(mu_);
  capacity_[d.value()] = capacity;
}

void Accounting::set_namespace(NamespaceId n, DeviceOrdinal d, Bytes limit, Bytes guaranteed, bool overcommit) {
  std::lock_guard lock(mu_);
  NamespaceUsage& u = ns_locked(n, d);
  u.overcommit = overcommit;
  const bool regroup = (u.guaranteed.value() == 0) != (guaranteed.value() == 0);
  u.limit = limit;
  u.guaranteed = guaranteed;
  if (regroup && !chunks_.empty()) regroup_locked();
}

void Accounting::remove_namespace(NamespaceId n) {
  std::lock_guard lock(mu_);
  for (auto it = ns_.begin(); it != ns_.end();) {
    if (it->first.second == n.value()) it = ns_.erase(it);
    else ++it;
  }
  if (!chunks_.empty()) regroup_locked();
}

void Accounting::assign(TenantId t, NamespaceId n) {
  std::lock_guard lock(mu_);
  const NamespaceId old = ns_of_locked(t);
  if (old == n) {
    tenant_ns_[t.value()] = n;
    return;
  }
  for (const auto& [k, u] : map_) {
    if (k.t != t) continue;
    NamespaceUsage& from = ns_locked(old, k.d);
    NamespaceUsage& to = ns_locked(n, k.d);
    from.granted -= std::min(from.granted, u.granted);
    from.nonpool -= std::min(from.nonpool, u.nonpool);
    from.reserved -= std::min(from.reserved, u.reserved);
    from.unhooked -= std::min(from.unhooked, u.unhooked);
    from.retained -= std::min(from.retained, u.retained);
    to.retained += u.retained;
    to.granted += u.granted;
    to.nonpool += u.nonpool;
    to.unhooked += u.unhooked;
    to.reserved += u.reserved;
  }
  tenant_ns_[t.value()] = n;
  if (auto r = tenant_refs_.find(t.value()); r != tenant_refs_.end() && r->second != 0) regroup_locked();
}

bool Accounting::remove_tenant(TenantId t) {
  std::lock_guard lock(mu_);
  for (const auto& [k, u] : map_) {
    if (k.t == t && (u.used() + u.reserved).value() != 0) return false;
  }
  if (auto r = tenant_refs_.find(t.value()); r != tenant_refs_.end() && r->second != 0) return false;
  tenant_refs_.erase(t.value());
  for (auto it = map_.begin(); it != map_.end();) {
    if (it->first.t == t) it = map_.erase(it);
    else ++it;
  }
  tenant_ns_.erase(t.value());
  return true;
}

NamespaceId Accounting::namespace_of(TenantId t) const {
  std::lock_guard lock(mu_);
  return ns_of_locked(t);
}

std::optional<Accounting::Reservation> Accounting::reserve(TenantId t, DeviceOrdinal d, Bytes n, Usage* usage_out,
                                                           Refusal* why) {
  std::lock_guard lock(mu_);
  Usage& u = map_[Key{t, d}];
  if (usage_out != nullptr) *usage_out = u;
  auto refuse = [&](Refusal r) -> std::optional<Reservation> {
    if (why != nullptr) *why = r;
    return std::nullopt;
  };
  // 1. the tenant's limit
  const std::uint64_t held =
      u.granted.value() + u.nonpool.value() + u.unhooked.value() + u.retained.value() + u.reserved.value();
  if (!fits(held, n.value(), u.limit.value())) return refuse(Refusal::tenant_limit);
  // 2. its namespace's limit
  const NamespaceId nsid = ns_of_locked(t);
  NamespaceUsage& nu = ns_locked(nsid, d);
  const std::uint64_t ns_held = nu.held().value();
  if (!fits(ns_held, n.value(), nu.limit.value())) return refuse(Refusal::namespace_limit);
  // 3. guarantees of the other namespaces, counting physical bytes (shared chunks once per
  // saving group). A namespace with a guarantee that stays within it physically borrows
  // nothing more: no sums needed.
  const std::uint64_t own_physical = ns_held - std::min(ns_held, nu.dedup_saved.value());
  const bool within_guarantee = nu.guaranteed.value() != 0 && fits(own_physical, n.value(), nu.guaranteed.value());
  if (auto cap = capacity_.find(d.value()); cap != capacity_.end() && !within_guarantee && !nu.overcommit) {
    const std::uint64_t before = borrowed_locked(d, nsid, 0);
    const std::uint64_t after = borrowed_locked(d, nsid, n.value());
    if (after > before) {
      std::uint64_t sum_g = 0;
      for (auto it = ns_.lower_bound(NsKey{d.value(), 0}); it != ns_.end() && it->first.first == d.value(); ++it) {
        sum_g += it->second.guaranteed.value();
      }
      const std::uint64_t c = cap->second.value();
      const std::uint64_t unguaranteed = sum_g >= c ? 0 : c - sum_g;
      if (after > unguaranteed) return refuse(Refusal::guarantee);
    }
  }
  u.reserved += n;
  nu.reserved += n;
  if (why != nullptr) *why = Refusal::none;
  return Reservation(this, t, d, n);
}

void Accounting::finish(const Reservation& r, bool commit) noexcept {
  std::lock_guard lock(mu_);
  auto it = map_.find(Key{r.tenant_, r.device_});
  if (it == map_.end()) return;  // cannot happen: reserve() created it
  Usage& u = it->second;
  NamespaceUsage& nu = ns_locked(ns_of_locked(r.tenant_), r.device_);
  u.reserved -= r.bytes_;
  nu.reserved -= std::min(nu.reserved, r.bytes_);
  if (commit) {
    u.granted += r.bytes_;
    nu.granted += r.bytes_;
  }
}

bool Accounting::uncharge(TenantId t, DeviceOrdinal d, Bytes n, const std::vector<SharedRef>& refs) {
  std::lock_guard lock(mu_);
  Usage& u = map_[Key{t, d}];
  NamespaceUsage& nu = ns_locked(ns_of_locked(t), d);
  const Bytes take = std::min(u.granted, n);
  u.granted -= take;
  nu.granted -= std::min(nu.granted, take);
  bool known = true;
  std::uint64_t ref_bytes = 0;
  for (const SharedRef& r : refs) {
    known = drop_ref_locked(t, d, r) && known;
    ref_bytes += r.size.value();
  }
  // References worth more than the bytes released could raise Σ borrowed: a caller's error.
  return take == n && known && ref_bytes <= n.value();
}

void Accounting::share(TenantId t, DeviceOrdinal d, const std::vector<SharedRef>& refs) {
  std::lock_guard lock(mu_);
  for (const SharedRef& r : refs) add_ref_locked(t, d, r);
}

// A tenant's saving group on `d`: its namespace if that has a guarantee there, else the group of
// all namespaces without one. mu_ held.
std::uint64_t Accounting::group_locked(TenantId t, DeviceOrdinal d) const {
  const NamespaceId n = ns_of_locked(t);
  auto it = ns_.find(NsKey{d.value(), n.value()});
  return it != ns_.end() && it->second.guaranteed.value() != 0 ? std::uint64_t{n.value()} : kUnguaranteedGroup;
}

Bytes& Accounting::saved_locked(std::int32_t d, std::uint64_t group) {
  if (group == kUnguaranteedGroup) return unguaranteed_saved_[d];
  return ns_[NsKey{d, static_cast<std::uint32_t>(group)}].dedup_saved;
}

Bytes Accounting::saved_of_locked(std::int32_t d, std::uint64_t group) const {
  if (group == kUnguaranteedGroup) {
    auto it = unguaranteed_saved_.find(d);
    return it == unguaranteed_saved_.end() ? Bytes{0} : it->second;
  }
  auto it = ns_.find(NsKey{d, static_cast<std::uint32_t>(group)});
  return it == ns_.end() ? Bytes{0} : it->second.dedup_saved;
}

void Accounting::add_ref_locked(TenantId t, DeviceOrdinal d, const SharedRef& r) {
  Chunk& c = chunks_[ChunkKey{d.value(), r.chunk}];
  if (c.by_tenant.empty()) {
    c.size = r.size;
    shared_totals_[d.value()].second += r.size;
  }
  shared_totals_[d.value()].first += c.size;
  ++c.by_tenant[t.value()];
  ++tenant_refs_[t.value()];
  const std::uint64_t g = group_locked(t, d);
  if (c.by_group[g]++ > 0) saved_locked(d.value(), g) += r.size;
}

bool Accounting::drop_ref_locked(TenantId t, DeviceOrdinal d, const SharedRef& r) {
  auto it = chunks_.find(ChunkKey{d.value(), r.chunk});
  if (it == chunks_.end()) return false;
  Chunk& c = it->second;
  auto bt = c.by_tenant.find(t.value());
  if (bt == c.by_tenant.end()) return false;
  if (--bt->second == 0) c.by_tenant.erase(bt);
  auto& [logical, physical] = shared_totals_[d.value()];
  logical -= std::min(logical, c.size);
  if (auto tr = tenant_refs_.find(t.value()); tr != tenant_refs_.end() && tr->second > 0) --tr->second;
  const std::uint64_t g = group_locked(t, d);
  auto bg = c.by_group.find(g);
  if (bg != c.by_group.end()) {
    if (bg->second > 1) {
      Bytes& s = saved_locked(d.value(), g);
      s -= std::min(s, c.size);
    }
    if (--bg->second == 0) c.by_group.erase(bg);
  }
  if (c.by_tenant.empty()) {
    physical -= std::min(physical, c.size);
    chunks_.erase(it);
  }
  return true;
}

// Recomputes every chunk's references by saving group, and the groups' savings, from the
// references by tenant (after a tenant moved or a guarantee appeared or went). mu_ held.
void Accounting::regroup_locked() {
  for (auto& [k, u] : ns_) u.dedup_saved = Bytes{0};
  unguaranteed_saved_.clear();
  for (auto& [k, c] : chunks_) {
    c.by_group.clear();
    for (const auto& [t, n] : c.by_tenant) c.by_group[group_locked(TenantId{t}, DeviceOrdinal{k.first})] += n;
    for (const auto& [g, n] : c.by_group) {
      if (n > 1) saved_locked(k.first, g) += Bytes{c.size.value() * (n - 1)};
    }
  }
}

std::uint64_t Accounting::borrowed_locked(DeviceOrdinal d, NamespaceId n, std::uint64_t extra) const {
  std::uint64_t sum = 0;
  std::uint64_t unguaranteed_held = 0;
  for (auto it = ns_.lower_bound(NsKey{d.value(), 0}); it != ns_.end() && it->first.first == d.value(); ++it) {
    if (it->second.overcommit) continue;
    const std::uint64_t held = it->second.held().value() + (it->first.second == n.value() ? extra : 0);
    const std::uint64_t g = it->second.guaranteed.value();
    if (g == 0) {
      unguaranteed_held += held;
    } else {
      const std::uint64_t physical = held - std::min(held, it->second.dedup_saved.value());
      sum += borrowed(physical, g);
    }
  }
  const std::uint64_t s = saved_of_locked(d.value(), kUnguaranteedGroup).value();
  return sum + (unguaranteed_held - std::min(unguaranteed_held, s));
}

void Accounting::restore(TenantId t, DeviceOrdinal d, Bytes n) {
  std::lock_guard lock(mu_);
  map_[Key{t, d}].granted += n;
  ns_locked(ns_of_locked(t), d).granted += n;
}

// Replaces one of the tenant's figures (`field`) by `n`, and the same column of its namespace's
// sums by the difference. mu_ held.
void Accounting::replace_locked(TenantId t, DeviceOrdinal d, Usage& u, Bytes Usage::*field,
                                Bytes NamespaceUsage::*ns_field, Bytes n) {
  NamespaceUsage& nu = ns_locked(ns_of_locked(t), d);
  nu.*ns_field -= std::min(nu.*ns_field, u.*field);
  nu.*ns_field += n;
  u.*field = n;
}

void Accounting::set_nonpool(TenantId t, DeviceOrdinal d, Bytes n) {
  std::lock_guard lock(mu_);
  replace_locked(t, d, map_[Key{t, d}], &Usage::nonpool, &NamespaceUsage::nonpool, n);
}

void Accounting::set_unhooked(TenantId t, DeviceOrdinal d, Bytes n) {
  std::lock_guard lock(mu_);
  replace_locked(t, d, map_[Key{t, d}], &Usage::unhooked, &NamespaceUsage::unhooked, n);
}

bool Accounting::set_retained(TenantId t, DeviceOrdinal d, Bytes n) {
  std::lock_guard lock(mu_);
  auto it = map_.find(Key{t, d});
  if (it == map_.end() && n.value() == 0) return false;
  Usage& u = it == map_.end() ? map_[Key{t, d}] : it->second;
  if (u.retained == n) return false;
  replace_locked(t, d, u, &Usage::retained, &NamespaceUsage::retained, n);
  return true;
}

Accounting::Usage Accounting::usage(TenantId t, DeviceOrdinal d) const {
  std::lock_guard lock(mu_);
  auto it = map_.find(Key{t, d});
  return it == map_.end() ? Usage{} : it->second;
}

Accounting::NamespaceUsage Accounting::namespace_usage(NamespaceId n, DeviceOrdinal d) const {
  std::lock_guard lock(mu_);
  auto it = ns_.find(NsKey{d.value(), n.value()});
  return it == ns_.end() ? NamespaceUsage{} : it->second;
}

std::vector<Accounting::Entry> Accounting::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<Entry> out;
  out.reserve(map_.size());
  for (const auto& [k, u] : map_) out.push_back(Entry{k.t, k.d, ns_of_locked(k.t), u});
  return out;
}

Accounting::DeviceEntry Accounting::device_locked(DeviceOrdinal d) const {
  DeviceEntry e{d, Bytes{0}, Bytes{0}, Bytes{0}};
  if (auto cap = capacity_.find(d.value()); cap != capacity_.end()) e.capacity = cap->second;
  for (auto it = ns_.lower_bound(NsKey{d.value(), 0}); it != ns_.end() && it->first.first == d.value(); ++it) {
    e.guaranteed += it->second.guaranteed;
    e.dedup_saved += it->second.dedup_saved;
  }
  e.borrowed = Bytes{borrowed_locked(d, NamespaceId{0}, 0)};
  e.unguaranteed_saved = saved_of_locked(d.value(), kUnguaranteedGroup);
  e.dedup_saved += e.unguaranteed_saved;
  if (auto it = shared_totals_.find(d.value()); it != shared_totals_.end()) {
    e.dedup_logical = it->second.first;
    e.dedup_physical = it->second.second;
  }
  return e;
}

Accounting::DeviceEntry Accounting::device_usage(DeviceOrdinal d) const {
  std::lock_guard lock(mu_);
  return device_locked(d);
}

Accounting::Snapshot Accounting::snapshot_all() const {
  std::lock_guard lock(mu_);
  Snapshot s;
  s.tenants.reserve(map_.size());
  for (const auto& [k, u] : map_) s.tenants.push_back(Entry{k.t, k.d, ns_of_locked(k.t), u});
  for (const auto& [k, u] : ns_)
    s.namespaces.push_back(NamespaceEntry{NamespaceId{k.second}, DeviceOrdinal{k.first}, u});
  std::vector<std::int32_t> devs;
  for (const auto& [k, u] : ns_) devs.push_back(k.first);
  for (const auto& [d, c] : capacity_) devs.push_back(d);
  for (const auto& [k, c] : chunks_) devs.push_back(k.first);
  std::sort(devs.begin(), devs.end());
  devs.erase(std::unique(devs.begin(), devs.end()), devs.end());
  for (std::int32_t d : devs) s.devices.push_back(device_locked(DeviceOrdinal{d}));
  return s;
}

}  // namespace vlake::pool
