// The host tier's state (contract in host_tier.hpp; docs/swap.md, "Host tier").
#include "vlake/pool/features/tier/host_tier.hpp"

#include <algorithm>

namespace vlake::pool {

HostTier::HostTier(Bytes bound, Bytes piece, Bytes granularity)
    : bound_(bound), gran_(granularity.value() == 0 ? Bytes{2ull << 20} : granularity) {
  const std::uint64_t g = gran_.value();
  const std::uint64_t p = std::max<std::uint64_t>(piece.value(), g);
  // A power of two of the granularity at most `piece` (so the tail sizes fill the gap below it).
  std::uint64_t pow = g;
  while (pow * 2 <= p) pow *= 2;
  piece_ = Bytes{pow};
}

std::vector<Bytes> HostTier::pieces_for(Bytes bytes) const {
  std::vector<Bytes> out;
  std::uint64_t left = (bytes.value() + gran_.value() - 1) / gran_.value() * gran_.value();
  while (left >= piece_.value()) {
    out.push_back(piece_);
    left -= piece_.value();
  }
  for (std::uint64_t s = piece_.value() / 2; left > 0 && s >= gran_.value(); s /= 2) {
    if (left >= s) {
      out.push_back(Bytes{s});
      left -= s;
    }
  }
  return out;
}

std::vector<Bytes> HostTier::to_build(Time now) {
  std::vector<Bytes> out;
  if (!enabled() || now < paused_until_) return out;
  auto have = [&](std::uint64_t size) {
    auto it = stock_.find(size);
    const std::uint32_t n = it == stock_.end() ? 0 : static_cast<std::uint32_t>(it->second.size());
    auto b = building_.find(size);
    return n + (b == building_.end() ? 0 : b->second);
  };
  auto queue = [&](std::uint64_t size) {
    if (!fits(Bytes{size})) return false;
    ++building_[size];
    building_bytes_ += Bytes{size};
    out.push_back(Bytes{size});
    return true;
  };
  for (std::uint64_t s = piece_.value() / 2; s >= gran_.value(); s /= 2) {
    for (std::uint32_t n = have(s); n < kSmallEach; ++n) {
      if (!queue(s)) break;
    }
  }
  while (queue(piece_.value())) {
  }
  return out;
}

void HostTier::built(HostPiece p) {
  auto b = building_.find(p.size.value());
  if (b != building_.end() && b->second > 0) {
    if (--b->second == 0) building_.erase(b);
    building_bytes_ -= p.size;
  }
  stock_bytes_ += p.size;
  stock_[p.size.value()].push_back(std::move(p));
}

void HostTier::build_failed(Bytes size, Time now) noexcept {
  paused_until_ = now + kBuildPause;
  auto b = building_.find(size.value());
  if (b == building_.end() || b->second == 0) return;
  if (--b->second == 0) building_.erase(b);
  building_bytes_ -= size;
}

std::optional<HostPiece> HostTier::take(Bytes size) {
  auto it = stock_.find(size.value());
  if (it == stock_.end() || it->second.empty()) return std::nullopt;
  HostPiece p = std::move(it->second.back());
  it->second.pop_back();
  if (it->second.empty()) stock_.erase(it);
  stock_bytes_ -= size;
  used_ += size;
  return p;
}

bool HostTier::make_room(Bytes size) {
  while (!fits(size) && !stock_.empty()) {
    auto it = std::prev(stock_.end());
    HostPiece p = std::move(it->second.back());
    it->second.pop_back();
    if (it->second.empty()) stock_.erase(it);
    stock_bytes_ -= p.size;
    released_.push_back(std::move(p));
  }
  return fits(size);
}

void HostTier::release(std::vector<HostPiece> pieces) {
  for (HostPiece& p : pieces) {
    used_ = used_ >= p.size ? used_ - p.size : Bytes{0};
    released_.push_back(std::move(p));
  }
}

void HostTier::put(std::uint64_t grant, HostGrant g) { grants_[grant] = std::move(g); }

const HostGrant* HostTier::find(std::uint64_t grant) const {
  auto it = grants_.find(grant);
  return it == grants_.end() ? nullptr : &it->second;
}

std::optional<HostGrant> HostTier::take_grant(std::uint64_t grant) {
  auto it = grants_.find(grant);
  if (it == grants_.end()) return std::nullopt;
  HostGrant g = std::move(it->second);
  grants_.erase(it);
  return g;
}

Bytes HostTier::host_bytes(DeviceOrdinal d) const {
  Bytes b{0};
  for (const auto& [id, g] : grants_) {
    if (g.device == d) b += g.bytes;
  }
  return b;
}

Bytes HostTier::session_bytes(std::uint64_t session) const {
  Bytes b{0};
  for (const auto& [id, g] : grants_) {
    if (g.session == session) b += g.bytes;
  }
  return b;
}

TierMove* HostTier::move_of(std::uint64_t session) {
  auto it = moves_.find(session);
  return it == moves_.end() ? nullptr : &it->second;
}

const TierMove* HostTier::move_of(std::uint64_t session) const {
  auto it = moves_.find(session);
  return it == moves_.end() ? nullptr : &it->second;
}

TierMove& HostTier::start(std::uint64_t session, proto::TierDirection dir, DeviceOrdinal d, Time now) {
  TierMove& m = moves_[session];
  m = TierMove{};
  m.id = next_move_++;
  m.session = session;
  m.direction = dir;
  m.device = d;
  m.since = now;
  m.step_at = now;
  return m;
}

std::optional<TierMove> HostTier::finish(std::uint64_t session) {
  auto it = moves_.find(session);
  if (it == moves_.end()) return std::nullopt;
  TierMove m = std::move(it->second);
  moves_.erase(it);
  return m;
}

std::uint32_t HostTier::location(std::uint64_t grant) const {
  for (const auto& [sid, m] : moves_) {
    if (m.current == grant) {
      return m.direction == proto::TierDirection::to_host ? state::kGrantToHost : state::kGrantToGpu;
    }
  }
  return grants_.count(grant) != 0 ? state::kGrantOnHost : state::kGrantOnGpu;
}

Bytes HostTier::demoting(DeviceOrdinal d) const {
  Bytes b{0};
  for (const auto& [sid, m] : moves_) {
    if (m.device == d && m.direction == proto::TierDirection::to_host) b += m.bytes - m.moved;
  }
  return b;
}

bool HostTier::moving(std::uint64_t grant) const {
  for (const auto& [sid, m] : moves_) {
    if (m.current == grant || std::find(m.grants.begin(), m.grants.end(), grant) != m.grants.end()) return true;
  }
  return false;
}

}  // namespace vlake::pool
