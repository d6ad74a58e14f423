// vlake::pool::FairShare — who may take an entry of a bounded table shared by tenants (the
// session, grant and import tables of the state segment, docs/security.md "Fair tables"), so
// that colluding tenants, each within its own caps, cannot fill a table and starve a tenant
// that holds little.
//
// Rule
//   The table (capacity C) is split in a shared part and a reserve (the last R free entries).
//   - While more than R entries are free, anyone may take one (first come, first served; the
//     per-tenant caps bound each owner there).
//   - In the reserve (R or fewer free), an owner may take an entry only while it holds fewer
//     than its fair share of the reserve: min(floor, C / (owners + 1)), where `owners` counts
//     the owners holding entries, the requester included (as if it held one), and the +1 keeps
//     a share for an owner not yet arrived. `floor` bounds what one owner may hold in the
//     reserve whatever the count of owners.
//   - A full table refuses everyone.
//   So an owner holding little (fewer than min(floor, C / (owners + 1)) entries) is refused
//   only when the table is full, and filling it takes at least (C - R) / per-owner cap +
//   R / floor owners: 12 owners for the session and the grant tables at the defaults
//   (C/2 reserve, C/16 floor, a per-tenant cap of C/8), each of them at its own cap or fair share.
//
// Plain decision: typed inputs, no clock, no I/O, no state but its three sizes. Thread-safe
// (const). Errors: the constructor throws std::invalid_argument for a zero capacity, or a
// reserve above it.
#pragma once

#include <cstddef>
#include <string>

namespace vlake::pool {

class FairShare {
 public:
  enum class Verdict {
    admit,            // take the entry
    table_full,       // no entry is free
    over_fair_share,  // in the reserve, and the owner holds its fair share already
  };
  // What the table looks like for one request.
  struct Table {
    std::size_t used = 0;    // entries in use, every owner's
    std::size_t owners = 0;  // owners holding at least one entry (the requester included if it holds one)
  };

  // Reserve capacity/2 and floor capacity/16 (at least 1).
  explicit FairShare(std::size_t capacity);
  FairShare(std::size_t capacity, std::size_t reserve, std::size_t floor);

  // Whether `used` entries in use put the table in its reserve (callers count owners only then).
  [[nodiscard]] bool contended(std::size_t used) const noexcept {
    return used >= capacity_ || capacity_ - used <= reserve_;
  }
  // The most entries an owner may hold and still take one in the reserve, with `owners` owners
  // holding entries (the requester included).
  [[nodiscard]] std::size_t fair_share(std::size_t owners) const noexcept;
  // The verdict for an owner holding `held` entries asking for one more.
  [[nodiscard]] Verdict decide(const Table& t, std::size_t held) const noexcept;
  // The reason of a refusal, for logs and replies: "<what> table full: 1024 of 1024 <what>s in use" or
  // "<what> table: <owner> holds 64, its fair share of the last 512 free of 1024 with 9 holders".
  [[nodiscard]] std::string describe(Verdict v, const std::string& what, const std::string& owner, const Table& t,
                                     std::size_t held) const;

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t reserve() const noexcept { return reserve_; }
  [[nodiscard]] std::size_t floor() const noexcept { return floor_; }

 private:
  std::size_t capacity_;
  std::size_t reserve_;
  std::size_t floor_;
};

}  // namespace vlake::pool
