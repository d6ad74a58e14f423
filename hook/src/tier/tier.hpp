// The host tier, the hook's side (docs/swap.md, "Host tier"): vlaked moves whole alloc grants
// of this process between device memory and pinned host memory, at the same addresses, while
// the process keeps running (protocol: TierNotice / TierStep / TierPlan, contracts/protocol.hpp).
//
// Contract
// - run_move(s, notice) runs one move on the worker thread: closes the entry gate and waits
//   until no application thread is inside a hooked call (gate.hpp; busy: answered
//   TierStep{busy}, nothing moved), synchronizes every context this process allocated in, then
//   takes the grants vlaked names one by one: for each, imports the pieces vlaked sent, copies
//   the grant's bytes into them (the copy engines, in the allocation's context), maps them at
//   the grant's addresses in place of its old handles (access for its device and the peers it
//   had), releases the old handles and says moved. A grant that is not a live allocation here
//   is declined (one in the local reserve is given back to vlaked instead: nobody uses it); a
//   step that fails leaves the grant on its old handles (failed). The gate opens when vlaked
//   says the move is over, or when vlaked cannot be reached.
// - Nothing the application sees changes: pointers, sizes, contents; kernels reach demoted
//   memory over PCIe. The move's driver calls do not count as the process's activity.
// Thread-safety: the worker thread only (busy_mu held). Never throws.
#pragma once

#include "vlake/contracts/protocol.hpp"

namespace vlake::hook {

struct State;

void run_move(State& s, const proto::TierNotice& notice) noexcept;

}  // namespace vlake::hook
