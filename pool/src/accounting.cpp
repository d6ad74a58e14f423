#include "vlake/pool/accounting.hpp"

#include <utility>

namespace vlake::pool {

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

void Accounting::set_limit(TenantId t, DeviceOrdinal d, Bytes limit) {
  std::lock_guard lock(mu_);
  map_[Key{t, d}].limit = limit;
}

std::optional<Accounting::Reservation> Accounting::reserve(TenantId t, DeviceOrdinal d, Bytes n,
                                                           Usage* usage_out) {
  std::lock_guard lock(mu_);
  Usage& u = map_[Key{t, d}];
  if (usage_out != nullptr) *usage_out = u;
  const std::uint64_t held = u.granted.value() + u.nonpool.value() + u.reserved.value();
  // Written to avoid overflow: held + n <= limit.
  if (held > u.limit.value() || n.value() > u.limit.value() - held) return std::nullopt;
  u.reserved += n;
  return Reservation(this, t, d, n);
}

void Accounting::finish(const Reservation& r, bool commit) noexcept {
  std::lock_guard lock(mu_);
  auto it = map_.find(Key{r.tenant_, r.device_});
  if (it == map_.end()) return;  // cannot happen: reserve() created it
  Usage& u = it->second;
  u.reserved -= r.bytes_;
  if (commit) u.granted += r.bytes_;
}

bool Accounting::uncharge(TenantId t, DeviceOrdinal d, Bytes n) {
  std::lock_guard lock(mu_);
  Usage& u = map_[Key{t, d}];
  if (u.granted < n) {
    u.granted = Bytes{0};
    return false;
  }
  u.granted -= n;
  return true;
}

void Accounting::restore(TenantId t, DeviceOrdinal d, Bytes n) {
  std::lock_guard lock(mu_);
  map_[Key{t, d}].granted += n;
}

void Accounting::set_nonpool(TenantId t, DeviceOrdinal d, Bytes n) {
  std::lock_guard lock(mu_);
  map_[Key{t, d}].nonpool = n;
}

Accounting::Usage Accounting::usage(TenantId t, DeviceOrdinal d) const {
  std::lock_guard lock(mu_);
  auto it = map_.find(Key{t, d});
  return it == map_.end() ? Usage{} : it->second;
}

std::vector<Accounting::Entry> Accounting::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<Entry> out;
  out.reserve(map_.size());
  for (const auto& [k, u] : map_) out.push_back(Entry{k.t, k.d, u});
  return out;
}

}  // namespace vlake::pool
