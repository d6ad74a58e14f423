#include "vlake/pool/idle_release.hpp"

#include <algorithm>
#include <numeric>

namespace vlake::pool {

std::vector<std::size_t> plan_idle_release(const std::vector<IdleHandleView>& free,
                                           std::chrono::steady_clock::time_point now, std::chrono::milliseconds idle,
                                           Bytes keep, Bytes warm) {
  std::vector<std::size_t> out;
  if (idle.count() <= 0) return out;
  std::uint64_t unbound = 0;
  std::uint64_t clean = 0;
  for (const IdleHandleView& h : free) {
    unbound += h.bound ? 0 : h.size.value();
    clean += !h.bound && h.clean ? h.size.value() : 0;
  }
  std::uint64_t spare = unbound > keep.value() ? unbound - keep.value() : 0;
  std::uint64_t clean_spare = clean > warm.value() ? clean - warm.value() : 0;

  std::vector<std::size_t> order(free.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (free[a].clean != free[b].clean) return !free[a].clean;  // dirty first
    return free[a].freed_seq < free[b].freed_seq;
  });
  for (std::size_t i : order) {
    const IdleHandleView& h = free[i];
    if (now < h.freed_at || now - h.freed_at < idle) continue;
    if (h.bound) {
      out.push_back(i);
      continue;
    }
    if (h.size.value() > spare) continue;
    if (h.clean) {
      if (h.size.value() > clean_spare) continue;
      clean_spare -= h.size.value();
    }
    spare -= h.size.value();
    out.push_back(i);
  }
  std::sort(out.begin(), out.end(),
            [&](std::size_t a, std::size_t b) { return free[a].freed_seq < free[b].freed_seq; });
  return out;
}

}  // namespace vlake::pool
