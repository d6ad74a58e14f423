#include "vlake/pool/fair_share.hpp"

#include <algorithm>
#include <stdexcept>

namespace vlake::pool {

FairShare::FairShare(std::size_t capacity)
    : FairShare(capacity, capacity / 2, std::max<std::size_t>(1, capacity / 16)) {}

FairShare::FairShare(std::size_t capacity, std::size_t reserve, std::size_t floor)
    : capacity_(capacity), reserve_(reserve), floor_(floor) {
  if (capacity == 0) throw std::invalid_argument("fair share: a table of no entries");
  if (reserve > capacity) throw std::invalid_argument("fair share: a reserve larger than the table");
}

std::size_t FairShare::fair_share(std::size_t owners) const noexcept {
  return std::min(floor_, capacity_ / (std::max<std::size_t>(owners, 1) + 1));
}

FairShare::Verdict FairShare::decide(const Table& t, std::size_t held) const noexcept {
  if (t.used >= capacity_) return Verdict::table_full;
  if (!contended(t.used)) return Verdict::admit;
  // The requester counts as an owner even before its first entry.
  const std::size_t owners = t.owners + (held == 0 ? 1 : 0);
  return held < fair_share(owners) ? Verdict::admit : Verdict::over_fair_share;
}

std::string FairShare::describe(Verdict v, const std::string& what, const std::string& owner, const Table& t,
                                std::size_t held) const {
  switch (v) {
    case Verdict::admit: return "admitted";
    case Verdict::table_full:
      return what + " table full: " + std::to_string(t.used) + " of " + std::to_string(capacity_) + " " + what +
             "s in use";
    case Verdict::over_fair_share: {
      const std::size_t owners = t.owners + (held == 0 ? 1 : 0);
      return what + " table nearly full: " + owner + " holds " + std::to_string(held) + ", its fair share (" +
             std::to_string(fair_share(owners)) + ") of the last " + std::to_string(reserve_) + " entries of " +
             std::to_string(capacity_) + " shared by " + std::to_string(owners) + " holders; " +
             std::to_string(capacity_ - t.used) + " left for tenants holding less";
    }
  }
  return "?";
}

}  // namespace vlake::pool
