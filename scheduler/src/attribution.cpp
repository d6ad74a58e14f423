#include "vlake/scheduler/attribution.hpp"

#include <algorithm>

namespace vlake::scheduler {

AttributionResult attribute(const std::vector<AllocView>& allocs, const std::vector<ListedContainer>& listed) {
  AttributionResult r;
  // Owned allocations first: present while their owner holds them.
  std::vector<const AllocView*> unowned;
  std::vector<std::pair<const alloc::Owner*, const std::set<std::string>*>> owners;  // who owns which id set
  for (const AllocView& a : allocs) {
    if (!a.owner) {
      unowned.push_back(&a);
      continue;
    }
    owners.emplace_back(&*a.owner, &a.device_ids);
    for (const ListedContainer& c : listed) {
      if (c.who == *a.owner && c.device_ids == a.device_ids) r.present.insert(a.id);
    }
  }
  // Newest unowned allocation first.
  std::sort(unowned.begin(), unowned.end(), [](const AllocView* x, const AllocView* y) {
    return x->created != y->created ? x->created > y->created : x->id > y->id;
  });
  for (const AllocView* a : unowned) {
    if (a->device_ids.empty()) continue;
    for (const ListedContainer& c : listed) {
      if (c.device_ids != a->device_ids) continue;
      r.present.insert(a->id);
      const bool owns = std::any_of(owners.begin(), owners.end(),
                                    [&](const auto& o) { return *o.first == c.who && *o.second == a->device_ids; });
      if (owns) continue;
      r.new_owner[a->id] = c.who;
      owners.emplace_back(&c.who, &a->device_ids);
      break;
    }
  }
  return r;
}

}  // namespace vlake::scheduler
