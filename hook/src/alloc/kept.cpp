#include "kept.hpp"

namespace vlake::hook {

void KeptMappings::put(std::uint64_t key, Entry e) {
  std::lock_guard lock(mu_);
  entries_[key] = std::move(e);
}

std::optional<KeptMappings::Entry> KeptMappings::take(std::uint64_t key, std::uint64_t generation, int device,
                                                      std::uint64_t bytes, std::vector<Entry>& stale) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  Entry e = std::move(it->second);
  entries_.erase(it);
  if (e.generation != generation || e.alloc.device != device || e.alloc.mapped != bytes) {
    stale.push_back(std::move(e));
    return std::nullopt;
  }
  return e;
}

std::vector<KeptMappings::Entry> KeptMappings::take_keys(std::span<const std::uint64_t> keys) {
  std::vector<Entry> out;
  std::lock_guard lock(mu_);
  for (std::uint64_t k : keys) {
    auto it = entries_.find(k);
    if (it == entries_.end()) continue;
    out.push_back(std::move(it->second));
    entries_.erase(it);
  }
  return out;
}

std::vector<std::pair<std::uint64_t, KeptMappings::Entry>> KeptMappings::take_if(
    const std::function<bool(const Entry&)>& match) {
  std::vector<std::pair<std::uint64_t, Entry>> out;
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (match(it->second)) {
      out.emplace_back(it->first, std::move(it->second));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::uint64_t KeptMappings::bytes(int device) const {
  std::lock_guard lock(mu_);
  std::uint64_t b = 0;
  for (const auto& [k, e] : entries_) {
    if (e.alloc.device == device) b += e.alloc.mapped;
  }
  return b;
}

std::size_t KeptMappings::size() const { return locked_size(entries_); }

void KeptMappings::clear_after_fork() noexcept { clear_and_unlock(entries_); }

}  // namespace vlake::hook
