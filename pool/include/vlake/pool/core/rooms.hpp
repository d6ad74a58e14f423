// vlake::pool::Rooms — the feature rooms a Node owns (pool/features/): one component per feature,
// each with its own state, rules, header and test file, and the fair shares of the fixed tables. The Node feeds them
// from its operations and shows them, read-only, through Node::rooms() (the publisher, vlakectl's views and the tests
// read them there); nothing else writes them.
//
// Ownership: plain members, constructed from the Node's settings. Thread-safety: none; the event
// loop's thread, through the Node.
#pragma once

#include "vlake/contracts/state.hpp"
#include "vlake/pool/core/settings.hpp"
#include "vlake/pool/fair_share.hpp"
#include "vlake/pool/features/contexts/context_book.hpp"
#include "vlake/pool/features/counted/counted_audit.hpp"
#include "vlake/pool/features/guard/guard_book.hpp"
#include "vlake/pool/features/ipc/ipc_registry.hpp"
#include "vlake/pool/features/parking/parking_lot.hpp"
#include "vlake/pool/features/reclaim/reclaim_trust.hpp"
#include "vlake/pool/features/rings/refusal_book.hpp"
#include "vlake/pool/features/swap/swap_book.hpp"
#include "vlake/pool/features/tier/host_tier.hpp"
#include "vlake/pool/features/unhooked/unhooked_book.hpp"

namespace vlake::pool {

struct Rooms {
  explicit Rooms(const NodeSettings& s)
      : reclaim(s.reclaim_deadline, s.reclaim_skip),
        counted(s.counted_realize, s.counted_skip),
        contexts(s.context_memory, s.context_fallback),
        guard(s.guard_event_rate, s.guard_event_burst),
        tier(s.host_tier, s.host_tier_piece, Bytes{2ull << 20}) {
    parking.set_ask_again(s.reclaim_deadline);
  }

  IpcRegistry ipc;        // CUDA IPC exports and imports (docs/ipc.md)
  ParkingLot parking;     // grants waiting for memory (docs/pool.md, "Pressure protocol")
  SwapBook swaps;         // swapping idle processes to host memory, per session (docs/swap.md)
  ReclaimTrust reclaim;   // what sessions asked to give memory back gave (claims and measurements)
  CountedAudit counted;   // counted grants against NVML's figures (docs/swap.md)
  UnhookedBook unhooked;  // memory outside vlake, per tenant (docs/quota.md, "enforce")
  ContextBook contexts;   // CUDA contexts admitted before their creation, per session
  GuardBook guard;        // guard event log, rates, kernel faults, canary sweep (docs/guard.md)
  RefusalBook refusals;   // the refusal log, kept per tenant (features/rings)
  HostTier tier;          // the host tier: host memory made ahead, grants on it, moves (docs/swap.md)
  // Who may take the last entries of the session, grant and import tables (fair_share.hpp,
  // docs/daemon.md "Limits").
  FairShare session_share{st::kMaxSessions};
  FairShare grant_share{st::kMaxGrants};
  FairShare import_share{st::kMaxGrants};
};

}  // namespace vlake::pool
