// vlake::pool::plan_pressure (contract in the header).
#include "vlake/pool/pressure_plan.hpp"

#include <algorithm>
#include <tuple>

namespace vlake::pool {

namespace {

std::uint64_t can_give(const PressureCandidate& c) { return pressure_claim(c).value(); }

std::uint64_t counted_on(const PressureCandidate& c) { return c.credible ? c.credible->value() : can_give(c); }

// The indices of the candidates `eligible` accepts, lowest priority first, then least recently
// active, then by session id; cut after the first ones whose `gives` add up to `need` (all of them
// when they do not). `covered`: what the returned ones give.
template <class Candidate, class Eligible, class Gives>
std::vector<std::size_t> take_in_order(const std::vector<Candidate>& candidates, Eligible eligible, Gives gives,
                                       std::uint64_t need, std::uint64_t& covered) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (eligible(candidates[i])) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Candidate& x = candidates[a];
    const Candidate& y = candidates[b];
    return std::tie(x.priority, x.last_active, x.session) < std::tie(y.priority, y.last_active, y.session);
  });
  covered = 0;
  std::size_t take = 0;
  while (take < order.size() && covered < need) covered += gives(candidates[order[take++]]);
  order.resize(take);
  return order;
}

}  // namespace

Bytes pressure_claim(const PressureCandidate& c) {
  if (!c.reclaim) return c.reserve;
  return std::max(c.reserve, c.held);
}

std::vector<std::size_t> plan_pressure(const std::vector<PressureCandidate>& sessions, std::int32_t requester_priority,
                                       Bytes shortfall) {
  std::uint64_t covered = 0;
  return take_in_order(
      sessions, [&](const PressureCandidate& c) { return c.priority <= requester_priority && can_give(c) != 0; },
      counted_on, shortfall.value(), covered);
}

std::vector<std::size_t> plan_swap(const std::vector<SwapCandidate>& sessions, std::int32_t requester_priority,
                                   Bytes need, std::chrono::steady_clock::time_point now,
                                   std::chrono::milliseconds min_idle) {
  std::uint64_t covered = 0;
  std::vector<std::size_t> order = take_in_order(
      sessions,
      [&](const SwapCandidate& c) {
        return c.priority <= requester_priority && c.bytes.value() != 0 && now - c.last_active >= min_idle;
      },
      [](const SwapCandidate& c) { return c.bytes.value(); }, need.value(), covered);
  if (covered < need.value()) return {};  // all or nothing
  return order;
}

}  // namespace vlake::pool
