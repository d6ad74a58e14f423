// Plain bookkeeping of the counted paths (counted.cpp): memory the driver allocates itself —
// stream-ordered pools, graph memory — charged to the tenant with counted grants.
//
// Ledger: the counted grants charged for one holder of driver memory (a memory pool, or a
//   device's graph memory pool) and the decision of what to do when the holder is seen holding
//   `reserved` bytes: charge the growth (one more grant), or, when it holds at least `slack`
//   bytes less than is charged, consolidate (release every grant, charge `reserved` afresh:
//   grants cannot be released in part). Not thread-safe: counted.cpp guards it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace vlake::hook {

class Ledger {
 public:
  struct Plan {
    std::uint64_t charge = 0;  // bytes to charge now (growth, or the consolidated total)
    bool consolidate = false;  // release every grant first
  };

  [[nodiscard]] std::uint64_t charged() const noexcept { return charged_; }
  [[nodiscard]] bool empty() const noexcept { return grants_.empty(); }
  void add(std::uint64_t grant_id, std::uint64_t bytes) {
    grants_.emplace_back(grant_id, bytes);
    charged_ += bytes;
  }
  // Forgets every grant and returns their ids (to release).
  std::vector<std::uint64_t> take_all() {
    std::vector<std::uint64_t> ids;
    ids.reserve(grants_.size());
    for (const auto& g : grants_) ids.push_back(g.first);
    grants_.clear();
    charged_ = 0;
    return ids;
  }
  // What to do for a holder that now holds `reserved` bytes (slack: the daemon's rounding).
  [[nodiscard]] Plan plan(std::uint64_t reserved, std::uint64_t slack) const noexcept {
    if (reserved > charged_) return Plan{reserved - charged_, false};
    if (charged_ - reserved >= (slack == 0 ? 1 : slack)) return Plan{reserved, true};
    return Plan{};
  }

 private:
  std::vector<std::pair<std::uint64_t, std::uint64_t>> grants_;  // id, bytes
  std::uint64_t charged_ = 0;
};

}  // namespace vlake::hook
