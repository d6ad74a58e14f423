// vlake::pool::FairRing — which slot of a fixed-capacity event ring (the guard event log and the
// refusal log of the state segment, contracts/state.hpp) a tenant's new entry takes, so that one
// tenant's flood only displaces its own entries (docs/security.md, "Rings per tenant").
//
// What it does
//   The ring holds `capacity` entries, each numbered by a seq that grows with every entry and
//   owned by a tenant, named by its tenant name ("" — no tenant known — is a tenant of its own
//   here). Names, not TenantIds: an id is reused once a tenant record is freed, and a new tenant
//   must not inherit (and so push out) the entries of a tenant that held the id before.
//   - place(): a free slot while there is one (the lowest); once the ring is full, the slot of
//     the oldest entry (lowest seq) of the tenant holding the most entries, the new entry counted
//     as its tenant's; on a tie, the tied tenant whose oldest entry is the oldest. So an entry is
//     pushed out only by its own tenant or by a tenant holding no more entries than it does: a
//     tenant holding fewer entries than a flooder never loses one to it, and while T tenants
//     write, each keeps at least capacity / T of its newest entries.
//   - Entries are not evicted oldest first, so a slot is not (seq - 1) % capacity: readers take
//     the slots in seq order (state::ring_order).
//   - evicted(): how many entries of a tenant were pushed out (the ring's summary of what it
//     lost); forget() drops that count when the tenant record is freed (its entries stay).
//   - assign(): rebuilds the occupancy from a published ring (a restarted daemon resumes it).
//   - keep() / resume_ring() (below): the same for a state segment ring of records that carry
//     `seq` and `tenant_name` (state::GuardLog, state::RefusalLog).
// Ownership: plain values. No clock or I/O. Errors: place() on a ring of capacity 0 and
// assign() with more slots than the capacity throw std::invalid_argument.
// Thread-safety: none; the event loop's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace vlake::pool {

class FairRing {
 public:
  struct Entry {
    std::uint64_t seq = 0;  // 0: the slot is free
    std::string tenant;     // its tenant's name
  };
  struct Placement {
    std::uint32_t slot = 0;
    std::optional<Entry> evicted;  // the entry the new one replaces (none: the slot was free)
  };

  explicit FairRing(std::uint32_t capacity);

  // Takes the slots of a published ring (index = slot; seq 0: free). Eviction counts are kept.
  void assign(const std::vector<Entry>& slots);
  // Where the entry `seq` of `tenant` goes (`seq` above every seq held); the slot is then its.
  Placement place(const std::string& tenant, std::uint64_t seq);

  [[nodiscard]] std::uint32_t capacity() const noexcept { return static_cast<std::uint32_t>(slots_.size()); }
  [[nodiscard]] std::uint32_t size() const noexcept { return used_; }
  // Entries of `tenant` in the ring now.
  [[nodiscard]] std::uint32_t held(const std::string& tenant) const;
  // Entries of `tenant` pushed out so far (since it was last forgotten).
  [[nodiscard]] std::uint64_t evicted(const std::string& tenant) const;
  // A previous daemon's count (resume).
  void set_evicted(const std::string& tenant, std::uint64_t n);
  // The tenant record was freed: its eviction count goes (entries it holds stay).
  void forget(const std::string& tenant) { evicted_.erase(tenant); }

 private:
  std::vector<Entry> slots_;
  std::uint32_t used_ = 0;
  std::map<std::string, std::uint32_t> held_;     // by tenant name; no zero counts
  std::map<std::string, std::uint64_t> evicted_;  // by tenant name
};

// What keep() did: the record as kept, and the tenant whose entry it pushed out (none: a free slot).
template <typename Record>
struct Kept {
  const Record& record;
  std::optional<std::string> evicted;  // the tenant name
};

// A record's tenant name (a fixed char array, NUL-terminated or full).
template <std::size_t N>
std::string ring_owner(const char (&name)[N]) {
  return std::string(name, strnlen(name, N));
}

// Numbers `r` (seq = log.next_seq, from 1), stores it in the slot of `slots` (the log's array)
// that `ring` chooses for r.tenant, and counts a pushed-out entry in log.evicted.
template <typename Log, typename Record, std::size_t N>
Kept<Record> keep(FairRing& ring, Log& log, Record (&slots)[N], Record r) {
  if (log.next_seq == 0) log.next_seq = 1;
  r.seq = log.next_seq++;
  const FairRing::Placement p = ring.place(ring_owner(r.tenant_name), r.seq);
  Record& slot = slots[p.slot];
  slot = r;
  if (!p.evicted) return {slot, std::nullopt};
  ++log.evicted;
  return {slot, p.evicted->tenant};
}

// Rebuilds `ring`'s occupancy from a published log's slots.
template <typename Record, std::size_t N>
void resume_ring(FairRing& ring, const Record (&slots)[N]) {
  std::vector<FairRing::Entry> entries(N);
  for (std::size_t i = 0; i < N; ++i) entries[i] = FairRing::Entry{slots[i].seq, ring_owner(slots[i].tenant_name)};
  ring.assign(entries);
}

}  // namespace vlake::pool
