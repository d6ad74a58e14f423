#include "vlake/pool/features/parking/parking_lot.hpp"

#include <algorithm>
#include <utility>

namespace vlake::pool {

std::vector<std::uint64_t> asked_of(const std::vector<PressureNote>& notes) {
  std::vector<std::uint64_t> out;
  out.reserve(notes.size());
  for (const PressureNote& n : notes) out.push_back(n.session);
  return out;
}

void ParkingLot::park(ConnId conn, std::uint64_t session, const proto::GrantRequest& req, Time now,
                      std::chrono::milliseconds wait, std::vector<std::uint64_t> asked, bool same_namespace) {
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
  grants_.push_back(std::move(p));
}

const ParkedGrant* ParkingLot::of_session(std::uint64_t session) const {
  auto it = std::find_if(grants_.begin(), grants_.end(), [&](const ParkedGrant& p) { return p.session == session; });
  return it == grants_.end() ? nullptr : &*it;
}

bool ParkingLot::due(Time now) const {
  if (grants_.empty()) return false;
  if (returned_) return true;
  return std::any_of(grants_.begin(), grants_.end(),
                     [&](const ParkedGrant& p) { return now >= p.deadline || now >= p.next_ask; });
}

std::optional<ParkingLot::Time> ParkingLot::next_wakeup() const {
  std::optional<Time> first;
  for (const ParkedGrant& p : grants_) {
    const Time at = std::min(p.deadline, p.next_ask);
    if (!first || at < *first) first = at;
  }
  return first;
}

std::vector<ParkedGrant> ParkingLot::begin_retry() {
  returned_ = false;
  return std::exchange(grants_, {});
}

}  // namespace vlake::pool
