// Peer access to served memory: cuCtxEnablePeerAccess / cuCtxDisablePeerAccess (peer.hpp,
// docs/hook.md "Several GPUs").
#include "peer.hpp"

#include "hook.hpp"
#include "share.hpp"

namespace vlake::hook {

namespace {

std::uint32_t bit(int device) { return std::uint32_t{1} << device; }

void add_desc(std::vector<CUmemAccessDesc>& out, int device, CUmemAccess_flags flags) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = flags;
  out.push_back(d);
}

// Brings the mapping [base, base + bytes) of `owner` from peer set `from` to `to`: one
// cuMemSetAccess for the devices that gain access and those that lose it. A refused
// revocation is retried without it (the access stays). Caller holds PeerSet::mu().
void change(std::uint64_t base, std::uint64_t bytes, int owner, std::uint32_t from, std::uint32_t to) {
  const UsedApi& api = used();
  if (api.cuMemSetAccess == nullptr || from == to || bytes == 0) return;
  std::vector<CUmemAccessDesc> grant;
  std::vector<CUmemAccessDesc> all;
  for (int d = 0; d < static_cast<int>(proto::kMaxDevices); ++d) {
    if (d == owner) continue;
    if ((to & ~from & bit(d)) != 0) add_desc(grant, d, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  }
  all = grant;
  for (int d = 0; d < static_cast<int>(proto::kMaxDevices); ++d) {
    if (d != owner && (from & ~to & bit(d)) != 0) add_desc(all, d, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  }
  const auto ptr = static_cast<CUdeviceptr>(base);
  CUresult rc = api.cuMemSetAccess(ptr, bytes, all.data(), all.size());
  if (rc != CUDA_SUCCESS && all.size() > grant.size()) {
    log(LogLevel::debug, "the driver refused to revoke peer access to 0x%llx on GPU %d (CUresult %d)",
        static_cast<unsigned long long>(base), owner, static_cast<int>(rc));
    rc = grant.empty() ? CUDA_SUCCESS : api.cuMemSetAccess(ptr, bytes, grant.data(), grant.size());
  }
  if (rc != CUDA_SUCCESS) {
    log(LogLevel::warn, "giving peer GPUs access to 0x%llx on GPU %d failed (CUresult %d)",
        static_cast<unsigned long long>(base), owner, static_cast<int>(rc));
  }
}

// Every live served allocation of `owner` to the current peer set. Caller holds mu().
void retag_all(State& s, int owner) {
  const std::uint32_t now = s.peers.of(owner);
  for (const LogicalAlloc& a : s.allocs.retag(owner, now)) {
    if (share::is_shared(a.grant_id)) continue;
    change(a.base, a.mapped, owner, a.peers, now);
  }
}

// The device of context `ctx` (pushed for the query).
CUresult device_of(CUcontext ctx, int& dev) {
  const UsedApi& api = used();
  if (api.cuCtxPushCurrent_v2 == nullptr || api.cuCtxPopCurrent_v2 == nullptr || api.cuCtxGetDevice == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (CUresult rc = api.cuCtxPushCurrent_v2(ctx); rc != CUDA_SUCCESS) return rc;
  CUdevice d = 0;
  const CUresult rc = api.cuCtxGetDevice(&d);
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent_v2(&popped);
  dev = d;
  return rc;
}

// The devices of the current context (the accessor) and of `peer` (the owner).
bool devices(CUcontext peer, int& accessor, int& owner) {
  const UsedApi& api = used();
  CUdevice d = 0;
  if (api.cuCtxGetDevice == nullptr || api.cuCtxGetDevice(&d) != CUDA_SUCCESS) return false;
  accessor = d;
  if (device_of(peer, owner) != CUDA_SUCCESS) return false;
  const int n = static_cast<int>(proto::kMaxDevices);
  return accessor >= 0 && accessor < n && owner >= 0 && owner < n && accessor != owner;
}

}  // namespace

std::uint32_t PeerSet::add(int owner, int accessor) noexcept {
  return peers_[static_cast<std::size_t>(owner)].fetch_or(bit(accessor)) | bit(accessor);
}

std::uint32_t PeerSet::remove(int owner, int accessor) noexcept {
  return peers_[static_cast<std::size_t>(owner)].fetch_and(~bit(accessor)) & ~bit(accessor);
}

std::size_t access_for(int owner, std::uint32_t peers, AccessDescs& out) noexcept {
  std::size_t n = 0;
  for (int d = 0; d < static_cast<int>(proto::kMaxDevices); ++d) {
    if (d != owner && (peers & bit(d)) == 0) continue;
    CUmemAccessDesc& desc = out[n++];
    desc = CUmemAccessDesc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return n;
}

void settle(State& s, std::uint64_t base, int device, std::uint32_t peers) {
  if (s.peers.of(device) == peers) return;  // the hot path: nothing changed
  std::lock_guard lock(s.peers.mu());
  const auto a = s.allocs.find(base);
  if (!a) return;  // freed meanwhile
  const std::uint32_t now = s.peers.of(device);
  const auto had = s.allocs.set_peers(base, now);
  if (!had || *had == now || share::is_shared(a->grant_id)) return;
  change(base, a->mapped, device, *had, now);
}

namespace {

// After the driver enabled (`enabled`) or disabled peer access to `peerContext`'s device: record
// the change and retag the owner's allocations. The driver's errors pass untouched.
CUresult peer_access_changed(CUresult rc, CUcontext peerContext, bool enabled) {
  if (rc != CUDA_SUCCESS) return rc;
  State* s = active_state();
  int accessor = 0;
  int owner = 0;
  if (s == nullptr || !devices(peerContext, accessor, owner)) return rc;
  std::lock_guard lock(s->peers.mu());
  if (enabled) {
    s->peers.add(owner, accessor);
  } else {
    s->peers.remove(owner, accessor);
  }
  retag_all(*s, owner);
  return rc;
}

}  // namespace

CUresult on_cuCtxEnablePeerAccess(bool ptds, CUcontext peerContext, unsigned int Flags) {
  return peer_access_changed(pass<Row::cuCtxEnablePeerAccess>(ptds, peerContext, Flags), peerContext, true);
}

CUresult on_cuCtxDisablePeerAccess(bool ptds, CUcontext peerContext) {
  return peer_access_changed(pass<Row::cuCtxDisablePeerAccess>(ptds, peerContext), peerContext, false);
}

}  // namespace vlake::hook
