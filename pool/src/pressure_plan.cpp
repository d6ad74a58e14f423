// vlake::pool::plan_pressure (contract in the header).
#include "vlake/pool/pressure_plan.hpp"

#include <algorithm>
#include <tuple>

namespace vlake::pool {

namespace {

std::uint64_t can_give(const PressureCandidate& c) {
  const std::uint64_t reserve = c.reserve.value();
  if (!c.reclaim) return reserve;
  return std::max(reserve, c.held.value());
}

}  // namespace

std::vector<std::size_t> plan_pressure(const std::vector<PressureCandidate>& sessions, std::int32_t requester_priority,
                                       Bytes shortfall) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < sessions.size(); ++i) {
    const PressureCandidate& c = sessions[i];
    if (c.priority > requester_priority || can_give(c) == 0) continue;
    order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const PressureCandidate& x = sessions[a];
    const PressureCandidate& y = sessions[b];
    return std::tie(x.priority, x.last_active, x.session) < std::tie(y.priority, y.last_active, y.session);
  });
  std::uint64_t covered = 0;
  std::size_t take = 0;
  while (take < order.size() && covered < shortfall.value()) covered += can_give(sessions[order[take++]]);
  order.resize(take);
  return order;
}

std::vector<std::size_t> plan_swap(const std::vector<SwapCandidate>& sessions, std::int32_t requester_priority,
                                   Bytes need, std::chrono::steady_clock::time_point now,
                                   std::chrono::milliseconds min_idle) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < sessions.size(); ++i) {
    const SwapCandidate& c = sessions[i];
    if (c.priority > requester_priority || c.bytes.value() == 0 || now - c.last_active < min_idle) continue;
    order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const SwapCandidate& x = sessions[a];
    const SwapCandidate& y = sessions[b];
    return std::tie(x.priority, x.last_active, x.session) < std::tie(y.priority, y.last_active, y.session);
  });
  std::uint64_t covered = 0;
  std::size_t take = 0;
  while (take < order.size() && covered < need.value()) covered += sessions[order[take++]].bytes.value();
  if (covered < need.value()) return {};
  order.resize(take);
  return order;
}

}  // namespace vlake::pool
