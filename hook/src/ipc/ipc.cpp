// CUDA IPC of pool memory through vlaked (ipc.hpp, docs/ipc.md).
// hook.hpp first: real.hpp sets up cuda.h for cudaTypedefs.h.
#include "ipc.hpp"
#include "hook.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "log.hpp"
#include "real.hpp"

namespace vlake::hook::ipc {

namespace {

struct Import {
  std::uint64_t token = 0;
  std::uint64_t import_id = 0;
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
  int refs = 0;
};

// Serializes opens and closes (one IpcOpen per token and process); taken before the connection.
std::mutex g_open_mu;
// The tables; taken after the connection, never held across a driver or daemon call.
std::mutex g_mu;
std::map<std::uint64_t, Import> g_imports;         // by token
std::map<std::uint64_t, std::uint64_t> g_by_base;  // mapping base -> token
std::map<std::uint64_t, std::uint64_t> g_exports;  // grant id -> token (exported by this process)
// Sizes of g_imports and g_exports, read without the mutex: the free and range-query paths of a
// process that never used IPC take no lock.
std::atomic<std::size_t> g_import_count{0};
std::atomic<std::size_t> g_export_count{0};

std::uint64_t addr(CUdeviceptr p) { return static_cast<std::uint64_t>(p); }

// The import whose mapping contains `a` (g_mu held), or end().
std::map<std::uint64_t, Import>::iterator import_at(std::uint64_t a) {
  auto b = g_by_base.upper_bound(a);
  if (b == g_by_base.begin()) return g_imports.end();
  --b;
  auto it = g_imports.find(b->second);
  if (it == g_imports.end() || a - it->second.base >= it->second.bytes) return g_imports.end();
  return it;
}

// The CUDA ordinal of the GPU with UUID `u` (-1: none).
int device_of(State& s, const std::uint8_t* u) {
  for (int d = 0; d < static_cast<int>(proto::kMaxDevices); ++d) {
    Uuid mine{};
    if (device_uuid(s, d, mine) != CUDA_SUCCESS) return -1;
    if (std::memcmp(mine.data(), u, 16) == 0) return d;
  }
  return -1;
}

// Unmaps [base, base + mapped), releases the handles and frees the VA (what is set).
void undo(std::uint64_t base, std::uint64_t reserved, std::uint64_t mapped,
          const std::vector<CUmemGenericAllocationHandle>& handles) {
  const UsedApi& api = used();
  if (base != 0 && mapped != 0) (void)pass<Row::cuMemUnmap>(false, static_cast<CUdeviceptr>(base), mapped);
  for (CUmemGenericAllocationHandle h : handles) (void)pass<Row::cuMemRelease>(false, h);
  if (base != 0 && reserved != 0 && api.cuMemAddressFree != nullptr) {
    (void)api.cuMemAddressFree(static_cast<CUdeviceptr>(base), reserved);
  }
}

CUresult refusal_of(proto::Status st) {
  switch (st) {
    case proto::Status::ipc_denied: return CUDA_ERROR_NOT_PERMITTED;
    case proto::Status::limit_reached: return CUDA_ERROR_OUT_OF_MEMORY;
    case proto::Status::internal: return CUDA_ERROR_UNKNOWN;
    default: return CUDA_ERROR_INVALID_VALUE;  // unknown_handle, bad_request: an invalid handle
  }
}

// Maps the pieces of an IpcOpenReply; fills `imp` (base, bytes, handles). On failure undoes
// everything it did.
CUresult map_import(State& s, const proto::IpcOpenReply& r, std::vector<UniqueFd>& fds, Import& imp) {
  const UsedApi& api = used();
  if (api.cuMemAddressReserve == nullptr || api.cuMemSetAccess == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  std::uint64_t expect = 0;
  bool ok = r.piece_count > 0 && fds.size() == r.piece_count;
  for (std::uint32_t i = 0; ok && i < r.piece_count; ++i) {
    ok = r.pieces[i].offset == expect && r.pieces[i].size > 0;
    expect += r.pieces[i].size;
  }
  if (!ok || expect != r.bytes) {
    log(LogLevel::error, "vlaked sent a malformed IPC layout (%u pieces, %zu descriptors)", r.piece_count, fds.size());
    return CUDA_ERROR_UNKNOWN;
  }
  const int mem_dev = device_of(s, r.device_uuid);
  if (mem_dev < 0) return CUDA_ERROR_INVALID_DEVICE;
  int cur_dev = mem_dev;
  if (api.cuCtxGetDevice != nullptr) {
    CUdevice d = 0;
    if (api.cuCtxGetDevice(&d) == CUDA_SUCCESS) cur_dev = d;
  }
  std::vector<CUmemGenericAllocationHandle> handles;
  for (UniqueFd& fd : fds) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult rc = pass<Row::cuMemImportFromShareableHandle>(
        false, &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd.get())),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    fd.reset();
    if (rc != CUDA_SUCCESS) {
      undo(0, 0, 0, handles);
      return rc;
    }
    handles.push_back(h);
  }
  CUdeviceptr base = 0;
  if (CUresult rc = api.cuMemAddressReserve(&base, r.bytes, 0, 0, 0); rc != CUDA_SUCCESS) {
    undo(0, 0, 0, handles);
    return rc;
  }
  std::uint64_t mapped = 0;
  for (std::uint32_t i = 0; i < r.piece_count; ++i) {
    const proto::SharePiece& p = r.pieces[i];
    if (CUresult rc = pass<Row::cuMemMap>(false, base + p.offset, p.size, std::size_t{0}, handles[i], 0ULL);
        rc != CUDA_SUCCESS) {
      undo(addr(base), r.bytes, mapped, handles);
      return rc;
    }
    mapped = p.offset + p.size;
  }
  for (std::uint32_t i = 0; i < r.piece_count; ++i) {
    const proto::SharePiece& p = r.pieces[i];
    CUmemAccessDesc d[2]{};
    const unsigned n = cur_dev == mem_dev ? 1u : 2u;
    for (unsigned k = 0; k < n; ++k) {
      d[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      d[k].location.id = k == 0 ? mem_dev : cur_dev;
      d[k].flags =
          (p.flags & proto::kShareReadOnly) != 0 ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    CUresult rc = api.cuMemSetAccess(base + p.offset, p.size, d, n);
    // The current context's GPU cannot reach the memory's (no peer access): as the driver's lazy
    // peer access, the memory's own GPU only.
    if (rc != CUDA_SUCCESS && n == 2) rc = api.cuMemSetAccess(base + p.offset, p.size, d, 1);
    if (rc != CUDA_SUCCESS) {
      undo(addr(base), r.bytes, mapped, handles);
      return rc;
    }
  }
  imp.base = addr(base);
  imp.bytes = r.bytes;
  imp.handles = std::move(handles);
  return CUDA_SUCCESS;
}

}  // namespace

bool exported(std::uint64_t grant_id) {
  if (g_export_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(g_mu);
  return g_exports.count(grant_id) != 0;
}

void forget(std::uint64_t grant_id) {
  std::lock_guard lock(g_mu);
  g_exports.erase(grant_id);
  g_export_count.store(g_exports.size(), std::memory_order_release);
}

std::optional<Range> imported(std::uint64_t a) {
  if (g_import_count.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard lock(g_mu);
  if (g_by_base.empty()) return std::nullopt;
  auto it = import_at(a);
  if (it == g_imports.end()) return std::nullopt;
  return Range{it->second.base, it->second.bytes};
}

std::size_t imports() {
  std::lock_guard lock(g_mu);
  return g_imports.size();
}

void lock_all() noexcept {
  g_open_mu.lock();
  g_mu.lock();
}

void unlock_all() noexcept {
  g_mu.unlock();
  g_open_mu.unlock();
}

void clear_after_fork() noexcept {
  // The child has none of the parent's mappings' owners: it forgets imports like grants.
  g_imports.clear();
  g_by_base.clear();
  g_exports.clear();
  g_import_count.store(0, std::memory_order_relaxed);
  g_export_count.store(0, std::memory_order_relaxed);
  g_mu.unlock();
  g_open_mu.unlock();
}

}  // namespace vlake::hook::ipc

namespace vlake::hook {

using ipc::g_by_base;
using ipc::g_exports;
using ipc::g_imports;
using ipc::g_mu;
using ipc::g_open_mu;

CUresult on_cuIpcGetMemHandle(bool ptds, CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  State* s = state();
  if (s == nullptr || s->passthrough || pHandle == nullptr) return pass<Row::cuIpcGetMemHandle>(ptds, pHandle, dptr);
  auto a = s->allocs.find(ipc::addr(dptr));
  if (!a || ipc::addr(dptr) - a->base >= a->mapped) return pass<Row::cuIpcGetMemHandle>(ptds, pHandle, dptr);
  Uuid uuid{};
  if (CUresult rc = device_uuid(*s, a->device, uuid); rc != CUDA_SUCCESS) return rc;
  auto rep = s->client.ipc_export(a->grant_id);
  if (!rep) {
    log(LogLevel::error, "cuIpcGetMemHandle: cannot reach vlaked (%s)", s->client.last_error().c_str());
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  if (rep->status != proto::Status::ok) {
    log(LogLevel::warn, "cuIpcGetMemHandle: vlaked refused to export grant %llu (status %d)",
        static_cast<unsigned long long>(a->grant_id), static_cast<int>(rep->status));
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::IpcHandleBlob blob{};
  std::memcpy(blob.magic, proto::kIpcHandleMagic, sizeof blob.magic);
  blob.token = rep->token;
  blob.secret = rep->secret;
  blob.offset = ipc::addr(dptr) - a->base;
  blob.bytes = rep->bytes;
  std::memcpy(blob.device_uuid, uuid.data(), sizeof blob.device_uuid);
  static_assert(sizeof blob == sizeof pHandle->reserved);
  std::memcpy(pHandle->reserved, &blob, sizeof blob);
  {
    std::lock_guard lock(g_mu);
    g_exports[a->grant_id] = rep->token;
    ipc::g_export_count.store(g_exports.size(), std::memory_order_release);
  }
  return CUDA_SUCCESS;
}

CUresult on_cuIpcOpenMemHandle_v2(bool ptds, CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  proto::IpcHandleBlob blob{};
  std::memcpy(&blob, handle.reserved, sizeof blob);
  State* s = state();
  if (s == nullptr || s->passthrough || std::memcmp(blob.magic, proto::kIpcHandleMagic, sizeof blob.magic) != 0) {
    return pass<Row::cuIpcOpenMemHandle_v2>(ptds, pdptr, handle, Flags);
  }
  if (pdptr == nullptr || (Flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0 ||
      blob.offset >= blob.bytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard open(g_open_mu);
  {
    std::lock_guard lock(g_mu);
    for (const auto& [grant, token] : g_exports) {
      // The process's own handle (docs/ipc.md: the driver refuses it; code to be measured).
      if (token == blob.token) return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (auto it = g_imports.find(blob.token); it != g_imports.end()) {
      if (blob.offset >= it->second.bytes) return CUDA_ERROR_INVALID_VALUE;
      ++it->second.refs;
      *pdptr = static_cast<CUdeviceptr>(it->second.base + blob.offset);
      return CUDA_SUCCESS;
    }
  }
  std::vector<UniqueFd> fds;
  auto rep = s->client.ipc_open(blob.token, blob.secret, fds);
  if (!rep) {
    log(LogLevel::error, "cuIpcOpenMemHandle: cannot reach vlaked (%s)", s->client.last_error().c_str());
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  if (rep->status != proto::Status::ok) {
    log(LogLevel::warn, "cuIpcOpenMemHandle: vlaked refused the handle (status %d)", static_cast<int>(rep->status));
    return ipc::refusal_of(rep->status);
  }
  ipc::Import imp;
  imp.token = blob.token;
  imp.import_id = rep->import_id;
  imp.refs = 1;
  CUresult rc = blob.offset < rep->bytes ? ipc::map_import(*s, *rep, fds, imp) : CUDA_ERROR_INVALID_VALUE;
  if (rc != CUDA_SUCCESS) {
    (void)s->client.ipc_close(rep->import_id);
    return rc;
  }
  *pdptr = static_cast<CUdeviceptr>(imp.base + blob.offset);
  std::lock_guard lock(g_mu);
  g_by_base[imp.base] = imp.token;
  g_imports.emplace(imp.token, std::move(imp));
  ipc::g_import_count.store(g_imports.size(), std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult on_cuIpcCloseMemHandle(bool ptds, CUdeviceptr dptr) {
  State* s = state();
  if (s == nullptr || s->passthrough) return pass<Row::cuIpcCloseMemHandle>(ptds, dptr);
  std::lock_guard open(g_open_mu);
  ipc::Import gone;
  {
    std::lock_guard lock(g_mu);
    auto it = g_imports.empty() ? g_imports.end() : ipc::import_at(ipc::addr(dptr));
    if (it == g_imports.end()) return pass<Row::cuIpcCloseMemHandle>(ptds, dptr);
    if (--it->second.refs > 0) return CUDA_SUCCESS;
    gone = std::move(it->second);
    g_by_base.erase(gone.base);
    g_imports.erase(it);
    ipc::g_import_count.store(g_imports.size(), std::memory_order_release);
  }
  // As cuIpcCloseMemHandle: the memory stays valid until the work using it is done.
  (void)pass<Row::cuCtxSynchronize>(false);
  ipc::undo(gone.base, gone.bytes, gone.bytes, gone.handles);
  auto ack = s->client.ipc_close(gone.import_id);
  if (ack && ack->status != proto::Status::ok) {
    log(LogLevel::debug, "vlaked did not know IPC import %llu (status %d)",
        static_cast<unsigned long long>(gone.import_id), static_cast<int>(ack->status));
  }
  return CUDA_SUCCESS;
}

}  // namespace vlake::hook
