#include "reserve.hpp"

#include <algorithm>
#include <iterator>

namespace vlake::hook {

std::uint64_t LocalReserve::fit_limit(std::uint64_t need, std::uint64_t granularity) noexcept {
  if (granularity == 0) return need;
  const std::uint64_t slack = need / 8 / granularity * granularity;
  return need + slack;
}

bool LocalReserve::take(int device, std::uint64_t need, std::uint64_t granularity, ReserveBlock& out) {
  std::lock_guard lock(mu_);
  auto it = blocks_.lower_bound(Key{device, need});
  if (it == blocks_.end() || it->first.first != device || it->first.second > fit_limit(need, granularity)) {
    if (stats_on_) {
      ++stats_.misses;
      stats_.miss_bytes += need;
    }
    return false;
  }
  // The most recently freed block of that size: its pages are the likeliest to be warm.
  it = std::prev(blocks_.upper_bound(it->first));
  if (stats_on_) {
    const Clock::time_point freed = it->second.freed;
    std::uint64_t stack = 0;
    for (const auto& [k, b] : blocks_) stack += b.freed >= freed ? k.second : 0;
    stats_.record_reuse(Clock::now() - freed, stack, it->first.second);
  }
  out = std::move(it->second);
  total_ -= it->first.second;
  blocks_.erase(it);
  return true;
}

std::vector<ReserveBlock> LocalReserve::put(ReserveBlock b) {
  std::vector<ReserveBlock> out;
  const std::uint64_t size = b.alloc.mapped;
  std::lock_guard lock(mu_);
  if (stats_on_) ++stats_.puts;
  if (size > max_bytes_) {
    out.push_back(std::move(b));
    if (stats_on_) count_leaving(out, stats_.evicted, stats_.evicted_bytes);
    return out;
  }
  const int device = b.alloc.device;
  blocks_.emplace(Key{device, size}, std::move(b));
  total_ += size;
  if (stats_on_) stats_.peak_bytes = std::max(stats_.peak_bytes, total_);
  if (total_ > max_bytes_) out = evict_locked(device, total_ - max_bytes_, true);
  if (stats_on_) count_leaving(out, stats_.evicted, stats_.evicted_bytes);
  return out;
}

std::vector<ReserveBlock> LocalReserve::evict_locked(int device, std::uint64_t bytes, bool any_device) {
  std::vector<ReserveBlock> out;
  std::uint64_t freed = 0;
  while (!blocks_.empty() && (bytes == 0 || freed < bytes)) {
    auto oldest = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (!any_device && it->first.first != device) continue;
      if (oldest == blocks_.end() || it->second.freed < oldest->second.freed) oldest = it;
    }
    if (oldest == blocks_.end()) break;
    freed += oldest->first.second;
    total_ -= oldest->first.second;
    out.push_back(std::move(oldest->second));
    blocks_.erase(oldest);
  }
  return out;
}

std::vector<ReserveBlock> LocalReserve::expire(Clock::time_point now) {
  std::vector<ReserveBlock> out;
  std::lock_guard lock(mu_);
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if (now - it->second.freed >= max_age_) {
      total_ -= it->first.second;
      out.push_back(std::move(it->second));
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
  if (stats_on_) count_leaving(out, stats_.expired, stats_.expired_bytes);
  return out;
}

std::vector<ReserveBlock> LocalReserve::drain(int device, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  std::vector<ReserveBlock> out = evict_locked(device, bytes, false);
  if (stats_on_) count_leaving(out, stats_.drained, stats_.drained_bytes);
  return out;
}

bool LocalReserve::take_grant(std::uint64_t grant_id, ReserveBlock& out) {
  std::lock_guard lock(mu_);
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    if (it->second.alloc.grant_id != grant_id) continue;
    out = std::move(it->second);
    total_ -= out.alloc.mapped;
    blocks_.erase(it);
    if (stats_on_) count_leaving(std::vector<ReserveBlock>{out}, stats_.drained, stats_.drained_bytes);
    return true;
  }
  return false;
}

void LocalReserve::count_leaving(const std::vector<ReserveBlock>& out, std::uint64_t& blocks,
                                 std::uint64_t& bytes) noexcept {
  blocks += out.size();
  for (const auto& b : out) bytes += b.alloc.mapped;
}

void LocalReserve::enable_stats() noexcept {
  std::lock_guard lock(mu_);
  stats_on_ = true;
}

void LocalReserve::note_miss(std::uint64_t bytes) noexcept {
  std::lock_guard lock(mu_);
  if (!stats_on_) return;
  ++stats_.misses;
  stats_.miss_bytes += bytes;
}

bool LocalReserve::stats_enabled() const noexcept {
  std::lock_guard lock(mu_);
  return stats_on_;
}

ReuseStats LocalReserve::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::uint64_t LocalReserve::bytes(int device) const {
  std::lock_guard lock(mu_);
  std::uint64_t n = 0;
  for (const auto& [k, b] : blocks_) n += k.first == device ? k.second : 0;
  return n;
}

std::uint64_t LocalReserve::blocks(int device) const {
  std::lock_guard lock(mu_);
  return static_cast<std::uint64_t>(
      std::count_if(blocks_.begin(), blocks_.end(), [device](const auto& kv) { return kv.first.first == device; }));
}

std::uint64_t LocalReserve::total_bytes() const {
  std::lock_guard lock(mu_);
  return total_;
}

void LocalReserve::clear_after_fork() noexcept {
  blocks_.clear();
  total_ = 0;
  unlock_after_fork();
}

}  // namespace vlake::hook
