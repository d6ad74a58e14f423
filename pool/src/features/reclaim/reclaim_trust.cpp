// vlake::pool::ReclaimTrust (contract in the header).
#include "vlake/pool/features/reclaim/reclaim_trust.hpp"

#include <algorithm>

namespace vlake::pool {

void ReclaimTrust::asked(std::uint64_t session, DeviceOrdinal d, Time now) {
  Record& r = records_[session];
  if (r.open) return;
  r.open = true;
  r.device = d;
  r.asked_at = now;
  r.given = Bytes{0};
}

void ReclaimTrust::gave(std::uint64_t session, DeviceOrdinal d, Bytes bytes, Time now) {
  auto it = records_.find(session);
  if (it == records_.end() || bytes.value() == 0) return;
  Record& r = it->second;
  if (r.open) {
    if (r.device == d) r.given += bytes;
    return;
  }
  // Late: it gave after its ask closed empty. It is askable again, counted for what it gave.
  if (r.skipped && now < r.skipped_until) {
    r.skipped = false;
    r.skipped_until = Time{};
    r.lately = bytes;
  }
}

std::vector<ReclaimTrust::Verdict> ReclaimTrust::expire(Time now) {
  std::vector<Verdict> out;
  for (auto& [id, r] : records_) {
    if (!r.open || now < r.asked_at + deadline_) continue;
    r.open = false;
    r.lately = r.given;
    r.skipped = r.given.value() == 0;
    r.skipped_until = r.skipped ? now + skip_ : Time{};
    out.push_back(Verdict{id, r.device, r.given, r.skipped});
  }
  std::sort(out.begin(), out.end(), [](const Verdict& a, const Verdict& b) { return a.session < b.session; });
  return out;
}

bool ReclaimTrust::askable(std::uint64_t session, Time now) const {
  auto it = records_.find(session);
  return it == records_.end() || !it->second.skipped || now >= it->second.skipped_until;
}

Bytes ReclaimTrust::credible(std::uint64_t session, Bytes claim, bool trust_claims) const {
  auto it = records_.find(session);
  if (it == records_.end() || !it->second.lately) return trust_claims ? claim : Bytes{0};
  return std::min(claim, *it->second.lately);
}

bool ReclaimTrust::open(std::uint64_t session) const {
  auto it = records_.find(session);
  return it != records_.end() && it->second.open;
}

std::optional<ReclaimTrust::Time> ReclaimTrust::next_deadline() const {
  std::optional<Time> t;
  for (const auto& [id, r] : records_) {
    if (!r.open) continue;
    const Time d = r.asked_at + deadline_;
    if (!t || d < *t) t = d;
  }
  return t;
}

}  // namespace vlake::pool
