// The host tier's moves (contract in tier.hpp; docs/swap.md, "Host tier").
#include "tier.hpp"

#include <chrono>
#include <cstdint>
#include <vector>

#include "alloc/internal.hpp"
#include "gate.hpp"
#include "hook.hpp"
#include "log.hpp"
#include "peer.hpp"

namespace vlake::hook {
namespace {

using proto::TierResult;

constexpr auto kDrainTimeout = std::chrono::milliseconds(2000);
constexpr auto kConnectionWait = std::chrono::milliseconds(2000);

// Where a move's time goes (the info line at its end): ns per phase, summed over its grants.
struct Phases {
  std::uint64_t import = 0, map = 0, copy = 0, remap = 0, release = 0;
};
std::uint64_t since_ns(std::chrono::steady_clock::time_point t) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t).count());
}

CUresult synchronize(CUcontext ctx) {
  CUresult rc = CUDA_ERROR_INVALID_CONTEXT;
  (void)in_context(ctx, [&] { rc = call_real<Row::cuCtxSynchronize>(false); });
  return rc;
}

// Every context this process allocated pool memory in has finished its work.
bool synchronize_all(State& s) {
  for (CUcontext ctx : s.allocs.contexts()) {
    if (CUresult rc = synchronize(ctx); rc != CUDA_SUCCESS) {
      log(LogLevel::warn, "host tier: synchronizing a context failed (CUresult %d); nothing is moved",
          static_cast<int>(rc));
      return false;
    }
  }
  return true;
}

void release_all(const std::vector<CUmemGenericAllocationHandle>& handles) {
  for (CUmemGenericAllocationHandle h : handles) (void)call_real<Row::cuMemRelease>(false, h);
}

// Maps `handles` (pieces at their offsets) at `base` and gives `dev` and `peers` access.
CUresult map_pieces(CUdeviceptr base, std::uint64_t bytes, const std::vector<proto::TierPiece>& pieces,
                    const std::vector<CUmemGenericAllocationHandle>& handles, int dev, std::uint32_t peers) {
  std::size_t done = 0;
  CUresult rc = CUDA_SUCCESS;
  for (; done < pieces.size(); ++done) {
    rc = call_real<Row::cuMemMap>(false, base + pieces[done].offset, pieces[done].size, std::size_t{0}, handles[done],
                                  0ULL);
    if (rc != CUDA_SUCCESS) break;
  }
  if (rc == CUDA_SUCCESS) {
    AccessDescs access;
    const std::size_t n = access_for(dev, peers, access);
    rc = used().cuMemSetAccess(base, bytes, access.data(), n);
  }
  if (rc != CUDA_SUCCESS) {
    for (std::size_t i = 0; i < done; ++i)
      (void)call_real<Row::cuMemUnmap>(false, base + pieces[i].offset, pieces[i].size);
  }
  return rc;
}

// A step of a move failed: logged (the grant stays on its old memory).
TierResult failed(std::uint64_t grant, const char* step, CUresult rc) {
  log(LogLevel::warn, "host tier: moving grant %llu failed at %s (CUresult %d); it stays where it is",
      static_cast<unsigned long long>(grant), step, static_cast<int>(rc));
  return TierResult::failed;
}

// Moves one allocation's data into the pieces and maps them at its addresses. The side that is
// device memory is mapped a second time at a scratch address for the copy (mapping device
// handles is cheap; mapping host-located memory is not: about 0.6 s per pass for 45 GiB on an
// H200): to the host, the old handles go to the scratch address, the new pieces straight to the
// allocation's address, then the copy; to the GPU, the new handles go to the scratch address,
// the copy, then they replace the old pieces at the allocation's address.
TierResult move_grant(State& s, const proto::TierPlan& head, const std::vector<proto::TierPiece>& pieces,
                      std::vector<UniqueFd>& fds, Phases& ph) {
  const std::uint64_t grant = head.grant_id;
  std::optional<LogicalAlloc> a = s.allocs.find_grant(grant);
  log(LogLevel::debug, "host tier: grant %llu (%s, %zu pieces) to %s", static_cast<unsigned long long>(grant),
      format_bytes(head.bytes).c_str(), pieces.size(),
      head.direction == proto::TierDirection::to_host ? "host" : "GPU");
  if (!a) {
    ReserveBlock b;
    if (s.reserve.take_grant(grant, b)) {
      // Nobody uses it: unmapped and released here, and vlaked takes it back (no Release of our
      // own: another thread may hold the connection for minutes, waiting for memory).
      if (CUresult rc = unmap_logical(b.alloc); rc != CUDA_SUCCESS) {
        log(LogLevel::warn, "host tier: unmapping reserved grant %llu failed (CUresult %d)",
            static_cast<unsigned long long>(grant), static_cast<int>(rc));
      }
      log(LogLevel::debug, "host tier: grant %llu was in the local reserve: released",
          static_cast<unsigned long long>(grant));
      return TierResult::released;
    }
    return TierResult::declined;
  }
  if (a->mapped != head.bytes || pieces.size() != fds.size()) return TierResult::declined;
  std::uint64_t expect = 0;
  for (const proto::TierPiece& p : pieces) {
    if (p.offset != expect) return TierResult::declined;
    expect += p.size;
  }
  if (expect != head.bytes) return TierResult::declined;
  const UsedApi& api = used();
  if (api.cuMemAddressReserve == nullptr || api.cuMemSetAccess == nullptr || api.cuMemAddressFree == nullptr) {
    return failed(grant, "the driver's VMM entry points", CUDA_ERROR_NOT_SUPPORTED);
  }
  const bool to_host = head.direction == proto::TierDirection::to_host;
  const auto base = static_cast<CUdeviceptr>(a->base);
  const std::uint64_t bytes = head.bytes;
  auto t = std::chrono::steady_clock::now();
  std::vector<CUmemGenericAllocationHandle> fresh;
  for (UniqueFd& fd : fds) {
    CUmemGenericAllocationHandle h = 0;
    if (CUresult rc = call_real<Row::cuMemImportFromShareableHandle>(
            false, &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd.get())),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        rc != CUDA_SUCCESS) {
      release_all(fresh);
      return failed(grant, "cuMemImportFromShareableHandle", rc);
    }
    fresh.push_back(h);
    fd.reset();
  }
  ph.import += since_ns(t);
  // The old layout (the driver's mappings, one per old handle): only the sizes are used (for
  // host-located memory the driver reports the mapping's size but not its address, measured on an
  // H200, driver 580).
  std::vector<proto::TierPiece> old;
  CUresult lrc = CUDA_ERROR_INVALID_CONTEXT;
  (void)in_context(a->ctx, [&] {  // the query needs a context
    lrc = CUDA_SUCCESS;
    for (std::uint64_t off = 0; off < a->mapped && lrc == CUDA_SUCCESS;) {
      CUdeviceptr b = 0;
      std::size_t n = 0;
      lrc = call_real<Row::cuMemGetAddressRange_v2>(false, &b, &n, base + off);
      if (lrc == CUDA_SUCCESS && (n == 0 || n > a->mapped - off || old.size() >= a->handles.size())) {
        lrc = CUDA_ERROR_INVALID_VALUE;
      }
      old.push_back(proto::TierPiece{n, off});
      off += n;
    }
  });
  if (lrc != CUDA_SUCCESS || old.size() != a->handles.size()) {
    release_all(fresh);
    return failed(grant, "reading its layout", lrc != CUDA_SUCCESS ? lrc : CUDA_ERROR_INVALID_VALUE);
  }
  const std::vector<CUmemGenericAllocationHandle> held(a->handles.begin(), a->handles.end());
  t = std::chrono::steady_clock::now();
  CUdeviceptr scratch = 0;
  if (CUresult rc = api.cuMemAddressReserve(&scratch, bytes, 0, 0, 0); rc != CUDA_SUCCESS) {
    release_all(fresh);
    return failed(grant, "cuMemAddressReserve", rc);
  }
  auto drop_scratch = [&](bool mapped) {
    if (mapped) (void)call_real<Row::cuMemUnmap>(false, scratch, bytes);
    (void)api.cuMemAddressFree(scratch, bytes);
  };
  // The device side at the scratch address.
  if (CUresult rc = to_host ? map_pieces(scratch, bytes, old, held, a->device, 0)
                            : map_pieces(scratch, bytes, pieces, fresh, a->device, 0);
      rc != CUDA_SUCCESS) {
    drop_scratch(false);
    release_all(fresh);
    return failed(grant, "mapping at a scratch address", rc);
  }
  ph.map += since_ns(t);
  auto copy = [&](CUdeviceptr dst, CUdeviceptr src) {
    CUresult rc = CUDA_ERROR_INVALID_CONTEXT;
    (void)in_context(a->ctx, [&] {
      rc = call_real<Row::cuMemcpyDtoD_v2>(false, dst, src, bytes);
      if (rc == CUDA_SUCCESS) rc = call_real<Row::cuCtxSynchronize>(false);
    });
    return rc;
  };
  // Puts the old handles back at the allocation's address (a later step failed).
  auto restore_old = [&](CUresult why, const char* step) {
    const CUresult back = map_pieces(base, bytes, old, held, a->device, a->peers);
    if (back != CUDA_SUCCESS) {
      log(LogLevel::error,
          "host tier: moving grant %llu failed at %s (CUresult %d) and mapping its old memory back "
          "failed too (CUresult %d): it is lost",
          static_cast<unsigned long long>(grant), step, static_cast<int>(why), static_cast<int>(back));
    }
    release_all(fresh);
    return failed(grant, step, why);
  };
  if (!to_host) {
    t = std::chrono::steady_clock::now();
    const CUresult crc = copy(scratch, base);
    ph.copy += since_ns(t);
    if (crc != CUDA_SUCCESS) {
      drop_scratch(true);
      release_all(fresh);
      return failed(grant, "copying", crc);
    }
  }
  t = std::chrono::steady_clock::now();
  if (CUresult rc = call_real<Row::cuMemUnmap>(false, base, a->mapped); rc != CUDA_SUCCESS) {
    drop_scratch(true);
    release_all(fresh);
    return failed(grant, "cuMemUnmap", rc);
  }
  if (CUresult rc = map_pieces(base, bytes, pieces, fresh, a->device, a->peers); rc != CUDA_SUCCESS) {
    drop_scratch(true);
    return restore_old(rc, "mapping the new pieces");
  }
  ph.remap += since_ns(t);
  if (to_host) {
    t = std::chrono::steady_clock::now();
    const CUresult crc = copy(base, scratch);
    ph.copy += since_ns(t);
    if (crc != CUDA_SUCCESS) {
      drop_scratch(true);
      (void)call_real<Row::cuMemUnmap>(false, base, a->mapped);
      return restore_old(crc, "copying");
    }
  }
  drop_scratch(true);
  t = std::chrono::steady_clock::now();
  release_all(held);
  std::vector<std::uint64_t> kept(fresh.begin(), fresh.end());
  (void)s.allocs.replace_handles(a->base, grant, std::move(kept), to_host);
  ph.release += since_ns(t);
  return TierResult::moved;
}

}  // namespace

void run_move(State& s, const proto::TierNotice& notice) noexcept {
  try {
    proto::TierStep step{};
    step.move_id = notice.move_id;
    std::vector<UniqueFd> fds;
    const auto stopping = std::chrono::steady_clock::now();
    if (!tier::close_and_drain(kDrainTimeout) || !synchronize_all(s)) {
      tier::open();
      log(LogLevel::debug, "vlaked wants to move memory of this process, but it is busy: not now");
      step.result = TierResult::busy;
      (void)s.client.tier_step(step, fds, kConnectionWait);
      return;
    }
    const std::uint64_t stop_ns = since_ns(stopping);
    const auto started = std::chrono::steady_clock::now();
    std::uint64_t moved_bytes = 0;
    unsigned moved = 0;
    Phases ph;
    for (;;) {
      fds.clear();
      std::optional<proto::TierPlan> plan = s.client.tier_step(step, fds, kConnectionWait);
      if (!plan || plan->status != proto::Status::ok || plan->grant_id == 0) {
        log(LogLevel::debug, "host tier: move %llu over (%s)", static_cast<unsigned long long>(notice.move_id),
            !plan                 ? s.client.last_error().c_str()
            : plan->grant_id == 0 ? "done"
                                  : "refused");
        break;
      }
      const proto::TierPlan head = *plan;
      std::vector<proto::TierPiece> pieces(head.pieces, head.pieces + head.piece_count);
      bool complete = head.first_piece == 0;
      while (complete && pieces.size() < head.total_pieces) {
        proto::TierStep more{};
        more.move_id = notice.move_id;
        more.grant_id = head.grant_id;
        more.first_piece = static_cast<std::uint32_t>(pieces.size());
        std::vector<UniqueFd> extra;
        std::optional<proto::TierPlan> next = s.client.tier_step(more, extra, kConnectionWait);
        if (!next || next->status != proto::Status::ok || next->grant_id != head.grant_id ||
            next->first_piece != pieces.size() || next->piece_count == 0) {
          complete = false;
          break;
        }
        pieces.insert(pieces.end(), next->pieces, next->pieces + next->piece_count);
        for (UniqueFd& fd : extra) fds.push_back(std::move(fd));
      }
      if (!complete) break;  // vlaked went away or called it off: the grant stays as it was
      const TierResult r = move_grant(s, head, pieces, fds, ph);
      log(LogLevel::debug, "host tier: grant %llu: result %u", static_cast<unsigned long long>(head.grant_id),
          static_cast<unsigned>(r));
      if (r == TierResult::moved) {
        ++moved;
        moved_bytes += head.bytes;
      }
      step = proto::TierStep{};
      step.move_id = notice.move_id;
      step.grant_id = head.grant_id;
      step.result = r;
    }
    tier::open();
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
    log(moved > 0 ? LogLevel::info : LogLevel::debug,
        "vlaked moved %u allocation(s) of this process (%s) to %s memory in %lld ms (stopping %llu, import %llu, map "
        "%llu, copy %llu, remap %llu, release %llu ms)",
        moved, format_bytes(moved_bytes).c_str(), notice.direction == proto::TierDirection::to_host ? "host" : "GPU",
        static_cast<long long>(ms), static_cast<unsigned long long>(stop_ns / 1000000),
        static_cast<unsigned long long>(ph.import / 1000000), static_cast<unsigned long long>(ph.map / 1000000),
        static_cast<unsigned long long>(ph.copy / 1000000), static_cast<unsigned long long>(ph.remap / 1000000),
        static_cast<unsigned long long>(ph.release / 1000000));
  } catch (...) {
    tier::open();
  }
}

}  // namespace vlake::hook
