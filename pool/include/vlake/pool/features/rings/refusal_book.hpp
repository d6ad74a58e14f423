// vlake::pool::RefusalBook — the refusal log the state segment publishes (state::RefusalLog;
// `vlakectl events`, the Kubernetes Events relay), kept per tenant (FairRing): a tenant's flood
// of refusals only pushes out its own (docs/security.md, "Rings per tenant").
//
// What it does
//   - record(): numbers a refusal (seq from 1, carried across restarts by resume()) and keeps it
//     in the slot FairRing chooses; says whose entry it pushed out, if any.
//   - evicted(): a tenant's refusals pushed out (TenantRecord::refusals_evicted); set_evicted()
//     resumes it, forget() drops it when the tenant record is freed.
// Ownership: plain values. No clock or I/O. Errors: none. Thread-safety: none; the event loop's
// thread only.
#pragma once

#include <cstdint>
#include <string>

#include "vlake/contracts/state.hpp"
#include "vlake/pool/features/rings/fair_ring.hpp"

namespace vlake::pool {

class RefusalBook {
 public:
  [[nodiscard]] const state::RefusalLog& log() const noexcept { return log_; }
  // A previous daemon's log: numbering and the kept refusals carry on.
  void resume(const state::RefusalLog& old);
  // Numbers `r` and keeps it (its tenant: r.tenant_name, "" for none).
  Kept<state::RefusalRecord> record(const state::RefusalRecord& r) { return keep(ring_, log_, log_.refusals, r); }

  // By tenant name.
  [[nodiscard]] std::uint64_t evicted(const std::string& tenant) const { return ring_.evicted(tenant); }
  void set_evicted(const std::string& tenant, std::uint64_t n) { ring_.set_evicted(tenant, n); }
  void forget(const std::string& tenant) { ring_.forget(tenant); }

 private:
  state::RefusalLog log_{};
  FairRing ring_{state::kRefusalEvents};
};

}  // namespace vlake::pool
