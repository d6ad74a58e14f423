// vlake::pool::GuardBook — what the guards of a node remember (docs/guard.md): the guard event
// log, each tenant's guard event rate, its kernel faults, and where the canary sweep resumes.
//
// What it does
//   - record(): numbers a guard event (seq from 1, carried across restarts by resume()) and
//     keeps it in the ring the state segment publishes (st::kGuardEvents), kept per tenant
//     (features/rings FairRing): one tenant's events only push out its own, or those of a tenant
//     holding no fewer; says whose event it pushed out. guard_events_evicted() counts them.
//   - admit(): a token bucket per tenant (burst tokens, refilled at `rate` per second): false
//     when the tenant is over its rate (the event is then counted, not recorded).
//   - count_fault()/kernel_faults(): a tenant's kernel faults by st::FaultAttributes bits.
//   - sweep_due()/sweep_order()/swept(): the periodic canary sweep, bounded per tick, resumes
//     after the last grant it checked.
//   - forget(): a tenant record was freed (its id may be reused): its bucket, faults and
//     eviction count go.
// Ownership: plain values. No clock of its own (every rule takes the time). Errors: none.
// Thread-safety: none; the event loop's thread only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/pool/features/rings/fair_ring.hpp"

namespace vlake::pool {

class GuardBook {
 public:
  using Time = std::chrono::steady_clock::time_point;
  using Faults = std::array<std::uint32_t, 4>;  // by st::FaultAttributes bits

  // `rate`: events per second per tenant; `burst`: the bucket's size.
  GuardBook(double rate, double burst) noexcept : rate_(rate), burst_(burst) {}

  // ---- the guard event log
  [[nodiscard]] const state::GuardLog& log() const noexcept { return log_; }
  // A previous daemon's log: numbering and the kept events carry on.
  void resume(const state::GuardLog& old);
  // Numbers `e` (its tenant: e.tenant_name) and keeps it; returns it as kept and whose event it
  // pushed out (a tenant name; none while the ring has a free slot).
  Kept<state::GuardEventRecord> record(const state::GuardEventRecord& e) { return keep(ring_, log_, log_.events, e); }
  // The tenant's events pushed out of the ring (TenantRecord::guard_events_evicted).
  [[nodiscard]] std::uint64_t guard_events_evicted(const std::string& tenant) const { return ring_.evicted(tenant); }

  // ---- rate per tenant
  // Takes one token of the tenant's bucket at `now` (a new tenant starts full); false: empty.
  bool admit(TenantId t, Time now);

  // ---- kernel faults per tenant
  void count_fault(TenantId t, std::uint32_t attributes);
  void set_faults(TenantId t, const Faults& f);                                                   // resume
  void set_evicted(const std::string& tenant, std::uint64_t n) { ring_.set_evicted(tenant, n); }  // resume
  [[nodiscard]] Faults kernel_faults(TenantId t) const;

  // The tenant record (`t`, named `name`) was freed: its bucket, faults and eviction count are
  // forgotten.
  void forget(TenantId t, const std::string& name);

  // ---- canary sweep
  // True (and the sweep counted as done at `now`) when `interval` (> 0) passed since the last one.
  bool sweep_due(Time now, std::chrono::milliseconds interval) noexcept;
  // Grant ids in the order the sweep checks them: ascending, starting after the last grant checked.
  [[nodiscard]] std::vector<std::uint64_t> sweep_order(std::vector<std::uint64_t> ids) const;
  void swept(std::uint64_t grant) noexcept { cursor_ = grant; }

 private:
  struct Bucket {
    double tokens = 0;
    Time last{};
  };
  double rate_;
  double burst_;
  state::GuardLog log_{};
  FairRing ring_{state::kGuardEvents};
  std::map<std::uint32_t, Bucket> buckets_;  // by TenantId value
  std::map<std::uint32_t, Faults> faults_;   // by TenantId value
  Time last_sweep_{};
  std::uint64_t cursor_ = 0;  // the sweep resumes after this grant id
};

}  // namespace vlake::pool
