// vlake::scheduler::attribute — which allocation belongs to which container (the attribution
// rule of docs/device-plugin.md), as a pure function so it can be tested without a kubelet.
//
// Input: the allocations on disk (id, device ids, creation time, current owner) and the
// containers the PodResources API lists with their device ids of our resource. Output: for
// each allocation whether a container holds it now and, for those without an owner, the
// owner to write. Rule: a container holds an allocation when its ids equal the allocation's
// ids (as sets). An owned allocation is present while its owner holds it. An unowned one is
// given to a holding container that owns no other allocation with those ids, newest
// allocation first; it is present while any container holds it.
// Thread-safety: pure.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "vlake/contracts/allocation.hpp"

namespace vlake::scheduler {

struct AllocView {
  std::string id;
  std::set<std::string> device_ids;
  std::int64_t created = 0;
  std::optional<alloc::Owner> owner;
};

struct ListedContainer {
  alloc::Owner who;
  std::set<std::string> device_ids;  // of our resource only
};

struct AttributionResult {
  std::set<std::string> present;                  // allocation ids
  std::map<std::string, alloc::Owner> new_owner;  // allocation id -> owner to write
};

AttributionResult attribute(const std::vector<AllocView>& allocs, const std::vector<ListedContainer>& listed);

}  // namespace vlake::scheduler
