// vlake::pool::CountedAudit (contract in the header).
#include "vlake/pool/features/counted/counted_audit.hpp"

#include <algorithm>
#include <unordered_set>

namespace vlake::pool {

std::vector<CountedAudit::Revocation> CountedAudit::observe(const std::vector<Holding>& holdings, Time now) {
  std::vector<Revocation> out;
  std::unordered_set<std::uint64_t> short_now;  // grants wholly unrealized at this reading
  std::map<std::pair<std::uint64_t, std::int32_t>, Reading> judged;
  for (const Holding& h : holdings) {
    const auto key = std::make_pair(h.session, h.device.value());
    if (h.exempt) continue;
    Bytes counted{0};
    for (const Grant& g : h.grants) counted += g.bytes;
    const Bytes unrealized = counted > h.seen ? counted - h.seen : Bytes{0};
    Reading r;
    r.realized = counted - unrealized;
    std::vector<Grant> newest = h.grants;
    std::sort(newest.begin(), newest.end(), [](const Grant& a, const Grant& b) {
      return a.granted_at != b.granted_at ? a.granted_at > b.granted_at : a.id > b.id;
    });
    Bytes left = unrealized;
    Bytes excess = unrealized > kSlack ? unrealized - kSlack : Bytes{0};
    for (const Grant& g : newest) {
      if (left.value() == 0) break;
      const Bytes u = std::min(g.bytes, left);
      left -= u;
      if (unrealized > kSlack && now - g.granted_at >= kSettle) r.overdue = true;
      if (u < g.bytes) continue;  // partly in NVML's figure: in use
      const auto [it, fresh] = unrealized_since_.try_emplace(g.id, now);
      grant_session_[g.id] = h.session;
      short_now.insert(g.id);
      // Revoked: unrealized at an earlier reading too, `window` after it was served, while what
      // is unrealized exceeds the slack.
      if (excess.value() == 0 || fresh || it->second >= now || now - g.granted_at < window_) continue;
      out.push_back(Revocation{g.id, h.session, h.device, g.bytes, counted, h.seen, g.granted_at});
      excess = excess > g.bytes ? excess - g.bytes : Bytes{0};
    }
    judged[key] = r;
  }
  // Sessions holding no counted grant there now, or exempt, have no figure.
  last_ = std::move(judged);
  // A grant not wholly unrealized at this reading starts afresh.
  for (auto it = unrealized_since_.begin(); it != unrealized_since_.end();) {
    if (short_now.count(it->first) != 0) {
      ++it;
      continue;
    }
    grant_session_.erase(it->first);
    it = unrealized_since_.erase(it);
  }
  return out;
}

void CountedAudit::revoked(std::uint64_t session, Time now) { revoked_at_[session] = now; }

std::optional<Bytes> CountedAudit::realized(std::uint64_t session, DeviceOrdinal d) const {
  auto it = last_.find(std::make_pair(session, d.value()));
  if (it == last_.end()) return std::nullopt;
  return it->second.realized;
}

bool CountedAudit::may_displace(std::uint64_t session, DeviceOrdinal d, Time now) const {
  if (auto it = revoked_at_.find(session); it != revoked_at_.end() && now < it->second + skip_) return false;
  auto it = last_.find(std::make_pair(session, d.value()));
  return it == last_.end() || !it->second.overdue;
}

void CountedAudit::forget(std::uint64_t session) {
  for (auto it = last_.begin(); it != last_.end();) {
    it = it->first.first == session ? last_.erase(it) : std::next(it);
  }
  for (auto it = grant_session_.begin(); it != grant_session_.end();) {
    if (it->second != session) {
      ++it;
      continue;
    }
    unrealized_since_.erase(it->first);
    it = grant_session_.erase(it);
  }
  revoked_at_.erase(session);
}

}  // namespace vlake::pool
