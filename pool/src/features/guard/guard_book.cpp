#include "vlake/pool/features/guard/guard_book.hpp"

#include <algorithm>

namespace vlake::pool {

void GuardBook::resume(const state::GuardLog& old) {
  log_ = old;
  resume_ring(ring_, log_.events);
}

bool GuardBook::admit(TenantId t, Time now) {
  auto [it, fresh] = buckets_.try_emplace(t.value());
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = burst_;
    b.last = now;
  } else if (now > b.last) {
    b.tokens = std::min(burst_, b.tokens + std::chrono::duration<double>(now - b.last).count() * rate_);
    b.last = now;
  }
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

void GuardBook::count_fault(TenantId t, std::uint32_t attributes) { ++faults_[t.value()].at(attributes & 3u); }

void GuardBook::set_faults(TenantId t, const Faults& f) { faults_[t.value()] = f; }

GuardBook::Faults GuardBook::kernel_faults(TenantId t) const {
  auto it = faults_.find(t.value());
  return it == faults_.end() ? Faults{} : it->second;
}

void GuardBook::forget(TenantId t, const std::string& name) {
  buckets_.erase(t.value());
  faults_.erase(t.value());
  ring_.forget(name);
}

bool GuardBook::sweep_due(Time now, std::chrono::milliseconds interval) noexcept {
  if (interval.count() <= 0 || now - last_sweep_ < interval) return false;
  last_sweep_ = now;
  return true;
}

std::vector<std::uint64_t> GuardBook::sweep_order(std::vector<std::uint64_t> ids) const {
  std::sort(ids.begin(), ids.end());
  auto start = std::upper_bound(ids.begin(), ids.end(), cursor_);
  if (start == ids.end()) start = ids.begin();
  std::rotate(ids.begin(), start, ids.end());
  return ids;
}

}  // namespace vlake::pool
