#include "vlake/pool/core/effects.hpp"

#include <iterator>
#include <utility>

namespace vlake::pool {

namespace {
template <class T>
void move_append(std::vector<T>& to, std::vector<T>& from) {
  to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  from.clear();
}
}  // namespace

void Effects::append(Effects&& later) {
  move_append(completions, later.completions);
  move_append(drops, later.drops);
  move_append(builds, later.builds);
  move_append(discards, later.discards);
  move_append(swap_notices, later.swap_notices);
  move_append(swap_jobs, later.swap_jobs);
  move_append(tier_notices, later.tier_notices);
  move_append(host_builds, later.host_builds);
  move_append(host_releases, later.host_releases);
  move_append(swap_replies, later.swap_replies);
  move_append(kills, later.kills);
}

}  // namespace vlake::pool
