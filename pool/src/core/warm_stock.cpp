#include "vlake/pool/warm_stock.hpp"

#include <algorithm>
#include <cmath>

namespace vlake::pool {

WarmStock::WarmStock(Bytes reserve, Bytes stock, Bytes granularity, Bytes bulk,
                     std::chrono::milliseconds half_life) noexcept
    : reserve_(reserve),
      stock_(stock),
      granularity_(std::max(granularity, Bytes{1})),
      bulk_(std::max(bulk, granularity_)),
      half_life_(std::max(half_life, std::chrono::milliseconds(1))) {}

double WarmStock::decayed(const Demand& d, Clock::time_point now) const {
  if (now <= d.at) return d.score;
  const double halves =
      std::chrono::duration<double, std::milli>(now - d.at).count() / static_cast<double>(half_life_.count());
  return d.score * std::exp2(-halves);
}

double WarmStock::score(Bytes size, Clock::time_point now) const {
  const auto it = demand_.find(size.value());
  return it == demand_.end() ? 0.0 : decayed(it->second, now);
}

void WarmStock::note(Bytes size, Clock::time_point now) {
  if (stock_.value() == 0 || size.value() == 0) return;
  // Forget what decayed away, then make room for a new size by dropping the lowest score.
  std::erase_if(demand_, [&](const auto& kv) { return decayed(kv.second, now) < 0.5; });
  auto it = demand_.find(size.value());
  if (it == demand_.end()) {
    if (demand_.size() >= kMaxSizes) {
      auto low = std::min_element(demand_.begin(), demand_.end(), [&](const auto& a, const auto& b) {
        return decayed(a.second, now) < decayed(b.second, now);
      });
      demand_.erase(low);
    }
    it = demand_.emplace(size.value(), Demand{0, now}).first;
  }
  it->second.score = decayed(it->second, now) + 1.0;
  it->second.at = std::max(it->second.at, now);
}

std::vector<std::pair<std::uint64_t, std::uint32_t>> WarmStock::ordered_want(Clock::time_point now) const {
  std::vector<std::pair<std::uint64_t, std::uint32_t>> out;
  // Demand: highest score first, then smaller sizes; each as many as the stock budget holds.
  struct Scored {
    std::uint64_t size;
    double score;
  };
  std::vector<Scored> scored;
  for (const auto& [size, d] : demand_) {
    const double s = decayed(d, now);
    if (s < kMinScore || size > stock_.value() / 4) continue;
    scored.push_back({size, s});
  }
  std::sort(scored.begin(), scored.end(),
            [](const Scored& a, const Scored& b) { return a.score != b.score ? a.score > b.score : a.size < b.size; });
  std::uint64_t left = stock_.value();
  for (const Scored& s : scored) {
    const auto n =
        static_cast<std::uint32_t>(std::clamp<double>(std::ceil(s.score / 2), 1.0, static_cast<double>(kMaxPerSize)));
    const auto fit = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, left / s.size));
    if (fit == 0) continue;
    out.emplace_back(s.size, fit);
    left -= fit * s.size;
  }
  // The warm reserve: G handles up to min(reserve / 8, 32 MiB), bulk handles, G for the rest.
  const std::uint64_t g = granularity_.value();
  const std::uint64_t r = reserve_.value() / g * g;
  if (r > 0) {
    const std::uint64_t small = std::min<std::uint64_t>(r / 8 / g * g, 32ull << 20);
    const std::uint64_t bulk_n = (r - small) / bulk_.value();
    const std::uint64_t rest = r - small - bulk_n * bulk_.value();
    auto add = [&](std::uint64_t size, std::uint64_t n) {
      if (n == 0) return;
      for (auto& [s, c] : out) {
        if (s == size) {
          c += static_cast<std::uint32_t>(n);
          return;
        }
      }
      out.emplace_back(size, static_cast<std::uint32_t>(n));
    };
    add(g, (small + rest) / g);
    add(bulk_.value(), bulk_n);
  }
  return out;
}

WarmStock::Counts WarmStock::want(Clock::time_point now) const {
  Counts c;
  for (const auto& [size, n] : ordered_want(now)) c[size] += n;
  return c;
}

Bytes WarmStock::bytes(const Counts& c) noexcept {
  std::uint64_t b = 0;
  for (const auto& [size, n] : c) b += size * n;
  return Bytes{b};
}

WarmStock::Plan WarmStock::plan(const View& view, Clock::time_point now, std::size_t max_make) const {
  Plan p;
  const auto order = ordered_want(now);
  Counts want;
  for (const auto& [size, n] : order) want[size] += n;
  auto have = [&](std::uint64_t size) {
    std::uint64_t n = 0;
    if (auto it = view.on_hand.find(size); it != view.on_hand.end()) n += it->second;
    if (auto it = view.in_flight.find(size); it != view.in_flight.end()) n += it->second;
    return n;
  };
  // Round-robin over the wanted sizes: one of each before two of any.
  std::map<std::uint64_t, std::uint64_t> planned;
  for (bool more = true; more && p.make.size() < max_make;) {
    more = false;
    for (const auto& [size, n] : order) {
      if (p.make.size() >= max_make) break;
      if (have(size) + planned[size] < want[size]) {
        p.make.push_back(Bytes{size});
        ++planned[size];
        more = true;
      }
    }
  }
  // Over the budgets: release handles on hand beyond want, unwanted sizes first, largest first.
  std::uint64_t total = 0;
  for (const auto& [size, n] : view.on_hand) total += size * n;
  for (const auto& [size, n] : view.in_flight) total += size * n;
  for (Bytes b : p.make) total += b.value();
  const std::uint64_t cap = budget().value();
  if (total <= cap) return p;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> surplus;  // size, count beyond want
  for (const auto& [size, n] : view.on_hand) {
    const std::uint64_t w = want.count(size) != 0 ? want[size] : 0;
    const std::uint64_t in = view.in_flight.count(size) != 0 ? view.in_flight.at(size) : 0;
    // In-flight handles of a size count first toward its want.
    const std::uint64_t keep = w > in ? w - in : 0;
    if (n > keep) surplus.emplace_back(size, n - keep);
  }
  std::sort(surplus.begin(), surplus.end(), [&](const auto& a, const auto& b) {
    const bool wa = want.count(a.first) != 0;
    const bool wb = want.count(b.first) != 0;
    if (wa != wb) return !wa;
    return a.first > b.first;
  });
  for (const auto& [size, n] : surplus) {
    for (std::uint64_t i = 0; i < n && total > cap; ++i) {
      p.release.push_back(Bytes{size});
      total -= size;
    }
    if (total <= cap) break;
  }
  return p;
}

}  // namespace vlake::pool
