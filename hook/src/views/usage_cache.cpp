#include "usage_cache.hpp"

#include <algorithm>

namespace vlake::hook {

std::uint64_t UsageCache::exact_margin(std::uint64_t limit) const noexcept {
  const std::uint64_t share = policy_.exact_divisor != 0 ? limit / policy_.exact_divisor : 0;
  return std::max(policy_.exact_floor, share);
}

std::optional<UsageFigures> UsageCache::get(const Uuid& device, std::uint64_t generation, Clock::time_point now) const {
  std::lock_guard lock(mu_);
  for (const Slot& s : slots_) {
    if (!s.used || s.device.bytes != device.bytes) continue;
    if (s.generation != generation || now < s.asked || now - s.asked >= policy_.ttl) return std::nullopt;
    const std::uint64_t free = s.figures.limit > s.figures.used ? s.figures.limit - s.figures.used : 0;
    if (free < exact_margin(s.figures.limit)) return std::nullopt;
    return s.figures;
  }
  return std::nullopt;
}

void UsageCache::put(const Uuid& device, const UsageFigures& u, std::uint64_t generation, Clock::time_point asked) {
  std::lock_guard lock(mu_);
  Slot* target = nullptr;
  for (Slot& s : slots_) {
    if (s.used && s.device.bytes == device.bytes) {
      target = &s;
      break;
    }
    if (!s.used && target == nullptr) target = &s;
  }
  if (target == nullptr) return;  // more devices than slots: not cached
  // An answer to an older request never replaces a newer one.
  if (target->used && target->device.bytes == device.bytes && target->asked > asked) return;
  target->used = true;
  target->device = device;
  target->figures = u;
  target->generation = generation;
  target->asked = asked;
}

void UsageCache::clear_after_fork() noexcept {
  slots_ = {};
  unlock_after_fork();
}

}  // namespace vlake::hook
