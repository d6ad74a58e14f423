#include "vlake/pool/servable.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <vector>

namespace vlake::pool {

namespace {

// Keeps the k largest of `v`, largest first: O(n) selection, then k log k.
void keep_top(std::vector<std::uint64_t>& v, std::uint32_t k) {
  if (v.size() > k) {
    std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<>());
    v.resize(k);
  }
  std::sort(v.begin(), v.end(), std::greater<>());
}

// The sum of the k largest of two lists, each sorted largest first.
std::uint64_t top_sum(const std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& b, std::uint32_t k) {
  std::uint64_t sum = 0;
  std::size_t i = 0;
  std::size_t j = 0;
  for (std::uint32_t n = 0; n < k; ++n) {
    if (i < a.size() && (j >= b.size() || a[i] >= b[j])) sum += a[i++];
    else if (j < b.size()) sum += b[j++];
    else break;
  }
  return sum;
}

}  // namespace

Bytes largest_servable(std::span<const ServableHandleView> free, std::optional<TenantId> tenant,
                       std::uint32_t max_handles) {
  std::vector<std::uint64_t> usable;
  for (const ServableHandleView& h : free) {
    if (!h.bound || h.bound == tenant) usable.push_back(h.size.value());
  }
  const std::uint32_t k = std::max<std::uint32_t>(max_handles, 1);
  keep_top(usable, k);
  return Bytes{top_sum(usable, {}, k)};
}

Servable servable(std::span<const ServableHandleView> free, std::uint32_t max_handles) {
  const std::uint32_t k = std::max<std::uint32_t>(max_handles, 1);
  std::vector<std::uint64_t> unbound;
  std::map<std::uint32_t, std::vector<std::uint64_t>> bound;  // by TenantId value
  for (const ServableHandleView& h : free) {
    if (h.bound) bound[h.bound->value()].push_back(h.size.value());
    else unbound.push_back(h.size.value());
  }
  keep_top(unbound, k);
  Servable out;
  out.unbound = Bytes{top_sum(unbound, {}, k)};
  out.largest = out.unbound;
  for (auto& [t, sizes] : bound) {
    keep_top(sizes, k);
    out.largest = std::max(out.largest, Bytes{top_sum(unbound, sizes, k)});
  }
  return out;
}

}  // namespace vlake::pool
