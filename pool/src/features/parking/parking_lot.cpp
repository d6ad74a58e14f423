#include "vlake/pool/features/parking/parking_lot.hpp"

#include <algorithm>
#include <set>
#include <utility>

namespace vlake::pool {

std::vector<std::uint64_t> asked_of(const std::vector<PressureNote>& notes) {
  std::vector<std::uint64_t> out;
  out.reserve(notes.size());
  for (const PressureNote& n : notes) out.push_back(n.session);
  return out;
}

void ParkingLot::park(ConnId conn, std::uint64_t session, const proto::GrantRequest& req, Time now,
                      std::chrono::milliseconds wait, std::vector<std::uint64_t> asked, bool same_namespace,
                      TenantId tenant, DeviceOrdinal device, Bytes want) {
  ParkedGrant p;
  p.conn = conn;
  p.session = session;
  p.req = req;
  p.received = now;
  p.deadline = now + wait;
  p.asked = std::move(asked);
  p.next_ask = now + ask_again_;
  p.same_namespace = same_namespace;
  p.round_at = now;
  p.tenant = tenant;
  p.device = device;
  p.want = want.value() == 0 ? Bytes{req.bytes} : want;
  park_again(std::move(p));
}

void ParkingLot::park_again(ParkedGrant p) {
  if (p.seq == 0) p.seq = next_seq_++;
  const std::uint64_t seq = p.seq;
  wakeups_.emplace(wakeup_of(p), seq);
  by_size_[static_cast<std::uint32_t>(p.device.value())].emplace(p.want.value(), seq);
  by_session_.emplace(p.session, seq);
  ++per_tenant_[p.tenant.value()];
  grants_.emplace(seq, std::move(p));
}

ParkedGrant ParkingLot::take(std::uint64_t seq) {
  auto it = grants_.find(seq);
  ParkedGrant p = std::move(it->second);
  grants_.erase(it);
  auto [lo, hi] = wakeups_.equal_range(wakeup_of(p));
  for (auto w = lo; w != hi; ++w) {
    if (w->second == seq) {
      wakeups_.erase(w);
      break;
    }
  }
  // Every index holds the grant (park_again put it in all of them).
  if (auto d = by_size_.find(static_cast<std::uint32_t>(p.device.value())); d != by_size_.end()) {
    std::multimap<std::uint64_t, std::uint64_t>& sizes = d->second;
    auto [slo, shi] = sizes.equal_range(p.want.value());
    for (auto z = slo; z != shi; ++z) {
      if (z->second == seq) {
        sizes.erase(z);
        break;
      }
    }
    if (sizes.empty()) by_size_.erase(d);
  }
  by_session_.erase({p.session, seq});
  if (auto t = per_tenant_.find(p.tenant.value()); t != per_tenant_.end() && --t->second == 0) per_tenant_.erase(t);
  return p;
}

const ParkedGrant* ParkingLot::of_session(std::uint64_t session) const {
  auto it = by_session_.lower_bound({session, 0});
  if (it == by_session_.end() || it->first != session) return nullptr;
  return &grants_.at(it->second);
}

std::size_t ParkingLot::parked_of(TenantId tenant) const {
  auto it = per_tenant_.find(tenant.value());
  return it == per_tenant_.end() ? 0 : it->second;
}

bool ParkingLot::due(Time now) const {
  if (grants_.empty()) return false;
  if (returned_) return true;
  return wakeups_.begin()->first <= now;
}

std::optional<ParkingLot::Time> ParkingLot::next_wakeup() const {
  if (wakeups_.empty()) return std::nullopt;
  return wakeups_.begin()->first;
}

std::vector<ParkedGrant> ParkingLot::begin_retry(Time now, const std::vector<Bytes>& servable) {
  const bool returned = std::exchange(returned_, false);
  std::set<std::uint64_t> pick;
  for (auto it = wakeups_.begin(); it != wakeups_.end() && it->first <= now; ++it) pick.insert(it->second);
  if (returned) {
    for (const auto& [device, sizes] : by_size_) {
      const std::uint64_t budget = device < servable.size() ? servable[device].value() : 0;
      std::uint64_t sum = 0;
      for (const auto& [want, seq] : sizes) {
        if (want > budget - sum) break;  // smallest first: the rest are larger
        sum += want;
        pick.insert(seq);
      }
    }
  }
  std::vector<ParkedGrant> out;
  out.reserve(pick.size());
  for (std::uint64_t seq : pick) out.push_back(take(seq));
  examined_ += out.size();
  return out;
}

std::vector<ParkedGrant> ParkingLot::begin_retry() {
  returned_ = false;
  std::vector<ParkedGrant> out;
  out.reserve(grants_.size());
  while (!grants_.empty()) out.push_back(take(grants_.begin()->first));
  examined_ += out.size();
  return out;
}

}  // namespace vlake::pool
