// The alloc room's functions shared by its files (mapping.cpp, worker.cpp, frees.cpp, entry.cpp,
// seams.cpp) and the hook's process state (hook.cpp). Not an interface for other rooms: they use
// hook.hpp.
//
// Contract: every function takes the process state it works on; none of them throws across an
// extern "C" boundary (the trampolines of interposer/exports.cpp catch). Thread-safety and lock
// order are State's (hook.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hook.hpp"

namespace vlake::hook {

using alloc::Decision;
using alloc::Obtained;

// ---- Process state (hook.cpp) ----
// The state if it was created, else nullptr (never creates it: for exit and wake-up paths).
State* existing_state() noexcept;
// The state, or nullptr when the call must pass straight through (disabled or initializing).
State* active() noexcept;
// The device (and context) current on the calling thread; remembers the context's device.
CUresult current_device(int& dev, CUcontext* ctx_out = nullptr);
bool capturing(CUstream stream);
CUstream effective_stream(bool ptds, CUstream s);

inline std::uint64_t addr(CUdeviceptr p) { return static_cast<std::uint64_t>(p); }
inline std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
// Alignment of a right-aligned (guard fault mode) pointer: what cuMemAlloc guarantees.
inline constexpr std::uint64_t kGuardAlign = 256;
// True if `p` lies in the mapped part of `a` (the guard chunk is VA the driver knows nothing of).
inline bool in_mapping(const LogicalAlloc& a, std::uint64_t p) { return p - a.base < a.mapped; }

// ---- Reports (seams.cpp) ----
std::string suppressed_note(std::uint64_t n);
void report_refusal(State& s, const GrantResult& g, int dev, std::uint64_t requested, const char* what = nullptr);

// ---- Grants and mappings (mapping.cpp) ----
// Asks the daemon for `bytes` on device `dev` (AllocPolicy::obtain); a refusal with a status is
// logged only if `report`.
Obtained obtain(State& s, int dev, std::uint64_t bytes, proto::GrantPurpose purpose, bool report = true,
                std::uint32_t flags = 0);
void give_back(State& s, std::uint64_t grant_id, std::uint32_t flags);
CUresult import_fd(int fd, CUmemGenericAllocationHandle& h);
// Unmaps, frees the VA and releases the imported handles of a logical allocation.
CUresult unmap_logical(const LogicalAlloc& a);
// Kept mappings leaving this process: unmapped and released (the caller tells the daemon).
void drop_entries(State& s, const std::vector<KeptMappings::Entry>& entries);
// Drops the kept mappings `match` accepts / every kept mapping on `dev`, and tells the daemon.
void drop_kept_if(State& s, const std::function<bool(const KeptMappings::Entry&)>& match);
void drop_kept(State& s, int dev);
bool keepable(const State& s, const LogicalAlloc& a);
// A logical allocation of the alloc path leaves this process's books: kept mapped when
// `may_keep` and it qualifies, else unmapped and released. The caller fenced it.
void release_alloc(State& s, LogicalAlloc a, bool may_keep);
// Records mapped memory as an allocation of `requested` bytes (right-aligned when `guard`).
void place(State& s, LogicalAlloc a, bool guard, CUcontext ctx, std::uint64_t requested, CUdeviceptr* dptr);
// Imports, reserves, maps and enables a grant's handles and records the allocation.
CUresult map_grant(State& s, GrantResult& g, int dev, CUcontext ctx, std::uint64_t requested, CUdeviceptr* dptr);
// The mapping part of map_grant, not recorded; `guard`: guard fault mode.
CUresult map_grant_only(State& s, GrantResult& g, int dev, std::uint64_t requested, LogicalAlloc& out, bool& guard);
bool reserve_usable(const State& s);
// Releases blocks that leave the reserve for good: kept mapped where they qualify and `keep`.
void retire_blocks(State& s, std::vector<ReserveBlock>& blocks, bool keep = false);
int device_of_uuid(State& s, const Uuid& u);

// ---- The worker (worker.cpp) ----
void ensure_worker(State& s);
// Blocks to unmap and release off the caller's thread (inline if there is no worker).
void retire_later(State& s, std::vector<ReserveBlock> blocks);
// Wakes the worker for queued prefetches (starts it if needed).
void kick_prefetch(State& s);
// Fetches the blocks misses queued into the reserve (prefetch.hpp); runs with busy_mu held.
void run_prefetch(State& s);

// Runs `f` with `ctx` pushed as the calling thread's current context (the worker has none);
// false, without running it, when the context cannot be pushed (destroyed).
template <class F>
bool in_context(CUcontext ctx, F f) {
  const UsedApi& api = used();
  if (ctx == nullptr || api.cuCtxPushCurrent_v2 == nullptr || api.cuCtxPopCurrent_v2 == nullptr) return false;
  if (api.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) return false;
  f();
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent_v2(&popped);
  return true;
}

// ---- Frees (frees.cpp) ----
// Frees a logical allocation of the alloc path: into the local reserve (after the fence that
// cuMemFree implies, unless the caller already fenced), or unmapped and its grant released.
CUresult free_logical(State& s, LogicalAlloc a, bool fenced = false);
// Completes the stream-ordered frees the streams have passed; how many. `wait`: wait for
// completions in progress on another thread.
std::size_t finish_frees(State& s, bool wait = true);
// Before a refused allocation is retried or a memory query answered: the frees the streams
// have passed are completed, those another thread is completing (`outstanding`) waited for.
void settle_frees(State& s, bool outstanding);
void wake_for_frees() noexcept;
void drain_frees_at_exit(State& s);
CUresult record_free_event(State& s, CUstream stream, CUcontext& ctx, CUevent& ev);
CUresult free_after_event(State& s, PendingFree f);

}  // namespace vlake::hook
