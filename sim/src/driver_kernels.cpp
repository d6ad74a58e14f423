// The simulated driver's modules and kernels: cuModuleLoadData, cuModuleUnload,
// cuModuleGetFunction, cuLaunchKernel, cuLaunchCooperativeKernel, cuLaunchKernelEx,
// cuLaunchHostFunc and their per-thread variants. PTX is not compiled: the simulator runs the
// kernels it knows by entry name on the host, synchronously, with the access checks of a GPU
// (a fault poisons the context: sticky CUDA_ERROR_ILLEGAL_ADDRESS).
#include "vlake/common/chunk_hash.hpp"
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

// =================================================================================================
// Modules and kernels: PTX is not compiled; the simulator runs the kernels it knows by entry
// name on the host, synchronously, with the access checks of a GPU (a fault is sticky).
// =================================================================================================

namespace {

constexpr const char* kKnownKernels[] = {
    // vlake_fill_u32(unsigned* p, unsigned long long n, unsigned v): p[0..n) = v
    "vlake_fill_u32",
    // vlake_hash_u64(const u64* p, u64 n, u64* partials): lane t of the grid's threads folds
    // p[t], p[t + threads], ... into partials[t] (vlake/common/chunk_hash.hpp)
    "vlake_hash_u64",
};

bool known_kernel(const std::string& name) {
  for (const char* k : kKnownKernels) {
    if (name == k) return true;
  }
  return false;
}

// Kernel parameter `i` (cuLaunchKernel's kernelParams: an array of pointers to the values).
template <class T>
T param(void** params, int i) {
  T v{};
  std::memcpy(&v, params[i], sizeof v);
  return v;
}

// Executes `f` with its parameters; a bad access poisons the context (reported by the next
// synchronizing call, as on a GPU) and leaves memory untouched.
void run_kernel(CUctx_st* ctx, const CUfunc_st* f, void** params, std::uint64_t threads) {
  if (f->name == "vlake_hash_u64") {
    const auto p = param<CUdeviceptr>(params, 0);
    const auto n = param<unsigned long long>(params, 1);
    const auto out = param<CUdeviceptr>(params, 2);
    if (threads > SIZE_MAX / 8 || as_addr(out) % 8 != 0 ||
        !accessible(as_addr(out), static_cast<std::size_t>(threads) * 8, ctx->device, true, ctx) ||
        (n != 0 && (n > SIZE_MAX / 8 || as_addr(p) % 8 != 0 ||
                    !accessible(as_addr(p), static_cast<std::size_t>(n) * 8, ctx->device, false, ctx)))) {
      ctx->sticky.store(rules::kIllegalAccess);
      return;
    }
    const auto* words = static_cast<const std::uint64_t*>(as_ptr(as_addr(p)));
    std::vector<std::uint64_t> acc(static_cast<std::size_t>(threads));
    for (std::size_t t = 0; t < acc.size(); ++t) acc[t] = vlake::chunk_hash_seed(t);
    for (std::uint64_t i = 0; i < n; ++i) {
      auto& a = acc[static_cast<std::size_t>(i % threads)];
      a = vlake::chunk_hash_step(a, words[i]);
    }
    std::memcpy(as_ptr(as_addr(out)), acc.data(), acc.size() * 8);
    return;
  }
  if (f->name == "vlake_fill_u32") {
    const auto p = param<CUdeviceptr>(params, 0);
    const auto n = param<unsigned long long>(params, 1);
    const auto v = param<unsigned>(params, 2);
    if (n == 0) return;
    if (n > SIZE_MAX / 4 || as_addr(p) % 4 != 0 ||
        !accessible(as_addr(p), static_cast<std::size_t>(n) * 4, ctx->device, true, ctx)) {
      ctx->sticky.store(rules::kIllegalAccess);
      return;
    }
    auto* words = static_cast<std::uint32_t*>(as_ptr(as_addr(p)));
    std::fill(words, words + n, v);
  }
}

}  // namespace

VLAKE_SIM_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  VLAKE_SIM_COUNT(cuModuleLoadData);
  return in_context([&](CUctx_st*) -> CUresult {
    if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::string_view text(static_cast<const char*>(image));
    auto mod = std::make_unique<CUmod_st>();
    for (std::size_t pos = text.find(".entry"); pos != std::string_view::npos; pos = text.find(".entry", pos + 6)) {
      std::size_t b = pos + 6;
      while (b < text.size() && (text[b] == ' ' || text[b] == '\t')) ++b;
      std::size_t e = b;
      while (e < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[e])) != 0 || text[e] == '_' || text[e] == '$')) {
        ++e;
      }
      if (e > b) mod->entries.emplace_back(text.substr(b, e - b));
    }
    if (mod->entries.empty()) return rules::kBadImage;
    std::unique_lock lock(g_proc->mu);
    g_proc->modules.insert(mod.get());
    *module = mod.release();
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuModuleUnload(CUmodule hmod) {
  VLAKE_SIM_COUNT(cuModuleUnload);
  return initialized([&]() -> CUresult {
    std::unique_lock lock(g_proc->mu);
    if (g_proc->modules.erase(hmod) == 0) return rules::kBadModuleOrFunction;
    delete hmod;
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  VLAKE_SIM_COUNT(cuModuleGetFunction);
  return initialized([&]() -> CUresult {
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_proc->mu);
    if (g_proc->modules.count(hmod) == 0) return rules::kBadModuleOrFunction;
    const std::string wanted(name);
    if (std::find(hmod->entries.begin(), hmod->entries.end(), wanted) == hmod->entries.end() || !known_kernel(wanted)) {
      return rules::kNoSuchFunction;
    }
    for (const auto& f : hmod->functions) {
      if (f->name == wanted) {
        *hfunc = f.get();
        return CUDA_SUCCESS;
      }
    }
    auto f = std::make_unique<CUfunc_st>();
    f->module = hmod;
    f->name = wanted;
    *hfunc = f.get();
    hmod->functions.push_back(std::move(f));
    return CUDA_SUCCESS;
  });
}

namespace {

// A cooperative grid must be co-resident: at most kMultiprocessors x (the blocks of this size
// one multiprocessor holds: kMaxBlocksPerMultiprocessor, kMaxThreadsPerMultiprocessor /
// threads per block) blocks (the device attributes of driver_devices.cpp), else
// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
constexpr std::uint64_t kMultiprocessors = 132;
constexpr std::uint64_t kMaxBlocksPerMultiprocessor = 32;
constexpr std::uint64_t kMaxThreadsPerMultiprocessor = 2048;

struct Launch {
  CUfunction f;
  unsigned grid[3];
  unsigned block[3];
  CUstream stream;
  void** params;
  void** extra;
  bool cooperative;
};

// cuLaunchKernel and its variants: checks the launch, then runs the kernel (synchronously).
CUresult launch(const Launch& l) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  const std::uint64_t blocks = std::uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  const std::uint64_t threads_per_block = std::uint64_t{l.block[0]} * l.block[1] * l.block[2];
  if (blocks == 0 || threads_per_block == 0 || threads_per_block > 1024) return CUDA_ERROR_INVALID_VALUE;
  if (l.params == nullptr || l.extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (l.cooperative && blocks > kMultiprocessors * std::min(kMaxBlocksPerMultiprocessor,
                                                            kMaxThreadsPerMultiprocessor / threads_per_block)) {
    return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  }
  std::shared_lock lock(g_proc->mu);
  if (!valid_stream(l.stream)) return rules::kBadStreamOrEvent;
  bool found = false;
  for (CUmod_st* m : g_proc->modules) {
    for (const auto& fn : m->functions) found = found || fn.get() == l.f;
  }
  if (!found) return rules::kBadModuleOrFunction;
  run_kernel(ctx, l.f, l.params, blocks * threads_per_block);
  return CUDA_SUCCESS;
}

}  // namespace

VLAKE_SIM_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                      unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                      unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                                      void** extra) {
  VLAKE_SIM_COUNT(cuLaunchKernel);
  (void)sharedMemBytes;
  return guarded([&] {
    return launch(
        {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, hStream, kernelParams, extra, false});
  });
}

VLAKE_SIM_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                 unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                                 unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                                 void** kernelParams) {
  VLAKE_SIM_COUNT(cuLaunchCooperativeKernel);
  (void)sharedMemBytes;
  return guarded([&] {
    return launch(
        {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, hStream, kernelParams, nullptr, true});
  });
}

// The launch attributes are accepted and ignored, except CU_LAUNCH_ATTRIBUTE_COOPERATIVE.
VLAKE_SIM_API CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  VLAKE_SIM_COUNT(cuLaunchKernelEx);
  return guarded([&]() -> CUresult {
    if (config == nullptr || (config->numAttrs != 0 && config->attrs == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    bool cooperative = false;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
      const CUlaunchAttribute& a = config->attrs[i];
      if (a.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) cooperative = a.value.cooperative != 0;
    }
    return launch({f,
                   {config->gridDimX, config->gridDimY, config->gridDimZ},
                   {config->blockDimX, config->blockDimY, config->blockDimZ},
                   config->hStream,
                   kernelParams,
                   extra,
                   cooperative});
  });
}

// A host function runs at once on the calling thread (streams are synchronous), outside every
// simulator lock, so it may call the driver.
VLAKE_SIM_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  VLAKE_SIM_COUNT(cuLaunchHostFunc);
  return in_context([&](CUctx_st*) -> CUresult {
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!stream_ok(hStream)) return rules::kBadStreamOrEvent;
    fn(userData);
    return CUDA_SUCCESS;
  });
}

// ---- Per-thread variants (VLAKE_SIM_PER_THREAD_ROWS) ---------------------------------------------

VLAKE_SIM_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                           unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                           void** kernelParams, void** extra) {
  VLAKE_SIM_COUNT(cuLaunchKernel_ptsz);
  return cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                        kernelParams, extra);
}

VLAKE_SIM_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                      unsigned int gridDimZ, unsigned int blockDimX,
                                                      unsigned int blockDimY, unsigned int blockDimZ,
                                                      unsigned int sharedMemBytes, CUstream hStream,
                                                      void** kernelParams) {
  VLAKE_SIM_COUNT(cuLaunchCooperativeKernel_ptsz);
  return cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                                   hStream, kernelParams);
}

VLAKE_SIM_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                             void** extra) {
  VLAKE_SIM_COUNT(cuLaunchKernelEx_ptsz);
  return cuLaunchKernelEx(config, f, kernelParams, extra);
}

VLAKE_SIM_API CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  VLAKE_SIM_COUNT(cuLaunchHostFunc_ptsz);
  return cuLaunchHostFunc(hStream, fn, userData);
}
