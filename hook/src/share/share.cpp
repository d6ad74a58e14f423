// hook.hpp first: real.hpp sets up cuda.h for cudaTypedefs.h.
#include "share.hpp"
#include "hook.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "log.hpp"
#include "real.hpp"

namespace vlake::hook::share {

namespace {

std::mutex g_mu;
struct SharedGrant {
  int device = 0;
  // The read-only runs of its mapping: (offset from the allocation's VA base, bytes).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> read_only;
};
std::map<std::uint64_t, SharedGrant> g_shared;  // grant id -> its shared layout
// g_shared.size(), read without the mutex: a refused copy in a process that shares nothing
// takes no lock.
std::atomic<std::size_t> g_shared_count{0};
// Grant id -> creation time of the allocation offered transparently: one offer per allocation
// (a block reused from the local reserve is a new allocation with a new creation time).
std::map<std::uint64_t, std::int64_t> g_offered;
// The pid of the process whose connection was told dedup_disabled (0: none). A forked child has
// another pid, so it asks again on its own connection.
std::atomic<pid_t> g_disabled_pid{0};

struct Mapping {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  bool read_only = false;
};

// Maps `maps` back to back from `base` and sets each run of equal access at once. On failure,
// unmaps what it mapped.
CUresult map_layout(std::uint64_t base, std::uint64_t total, const std::vector<Mapping>& maps, int device) {
  const UsedApi& api = used();
  if (api.cuMemSetAccess == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  for (const Mapping& m : maps) {
    if (CUresult rc = pass<Row::cuMemMap>(false, static_cast<CUdeviceptr>(base + m.offset), m.size, std::size_t{0},
                                          m.handle, 0ULL);
        rc != CUDA_SUCCESS) {
      pass<Row::cuMemUnmap>(false, static_cast<CUdeviceptr>(base), total);
      return rc;
    }
  }
  std::size_t i = 0;
  while (i < maps.size()) {
    std::size_t j = i;
    std::uint64_t run = 0;
    while (j < maps.size() && maps[j].read_only == maps[i].read_only) run += maps[j++].size;
    CUmemAccessDesc d{};
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = device;
    d.flags = maps[i].read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult rc = api.cuMemSetAccess(static_cast<CUdeviceptr>(base + maps[i].offset), run, &d, 1);
        rc != CUDA_SUCCESS) {
      pass<Row::cuMemUnmap>(false, static_cast<CUdeviceptr>(base), total);
      return rc;
    }
    i = j;
  }
  return CUDA_SUCCESS;
}

int status_of(proto::Status st) {
  switch (st) {
    case proto::Status::ok: return VLAKE_SHARE_OK;
    case proto::Status::bad_request: return VLAKE_SHARE_REFUSED;
    case proto::Status::out_of_memory: return VLAKE_SHARE_NO_MEMORY;
    default: return VLAKE_SHARE_INTERNAL;
  }
}

int share_owned(State& s, LogicalAlloc& a, std::uint64_t ptr, std::uint64_t bytes, vlake_share_result* out,
                bool transparent) {
  // A transparent share's failures are the hook's business only: debug (docs/dedup.md).
  auto lvl = [transparent](LogLevel l) { return transparent ? LogLevel::debug : l; };
  const std::uint64_t g = s.client.granularity();
  if (g == 0) return VLAKE_SHARE_INTERNAL;
  const std::uint64_t lo = ptr - a.base;
  const std::uint64_t hi = lo + bytes;
  const std::uint64_t from = (lo + g - 1) / g * g;
  const std::uint64_t to = hi / g * g;
  vlake_share_result res{};
  res.chunk_bytes = g;
  if (to <= from) {
    if (out != nullptr) *out = res;
    return VLAKE_SHARE_OK;  // no whole chunk: nothing to share
  }
  if (CUresult rc = fence_allocation(a); rc != CUDA_SUCCESS) {
    log(lvl(LogLevel::error), "vlake_share_readonly: synchronizing before the share failed (CUresult %d)",
        static_cast<int>(rc));
    return VLAKE_SHARE_FAULTED;
  }
  // The allocation's current layout, from the driver (one mapping per handle, in VA order).
  std::vector<Mapping> old;
  for (std::uint64_t off = 0; off < a.mapped;) {
    CUdeviceptr b = 0;
    std::size_t n = 0;
    if (pass<Row::cuMemGetAddressRange_v2>(false, &b, &n, static_cast<CUdeviceptr>(a.base + off)) != CUDA_SUCCESS ||
        b != a.base + off || n == 0 || old.size() >= a.handles.size()) {
      log(lvl(LogLevel::error), "vlake_share_readonly: the allocation's mappings are not as expected");
      return VLAKE_SHARE_INTERNAL;
    }
    old.push_back(Mapping{off, n, a.handles[old.size()], false});
    off += n;
  }
  if (old.size() != a.handles.size()) return VLAKE_SHARE_INTERNAL;

  // Fetch the daemon's plan, batch by batch.
  std::vector<proto::SharePiece> pieces;
  std::vector<UniqueFd> fds;
  proto::ShareReply first{};
  for (std::uint32_t next = 0;;) {
    proto::ShareRequest req{};
    req.h = proto::make_header<proto::ShareRequest>(proto::MsgType::share_request, 0);
    req.grant_id = a.grant_id;
    req.offset = from;
    req.bytes = to - from;
    req.first_piece = next;
    req.flags = transparent ? std::uint32_t{proto::kShareTransparent} : 0u;
    std::vector<UniqueFd> got;
    auto rep = s.client.share(req, got);
    if (!rep) {
      log(lvl(LogLevel::error), "vlake_share_readonly: cannot reach vlaked (%s)", s.client.last_error().c_str());
      return VLAKE_SHARE_UNREACHABLE;
    }
    if (rep->status == proto::Status::dedup_disabled) {
      g_disabled_pid.store(::getpid(), std::memory_order_relaxed);
      log(LogLevel::debug, "transparent dedup is off for this tenant's namespace: no more offers");
      return VLAKE_SHARE_REFUSED;
    }
    if (rep->status != proto::Status::ok) {
      log(lvl(LogLevel::warn), "vlake_share_readonly: vlaked refused the share (status %d)",
          static_cast<int>(rep->status));
      return status_of(rep->status);
    }
    if (next == 0) first = *rep;
    const std::uint32_t n = std::min(rep->piece_count, proto::kMaxHandlesPerGrant);
    std::size_t with_fd = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      pieces.push_back(rep->pieces[i]);
      if ((rep->pieces[i].flags & proto::kShareKeep) == 0) ++with_fd;
    }
    if (got.size() != with_fd || rep->first_piece != next || n == 0) {
      log(lvl(LogLevel::error), "vlake_share_readonly: vlaked sent a malformed plan");
      if (pieces.size() < rep->total_pieces || n == 0) {
        proto::ShareCommit abort{};
        abort.h = proto::make_header<proto::ShareCommit>(proto::MsgType::share_commit, 0);
        abort.grant_id = a.grant_id;
        (void)s.client.share_commit(abort);
      }
      return VLAKE_SHARE_INTERNAL;
    }
    for (auto& fd : got) fds.push_back(std::move(fd));
    next += n;
    if (next >= rep->total_pieces) break;
  }
  auto abort_share = [&] {
    proto::ShareCommit abort{};
    abort.h = proto::make_header<proto::ShareCommit>(proto::MsgType::share_commit, 0);
    abort.grant_id = a.grant_id;
    (void)s.client.share_commit(abort);
  };
  // Check the plan covers the allocation, then import its new handles.
  std::vector<Mapping> next;
  std::vector<CUmemGenericAllocationHandle> imported;
  auto release_imported = [&] {
    for (CUmemGenericAllocationHandle h : imported) pass<Row::cuMemRelease>(false, h);
  };
  {
    std::uint64_t expect = 0;
    std::size_t fd_i = 0;
    for (const proto::SharePiece& p : pieces) {
      const bool keep = (p.flags & proto::kShareKeep) != 0;
      if (p.offset != expect || p.size == 0 || (keep && p.keep_index >= old.size()) ||
          (keep && old[p.keep_index].size != p.size)) {
        log(lvl(LogLevel::error), "vlake_share_readonly: vlaked sent a malformed plan");
        release_imported();
        abort_share();
        return VLAKE_SHARE_INTERNAL;
      }
      Mapping m{p.offset, p.size, 0, (p.flags & proto::kShareReadOnly) != 0};
      if (keep) {
        m.handle = old[p.keep_index].handle;
      } else {
        CUmemGenericAllocationHandle h = 0;
        const CUresult rc = pass<Row::cuMemImportFromShareableHandle>(
            false, &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[fd_i++].get())),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (rc != CUDA_SUCCESS) {
          release_imported();
          abort_share();
          return VLAKE_SHARE_DRIVER;
        }
        imported.push_back(h);
        m.handle = h;
      }
      next.push_back(m);
      expect += p.size;
    }
    if (expect != a.mapped) {
      log(lvl(LogLevel::error), "vlake_share_readonly: vlaked's plan does not cover the allocation");
      release_imported();
      abort_share();
      return VLAKE_SHARE_INTERNAL;
    }
  }
  fds.clear();
  // Swap the layouts: the old handles stay referenced (a.handles) until the daemon commits.
  const CUdeviceptr base = static_cast<CUdeviceptr>(a.base);
  auto restore_old = [&] {
    pass<Row::cuMemUnmap>(false, base, a.mapped);
    if (map_layout(a.base, a.mapped, old, a.device) != CUDA_SUCCESS) {
      log(LogLevel::error,
          "vlake_share_readonly: restoring the old mapping of 0x%llx failed; the allocation is "
          "unusable",
          static_cast<unsigned long long>(a.ptr));
    }
  };
  if (CUresult rc = pass<Row::cuMemUnmap>(false, base, a.mapped); rc != CUDA_SUCCESS) {
    release_imported();
    abort_share();
    return VLAKE_SHARE_DRIVER;
  }
  if (CUresult rc = map_layout(a.base, a.mapped, next, a.device); rc != CUDA_SUCCESS) {
    log(lvl(LogLevel::error), "vlake_share_readonly: mapping the shared layout failed (CUresult %d)",
        static_cast<int>(rc));
    restore_old();
    release_imported();
    abort_share();
    return VLAKE_SHARE_DRIVER;
  }
  proto::ShareCommit commit{};
  commit.h = proto::make_header<proto::ShareCommit>(proto::MsgType::share_commit, 0);
  commit.grant_id = a.grant_id;
  commit.commit = 1;
  auto ack = s.client.share_commit(commit);
  if (ack && ack->status != proto::Status::ok) {
    // The daemon did not take the new layout: the old handles are still the grant's.
    restore_old();
    release_imported();
    return VLAKE_SHARE_INTERNAL;
  }
  if (!ack) {
    // Unknown outcome: keep the new layout (if the daemon did not commit, it drops the plan when
    // the session ends). Logged, since the accounting of this grant may now be off.
    log(LogLevel::warn, "vlake_share_readonly: no answer to the commit (%s); keeping the new layout",
        s.client.last_error().c_str());
  }
  // The replaced handles go; the allocation now holds the new layout's handles.
  std::vector<std::uint64_t> now;
  std::vector<bool> kept(old.size(), false);
  for (const proto::SharePiece& p : pieces) {
    if ((p.flags & proto::kShareKeep) != 0) kept[p.keep_index] = true;
  }
  for (std::size_t i = 0; i < old.size(); ++i) {
    if (!kept[i]) pass<Row::cuMemRelease>(false, old[i].handle);
  }
  for (const Mapping& m : next) now.push_back(m.handle);
  a.handles = std::move(now);
  {
    SharedGrant sg;
    sg.device = a.device;
    for (const Mapping& m : next) {
      if (!m.read_only) continue;
      if (!sg.read_only.empty() && sg.read_only.back().first + sg.read_only.back().second == m.offset) {
        sg.read_only.back().second += m.size;
      } else {
        sg.read_only.emplace_back(m.offset, m.size);
      }
    }
    std::lock_guard lock(g_mu);
    g_shared[a.grant_id] = std::move(sg);
    g_shared_count.store(g_shared.size(), std::memory_order_relaxed);
  }
  res.shared_bytes = first.shared_bytes;
  res.merged_bytes = first.merged_bytes;
  res.copied_bytes = first.copied_bytes;
  if (out != nullptr) *out = res;
  log(LogLevel::info, "shared %s of 0x%llx read-only (%s merged with existing chunks)",
      format_bytes(res.shared_bytes).c_str(), static_cast<unsigned long long>(ptr),
      format_bytes(res.merged_bytes).c_str());
  return VLAKE_SHARE_OK;
}

int share_range(State& s, std::uint64_t ptr, std::uint64_t bytes, vlake_share_result* out, bool transparent) noexcept {
  try {
    if (ptr == 0 || bytes == 0) return VLAKE_SHARE_INVALID;
    auto found = s.allocs.find(ptr);
    if (!found) return VLAKE_SHARE_NOT_VLAKE;
    if (ptr < found->base || ptr - found->base >= found->mapped || bytes > found->mapped - (ptr - found->base)) {
      return VLAKE_SHARE_INVALID;
    }
    // Own the allocation while its layout changes (a concurrent free fails meanwhile).
    auto a = s.allocs.take(found->ptr);
    if (!a) return VLAKE_SHARE_INVALID;
    int rc = VLAKE_SHARE_INTERNAL;
    try {
      rc = share_owned(s, *a, ptr, bytes, out, transparent);
    } catch (...) {
      s.allocs.insert(std::move(*a));
      throw;
    }
    s.allocs.insert(std::move(*a));
    return rc;
  } catch (...) {
    return VLAKE_SHARE_INTERNAL;
  }
}

}  // namespace

int share_readonly(State& s, std::uint64_t ptr, std::uint64_t bytes, vlake_share_result* out) noexcept {
  return share_range(s, ptr, bytes, out, false);
}

bool may_offer(const State& s, std::uint64_t bytes) noexcept {
  const std::uint64_t g = s.policy.granularity();
  if (g != 0 && bytes < g) return false;
  const pid_t off = g_disabled_pid.load(std::memory_order_relaxed);
  return off == 0 || off != ::getpid();
}

namespace {

// The allocation an upload of `bytes` to `dst` would be offered for (offer_upload's rules), or
// nothing. Records nothing.
std::optional<LogicalAlloc> offer_target(State& s, std::uint64_t dst, std::uint64_t bytes) {
  if (!may_offer(s, bytes) || s.policy.canary()) return std::nullopt;
  auto found = s.allocs.find(dst);
  if (!found || found->ptr != dst || bytes < found->requested) return std::nullopt;
  const std::uint64_t g = s.client.granularity();
  if (g == 0) return std::nullopt;
  const std::uint64_t lo = found->ptr - found->base;
  const std::uint64_t from = (lo + g - 1) / g * g;
  const std::uint64_t to = (lo + found->requested) / g * g;
  if (to <= from) return std::nullopt;  // no whole chunk
  std::lock_guard lock(g_mu);
  if (g_shared.count(found->grant_id) != 0) return std::nullopt;
  const auto it = g_offered.find(found->grant_id);
  if (it != g_offered.end() && it->second == found->created.time_since_epoch().count()) {
    return std::nullopt;  // offered before (e.g. a re-upload)
  }
  return found;
}

}  // namespace

bool would_offer(State& s, std::uint64_t dst, std::uint64_t bytes) noexcept {
  try {
    return offer_target(s, dst, bytes).has_value();
  } catch (...) {
    return false;
  }
}

void offer_upload(State& s, std::uint64_t dst, std::uint64_t bytes) noexcept {
  try {
    const auto found = offer_target(s, dst, bytes);
    if (!found) return;
    {
      std::lock_guard lock(g_mu);
      const std::int64_t born = found->created.time_since_epoch().count();
      auto [it, fresh] = g_offered.try_emplace(found->grant_id, born);
      if (!fresh && it->second == born) return;  // another thread offered it meanwhile
      it->second = born;
    }
    vlake_share_result res{};
    const int rc = share_range(s, dst, found->requested, &res, true);
    if (rc == VLAKE_SHARE_OK) {
      log(LogLevel::debug, "transparent dedup: upload to 0x%llx shared %s (%s merged)",
          static_cast<unsigned long long>(dst), format_bytes(res.shared_bytes).c_str(),
          format_bytes(res.merged_bytes).c_str());
    } else {
      log(LogLevel::debug, "transparent dedup: upload to 0x%llx not shared (status %d)",
          static_cast<unsigned long long>(dst), rc);
    }
  } catch (...) {
    // Never reaches the application.
  }
}

bool is_shared(std::uint64_t grant_id) noexcept {
  std::lock_guard lock(g_mu);
  return g_shared.count(grant_id) != 0;
}

void forget(std::uint64_t grant_id) noexcept {
  std::lock_guard lock(g_mu);
  g_shared.erase(grant_id);
  g_shared_count.store(g_shared.size(), std::memory_order_relaxed);
  g_offered.erase(grant_id);
}

bool holds_shared(int device) noexcept {
  std::lock_guard lock(g_mu);
  for (const auto& [g, sg] : g_shared) {
    if (sg.device == device) return true;
  }
  return false;
}

std::optional<ReadOnlyHit> readonly_hit(State& s, std::uint64_t dst, std::uint64_t bytes) noexcept {
  try {
    if (bytes == 0 || g_shared_count.load(std::memory_order_relaxed) == 0) return std::nullopt;
    const std::uint64_t end = dst + std::min(bytes, UINT64_MAX - dst);
    // The allocation holding the destination's first byte, else its last one.
    for (const std::uint64_t probe : {dst, end - 1}) {
      auto a = s.allocs.find(probe);
      if (!a) continue;
      std::lock_guard lock(g_mu);
      const auto it = g_shared.find(a->grant_id);
      if (it == g_shared.end()) continue;
      ReadOnlyHit hit;
      for (const auto& [off, n] : it->second.read_only) {
        const std::uint64_t lo = std::max(dst, a->base + off);
        const std::uint64_t hi = std::min(end, a->base + off + n);
        if (lo >= hi) continue;
        if (hit.shared_bytes == 0) hit.shared_offset = lo - a->ptr;
        hit.shared_bytes += hi - lo;
      }
      if (hit.shared_bytes == 0) continue;
      hit.grant_id = a->grant_id;
      hit.device = a->device;
      hit.alloc_ptr = a->ptr;
      hit.alloc_bytes = a->requested;
      hit.alloc_born_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(a->created.time_since_epoch()).count();
      return hit;
    }
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace vlake::hook::share

extern "C" {

__attribute__((visibility("default"))) int vlake_share_readonly_ex(const void* ptr, size_t bytes,
                                                                   vlake_share_result* out) {
  try {
    vlake::hook::State* s = vlake::hook::state();
    if (s == nullptr || s->passthrough) return VLAKE_SHARE_NOT_VLAKE;
    return vlake::hook::share::share_readonly(*s, reinterpret_cast<std::uint64_t>(ptr), bytes, out);
  } catch (...) {
    return VLAKE_SHARE_INTERNAL;
  }
}

__attribute__((visibility("default"))) int vlake_share_readonly(const void* ptr, size_t bytes) {
  return vlake_share_readonly_ex(ptr, bytes, nullptr);
}

__attribute__((visibility("default"))) size_t vlake_share_chunk_bytes(void) {
  try {
    vlake::hook::State* s = vlake::hook::state();
    if (s != nullptr) {
      if (const std::uint64_t g = s->client.granularity(); g != 0) return g;
    }
    const vlake::hook::UsedApi& api = vlake::hook::used();
    if (api.cuCtxGetDevice == nullptr || api.cuMemGetAllocationGranularity == nullptr) return 0;
    CUdevice d = 0;
    if (api.cuCtxGetDevice(&d) != CUDA_SUCCESS) return 0;
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = d;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    std::size_t g = 0;
    if (api.cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      return 0;
    }
    return g;
  } catch (...) {
    return 0;
  }
}

__attribute__((visibility("default"))) const char* vlake_share_strerror(int status) {
  switch (status) {
    case VLAKE_SHARE_OK: return "ok";
    case VLAKE_SHARE_NOT_VLAKE: return "the pointer is not in an allocation served by vlake";
    case VLAKE_SHARE_INVALID: return "the range leaves its allocation or is empty";
    case VLAKE_SHARE_UNREACHABLE: return "vlaked cannot be reached";
    case VLAKE_SHARE_REFUSED: return "vlaked refused (allocation shared already, or guard canary mode)";
    case VLAKE_SHARE_NO_MEMORY: return "no GPU memory for the copies";
    case VLAKE_SHARE_DRIVER: return "a driver call failed; the allocation is unchanged";
    case VLAKE_SHARE_FAULTED: return "the allocation's CUDA context has a sticky error";
    case VLAKE_SHARE_INTERNAL: return "internal error (see the vlake: line on stderr)";
    default: return "unknown status";
  }
}

}  // extern "C"
