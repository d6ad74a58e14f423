#include "vlake/pool/features/unhooked/unhooked_book.hpp"

#include <algorithm>

namespace vlake::pool {

namespace {
const UnhookedUse kNone{};
}  // namespace

bool UnhookedUse::empty() const noexcept {
  return procs.empty() && std::all_of(bytes.begin(), bytes.end(), [](std::uint64_t b) { return b == 0; });
}

const UnhookedUse& UnhookedBook::of(TenantId t) const {
  auto it = use_.find(t.value());
  return it == use_.end() ? kNone : it->second;
}

std::vector<UnhookedProcess> UnhookedBook::newcomers(TenantId t, const std::vector<UnhookedProcess>& procs) const {
  const UnhookedUse& u = of(t);
  std::vector<UnhookedProcess> out;
  if (procs.size() <= u.procs.size()) return out;  // as many as before: none counted new
  for (const UnhookedProcess& p : procs) {
    const bool known =
        std::any_of(u.procs.begin(), u.procs.end(), [&](const UnhookedProcess& o) { return o.pid == p.pid; });
    if (!known) out.push_back(p);
  }
  return out;
}

bool UnhookedBook::record(TenantId t, const Bytes& bytes, std::vector<UnhookedProcess> procs) {
  UnhookedUse& u = use_[t.value()];
  const bool changed = bytes != u.bytes || procs.size() != u.procs.size();
  u.bytes = bytes;
  u.procs = std::move(procs);
  return changed;
}

UnhookedBook::Verdict UnhookedBook::over_limit(TenantId t, bool over, Time now, std::chrono::milliseconds grace) {
  if (!over) {
    if (auto it = use_.find(t.value()); it != use_.end()) it->second.over_since.reset();
    return Verdict::none;
  }
  UnhookedUse& u = use_[t.value()];
  Verdict v = Verdict::none;
  if (!u.over_since) {
    u.over_since = now;
    v = Verdict::grace;
  }
  if (now - *u.over_since < grace) return v;
  u.over_since.reset();
  return Verdict::kill;
}

std::optional<TenantId> UnhookedBook::cached(std::uint32_t pid, std::uint64_t start_time) const {
  auto it = cache_.find({pid, start_time});
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

void UnhookedBook::prune(const std::function<bool(std::uint32_t, std::uint64_t)>& live) {
  for (auto it = cache_.begin(); it != cache_.end();) {
    it = live(it->first.first, it->first.second) ? std::next(it) : cache_.erase(it);
  }
}

}  // namespace vlake::pool
