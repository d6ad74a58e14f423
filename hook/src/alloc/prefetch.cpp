#include "prefetch.hpp"

#include <algorithm>

namespace vlake::hook {

std::uint32_t Prefetch::limit(std::uint64_t size) const noexcept {
  if (size == 0) return 0;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(max_count_, std::max<std::uint64_t>(1, max_bytes_ / size)));
}

void Prefetch::enqueue(const Key& k, Size& z, std::uint32_t n, void* ctx) {
  const std::uint32_t cap = limit(k.second);
  n = std::min(n, cap > z.queued ? cap - z.queued : 0u);
  for (std::uint32_t i = 0; i < n; ++i) queue_.push_back(Request{k.first, k.second, ctx});
  z.queued += n;
}

bool Prefetch::miss(int dev, std::uint64_t size, void* ctx, Clock::time_point now) {
  if (!enabled() || size > max_size_) return false;
  std::lock_guard lock(mu_);
  Size& z = sizes_[Key{dev, size}];
  if (now < z.blocked_until) return false;
  const bool streak = z.batch > 0 && now - z.last_miss <= window_;
  z.batch = streak ? std::min(z.batch * 2, limit(size)) : 1;
  z.last_miss = now;
  const std::size_t before = queue_.size();
  enqueue(Key{dev, size}, z, z.batch, ctx);
  return queue_.size() != before;
}

bool Prefetch::hit(int dev, std::uint64_t size, void* ctx, Clock::time_point now) {
  if (!enabled()) return false;
  std::lock_guard lock(mu_);
  auto it = sizes_.find(Key{dev, size});
  if (it == sizes_.end()) return false;
  Size& z = it->second;
  if (now < z.blocked_until || now - z.last_miss > window_) return false;
  const std::size_t before = queue_.size();
  enqueue(it->first, z, 1, ctx);
  return queue_.size() != before;
}

void Prefetch::failed(int dev, std::uint64_t size, Clock::time_point now) {
  std::lock_guard lock(mu_);
  Size& z = sizes_[Key{dev, size}];
  z.blocked_until = now + window_;
  z.batch = 0;
  // What is still queued for that size goes too.
  const auto gone = std::erase_if(queue_, [&](const Request& r) { return r.device == dev && r.size == size; });
  z.queued -= std::min<std::uint32_t>(z.queued, static_cast<std::uint32_t>(gone) + 1);
}

std::vector<Prefetch::Request> Prefetch::take() {
  std::lock_guard lock(mu_);
  return std::exchange(queue_, {});
}

void Prefetch::done(int dev, std::uint64_t size) {
  std::lock_guard lock(mu_);
  auto it = sizes_.find(Key{dev, size});
  if (it != sizes_.end() && it->second.queued > 0) --it->second.queued;
}

std::size_t Prefetch::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

}  // namespace vlake::hook
