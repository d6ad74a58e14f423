// Implementations of the intercepted entry points (see hook.hpp and docs/hook.md).
#include "hook.hpp"

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

// ---- Process state ------------------------------------------------------------------------------

namespace {

std::atomic<State*> g_state{nullptr};
std::once_flag g_state_once;
thread_local bool t_creating = false;

void fork_prepare() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) return;
  s->busy_mu.lock();
  s->settle_mu.lock();
  s->work_mu.lock();
  ipc::lock_all();
  s->client.prepare_fork();
  s->allocs.lock_all();
  s->creates.lock_all();
  s->managed.lock_all();
  s->reserve.lock_all();
  s->kept.lock_all();
  s->frees.lock_all();
  s->events.lock_all();
  s->usage_cache.lock_all();
  s->uuid_mu.lock();
  s->reclaim.prepare_fork();
}

void fork_parent() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) return;
  s->reclaim.parent_after_fork();
  s->uuid_mu.unlock();
  s->usage_cache.unlock_all();
  s->events.unlock_all();
  s->frees.unlock_all();
  s->kept.unlock_all();
  s->reserve.unlock_all();
  s->managed.unlock_all();
  s->creates.unlock_all();
  s->allocs.unlock_all();
  s->client.parent_after_fork();
  ipc::unlock_all();
  s->work_mu.unlock();
  s->settle_mu.unlock();
  s->busy_mu.unlock();
}

// VLAKE_RESERVE_STATS (docs/hook.md, "Choosing the reserve's defaults"): the local reserve's
// reuse statistics, written once at exit to "<path>.<pid>.json" (a forked child writes its own).
void write_reserve_stats() noexcept {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr || !s->reserve.stats_enabled()) return;
  try {
    const std::string path = s->config.reserve_stats + "." + std::to_string(::getpid()) + ".json";
    const std::string json = s->reserve.stats().to_json(s->reserve.max_bytes(), s->reserve.max_age()) + "\n";
    if (std::FILE* f = std::fopen(path.c_str(), "we")) {
      const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
      if (std::fclose(f) != 0 || !ok) log(LogLevel::warn, "writing %s failed", path.c_str());
    } else {
      log(LogLevel::warn, "cannot write the reserve statistics to %s: %s", path.c_str(), std::strerror(errno));
    }
  } catch (...) {
  }
}

// The child owns none of the parent's grants and must not talk on its connection: it forgets
// both and connects afresh when it uses CUDA.
void fork_child() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) return;
  s->reclaim.child_after_fork();
  s->uuid_mu.unlock();
  s->kept.clear_after_fork();
  s->usage_cache.clear_after_fork();
  s->events.clear_after_fork();  // the parent's events and frees: never touched here
  s->frees.clear_after_fork();
  s->reserve.clear_after_fork();
  s->managed.clear_after_fork();
  s->creates.clear_after_fork();
  s->allocs.clear_after_fork();
  s->client.child_after_fork();
  ipc::clear_after_fork();
  g_swap_gate_closed.store(false, std::memory_order_relaxed);  // the parent's swap is not the child's
  // The worker thread does not exist in the child; its queue holds the parent's grants.
  s->retire_queue.clear();
  s->after_reclaim.clear();
  s->kicked = false;
  s->frees_queued.store(0);
  s->frees_completed.store(0);
  s->worker_started = false;
  s->stopping = false;
  s->work_mu.unlock();
  s->settle_mu.unlock();
  s->busy_mu.unlock();
  s->refusals.reset();
  s->unreachable.reset();
  s->passthrough_warned.store(false);
  s->fault_reported.store(false);
}

void create_state() {
  Config c = Config::from_environment();
  set_log_level(c.log_level);
  for (const std::string& p : c.problems) log(LogLevel::warn, "%s", p.c_str());
  auto* s = new State(std::move(c));  // never destroyed: wrappers may run during exit
  ::pthread_atfork(fork_prepare, fork_parent, fork_child);
  if (s->config.disabled) {
    // VLAKE_DISABLE only where the quota file allows it (allow_disable); without a daemon there
    // is nothing to enforce (NVML attribution still charges the process's memory).
    switch (s->client.ask_passthrough()) {
      case DaemonClient::Passthrough::allowed:
        s->passthrough = true;
        log(LogLevel::info, "VLAKE_DISABLE is set and allowed for tenant %s: passing everything through",
            s->client.tenant_name().c_str());
        break;
      case DaemonClient::Passthrough::unreachable:
        s->passthrough = true;
        log(LogLevel::info, "VLAKE_DISABLE is set and vlaked is unreachable (%s): passing everything through",
            s->client.last_error().c_str());
        break;
      case DaemonClient::Passthrough::refused:
        log(LogLevel::warn,
            "VLAKE_DISABLE is set but the quota file does not allow it for tenant %s (allow_disable): the hook "
            "stays on",
            s->client.tenant_name().c_str());
        break;
    }
  }
  if (s->config.profile) Profile::get().enable();
  if (!s->config.reserve_stats.empty() && s->reserve.enabled()) {
    s->reserve.enable_stats();
    std::atexit(write_reserve_stats);
  }
  g_state.store(s, std::memory_order_release);
}

}  // namespace

State* state() noexcept {
  State* s = g_state.load(std::memory_order_acquire);
  if (s != nullptr) return s;
  if (t_creating) return nullptr;
  t_creating = true;
  try {
    std::call_once(g_state_once, create_state);
  } catch (...) {
  }
  t_creating = false;
  return g_state.load(std::memory_order_acquire);
}

namespace {

// The state, or nullptr when the call must pass straight through (disabled or initializing).
State* active() noexcept {
  State* s = state();
  return s != nullptr && !s->passthrough ? s : nullptr;
}

std::uint64_t addr(CUdeviceptr p) { return static_cast<std::uint64_t>(p); }

// Records ctx -> device in the state's small table (first free or matching slot).
void remember_context(CUcontext ctx, int dev) noexcept {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr || ctx == nullptr) return;
  for (std::size_t i = 0; i < State::kContextSlots; ++i) {
    CUcontext seen = s->ctx_seen[i].load(std::memory_order_acquire);
    if (seen == ctx) return;
    if (seen == nullptr) {
      s->ctx_device[i].store(dev, std::memory_order_relaxed);
      CUcontext expected = nullptr;
      if (s->ctx_seen[i].compare_exchange_strong(expected, ctx, std::memory_order_acq_rel) || expected == ctx) {
        return;
      }
    }
  }
}

CUresult current_device(int& dev, CUcontext* ctx_out = nullptr) {
  const UsedApi& api = used();
  if (api.cuCtxGetCurrent == nullptr || api.cuCtxGetDevice == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  CUcontext ctx = nullptr;
  if (CUresult rc = api.cuCtxGetCurrent(&ctx); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUdevice d = 0;
  if (CUresult rc = api.cuCtxGetDevice(&d); rc != CUDA_SUCCESS) return rc;
  dev = d;
  if (ctx_out != nullptr) *ctx_out = ctx;
  remember_context(ctx, d);
  return CUDA_SUCCESS;
}

std::string suppressed_note(std::uint64_t n) {
  if (n == 0) return {};
  return " (" + std::to_string(n) + " similar message" + (n == 1 ? "" : "s") + " suppressed)";
}

void report_refusal(State& s, const GrantResult& g, int dev, std::uint64_t requested) {
  std::uint64_t suppressed = 0;
  if (!s.refusals.allow(suppressed)) return;
  const std::string tenant = s.client.tenant_name();
  const std::string note = suppressed_note(suppressed);
  if (g.status == Status::over_limit) {
    log(LogLevel::error, "out of memory on GPU %d: tenant %s holds %s of its %s limit; request of %s refused%s", dev,
        tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(), format_bytes(requested).c_str(),
        note.c_str());
  } else if (g.status == Status::namespace_over_limit) {
    log(LogLevel::error,
        "out of memory on GPU %d: the namespace of tenant %s holds %s of its %s limit; request of "
        "%s refused%s",
        dev, tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(),
        format_bytes(requested).c_str(), note.c_str());
  } else if (g.status == Status::limit_reached) {
    log(LogLevel::error,
        "out of memory on GPU %d: tenant %s holds %llu of its %llu grants (vlaked's grant cap, or its grant table "
        "is full); request of %s refused%s",
        dev, tenant.c_str(), static_cast<unsigned long long>(g.used), static_cast<unsigned long long>(g.limit),
        format_bytes(requested).c_str(), note.c_str());
  } else if (g.status == Status::guarantee) {
    log(LogLevel::error,
        "out of memory on GPU %d: the rest of the GPU is guaranteed to other namespaces; tenant %s "
        "holds %s of its %s limit; request of %s refused%s",
        dev, tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(),
        format_bytes(requested).c_str(), note.c_str());
  } else if (g.status == Status::out_of_memory) {
    log(LogLevel::error,
        "out of memory on GPU %d: the GPU is full (the node pool has no memory left); tenant %s "
        "holds %s of its %s limit; request of %s refused%s",
        dev, tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(),
        format_bytes(requested).c_str(), note.c_str());
  } else {
    log(LogLevel::error, "allocation of %s on GPU %d refused by vlaked (status %d)%s", format_bytes(requested).c_str(),
        dev, static_cast<int>(g.status), note.c_str());
  }
}

using alloc::Decision;
using alloc::Obtained;

void drop_kept(State& s, int dev);
void ensure_worker(State& s);  // the worker thread (below)

// Asks the daemon for `bytes` on device `dev` (AllocPolicy::obtain); a refusal with a status is
// logged only if `report`.
Obtained obtain(State& s, int dev, std::uint64_t bytes, GrantPurpose purpose, bool report = true) {
  return s.policy.obtain(DeviceOrdinal{dev}, Bytes{bytes}, purpose, report);
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

void ensure_worker(State& s);

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
constexpr std::uint64_t kGuardAlign = 256;

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// True if `p` lies in the mapped part of `a` (the guard chunk is VA the driver knows nothing of).
bool in_mapping(const LogicalAlloc& a, std::uint64_t p) { return p - a.base < a.mapped; }

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
CUresult map_grant_only(State& s, GrantResult& g, int dev, std::uint64_t requested, LogicalAlloc& out, bool& guard);

// Imports, reserves, maps and enables the handles of an alloc grant; records the allocation.
// In guard fault mode the reservation has one more granularity-sized chunk, left unmapped, and
// the returned pointer is right-aligned (256 B) so that the allocation ends at the grant's end.
CUresult map_grant(State& s, GrantResult& g, int dev, CUcontext ctx, std::uint64_t requested, CUdeviceptr* dptr) {
  LogicalAlloc a;
  bool guard = false;
  if (CUresult rc = map_grant_only(s, g, dev, requested, a, guard); rc != CUDA_SUCCESS) return rc;
  place(s, std::move(a), guard, ctx, requested, dptr);
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
void retire_blocks(State& s, std::vector<ReserveBlock>& blocks, bool keep = false) {
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
void run_prefetch(State& s);

// Swapping (docs/swap.md): a process whose other threads used more than a fifth of a CPU over
// the last 500 ms is busy (it does not get ready to be swapped out); one on the host that did so
// over the last 200 ms is brought back at once.
constexpr std::uint64_t kBusyWindowNs = 500'000'000;
constexpr std::uint64_t kWakeWindowNs = 200'000'000;

// The worker's periodic duties; runs with busy_mu held.
void worker_tick(State& s, std::vector<ReserveBlock>& work, std::vector<std::pair<int, std::uint64_t>>& reclaimed,
                 std::array<std::uint64_t, proto::kMaxDevices>& reported,
                 std::array<bool, proto::kMaxDevices>& reported_reclaim,
                 std::chrono::steady_clock::time_point& last_report,
                 std::chrono::steady_clock::time_point& last_active_report) {
  retire_blocks(s, work, true);
  auto old = s.reserve.expire(std::chrono::steady_clock::now());
  bool urgent = !old.empty();
  retire_blocks(s, old, true);
  s.client.poll_pressure();
  // Swapping (docs/swap.md): close the gate and say ready, or open it (the swap was called off).
  if (s.client.overcommit_known()) {
    s.cpu.sample(static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()),
                 app_cpu_ns(static_cast<long>(::gettid())));
  }
  for (const proto::SwapNotice& n : s.client.take_swap_notices()) {
    if (n.phase == proto::SwapPhase::host) {
      s.on_host = g_swap_gate_closed.load(std::memory_order_acquire);  // the checkpoint is done
      continue;
    }
    if (n.phase == proto::SwapPhase::out) {
      if (s.cpu.busy(kBusyWindowNs)) {
        // Its threads are computing: not idle (vlaked leaves it alone when it does not answer).
        log(LogLevel::debug, "vlaked wants to move this process to host memory, but it is busy: not now");
        continue;
      }
      s.on_host = false;
      close_swap_gate();
      log(LogLevel::info, "vlaked is moving this idle process to host memory; its next CUDA call brings it back");
      (void)s.client.send_swap_ready(n.swap_id);
    } else {
      open_swap_gate();
    }
  }
  // On the host, and its threads started computing: bring it back now, before one of them blocks
  // in a driver call the hook does not intercept (docs/swap.md).
  // (Not while the checkpoint runs: the driver's own work in the process uses the CPU then.)
  if (!g_swap_gate_closed.load(std::memory_order_acquire)) {
    s.on_host = false;
  } else if (s.on_host && s.cpu.busy(kWakeWindowNs)) {
    (void)ask_swap_in();
  }
  // Kept mappings: the daemon's Drop messages, and mappings kept under an older connection.
  if (std::vector<std::uint64_t> keys = s.client.take_drops(); !keys.empty()) {
    drop_entries(s, s.kept.take_keys(keys));
    (void)s.client.send_dropped(keys);
  }
  if (s.kept.size() > 0) {
    const std::uint64_t generation = s.client.generation();
    drop_kept_if(s, [generation](const KeptMappings::Entry& e) { return e.generation != generation; });
  }
  for (const PressureNote& n : s.client.take_pressure()) {
    const int dev = device_of_uuid(s, n.device);
    if (dev < 0) continue;
    const std::uint64_t had = s.reserve.bytes(dev);
    auto out = s.reserve.drain(dev, n.bytes);
    log(LogLevel::info, "vlaked asked for memory on GPU %d: returning %zu reserved block(s)", dev, out.size());
    urgent = true;
    retire_blocks(s, out);
    // More than the reserve held (or all of it): the frameworks' caches (docs/hook.md, "Reclaim").
    if (s.reclaim.registered() && (n.bytes == 0 || had < n.bytes))
      s.reclaim.request(dev, n.bytes == 0 ? 0 : n.bytes - had);
  }
  // What the reclaim callbacks freed went into the reserve, or stayed mapped as kept mappings
  // (blocks the reserve could not hold): both go back to vlaked.
  for (const auto& [dev, bytes] : reclaimed) {
    auto out = s.reserve.drain(dev, 0);
    urgent = true;
    retire_blocks(s, out);
    drop_kept(s, dev);
  }
  reclaimed.clear();
  const bool reclaim = s.reclaim.registered();
  const auto now = std::chrono::steady_clock::now();
  // Activity (vlakectl's IDLE column, vlake_process_idle_seconds; overcommit: vlaked swaps out
  // processes idle for a while): at most one report a second while the process makes CUDA calls.
  bool active = false;
  if (s.client.answered() && now - last_active_report >= std::chrono::seconds(1) &&
      g_cuda_active.exchange(false, std::memory_order_relaxed)) {
    active = true;
    last_active_report = now;
  }
  if (!urgent && !active && now - last_report < std::chrono::milliseconds(250)) return;
  last_report = now;
  for (std::size_t d = 0; d < proto::kMaxDevices; ++d) {
    std::optional<Uuid> u;
    {
      std::lock_guard lock(s.uuid_mu);
      u = s.uuids[d];
    }
    if (!u) continue;
    const std::uint64_t bytes = s.reserve.bytes(static_cast<int>(d));
    if (bytes == reported[d] && reclaim == reported_reclaim[d] && !active) continue;
    if (s.client.send_reserve_report(*u, bytes, s.reserve.blocks(static_cast<int>(d)), reclaim, active)) {
      reported[d] = bytes;
      reported_reclaim[d] = reclaim;
      active = false;  // one report says it
    }
  }
}

// Stream-ordered frees (defined with the free path below).
std::size_t finish_frees(State& s, bool wait = true);
void drain_frees_at_exit(State& s);

constexpr auto kWorkerPeriod = std::chrono::milliseconds(50);

void worker_main(State* s) {
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);  // the application's handlers never run here
  ::pthread_setname_np(::pthread_self(), "vlake-reserve");
  t_gate_exempt = true;  // never asks for a restore (swap.hpp)
  std::array<std::uint64_t, proto::kMaxDevices> reported{};
  std::array<bool, proto::kMaxDevices> reported_reclaim{};
  auto last_report = std::chrono::steady_clock::time_point{};
  auto last_active_report = std::chrono::steady_clock::time_point{};
  auto last_tick = std::chrono::steady_clock::time_point{};
  for (;;) {
    std::vector<ReserveBlock> work;
    std::vector<std::pair<int, std::uint64_t>> reclaimed;
    {
      std::unique_lock lock(s->work_mu);
      // Frees waiting for their stream are polled sooner (PendingFrees::next_poll()).
      const std::chrono::microseconds wait = s->frees.empty() ? kWorkerPeriod : s->frees.next_poll();
      s->work_cv.wait_for(lock, wait, [s] { return !s->retire_queue.empty() || s->kicked || s->stopping; });
      if (s->stopping) return;
      s->kicked = false;
      work.swap(s->retire_queue);
      reclaimed.swap(s->after_reclaim);
    }
    std::lock_guard busy(s->busy_mu);
    {
      std::lock_guard lock(s->work_mu);
      if (s->stopping) return;
    }
    try {
      finish_frees(*s);
    } catch (...) {
    }
    try {
      run_prefetch(*s);
    } catch (...) {
    }
    // A wake-up only to poll frees leaves the periodic duties to their own pace.
    const auto now = std::chrono::steady_clock::now();
    if (work.empty() && reclaimed.empty() && now - last_tick < kWorkerPeriod) continue;
    last_tick = now;
    try {
      worker_tick(*s, work, reclaimed, reported, reported_reclaim, last_report, last_active_report);
    } catch (...) {
    }
  }
}

// At exit (before the driver's own exit handlers, which were registered earlier): stop the
// worker and keep it off the driver for good.
void stop_worker() {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr) return;
  {
    std::lock_guard lock(s->work_mu);
    if (!s->worker_started) return;
    s->stopping = true;
  }
  s->work_cv.notify_all();
  s->reclaim.stop();
  s->busy_mu.lock();  // waits for a tick in progress; never unlocked
  drain_frees_at_exit(*s);
}

void ensure_worker(State& s) {
  std::lock_guard lock(s.work_mu);
  if (s.worker_started || s.stopping) return;
  try {
    std::thread(worker_main, &s).detach();
  } catch (...) {
    return;  // no thread: blocks leave the reserve only on refusals (retired inline)
  }
  s.worker_started = true;
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(stop_worker); });
}

// Blocks to unmap and release off the caller's thread (inline if there is no worker).
void retire_later(State& s, std::vector<ReserveBlock> blocks) {
  if (blocks.empty()) return;
  ensure_worker(s);
  {
    std::lock_guard lock(s.work_mu);
    if (s.worker_started && !s.stopping) {
      for (auto& b : blocks) s.retire_queue.push_back(std::move(b));
      blocks.clear();
    }
  }
  if (blocks.empty()) {
    s.work_cv.notify_one();
    return;
  }
  retire_blocks(s, blocks);
}

// Wakes the worker for queued prefetches (starts it if needed).
void kick_prefetch(State& s) {
  ensure_worker(s);
  {
    std::lock_guard lock(s.work_mu);
    s.kicked = true;
  }
  s.work_cv.notify_one();
}

// The alloc path shared by cuMemAlloc, cuMemAllocPitch and cuMemAllocAsync (AllocPolicy):
// `direct` performs the call on the driver (passthrough and counted paths).
template <class Direct>
CUresult serve_alloc(State& s, CUdeviceptr* dptr, std::uint64_t bytes, Direct direct) {
  int dev = 0;
  CUcontext ctx = nullptr;
  if (CUresult rc = current_device(dev, &ctx); rc != CUDA_SUCCESS) return rc;
  return s.policy.serve_alloc(DeviceOrdinal{dev}, ctx, Bytes{bytes}, dptr, direct);
}

// Frees a logical allocation of the alloc path: into the local reserve (after the fence that
// cuMemFree implies, unless the caller already fenced), or unmapped and its grant released.
CUresult free_logical(State& s, LogicalAlloc a, bool fenced = false) {
  // Memory with shared read-only chunks (docs/dedup.md) is never reused: it goes back at once;
  // so does exported memory (docs/ipc.md): another process may map it until the daemon says.
  bool shared = share::is_shared(a.grant_id);
  if (shared) share::forget(a.grant_id);
  if (ipc::exported(a.grant_id)) {
    ipc::forget(a.grant_id);
    shared = true;
  }
  if (reserve_usable(s) && !shared) {
    CUresult rc = fenced ? CUDA_SUCCESS : fence_allocation(a);
    if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFree", rc);
    ReserveBlock b;
    b.alloc = std::move(a);
    b.freed = std::chrono::steady_clock::now();
    auto out = s.reserve.put(std::move(b));
    ensure_worker(s);
    retire_later(s, std::move(out));
    return rc;
  }
  // No reserve: the grant goes back now; its mapping stays kept when it qualifies (after the
  // fence cuMemFree implies: the daemon may hand the memory to another process of the tenant).
  CUresult rc = CUDA_SUCCESS;
  const bool keep = !shared && keepable(s, a);
  if (keep && !fenced) {
    rc = fence_allocation(a);
    if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFree", rc);
  }
  release_alloc(s, std::move(a), keep && rc == CUDA_SUCCESS);
  return rc;
}

CUstream effective_stream(bool ptds, CUstream s) { return ptds && s == nullptr ? CU_STREAM_PER_THREAD : s; }

// ---- Stream-ordered frees (pending.hpp, docs/hook.md "Stream-ordered frees") -------------------

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

// Prefetch (prefetch.hpp, docs/hook.md "Prefetch"): the worker fetches the blocks that misses
// queued, in the context of the allocation that missed, into the local reserve. A refusal stops
// prefetching that size for a while; nothing is logged (the application asked for nothing).
// Runs with busy_mu held.
void run_prefetch(State& s) {
  for (const Prefetch::Request& r : s.prefetch.take()) {
    bool refused = false;
    auto* ctx = static_cast<CUcontext>(r.ctx);
    in_context(ctx, [&] {
      if (!reserve_usable(s)) return;
      Obtained o = obtain(s, r.device, r.size, GrantPurpose::alloc, /*report=*/false);
      if (o.decision != Decision::granted) {
        refused = o.decision == Decision::refused;
        return;
      }
      const std::uint64_t grant_id = o.grant.grant_id;
      LogicalAlloc a;
      bool guard = false;
      if (map_grant_only(s, o.grant, r.device, r.size, a, guard) != CUDA_SUCCESS) {
        give_back(s, grant_id, 0);
        return;
      }
      a.ctx = ctx;
      ReserveBlock b;
      b.alloc = std::move(a);
      b.freed = std::chrono::steady_clock::now();
      b.prefetched = true;
      auto out = s.reserve.put(std::move(b));
      retire_blocks(s, out, true);
    });
    if (refused) s.prefetch.failed(r.device, r.size, std::chrono::steady_clock::now());
    else s.prefetch.done(r.device, r.size);
  }
}

EventState query_free(const PendingFree& f) {
  CUresult rc = CUDA_ERROR_INVALID_CONTEXT;  // a context that cannot be pushed runs nothing more
  in_context(f.ctx, [&] { rc = pass<Row::cuEventQuery>(false, f.event); });
  if (rc == CUDA_ERROR_NOT_READY) return EventState::pending;
  return rc == CUDA_SUCCESS ? EventState::complete : EventState::failed;
}

// Keeps a completed free's event for reuse (or destroys it) and frees the memory: the stream
// has passed the free, so nothing queued before it can touch the memory any more.
void complete_free(State& s, PendingFree& f) {
  in_context(f.ctx, [&] {
    if (f.state == EventState::failed) {
      const CUresult rc = pass<Row::cuEventQuery>(false, f.event);
      if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFreeAsync", rc);
    }
    if (f.state == EventState::failed || !s.events.release(f.ctx, f.event)) used().cuEventDestroy_v2(f.event);
  });
  free_logical(s, std::move(f.alloc), /*fenced=*/true);
  s.frees_completed.fetch_add(1, std::memory_order_acq_rel);
}

// Completes the frees whose stream has reached them; how many. On the worker, and on an
// application thread before its refused allocation is retried or its memory query answered (a
// query of an event never waits). `wait`: wait for completions in progress on another thread
// (else, when another thread is completing frees, leave it to that one).
std::size_t finish_frees(State& s, bool wait) {
  if (!s.frees.maybe_pending()) return 0;
  std::unique_lock lock(s.settle_mu, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return 0;
  }
  auto done = s.frees.take_done(query_free);
  for (PendingFree& f : done) complete_free(s, f);
  return done.size();
}

// After a successful synchronization: frees waiting for their stream are likely complete now;
// the worker looks at once (one atomic load when there are none).
void wake_for_frees() noexcept {
  State* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr || !s->frees.maybe_pending()) return;
  {
    std::lock_guard lock(s->work_mu);
    s->kicked = true;
  }
  s->work_cv.notify_one();
}

// At exit (worker stopped): frees still waiting get up to kExitWait in all for their streams and
// are completed; what is left then is left to the daemon, which takes every grant of the
// process back when its connection closes (the driver tears the mappings down with the process).
constexpr auto kExitWait = std::chrono::seconds(1);

void drain_frees_at_exit(State& s) {
  const auto deadline = std::chrono::steady_clock::now() + kExitWait;
  for (;;) {
    try {
      finish_frees(s);
    } catch (...) {
    }
    if (!s.frees.maybe_pending() || std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(s.frees.next_poll());
  }
}

// The event entry points the hook calls itself (used.def), as cudaTypedefs.h types them.
static_assert(std::is_same_v<decltype(UsedApi::cuEventCreate), PFN_cuEventCreate_v2000>);
static_assert(std::is_same_v<decltype(UsedApi::cuEventRecord), PFN_cuEventRecord_v2000>);
static_assert(std::is_same_v<decltype(UsedApi::cuEventDestroy_v2), PFN_cuEventDestroy_v4000>);

// Records an event on `stream` behind the work queued so far: an idle event of the current
// context, or a new one (CU_EVENT_DISABLE_TIMING). Sets ctx and ev on success.
CUresult record_free_event(State& s, CUstream stream, CUcontext& ctx, CUevent& ev) {
  const UsedApi& api = used();
  if (api.cuCtxGetCurrent == nullptr || api.cuEventCreate == nullptr || api.cuEventRecord == nullptr ||
      api.cuEventDestroy_v2 == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (CUresult rc = api.cuCtxGetCurrent(&ctx); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const CUevent idle = s.events.acquire(ctx);
  if (idle != nullptr && api.cuEventRecord(idle, stream) == CUDA_SUCCESS) {
    ev = idle;
    return CUDA_SUCCESS;
  }
  CUresult rc = api.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  if (rc == CUDA_SUCCESS) {
    rc = api.cuEventRecord(ev, stream);
    if (rc != CUDA_SUCCESS) api.cuEventDestroy_v2(ev);
  }
  // The idle event failed where a fresh one worked: it is stale (its context was destroyed and
  // another got the same handle) and is dropped untouched. Where both failed the stream is the
  // cause (e.g. one of another context: the caller waits instead) and it stays idle.
  if (idle != nullptr && rc != CUDA_SUCCESS && !s.events.release(ctx, idle)) api.cuEventDestroy_v2(idle);
  return rc;
}

// Hands a recorded free to the worker. Without one (exit under way, no thread) the caller waits
// for the event and frees here, as before.
CUresult free_after_event(State& s, PendingFree f) {
  ensure_worker(s);
  bool queued = false;
  {
    std::lock_guard lock(s.work_mu);
    if (s.worker_started && !s.stopping) {
      s.frees_queued.fetch_add(1, std::memory_order_acq_rel);
      s.frees.push(std::move(f));
      s.kicked = true;
      queued = true;
    }
  }
  if (queued) {
    s.work_cv.notify_one();
    return CUDA_SUCCESS;
  }
  const CUresult rc = pass<Row::cuEventSynchronize>(false, f.event);
  if (!s.events.release(f.ctx, f.event)) used().cuEventDestroy_v2(f.event);
  if (rc != CUDA_SUCCESS) {
    if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault("cuMemFreeAsync", rc);
    s.allocs.insert(std::move(f.alloc));  // not freed: as a failed cuStreamSynchronize left it
    return rc;
  }
  return free_logical(s, std::move(f.alloc), /*fenced=*/true);
}

bool capturing(CUstream stream) {
  const UsedApi& api = used();
  if (api.cuStreamIsCapturing == nullptr) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (api.cuStreamIsCapturing(stream, &st) != CUDA_SUCCESS) return false;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

// cuMemCreate properties vlake serves from the pool: pinned device memory, no or POSIX-fd
// handle types, no compression, RDMA or special usage.
bool served_prop(const CUmemAllocationProp* prop, unsigned long long flags) {
  if (prop == nullptr || flags != 0) return false;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return false;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return false;
  const auto types = static_cast<unsigned>(prop->requestedHandleTypes);
  if (types != CU_MEM_HANDLE_TYPE_NONE && types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return false;
  }
  if (prop->allocFlags.compressionType != 0 || prop->allocFlags.gpuDirectRDMACapable != 0 ||
      prop->allocFlags.usage != 0) {
    return false;
  }
  return true;
}

std::uint64_t saturating_sub(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

// ---- The allocation policy's seams (alloc/policy.hpp) -------------------------------------------

namespace alloc {

class ProcessSeams final : public Daemon, public Driver, public Reports {
 public:
  explicit ProcessSeams(State& s) noexcept : s_(s) {}

  Answer grant(const Uuid& gpu, Bytes bytes, GrantPurpose purpose) override {
    std::optional<GrantResult> g;
    {
      PhaseTimer t(Phase::grant);
      g = s_.client.grant(gpu, bytes.value(), purpose);
    }
    // The worker reports activity (vlakectl's IDLE column) and, under overcommit (docs/swap.md),
    // reads vlaked's SwapNotices.
    if (s_.client.answered()) ensure_worker(s_);
    Answer a;
    if (!g) {
      a.kind = s_.client.refused() ? Answer::Kind::refused : Answer::Kind::unreachable;
      a.why = s_.client.last_error();
      return a;
    }
    a.kind = Answer::Kind::reply;
    a.result = std::move(*g);
    if (a.result.status == Status::ok) {
      a.granularity = s_.client.granularity();
      a.guard = s_.client.guard_mode();
    }
    return a;
  }
  void release(std::uint64_t grant_id, std::uint32_t flags) override { give_back(s_, grant_id, flags); }
  void drop_kept(DeviceOrdinal device) override { hook::drop_kept(s_, device.value()); }
  bool overcommit() override { return s_.client.overcommit(); }

  CUresult device_uuid(DeviceOrdinal device, Uuid& out) override { return hook::device_uuid(s_, device.value(), out); }
  CUresult map(GrantResult& g, DeviceOrdinal device, CUcontext ctx, Bytes requested, CUdeviceptr* dptr) override {
    return map_grant(s_, g, device.value(), ctx, requested.value(), dptr);
  }
  void place(LogicalAlloc a, bool guard, CUcontext ctx, Bytes requested, CUdeviceptr* dptr) override {
    hook::place(s_, std::move(a), guard, ctx, requested.value(), dptr);
  }
  void retire(std::vector<ReserveBlock>& blocks) override { retire_blocks(s_, blocks); }
  void record_counted(CUdeviceptr ptr, std::uint64_t grant_id) override { s_.managed.insert(addr(ptr), grant_id); }
  std::uint64_t frees_queued() override { return s_.frees_queued.load(std::memory_order_acquire); }
  std::uint64_t frees_completed() override { return s_.frees_completed.load(std::memory_order_acquire); }
  void settle_frees(bool outstanding) override {
    if (outstanding) {
      std::lock_guard lock(s_.settle_mu);  // the worker's completions in progress are finished
    }
    finish_frees(s_);
  }
  void prefetch_hit(DeviceOrdinal device, Bytes size, CUcontext ctx) override {
    if (s_.prefetch.hit(device.value(), size.value(), ctx, std::chrono::steady_clock::now())) kick_prefetch(s_);
  }
  void prefetch_miss(DeviceOrdinal device, Bytes size, CUcontext ctx) override {
    if (s_.prefetch.miss(device.value(), size.value(), ctx, std::chrono::steady_clock::now())) kick_prefetch(s_);
  }

  void refusal(const GrantResult& g, DeviceOrdinal device, Bytes requested) override {
    report_refusal(s_, g, device.value(), requested.value());
  }
  void limit_refusal(const std::string& why, DeviceOrdinal device, Bytes requested) override {
    std::uint64_t suppressed = 0;
    if (s_.refusals.allow(suppressed)) {
      log(LogLevel::error, "%s; request of %s on GPU %d refused%s", why.c_str(),
          format_bytes(requested.value()).c_str(), device.value(), suppressed_note(suppressed).c_str());
    }
  }
  void unreachable(const std::string& why, DeviceOrdinal device, Bytes requested) override {
    std::uint64_t suppressed = 0;
    if (s_.unreachable.allow(suppressed)) {
      log(LogLevel::error,
          "cannot reach vlaked at %s (%s); request of %s on GPU %d refused. Start the daemon "
          "(e.g. systemctl start vlaked) or point VLAKE_SOCKET at its socket; "
          "VLAKE_ON_UNREACHABLE=passthrough runs without accounting%s",
          s_.client.socket_path().c_str(), why.c_str(), format_bytes(requested.value()).c_str(), device.value(),
          suppressed_note(suppressed).c_str());
    }
  }
  void passthrough(const std::string& why) override {
    if (!s_.passthrough_warned.exchange(true)) {
      log(LogLevel::warn,
          "cannot reach vlaked at %s (%s); VLAKE_ON_UNREACHABLE=passthrough: allocating "
          "directly from the driver, without accounting",
          s_.client.socket_path().c_str(), why.c_str());
    }
  }
  void map_failed(DeviceOrdinal device, Bytes granted, CUresult rc) override {
    std::uint64_t suppressed = 0;
    if (s_.refusals.allow(suppressed)) {
      log(LogLevel::warn, "GPU %d: mapping a grant of %llu bytes failed (CUresult %d)%s", device.value(),
          static_cast<unsigned long long>(granted.value()), static_cast<int>(rc),
          suppressed > 0 ? " (similar messages suppressed)" : "");
    }
  }

 private:
  State& s_;
};

}  // namespace alloc

// Every process reads Pressure (kHelloPressure): one that keeps no reserve may still register a
// reclaim callback later; the daemon asks only sessions that have something to give.
State::State(Config c)
    : config(std::move(c)),
      client(config, true),
      reserve(config.reserve_bytes, config.reserve_age),
      // Sizes up to 1/16 of the reserve, at most 1/8 of it per size in flight.
      prefetch(config.reserve_bytes > 0 ? config.prefetch : 0, config.reserve_bytes / 16, config.reserve_bytes / 8),
      reclaim([this](int device, std::uint64_t bytes) {
        {
          std::lock_guard lock(work_mu);
          after_reclaim.emplace_back(device, bytes);
          kicked = true;
        }
        work_cv.notify_one();
      }),
      seams(new alloc::ProcessSeams(*this)),
      policy(*seams, *seams, *seams, reserve, config.on_unreachable) {}

void start_worker(State& s) { ensure_worker(s); }

CUresult fence_allocation(const LogicalAlloc& a) {
  const UsedApi& api = used();
  if (a.ctx == nullptr || api.cuCtxGetCurrent == nullptr || api.cuCtxPushCurrent_v2 == nullptr ||
      api.cuCtxPopCurrent_v2 == nullptr) {
    return pass<Row::cuCtxSynchronize>(false);
  }
  CUcontext cur = nullptr;
  if (api.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == a.ctx) {
    return pass<Row::cuCtxSynchronize>(false);
  }
  if (CUresult rc = api.cuCtxPushCurrent_v2(a.ctx); rc != CUDA_SUCCESS) return rc;
  const CUresult rc = pass<Row::cuCtxSynchronize>(false);
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent_v2(&popped);
  return rc;
}

CUresult device_uuid(State& s, int dev, Uuid& out) {
  if (dev < 0 || dev >= static_cast<int>(proto::kMaxDevices)) return CUDA_ERROR_INVALID_DEVICE;
  {
    std::lock_guard lock(s.uuid_mu);
    if (s.uuids[static_cast<std::size_t>(dev)]) {
      out = *s.uuids[static_cast<std::size_t>(dev)];
      return CUDA_SUCCESS;
    }
  }
  const UsedApi& api = used();
  if (api.cuDeviceGetUuid_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUuuid u{};
  if (CUresult rc = api.cuDeviceGetUuid_v2(&u, dev); rc != CUDA_SUCCESS) return rc;
  out = Uuid::from_bytes(u.bytes);
  std::lock_guard lock(s.uuid_mu);
  s.uuids[static_cast<std::size_t>(dev)] = out;
  return CUDA_SUCCESS;
}

State* active_state() noexcept { return active(); }

CUresult current_device_of(int& dev) { return current_device(dev); }

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

bool stream_capturing(bool ptds, CUstream stream) { return capturing(effective_stream(ptds, stream)); }

std::optional<UsageResult> usage_of(State& s, const Uuid& uuid) {
  // The generation and the time are read before asking: a change racing the request leaves the
  // answer stale (usage_cache.hpp).
  const std::uint64_t generation = s.client.changes();
  const auto now = UsageCache::Clock::now();
  if (auto c = s.usage_cache.get(uuid, generation, now)) {
    return UsageResult{Status::ok, c->total, c->limit, c->used};
  }
  auto u = s.client.usage(uuid);
  if (u && u->status == Status::ok) s.usage_cache.put(uuid, UsageFigures{u->total, u->limit, u->used}, generation, now);
  return u;
}

void virtualize_memory_info(const UsageResult& u, std::size_t& free, std::size_t& total) noexcept {
  const std::uint64_t real_total = total;
  const std::uint64_t real_free = free;
  total = static_cast<std::size_t>(std::min(u.limit, real_total));
  free = static_cast<std::size_t>(std::min(saturating_sub(u.limit, u.used), real_free));
}

// ---- Alloc path ---------------------------------------------------------------------------------

CUresult on_cuMemAlloc_v2(bool ptds, CUdeviceptr* dptr, size_t bytesize) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemAlloc_v2>(ptds, dptr, bytesize);
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return serve_alloc(*s, dptr, bytesize, [&] { return pass<Row::cuMemAlloc_v2>(ptds, dptr, bytesize); });
}

CUresult on_cuMemAllocPitch_v2(bool ptds, CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                               unsigned int ElementSizeBytes) {
  State* s = active();
  if (s == nullptr) {
    return pass<Row::cuMemAllocPitch_v2>(ptds, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  }
  if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int dev = 0;
  if (CUresult rc = current_device(dev); rc != CUDA_SUCCESS) return rc;
  std::uint64_t align = 512;
  const UsedApi& api = used();
  int attr = 0;
  if (api.cuDeviceGetAttribute != nullptr &&
      api.cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, dev) == CUDA_SUCCESS && attr > 0 &&
      static_cast<std::uint64_t>(attr) > align) {
    align = static_cast<std::uint64_t>(attr);
  }
  if (WidthInBytes > std::numeric_limits<std::uint64_t>::max() - align) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const std::uint64_t pitch = (WidthInBytes + align - 1) / align * align;
  if (pitch > std::numeric_limits<std::uint64_t>::max() / Height) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult rc = serve_alloc(*s, dptr, pitch * Height, [&] {
    return pass<Row::cuMemAllocPitch_v2>(ptds, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  });
  if (rc == CUDA_SUCCESS && s->allocs.find(addr(*dptr))) *pPitch = pitch;
  return rc;
}

CUresult on_cuMemFree_v2(bool ptds, CUdeviceptr dptr) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemFree_v2>(ptds, dptr);
  if (auto a = s->allocs.take(addr(dptr))) return free_logical(*s, std::move(*a));
  if (s->allocs.find(addr(dptr))) return CUDA_ERROR_INVALID_VALUE;  // inside, not the pointer
  if (auto grant = s->managed.take(addr(dptr))) {
    const CUresult rc = pass<Row::cuMemFree_v2>(ptds, dptr);
    if (rc == CUDA_SUCCESS) {
      give_back(*s, *grant, 0);
    } else {
      s->managed.insert(addr(dptr), *grant);
    }
    return rc;
  }
  return free_unserved(*s, ptds, dptr, nullptr, false);
}

CUresult on_cuMemAllocAsync(bool ptds, CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  State* s = active();
  if (s == nullptr || capturing(effective_stream(ptds, hStream))) {
    // Stream capture records an allocation node in the graph: left to the driver.
    return pass<Row::cuMemAllocAsync>(ptds, dptr, bytesize, hStream);
  }
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (s->client.overcommit()) {
    // Overcommit (docs/swap.md): the device's current stream-ordered pool, counted like any
    // cuMemAllocFromPoolAsync.
    int dev = 0;
    if (CUresult rc = current_device(dev); rc != CUDA_SUCCESS) return rc;
    CUmemoryPool pool = nullptr;
    if (CUresult rc = on_cuDeviceGetMemPool(false, &pool, dev); rc != CUDA_SUCCESS) return rc;
    return on_cuMemAllocFromPoolAsync(ptds, dptr, bytesize, pool, hStream);
  }
  // The memory is mapped before this call returns, so it is valid for any later work on the
  // stream (stream-ordered semantics hold trivially).
  return serve_alloc(*s, dptr, bytesize, [&] { return pass<Row::cuMemAllocAsync>(ptds, dptr, bytesize, hStream); });
}

CUresult on_cuMemFreeAsync(bool ptds, CUdeviceptr dptr, CUstream hStream) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemFreeAsync>(ptds, dptr, hStream);
  if (!s->allocs.find(addr(dptr))) return free_unserved(*s, ptds, dptr, hStream, true);
  const CUstream stream = effective_stream(ptds, hStream);
  if (capturing(stream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  // Work queued on the stream may still use the memory: an event behind it, and the worker
  // frees the memory once the stream has reached it (pending.hpp). The pointer is gone at once.
  CUcontext ctx = nullptr;
  CUevent ev = nullptr;
  if (record_free_event(*s, stream, ctx, ev) == CUDA_SUCCESS) {
    auto a = s->allocs.take(addr(dptr));
    if (!a) {  // not the pointer, or freed meanwhile
      if (!s->events.release(ctx, ev)) used().cuEventDestroy_v2(ev);
      return CUDA_ERROR_INVALID_VALUE;
    }
    PendingFree f;
    f.alloc = std::move(*a);
    f.event = ev;
    f.ctx = ctx;
    return free_after_event(*s, std::move(f));
  }
  // No event on that stream (e.g. it belongs to another context): wait here, then free.
  const UsedApi& api = used();
  if (api.cuStreamSynchronize == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (CUresult rc = api.cuStreamSynchronize(stream); rc != CUDA_SUCCESS) return rc;
  auto a = s->allocs.take(addr(dptr));
  if (!a) return CUDA_ERROR_INVALID_VALUE;  // not the pointer, or freed meanwhile
  return free_logical(*s, std::move(*a), /*fenced=*/true);
}

// ---- Create path --------------------------------------------------------------------------------

CUresult on_cuMemCreate(bool ptds, CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                        unsigned long long flags) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemCreate>(ptds, handle, size, prop, flags);
  // Overcommit (docs/swap.md): every handle is the driver's, counted.
  if (!served_prop(prop, flags) || s->client.overcommit()) return create_counted(*s, ptds, handle, size, prop, flags);
  if (handle == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const UsedApi& api = used();
  if (api.cuMemGetAllocationGranularity == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  std::size_t gran = 0;
  if (CUresult rc = api.cuMemGetAllocationGranularity(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (gran == 0 || size % gran != 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = prop->location.id;
  Obtained o = obtain(*s, dev, size, GrantPurpose::create);
  if (o.decision == Decision::passthrough) {
    return pass<Row::cuMemCreate>(ptds, handle, size, prop, flags);
  }
  if (o.decision == Decision::refused) return o.rc;
  GrantResult& g = o.grant;
  if (g.handles.size() != 1 || g.fds.size() != 1 || g.handles[0].size != size || g.handles[0].offset != 0) {
    log(LogLevel::error,
        "vlaked answered a create grant of %zu bytes with %zu handles; expected one handle of "
        "that size",
        size, g.handles.size());
    give_back(*s, g.grant_id, 0);
    return CUDA_ERROR_UNKNOWN;
  }
  CUmemGenericAllocationHandle h = 0;
  if (CUresult rc = import_fd(g.fds[0].get(), h); rc != CUDA_SUCCESS) {
    give_back(*s, g.grant_id, 0);
    return rc;
  }
  s->creates.add(h, g.grant_id, size, *prop, std::move(g.fds[0]));
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult on_cuMemRelease(bool ptds, CUmemGenericAllocationHandle handle) {
  State* s = active();
  if (s == nullptr || !s->creates.owns(handle)) return pass<Row::cuMemRelease>(ptds, handle);
  const CUresult rc = pass<Row::cuMemRelease>(ptds, handle);
  if (rc != CUDA_SUCCESS) return rc;
  bool ours = false;
  if (auto done = s->creates.released(handle, ours)) {
    give_back(*s, done->grant_id, done->exported ? proto::kReleaseExported : 0u);
  }
  return rc;
}

CUresult on_cuMemRetainAllocationHandle(bool ptds, CUmemGenericAllocationHandle* handle, void* address) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemRetainAllocationHandle>(ptds, handle, address);
  // Memory of the alloc path is cuMemAlloc memory to the application: it has no handle.
  if (s->allocs.find(reinterpret_cast<std::uintptr_t>(address))) return CUDA_ERROR_INVALID_VALUE;
  const CUresult rc = pass<Row::cuMemRetainAllocationHandle>(ptds, handle, address);
  if (rc == CUDA_SUCCESS && handle != nullptr) {
    s->creates.retained(reinterpret_cast<std::uintptr_t>(address), *handle);
  }
  return rc;
}

CUresult on_cuMemMap(bool ptds, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                     unsigned long long flags) {
  const CUresult rc = pass<Row::cuMemMap>(ptds, ptr, size, offset, handle, flags);
  State* s = active();
  if (rc == CUDA_SUCCESS && s != nullptr) s->creates.mapped(addr(ptr), size, handle);
  return rc;
}

CUresult on_cuMemUnmap(bool ptds, CUdeviceptr ptr, size_t size) {
  const CUresult rc = pass<Row::cuMemUnmap>(ptds, ptr, size);
  State* s = active();
  if (rc == CUDA_SUCCESS && s != nullptr) {
    for (const FinishedGrant& f : s->creates.unmapped(addr(ptr), size)) {
      give_back(*s, f.grant_id, f.exported ? proto::kReleaseExported : 0u);
    }
  }
  return rc;
}

CUresult on_cuMemImportFromShareableHandle(bool ptds, CUmemGenericAllocationHandle* handle, void* osHandle,
                                           CUmemAllocationHandleType shHandleType) {
  const CUresult rc = pass<Row::cuMemImportFromShareableHandle>(ptds, handle, osHandle, shHandleType);
  State* s = active();
  // A driver may answer an import of memory this process already holds with the same handle
  // value and one more reference (the simulator does): count it like a retain.
  if (rc == CUDA_SUCCESS && s != nullptr && handle != nullptr) s->creates.add_reference(*handle);
  return rc;
}

CUresult on_cuMemExportToShareableHandle(bool ptds, void* shareableHandle, CUmemGenericAllocationHandle handle,
                                         CUmemAllocationHandleType handleType, unsigned long long flags) {
  State* s = active();
  if (s == nullptr || !s->creates.serves(handle)) {
    return pass<Row::cuMemExportToShareableHandle>(ptds, shareableHandle, handle, handleType, flags);
  }
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  auto prop = s->creates.props(handle);
  if (!prop || (static_cast<unsigned>(prop->requestedHandleTypes) & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;  // created without the POSIX-fd type, as the driver says
  }
  // An imported handle cannot be exported (measured): hand out a copy of the descriptor the
  // daemon sent with the grant.
  auto fd = s->creates.export_fd(handle);
  if (!fd) return CUDA_ERROR_INVALID_VALUE;
  if (*fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = *fd;
  return CUDA_SUCCESS;
}

CUresult on_cuMemGetAllocationPropertiesFromHandle(bool ptds, CUmemAllocationProp* prop,
                                                   CUmemGenericAllocationHandle handle) {
  State* s = active();
  if (s != nullptr && prop != nullptr) {
    if (auto p = s->creates.props(handle)) {
      *prop = *p;
      return CUDA_SUCCESS;
    }
  }
  return pass<Row::cuMemGetAllocationPropertiesFromHandle>(ptds, prop, handle);
}

// ---- Counted ------------------------------------------------------------------------------------

CUresult on_cuMemAllocManaged(bool ptds, CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  State* s = active();
  if (s == nullptr) return pass<Row::cuMemAllocManaged>(ptds, dptr, bytesize, flags);
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  int dev = 0;
  if (CUresult rc = current_device(dev); rc != CUDA_SUCCESS) return rc;
  return s->policy.serve_counted(DeviceOrdinal{dev}, Bytes{bytesize}, dptr,
                                 [&] { return pass<Row::cuMemAllocManaged>(ptds, dptr, bytesize, flags); });
}

// ---- Virtualized queries ------------------------------------------------------------------------

CUresult on_cuMemGetInfo_v2(bool ptds, size_t* free, size_t* total) {
  const CUresult rc = pass<Row::cuMemGetInfo_v2>(ptds, free, total);
  State* s = active();
  if (rc != CUDA_SUCCESS || s == nullptr) return rc;
  int dev = 0;
  Uuid uuid{};
  if (current_device(dev) != CUDA_SUCCESS || device_uuid(*s, dev, uuid) != CUDA_SUCCESS) {
    return rc;
  }
  // Stream-ordered frees the stream has passed are freed first, including any the background
  // thread is completing right now (waited for: its release must precede this answer).
  if (s->frees_queued.load(std::memory_order_acquire) != s->frees_completed.load(std::memory_order_acquire)) {
    std::lock_guard lock(s->settle_mu);  // the worker's completions in progress are finished
  }
  finish_frees(*s, /*wait=*/true);
  if (auto u = usage_of(*s, uuid); u && u->status == Status::ok) {
    // Memory in this process's reserve is free to it: the next allocations reuse it.
    const std::uint64_t mine = s->reserve.bytes(dev);
    u->used = saturating_sub(u->used, mine);
    *free += static_cast<std::size_t>(mine);
    virtualize_memory_info(*u, *free, *total);
  }
  return rc;
}

CUresult on_cuDeviceTotalMem_v2(bool ptds, size_t* bytes, CUdevice dev) {
  const CUresult rc = pass<Row::cuDeviceTotalMem_v2>(ptds, bytes, dev);
  State* s = active();
  if (rc != CUDA_SUCCESS || s == nullptr) return rc;
  Uuid uuid{};
  if (device_uuid(*s, dev, uuid) != CUDA_SUCCESS) return rc;
  if (auto u = usage_of(*s, uuid); u && u->status == Status::ok) {
    *bytes = static_cast<size_t>(std::min<std::uint64_t>(u->limit, *bytes));
  }
  return rc;
}

CUresult on_cuMemGetAddressRange_v2(bool ptds, CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  State* s = active();
  if (s != nullptr) {
    if (auto r = ipc::imported(addr(dptr))) {  // an IPC import answers its whole range
      if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(r->base);
      if (psize != nullptr) *psize = static_cast<size_t>(r->bytes);
      return CUDA_SUCCESS;
    }
    if (auto a = s->allocs.find(addr(dptr)); a && in_mapping(*a, addr(dptr))) {
      if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(a->ptr);
      if (psize != nullptr) *psize = static_cast<size_t>(a->requested);
      return CUDA_SUCCESS;
    }
  }
  return pass<Row::cuMemGetAddressRange_v2>(ptds, pbase, psize, dptr);
}

CUresult on_cuPointerGetAttribute(bool ptds, void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  State* s = active();
  if (s != nullptr && data != nullptr &&
      (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE)) {
    if (auto r = ipc::imported(addr(ptr))) {
      if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
        const auto v = static_cast<CUdeviceptr>(r->base);
        std::memcpy(data, &v, sizeof v);
      } else {
        const auto v = static_cast<size_t>(r->bytes);
        std::memcpy(data, &v, sizeof v);
      }
      return CUDA_SUCCESS;
    }
    if (auto a = s->allocs.find(addr(ptr)); a && in_mapping(*a, addr(ptr))) {
      if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
        const auto v = static_cast<CUdeviceptr>(a->ptr);
        std::memcpy(data, &v, sizeof v);
      } else {
        const auto v = static_cast<size_t>(a->requested);
        std::memcpy(data, &v, sizeof v);
      }
      return CUDA_SUCCESS;
    }
  }
  return pass<Row::cuPointerGetAttribute>(ptds, data, attribute, ptr);
}

CUresult on_cuPointerGetAttributes(bool ptds, unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                   CUdeviceptr ptr) {
  const CUresult rc = pass<Row::cuPointerGetAttributes>(ptds, numAttributes, attributes, data, ptr);
  State* s = active();
  if (rc != CUDA_SUCCESS || s == nullptr) return rc;
  if (auto r = ipc::imported(addr(ptr))) {
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
        const auto v = static_cast<CUdeviceptr>(r->base);
        std::memcpy(data[i], &v, sizeof v);
      } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
        const auto v = static_cast<size_t>(r->bytes);
        std::memcpy(data[i], &v, sizeof v);
      }
    }
    return rc;
  }
  auto a = s->allocs.find(addr(ptr));
  if (!a || !in_mapping(*a, addr(ptr))) return rc;
  for (unsigned i = 0; i < numAttributes; ++i) {
    if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
      const auto v = static_cast<CUdeviceptr>(a->ptr);
      std::memcpy(data[i], &v, sizeof v);
    } else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
      const auto v = static_cast<size_t>(a->requested);
      std::memcpy(data[i], &v, sizeof v);
    }
  }
  return rc;
}

// ---- Fault reporting ----------------------------------------------------------------------------

namespace {

// The device of the calling thread's current context, even when the context carries a sticky
// fault (then cuCtxGetDevice fails and the table of contexts seen earlier answers). -1 if
// unknown.
int faulting_device(State& s) {
  const UsedApi& api = used();
  CUcontext ctx = nullptr;
  if (api.cuCtxGetCurrent == nullptr || api.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    return -1;
  }
  CUdevice d = 0;
  if (api.cuCtxGetDevice != nullptr && api.cuCtxGetDevice(&d) == CUDA_SUCCESS) return d;
  for (std::size_t i = 0; i < State::kContextSlots; ++i) {
    if (s.ctx_seen[i].load(std::memory_order_acquire) == ctx) {
      return s.ctx_device[i].load(std::memory_order_relaxed);
    }
  }
  return -1;
}

std::string format_age(std::chrono::nanoseconds age) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(age).count();
  if (ms < 10000) return std::to_string(ms) + " ms";
  return std::to_string(ms / 1000) + " s";
}

void report_fault_impl(State& s, const char* call, CUresult rc) {
  int dev = faulting_device(s);
  if (dev < 0) {
    // No context to ask: the device of this process's newest allocation, else GPU 0.
    dev = 0;
    for (int d = 0; d < static_cast<int>(proto::kMaxDevices); ++d) {
      if (s.allocs.count(d) != 0) {
        dev = d;
        break;
      }
    }
  }
  proto::GuardEvent ev{};
  // What is known, no more: whether this process maps shared read-only chunks on that GPU (the
  // driver does not say which address faulted, docs/guard.md).
  ev.kind = share::holds_shared(dev) ? proto::GuardKind::fault_maps_shared : proto::GuardKind::fault;
  ev.cuda_status = static_cast<std::int32_t>(rc);
  std::snprintf(ev.call, sizeof ev.call, "%s", call);
  Uuid uuid{};
  const bool have_uuid = device_uuid(s, dev, uuid) == CUDA_SUCCESS;
  if (have_uuid) uuid.copy_to(ev.device_uuid);
  ev.live_allocations = static_cast<std::uint32_t>(s.allocs.count(dev));
  const auto now = std::chrono::steady_clock::now();
  const auto suspects = s.allocs.newest(dev, proto::kMaxGuardSuspects);
  std::string list;
  for (const LogicalAlloc& a : suspects) {
    const auto age = std::chrono::duration_cast<std::chrono::nanoseconds>(now - a.created);
    proto::GuardSuspect& g = ev.suspects[ev.suspect_count++];
    g.address = a.ptr;
    g.bytes = a.requested;
    g.age_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, age.count()));
    char item[96];
    std::snprintf(item, sizeof item, "%s0x%llx (%s, %s ago)", list.empty() ? "" : ", ",
                  static_cast<unsigned long long>(a.ptr), format_bytes(a.requested).c_str(), format_age(age).c_str());
    list += item;
  }
  if (list.empty()) list = "none (no live allocation served by vlake on this GPU)";
  std::string outcome;
  if (!have_uuid) {
    outcome = "not reported to vlaked (the GPU's UUID is unknown)";
  } else if (s.client.send_guard_event(ev)) {
    outcome = "reported to vlaked as a kernel fault";
  } else {
    outcome = "could not be reported to vlaked (" + s.client.last_error() + ")";
  }
  log(LogLevel::error, "GPU fault (%s) on GPU %d in %s; %s; the newest allocations were: %s",
      rc == CUDA_ERROR_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "error", dev, call, outcome.c_str(),
      list.c_str());
}

void report_refused_write_impl(State& s, const char* call, std::uint64_t dst, std::uint64_t bytes, CUresult rc) {
  const auto hit = share::readonly_hit(s, dst, bytes);
  if (!hit) return;
  proto::ReadOnlyWrite m{};
  m.grant_id = hit->grant_id;
  m.address = dst;
  m.bytes = bytes;
  m.alloc_address = hit->alloc_ptr;
  m.alloc_bytes = hit->alloc_bytes;
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  m.alloc_age_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, now_ns - hit->alloc_born_ns));
  m.shared_offset = hit->shared_offset;
  m.shared_bytes = hit->shared_bytes;
  m.cuda_status = static_cast<std::int32_t>(rc);
  std::snprintf(m.call, sizeof m.call, "%s", call);
  Uuid uuid{};
  std::string outcome;
  if (device_uuid(s, hit->device, uuid) != CUDA_SUCCESS) {
    outcome = "not reported to vlaked (the GPU's UUID is unknown)";
  } else {
    uuid.copy_to(m.device_uuid);
    outcome = s.client.send_readonly_write(m) ? "reported to vlaked"
                                              : "could not be reported to vlaked (" + s.client.last_error() + ")";
  }
  log(LogLevel::error,
      "%s into shared read-only memory refused by the driver (CUresult %d): destination 0x%llx, %s, overlaps %s "
      "shared from offset %llu of allocation 0x%llx (%s) on GPU %d; %s",
      call, static_cast<int>(rc), static_cast<unsigned long long>(dst), format_bytes(bytes).c_str(),
      format_bytes(hit->shared_bytes).c_str(), static_cast<unsigned long long>(hit->shared_offset),
      static_cast<unsigned long long>(hit->alloc_ptr), format_bytes(hit->alloc_bytes).c_str(), hit->device,
      outcome.c_str());
}

}  // namespace

__attribute__((cold, noinline)) void report_refused_write(const char* call, std::uint64_t dst, std::uint64_t bytes,
                                                          CUresult rc) noexcept {
  try {
    State* s = active();
    if (s == nullptr) return;
    report_refused_write_impl(*s, call, dst, bytes, rc);
  } catch (...) {
  }
}

__attribute__((cold, noinline)) void report_fault(const char* call, CUresult rc) noexcept {
  try {
    State* s = active();
    if (s == nullptr || s->fault_reported.exchange(true)) return;
    report_fault_impl(*s, call, rc);
  } catch (...) {
  }
}

// ---- Synchronizing calls ------------------------------------------------------------------------
// On success (and any other error) the cost is one compare.

CUresult on_cuCtxSynchronize(bool ptds) {
  const CUresult rc = pass<Row::cuCtxSynchronize>(ptds);
  if (rc == CUDA_SUCCESS) {
    after_synchronize();
    wake_for_frees();
  }
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuCtxSynchronize", rc);
  return rc;
}

CUresult on_cuCtxSynchronize_v2(bool ptds, CUcontext ctx) {
  const CUresult rc = pass<Row::cuCtxSynchronize_v2>(ptds, ctx);
  if (rc == CUDA_SUCCESS) {
    after_synchronize();
    wake_for_frees();
  }
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuCtxSynchronize_v2", rc);
  return rc;
}

CUresult on_cuStreamSynchronize(bool ptds, CUstream hStream) {
  const CUresult rc = pass<Row::cuStreamSynchronize>(ptds, hStream);
  if (rc == CUDA_SUCCESS) {
    after_synchronize();
    wake_for_frees();
  }
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuStreamSynchronize", rc);
  return rc;
}

CUresult on_cuStreamQuery(bool ptds, CUstream hStream) {
  const CUresult rc = pass<Row::cuStreamQuery>(ptds, hStream);
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuStreamQuery", rc);
  return rc;
}

CUresult on_cuEventSynchronize(bool ptds, CUevent hEvent) {
  const CUresult rc = pass<Row::cuEventSynchronize>(ptds, hEvent);
  if (rc == CUDA_SUCCESS) {
    after_synchronize();
    wake_for_frees();
  }
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuEventSynchronize", rc);
  return rc;
}

CUresult on_cuEventQuery(bool ptds, CUevent hEvent) {
  const CUresult rc = pass<Row::cuEventQuery>(ptds, hEvent);
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuEventQuery", rc);
  return rc;
}

CUresult on_cuMemcpyDtoH_v2(bool ptds, void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  const CUresult rc = pass<Row::cuMemcpyDtoH_v2>(ptds, dstHost, srcDevice, ByteCount);
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuMemcpyDtoH", rc);
  return rc;
}

CUresult on_cuMemcpyDtoHAsync_v2(bool ptds, void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  const CUresult rc = pass<Row::cuMemcpyDtoHAsync_v2>(ptds, dstHost, srcDevice, ByteCount, hStream);
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault("cuMemcpyDtoHAsync", rc);
  return rc;
}

namespace {

// The failure path of a call that writes device memory from `dst` over `span` bytes: a sticky
// fault is reported as a kernel fault, a refusal (CUDA_ERROR_INVALID_VALUE) whose destination
// overlaps shared read-only chunks as a refused write. Returns rc.
__attribute__((cold, noinline)) CUresult after_write(CUresult rc, const char* call, std::uint64_t dst,
                                                     std::uint64_t span) noexcept {
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault(call, rc);
  else if (rc == CUDA_ERROR_INVALID_VALUE) report_refused_write(call, dst, span, rc);
  return rc;
}

// Passes call R through; when it fails, hands its destination ({address, bytes}) to
// after_write(). `dst` is that pair, or a function giving it, for destinations that must be read
// from the call's descriptor (2D/3D copies): those are read only on failure.
using Dst = std::pair<std::uint64_t, std::uint64_t>;
template <Row R, class DstOrFn, class... A>
CUresult pass_write(bool ptds, const char* call, DstOrFn dst, A... args) {
  const CUresult rc = pass<R>(ptds, args...);
  if (rc != CUDA_SUCCESS) [[unlikely]] {
    Dst d;
    if constexpr (std::is_invocable_v<DstOrFn>) {
      d = dst();
    } else {
      d = dst;
    }
    return after_write(rc, call, d.first, d.second);
  }
  return rc;
}

}  // namespace

// Copies and memsets into device memory: passed through; the checks run only on failure.
CUresult on_cuMemcpyDtoD_v2(bool ptds, CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return pass_write<Row::cuMemcpyDtoD_v2>(ptds, "cuMemcpyDtoD", Dst{addr(dstDevice), ByteCount}, dstDevice, srcDevice,
                                          ByteCount);
}

CUresult on_cuMemcpyDtoDAsync_v2(bool ptds, CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                 CUstream hStream) {
  return pass_write<Row::cuMemcpyDtoDAsync_v2>(ptds, "cuMemcpyDtoDAsync", Dst{addr(dstDevice), ByteCount}, dstDevice,
                                               srcDevice, ByteCount, hStream);
}

CUresult on_cuMemcpy(bool ptds, CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return pass_write<Row::cuMemcpy>(ptds, "cuMemcpy", Dst{addr(dst), ByteCount}, dst, src, ByteCount);
}

CUresult on_cuMemcpyAsync(bool ptds, CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return pass_write<Row::cuMemcpyAsync>(ptds, "cuMemcpyAsync", Dst{addr(dst), ByteCount}, dst, src, ByteCount, hStream);
}

CUresult on_cuMemcpyPeer(bool ptds, CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                         CUcontext srcContext, size_t ByteCount) {
  return pass_write<Row::cuMemcpyPeer>(ptds, "cuMemcpyPeer", Dst{addr(dstDevice), ByteCount}, dstDevice, dstContext,
                                       srcDevice, srcContext, ByteCount);
}

CUresult on_cuMemcpyPeerAsync(bool ptds, CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                              CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  return pass_write<Row::cuMemcpyPeerAsync>(ptds, "cuMemcpyPeerAsync", Dst{addr(dstDevice), ByteCount}, dstDevice,
                                            dstContext, srcDevice, srcContext, ByteCount, hStream);
}

CUresult on_cuMemcpy2D_v2(bool ptds, const CUDA_MEMCPY2D* pCopy) {
  return pass_write<Row::cuMemcpy2D_v2>(
      ptds, "cuMemcpy2D", [=] { return dst_2d(pCopy); }, pCopy);
}

CUresult on_cuMemcpy2DUnaligned_v2(bool ptds, const CUDA_MEMCPY2D* pCopy) {
  return pass_write<Row::cuMemcpy2DUnaligned_v2>(
      ptds, "cuMemcpy2DUnaligned", [=] { return dst_2d(pCopy); }, pCopy);
}

CUresult on_cuMemcpy2DAsync_v2(bool ptds, const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return pass_write<Row::cuMemcpy2DAsync_v2>(
      ptds, "cuMemcpy2DAsync", [=] { return dst_2d(pCopy); }, pCopy, hStream);
}

CUresult on_cuMemcpy3D_v2(bool ptds, const CUDA_MEMCPY3D* pCopy) {
  return pass_write<Row::cuMemcpy3D_v2>(
      ptds, "cuMemcpy3D", [=] { return dst_3d(pCopy); }, pCopy);
}

CUresult on_cuMemcpy3DAsync_v2(bool ptds, const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return pass_write<Row::cuMemcpy3DAsync_v2>(
      ptds, "cuMemcpy3DAsync", [=] { return dst_3d(pCopy); }, pCopy, hStream);
}

// Memsets: N elements of 1, 2 or 4 bytes; 2D: Height rows of Width elements, dstPitch bytes apart.
CUresult on_cuMemsetD8_v2(bool ptds, CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return pass_write<Row::cuMemsetD8_v2>(ptds, "cuMemsetD8", Dst{addr(dstDevice), N}, dstDevice, uc, N);
}

CUresult on_cuMemsetD16_v2(bool ptds, CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return pass_write<Row::cuMemsetD16_v2>(
      ptds, "cuMemsetD16",
      [=] {
        return Dst{addr(dstDevice), span_elems(2, N)};
      },
      dstDevice, us, N);
}

CUresult on_cuMemsetD32_v2(bool ptds, CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return pass_write<Row::cuMemsetD32_v2>(
      ptds, "cuMemsetD32",
      [=] {
        return Dst{addr(dstDevice), span_elems(4, N)};
      },
      dstDevice, ui, N);
}

CUresult on_cuMemsetD8Async(bool ptds, CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  return pass_write<Row::cuMemsetD8Async>(ptds, "cuMemsetD8Async", Dst{addr(dstDevice), N}, dstDevice, uc, N, hStream);
}

CUresult on_cuMemsetD16Async(bool ptds, CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  return pass_write<Row::cuMemsetD16Async>(
      ptds, "cuMemsetD16Async",
      [=] {
        return Dst{addr(dstDevice), span_elems(2, N)};
      },
      dstDevice, us, N, hStream);
}

CUresult on_cuMemsetD32Async(bool ptds, CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  return pass_write<Row::cuMemsetD32Async>(
      ptds, "cuMemsetD32Async",
      [=] {
        return Dst{addr(dstDevice), span_elems(4, N)};
      },
      dstDevice, ui, N, hStream);
}

CUresult on_cuMemsetD2D8_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
                            size_t Height) {
  return pass_write<Row::cuMemsetD2D8_v2>(
      ptds, "cuMemsetD2D8",
      [=] {
        return Dst{addr(dstDevice), span_2d(dstPitch, Width, Height)};
      },
      dstDevice, dstPitch, uc, Width, Height);
}

CUresult on_cuMemsetD2D16_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                             size_t Height) {
  return pass_write<Row::cuMemsetD2D16_v2>(
      ptds, "cuMemsetD2D16",
      [=] {
        return Dst{addr(dstDevice), span_2d(dstPitch, span_elems(2, Width), Height)};
      },
      dstDevice, dstPitch, us, Width, Height);
}

CUresult on_cuMemsetD2D32_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
                             size_t Height) {
  return pass_write<Row::cuMemsetD2D32_v2>(
      ptds, "cuMemsetD2D32",
      [=] {
        return Dst{addr(dstDevice), span_2d(dstPitch, span_elems(4, Width), Height)};
      },
      dstDevice, dstPitch, ui, Width, Height);
}

CUresult on_cuMemsetD2D8Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
                              size_t Height, CUstream hStream) {
  return pass_write<Row::cuMemsetD2D8Async>(
      ptds, "cuMemsetD2D8Async",
      [=] {
        return Dst{addr(dstDevice), span_2d(dstPitch, Width, Height)};
      },
      dstDevice, dstPitch, uc, Width, Height, hStream);
}

CUresult on_cuMemsetD2D16Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                               size_t Height, CUstream hStream) {
  return pass_write<Row::cuMemsetD2D16Async>(
      ptds, "cuMemsetD2D16Async",
      [=] {
        return Dst{addr(dstDevice), span_2d(dstPitch, span_elems(2, Width), Height)};
      },
      dstDevice, dstPitch, us, Width, Height, hStream);
}

CUresult on_cuMemsetD2D32Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
                               size_t Height, CUstream hStream) {
  return pass_write<Row::cuMemsetD2D32Async>(
      ptds, "cuMemsetD2D32Async",
      [=] {
        return Dst{addr(dstDevice), span_2d(dstPitch, span_elems(4, Width), Height)};
      },
      dstDevice, dstPitch, ui, Width, Height, hStream);
}

// Host-to-device uploads: passed through; a successful upload that fills a whole alloc-path
// allocation is offered for transparent dedup (share.hpp, docs/dedup.md "Transparent mode").
CUresult on_cuMemcpyHtoD_v2(bool ptds, CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  const CUresult rc = pass<Row::cuMemcpyHtoD_v2>(ptds, dstDevice, srcHost, ByteCount);
  if (rc != CUDA_SUCCESS) [[unlikely]]
    return after_write(rc, "cuMemcpyHtoD", addr(dstDevice), ByteCount);
  if (State* s = active(); s != nullptr && share::may_offer(*s, ByteCount)) {
    share::offer_upload(*s, addr(dstDevice), ByteCount);  // the share fences the context
  }
  return rc;
}

CUresult on_cuMemcpyHtoDAsync_v2(bool ptds, CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                 CUstream hStream) {
  const CUresult rc = pass<Row::cuMemcpyHtoDAsync_v2>(ptds, dstDevice, srcHost, ByteCount, hStream);
  if (rc != CUDA_SUCCESS) [[unlikely]]
    return after_write(rc, "cuMemcpyHtoDAsync", addr(dstDevice), ByteCount);
  State* s = active();
  if (s == nullptr || !share::may_offer(*s, ByteCount)) return rc;
  // The copy must have landed before the daemon reads the chunks: wait for that stream (a
  // captured stream only records the copy: nothing to share).
  const CUstream stream = effective_stream(ptds, hStream);
  if (capturing(stream)) return rc;
  // Synchronize only for an offer that will be made (not ours, partial, offered before: no wait).
  if (!share::would_offer(*s, addr(dstDevice), ByteCount)) return rc;
  if (pass<Row::cuStreamSynchronize>(false, stream) != CUDA_SUCCESS) return rc;
  share::offer_upload(*s, addr(dstDevice), ByteCount);
  return rc;
}

}  // namespace vlake::hook
