// CUDA contexts admitted by vlaked before the driver creates them (contexts.hpp).
#include "contexts.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <mutex>

#include "alloc/internal.hpp"
#include "hook.hpp"
#include "pass.hpp"

namespace vlake::hook {

namespace contexts {
namespace {

std::mutex g_mu;
// Per device: this process holds an admission for its primary context (guarded by g_mu).
std::array<bool, proto::kMaxDevices> g_primary{};
// Created and green contexts this process holds an admission for: handle -> device (g_mu).
std::map<const void*, CUdevice> g_created;

bool in_range(CUdevice dev) { return dev >= 0 && static_cast<std::uint32_t>(dev) < proto::kMaxDevices; }

// Whether the driver says the device's primary context is active (false when it cannot say).
bool driver_active(CUdevice dev) {
  const UsedApi& api = used();
  if (api.cuDevicePrimaryCtxGetState == nullptr) return false;
  unsigned int flags = 0;
  int active = 0;
  return api.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active != 0;
}

// Asks vlaked to admit a context on `dev`: CUDA_SUCCESS (admitted: `admitted` true; or nothing
// to ask) or CUDA_ERROR_OUT_OF_MEMORY (refused, logged).
CUresult admit(State& s, CUdevice dev, bool& admitted) {
  admitted = false;
  Uuid uuid;
  if (device_uuid(s, dev, uuid) != CUDA_SUCCESS) return CUDA_SUCCESS;  // the driver answers for a bad device
  const std::optional<proto::ContextReply> rep = s.client.context(uuid, proto::ContextOp::admit);
  if (!rep) {
    if (!s.client.refused()) return CUDA_SUCCESS;  // unreachable: NVML still sees the context
    std::uint64_t suppressed = 0;
    if (s.refusals.allow(suppressed)) {
      log(LogLevel::error, "%s; a CUDA context on GPU %d refused%s", s.client.last_error().c_str(),
          static_cast<int>(dev), suppressed_note(suppressed).c_str());
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (rep->status == proto::Status::ok) {
    admitted = true;
    return CUDA_SUCCESS;
  }
  if (rep->status == proto::Status::unknown_device) return CUDA_SUCCESS;  // a GPU vlaked does not manage
  GrantResult g;
  g.status = rep->status;
  g.limit = rep->limit;
  g.used = rep->used;
  report_refusal(s, g, static_cast<int>(dev), rep->bytes, "a CUDA context of");
  return CUDA_ERROR_OUT_OF_MEMORY;
}

void give_back(State& s, CUdevice dev) {
  Uuid uuid;
  if (device_uuid(s, dev, uuid) != CUDA_SUCCESS) return;
  (void)s.client.context(uuid, proto::ContextOp::release);  // unknown to a restarted vlaked: fine
}

// Every context creation (caller holds g_mu): vlaked admits a context on `dev`, then `create`
// runs the driver's call; on its success `created()` records the admission, on its failure the
// admission is given back. A refusal returns CUDA_ERROR_OUT_OF_MEMORY without the driver's call.
template <class Create, class Created>
CUresult admitted_create(State& s, CUdevice dev, Create&& create, Created&& created) {
  bool admitted = false;
  if (const CUresult rc = admit(s, dev, admitted); rc != CUDA_SUCCESS) return rc;
  const CUresult rc = create();
  if (admitted) {
    if (rc == CUDA_SUCCESS) {
      created();
    } else {
      give_back(s, dev);
    }
  }
  return rc;
}

// After a release or reset: the primary context's admission goes when the driver says it is gone.
CUresult after_release(State& s, CUdevice dev, CUresult rc, bool reset) {
  if (rc != CUDA_SUCCESS || !g_primary[static_cast<std::size_t>(dev)]) return rc;
  if (driver_active(dev)) return rc;
  // Without cuDevicePrimaryCtxGetState only a reset is known to destroy it.
  if (used().cuDevicePrimaryCtxGetState == nullptr && !reset) return rc;
  g_primary[static_cast<std::size_t>(dev)] = false;
  give_back(s, dev);
  return rc;
}

}  // namespace

void lock_all() noexcept { g_mu.lock(); }
void unlock_all() noexcept { g_mu.unlock(); }
void clear_after_fork() noexcept {
  g_primary.fill(false);
  g_created.clear();
  g_mu.unlock();
}

namespace {

// A created or green context: admitted before `create` runs the driver's call, remembered by the
// handle it wrote, given back if the driver failed.
template <class Handle, class Create>
CUresult create(Handle* out, CUdevice dev, Create&& create) {
  State* s = active_state();
  if (s == nullptr || out == nullptr || !in_range(dev)) return create();
  std::lock_guard lock(g_mu);
  return admitted_create(*s, dev, create, [&] { g_created[static_cast<const void*>(*out)] = dev; });
}

// A created or green context's destruction: its admission goes once the driver destroyed it.
template <class Destroy>
CUresult destroy(const void* handle, Destroy&& destroy) {
  State* s = active_state();
  if (s == nullptr) return destroy();
  std::lock_guard lock(g_mu);
  const CUresult rc = destroy();
  if (rc != CUDA_SUCCESS) return rc;
  if (const auto it = g_created.find(handle); it != g_created.end()) {
    const CUdevice dev = it->second;
    g_created.erase(it);
    give_back(*s, dev);
  }
  return rc;
}

}  // namespace

}  // namespace contexts

CUresult on_cuCtxCreate_v2(bool ptds, CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return contexts::create(pctx, dev, [&] { return pass<Row::cuCtxCreate_v2>(ptds, pctx, flags, dev); });
}

CUresult on_cuCtxCreate_v3(bool ptds, CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                           unsigned int flags, CUdevice dev) {
  return contexts::create(pctx, dev,
                          [&] { return pass<Row::cuCtxCreate_v3>(ptds, pctx, paramsArray, numParams, flags, dev); });
}

CUresult on_cuCtxCreate_v4(bool ptds, CUcontext* pctx, CUctxCreateParams* ctxCreateParams, unsigned int flags,
                           CUdevice dev) {
  return contexts::create(pctx, dev,
                          [&] { return pass<Row::cuCtxCreate_v4>(ptds, pctx, ctxCreateParams, flags, dev); });
}

CUresult on_cuCtxDestroy_v2(bool ptds, CUcontext ctx) {
  return contexts::destroy(ctx, [&] { return pass<Row::cuCtxDestroy_v2>(ptds, ctx); });
}

CUresult on_cuGreenCtxCreate(bool ptds, CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  return contexts::create(phCtx, dev, [&] { return pass<Row::cuGreenCtxCreate>(ptds, phCtx, desc, dev, flags); });
}

CUresult on_cuGreenCtxDestroy(bool ptds, CUgreenCtx hCtx) {
  return contexts::destroy(hCtx, [&] { return pass<Row::cuGreenCtxDestroy>(ptds, hCtx); });
}

CUresult on_cuDevicePrimaryCtxRetain(bool ptds, CUcontext* pctx, CUdevice dev) {
  State* s = active_state();
  if (s == nullptr || !contexts::in_range(dev)) return pass<Row::cuDevicePrimaryCtxRetain>(ptds, pctx, dev);
  std::lock_guard lock(contexts::g_mu);
  if (contexts::g_primary[static_cast<std::size_t>(dev)] || contexts::driver_active(dev)) {
    return pass<Row::cuDevicePrimaryCtxRetain>(ptds, pctx, dev);  // it exists: no new memory
  }
  return contexts::admitted_create(
      *s, dev, [&] { return pass<Row::cuDevicePrimaryCtxRetain>(ptds, pctx, dev); },
      [&] { contexts::g_primary[static_cast<std::size_t>(dev)] = true; });
}

CUresult on_cuDevicePrimaryCtxRelease_v2(bool ptds, CUdevice dev) {
  State* s = active_state();
  if (s == nullptr || !contexts::in_range(dev)) return pass<Row::cuDevicePrimaryCtxRelease_v2>(ptds, dev);
  std::lock_guard lock(contexts::g_mu);
  return contexts::after_release(*s, dev, pass<Row::cuDevicePrimaryCtxRelease_v2>(ptds, dev), false);
}

CUresult on_cuDevicePrimaryCtxReset_v2(bool ptds, CUdevice dev) {
  State* s = active_state();
  if (s == nullptr || !contexts::in_range(dev)) return pass<Row::cuDevicePrimaryCtxReset_v2>(ptds, dev);
  std::lock_guard lock(contexts::g_mu);
  return contexts::after_release(*s, dev, pass<Row::cuDevicePrimaryCtxReset_v2>(ptds, dev), true);
}

}  // namespace vlake::hook
