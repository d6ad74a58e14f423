// Grants becoming mappings and back (alloc/internal.hpp): import, map, place, release, kept
// mappings, and the counted charges.
#include "hook.hpp"

#include "alloc/internal.hpp"
#include "ipc.hpp"
#include "profile.hpp"
#include "share.hpp"
#include "write_span.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace vlake::hook {

using proto::GrantPurpose;
using proto::Status;

// Asks the daemon for `bytes` on device `dev` (AllocPolicy::obtain); a refusal with a status is
// logged only if `report`.
Obtained obtain(State& s, int dev, std::uint64_t bytes, GrantPurpose purpose, bool report, std::uint32_t flags) {
  return s.policy.obtain(DeviceOrdinal{dev}, Bytes{bytes}, purpose, report, flags);
}

void give_back(State& s, std::uint64_t grant_id, std::uint32_t flags) {
  PhaseTimer t(Phase::release_rpc);
  auto st = s.client.release(grant_id, flags);
  if (st && *st != Status::ok) {
    log(LogLevel::warn, "vlaked refused the release of grant %llu (status %d)",
        static_cast<unsigned long long>(grant_id), static_cast<int>(*st));
  }
}

CUresult import_fd(int fd, CUmemGenericAllocationHandle& h) {
  return pass<Row::cuMemImportFromShareableHandle>(false, &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

// Unmaps, frees the VA and releases the imported handles of a logical allocation.
CUresult unmap_logical(const LogicalAlloc& a) {
  const UsedApi& api = used();
  CUresult first = CUDA_SUCCESS;
  auto note = [&first](CUresult rc) {
    if (first == CUDA_SUCCESS) first = rc;
  };
  if (a.base != 0 && a.mapped != 0) {
    PhaseTimer t(Phase::unmap);
    note(pass<Row::cuMemUnmap>(false, static_cast<CUdeviceptr>(a.base), a.mapped));
  }
  PhaseTimer t(Phase::release_handles);
  for (std::uint64_t h : a.handles) note(pass<Row::cuMemRelease>(false, h));
  if (a.base != 0 && a.reserved != 0) {
    note(api.cuMemAddressFree != nullptr ? api.cuMemAddressFree(static_cast<CUdeviceptr>(a.base), a.reserved)
                                         : CUDA_ERROR_NOT_SUPPORTED);
  }
  return first;
}

// Kept mappings leaving this process: unmapped and released (the caller tells the daemon).
void drop_entries(State&, const std::vector<KeptMappings::Entry>& entries) {
  for (const KeptMappings::Entry& e : entries) {
    if (CUresult rc = unmap_logical(e.alloc); rc != CUDA_SUCCESS) {
      log(LogLevel::warn, "unmapping a kept mapping of %s failed (CUresult %d)", format_bytes(e.alloc.mapped).c_str(),
          static_cast<int>(rc));
    }
  }
}

// Drops the kept mappings `match` accepts and tells the daemon (Dropped).
void drop_kept_if(State& s, const std::function<bool(const KeptMappings::Entry&)>& match) {
  auto taken = s.kept.take_if(match);
  if (taken.empty()) return;
  std::vector<std::uint64_t> keys;
  std::vector<KeptMappings::Entry> entries;
  for (auto& [k, e] : taken) {
    keys.push_back(k);
    entries.push_back(std::move(e));
  }
  drop_entries(s, entries);
  (void)s.client.send_dropped(keys);
}

// Drops every kept mapping on `dev` and tells the daemon.
void drop_kept(State& s, int dev) {
  drop_kept_if(s, [dev](const KeptMappings::Entry& e) { return e.alloc.device == dev; });
}

// Only grants the daemon gave a key qualify: one handle, bound to the tenant, no canary.
bool keepable(const State& s, const LogicalAlloc& a) { return s.config.keep_mapped && a.key != 0; }

// A logical allocation of the alloc path leaves this process's books: kept mapped (its grant
// released with kReleaseKeepMapped; docs/hook.md, "Kept mappings") when `may_keep` and it
// qualifies, else unmapped and released. The caller fenced it.
void release_alloc(State& s, LogicalAlloc a, bool may_keep) {
  const std::uint64_t grant_id = a.grant_id;
  if (may_keep && keepable(s, a)) {
    const std::uint64_t key = a.key;
    s.kept.put(key, KeptMappings::Entry{std::move(a), s.client.generation()});
    give_back(s, grant_id, proto::kReleaseKeepMapped);
    ensure_worker(s);  // it reads the daemon's Drop messages
    return;
  }
  if (CUresult rc = unmap_logical(a); rc != CUDA_SUCCESS) {
    log(LogLevel::warn, "unmapping pool allocation 0x%llx failed (CUresult %d)", static_cast<unsigned long long>(a.ptr),
        static_cast<int>(rc));
  }
  give_back(s, grant_id, 0);
}

// Alignment of a right-aligned (guard fault mode) pointer: what cuMemAlloc guarantees.

// True if `p` lies in the mapped part of `a` (the guard chunk is VA the driver knows nothing of).

// Hands mapped memory (a new grant's or a reserved block's) to the application as an allocation
// of `requested` bytes: in guard fault mode right-aligned so that it ends where the mapping ends.
void place(State& s, LogicalAlloc a, bool guard, CUcontext ctx, std::uint64_t requested, CUdeviceptr* dptr) {
  a.ptr = guard ? a.base + a.mapped - round_up(requested, kGuardAlign) : a.base;
  a.requested = requested;
  a.ctx = ctx;
  a.created = std::chrono::steady_clock::now();
  *dptr = static_cast<CUdeviceptr>(a.ptr);
  const std::uint64_t base = a.base;
  const int dev = a.device;
  const std::uint32_t peers = a.peers;
  s.allocs.insert(std::move(a));
  settle(s, base, dev, peers);  // peer access changed since it was mapped (peer.hpp)
}

// The mapping part of map_grant: the grant's memory as a LogicalAlloc `out` (a kept mapping
// reused, or the handles imported, mapped and enabled), not recorded as an allocation; `guard`:
// guard fault mode (out.reserved has the guard chunk).

// Imports, reserves, maps and enables the handles of an alloc grant; records the allocation.
// In guard fault mode the reservation has one more granularity-sized chunk, left unmapped, and
// the returned pointer is right-aligned (256 B) so that the allocation ends at the grant's end.
CUresult map_grant(State& s, GrantResult& g, int dev, CUcontext ctx, std::uint64_t requested, CUdeviceptr* dptr) {
  LogicalAlloc a;
  bool guard = false;
  if (CUresult rc = map_grant_only(s, g, dev, requested, a, guard); rc != CUDA_SUCCESS) return rc;
  place(s, std::move(a), guard, ctx, requested, dptr);
  ensure_worker(s);  // it reads vlaked's notices (Pressure, swaps, host tier moves) and reports activity
  return CUDA_SUCCESS;
}

CUresult map_grant_only(State& s, GrantResult& g, int dev, std::uint64_t requested, LogicalAlloc& out, bool& guard) {
  const UsedApi& api = used();
  if (api.cuMemAddressReserve == nullptr || api.cuMemSetAccess == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::uint64_t expect = 0;
  bool ok = !g.handles.empty() && g.handles.size() == g.fds.size();
  for (std::size_t i = 0; ok && i < g.handles.size(); ++i) {
    ok = g.handles[i].offset == expect && g.handles[i].size > 0;
    expect += g.handles[i].size;
  }
  if (!ok || expect != g.bytes || g.bytes < requested) {
    log(LogLevel::error, "vlaked sent a malformed grant (%zu handles, %zu descriptors)", g.handles.size(),
        g.fds.size());
    return CUDA_ERROR_UNKNOWN;
  }
  // Guard fault mode: one unmapped granularity-sized chunk after the grant, and the pointer
  // right-aligned so that the allocation ends where the mapping ends.
  guard = s.client.guard_mode() == proto::GuardMode::fault;
  std::uint64_t guard_bytes = 0;
  if (guard) {
    guard_bytes = s.client.granularity();
    if (guard_bytes == 0) guard_bytes = g.handles.back().size;
  }
  // Kept mappings (docs/hook.md): the daemon handed back one handle this process still maps.
  const std::uint64_t generation = s.client.generation();
  if (g.handles.size() == 1 && g.handles[0].key != 0) {
    std::vector<KeptMappings::Entry> stale;
    auto hit = s.kept.take(g.handles[0].key, generation, dev, g.bytes, stale);
    drop_entries(s, stale);
    if (hit && (hit->alloc.reserved > hit->alloc.mapped) == guard) {
      PhaseTimer t(Phase::kept_reuse);
      out = std::move(hit->alloc);
      out.grant_id = g.grant_id;
      g.fds.clear();
      return CUDA_SUCCESS;
    }
    if (hit) drop_entries(s, std::vector<KeptMappings::Entry>{std::move(*hit)});
  } else {
    // Handles kept here and now part of a larger grant: the old mappings go (the daemon knows).
    std::vector<std::uint64_t> keys;
    for (const auto& h : g.handles) {
      if (h.key != 0) keys.push_back(h.key);
    }
    if (!keys.empty()) drop_entries(s, s.kept.take_keys(keys));
  }
  LogicalAlloc a;
  a.grant_id = g.grant_id;
  a.device = dev;
  if (g.handles.size() == 1) a.key = g.handles[0].key;
  for (auto& fd : g.fds) {
    CUmemGenericAllocationHandle h = 0;
    CUresult irc = CUDA_SUCCESS;
    {
      PhaseTimer t(Phase::import);
      irc = import_fd(fd.get(), h);
    }
    if (irc != CUDA_SUCCESS) {
      unmap_logical(a);
      return irc;
    }
    a.handles.push_back(h);
    fd.reset();
  }
  CUdeviceptr base = 0;
  CUresult vrc = CUDA_SUCCESS;
  {
    PhaseTimer t(Phase::reserve);
    vrc = api.cuMemAddressReserve(&base, g.bytes + guard_bytes, 0, 0, 0);
  }
  if (CUresult rc = vrc; rc != CUDA_SUCCESS) {
    unmap_logical(a);
    return rc;
  }
  a.base = addr(base);
  a.reserved = g.bytes + guard_bytes;
  for (std::size_t i = 0; i < a.handles.size(); ++i) {
    PhaseTimer t(Phase::map);
    if (CUresult rc = pass<Row::cuMemMap>(false, base + g.handles[i].offset, g.handles[i].size, std::size_t{0},
                                          a.handles[i], 0ULL);
        rc != CUDA_SUCCESS) {
      unmap_logical(a);
      return rc;
    }
    a.mapped = g.handles[i].offset + g.handles[i].size;
  }
  // Its own device and every peer that enabled access to it (peer.hpp): one call.
  a.peers = s.peers.of(dev);
  AccessDescs access;
  const std::size_t descs = access_for(dev, a.peers, access);
  CUresult arc = CUDA_SUCCESS;
  {
    PhaseTimer t(Phase::access);
    arc = api.cuMemSetAccess(base, g.bytes, access.data(), descs);
  }
  if (CUresult rc = arc; rc != CUDA_SUCCESS) {
    unmap_logical(a);
    return rc;
  }
  out = std::move(a);
  return CUDA_SUCCESS;
}

// ---- Local reserve ------------------------------------------------------------------------------

bool reserve_usable(const State& s) { return s.policy.reserve_usable(); }

// Releases blocks that leave the reserve for good: kept mapped where they qualify and `keep`
// (evicted or expired), else unmapped (pressure, refusals).
void retire_blocks(State& s, std::vector<ReserveBlock>& blocks, bool keep) {
  for (ReserveBlock& b : blocks) release_alloc(s, std::move(b.alloc), keep);
  blocks.clear();
}

int device_of_uuid(State& s, const Uuid& u) {
  std::lock_guard lock(s.uuid_mu);
  for (std::size_t i = 0; i < s.uuids.size(); ++i) {
    if (s.uuids[i] && *s.uuids[i] == u) return static_cast<int>(i);
  }
  return -1;
}

// Prefetch (defined with in_context below).

Charge charge_counted(State& s, int dev, std::uint64_t bytes) {
  Obtained o = obtain(s, dev, bytes, GrantPurpose::counted);
  Charge c;
  c.rc = o.rc;
  if (o.decision == Decision::passthrough) {
    c.outcome = Charge::Outcome::passthrough;
  } else if (o.decision == Decision::granted) {
    c.outcome = Charge::Outcome::granted;
    c.grant_id = o.grant.grant_id;
    c.bytes = o.grant.bytes;
  }
  return c;
}

void uncharge(State& s, std::uint64_t grant_id) { give_back(s, grant_id, 0); }

}  // namespace vlake::hook
