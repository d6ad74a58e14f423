#include "vlake/pool/features/rings/fair_ring.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace vlake::pool {

FairRing::FairRing(std::uint32_t capacity) : slots_(capacity) {}

void FairRing::assign(const std::vector<Entry>& slots) {
  if (slots.size() > slots_.size()) throw std::invalid_argument("FairRing::assign: more slots than the capacity");
  std::fill(slots_.begin(), slots_.end(), Entry{});
  held_.clear();
  used_ = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].seq == 0) continue;
    slots_[i] = slots[i];
    ++held_[slots[i].tenant];
    ++used_;
  }
}

FairRing::Placement FairRing::place(const std::string& tenant, std::uint64_t seq) {
  if (slots_.empty()) throw std::invalid_argument("FairRing::place: a ring of capacity 0");
  Placement p;
  if (used_ < slots_.size()) {
    while (slots_[p.slot].seq != 0) ++p.slot;
    ++used_;
  } else {
    // The most entries any tenant holds, the new one counted as its tenant's.
    auto count = [&](const std::string& t) {
      auto it = held_.find(t);
      return (it == held_.end() ? 0u : it->second) + (t == tenant ? 1u : 0u);
    };
    std::uint32_t most = count(tenant);
    for (const auto& [t, n] : held_) most = std::max(most, count(t));
    // The oldest entry of a tenant holding that many (the new entry's tenant may hold only the
    // new one: the ring is full, so some other tenant then holds at least as many).
    bool found = false;
    for (std::uint32_t i = 0; i < slots_.size(); ++i) {
      const Entry& e = slots_[i];
      if (count(e.tenant) != most) continue;
      if (!found || e.seq < slots_[p.slot].seq) {
        p.slot = i;
        found = true;
      }
    }
    p.evicted = std::move(slots_[p.slot]);
    const std::string& old = p.evicted->tenant;
    ++evicted_[old];
    if (--held_[old] == 0) held_.erase(old);
  }
  slots_[p.slot] = Entry{seq, tenant};
  ++held_[tenant];
  return p;
}

std::uint32_t FairRing::held(const std::string& tenant) const {
  auto it = held_.find(tenant);
  return it == held_.end() ? 0 : it->second;
}

void FairRing::set_evicted(const std::string& tenant, std::uint64_t n) {
  if (n == 0) evicted_.erase(tenant);
  else evicted_[tenant] = n;
}

std::uint64_t FairRing::evicted(const std::string& tenant) const {
  auto it = evicted_.find(tenant);
  return it == evicted_.end() ? 0 : it->second;
}

}  // namespace vlake::pool
