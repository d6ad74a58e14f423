// The swap gate (contract in swap.hpp; docs/swap.md).
#include "swap.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "hook.hpp"
#include "log.hpp"

namespace vlake::hook {
namespace {

std::mutex g_mu;
std::condition_variable g_cv;
bool g_asking = false;             // guarded by g_mu: a thread waits for vlaked's answer
CUresult g_answer = CUDA_SUCCESS;  // guarded by g_mu: the last answer's result
std::atomic<std::uint64_t> g_swap_ins{0};

}  // namespace

void close_swap_gate() noexcept { g_swap_gate_closed.store(true, std::memory_order_release); }

void open_swap_gate() noexcept {
  {
    std::lock_guard lock(g_mu);
    g_swap_gate_closed.store(false, std::memory_order_release);
  }
  g_cv.notify_all();
}

std::uint64_t swap_ins() noexcept { return g_swap_ins.load(std::memory_order_relaxed); }

namespace {
CUresult ask(bool worker) noexcept;
}  // namespace

CUresult wait_at_swap_gate() noexcept {
  if (t_gate_exempt) return CUDA_SUCCESS;
  return ask(false);
}

CUresult ask_swap_in() noexcept { return ask(true); }

namespace {

CUresult ask(bool worker) noexcept {
  try {
    std::unique_lock lock(g_mu);
    if (worker && g_asking) return CUDA_SUCCESS;  // an application thread asks already
    while (g_asking) {
      g_cv.wait(lock);
      if (!g_asking && g_swap_gate_closed.load(std::memory_order_acquire) && g_answer != CUDA_SUCCESS) return g_answer;
    }
    if (!g_swap_gate_closed.load(std::memory_order_acquire)) return CUDA_SUCCESS;
    g_asking = true;
    lock.unlock();
    State* s = active_state();
    std::optional<proto::SwapInReply> r;
    if (s != nullptr) r = s->client.swap_in();
    CUresult rc = CUDA_SUCCESS;
    bool open = true;
    if (!r) {
      // vlaked cannot be reached: if the checkpoint ran, nobody can restore the process; if not,
      // it is on the GPU. Either way the call goes on (and blocks in a locked driver).
      log(LogLevel::error, "vlaked was asked to bring this process back to the GPU but cannot be reached (%s)",
          s != nullptr ? s->client.last_error().c_str() : "no session");
    } else if (r->status == proto::Status::ok) {
      g_swap_ins.fetch_add(1, std::memory_order_relaxed);
      log(LogLevel::info, "back on the GPU after %llu ms on the host%s", static_cast<unsigned long long>(r->waited_ms),
          worker ? " (asked because its threads started using the CPU)" : "");
    } else if (r->status == proto::Status::out_of_memory) {
      open = false;
      rc = CUDA_ERROR_OUT_OF_MEMORY;
      log(LogLevel::warn,
          "this idle process was moved to host memory to make room for others, and the GPU had no room to bring it "
          "back within %llu ms; this call fails with CUDA_ERROR_OUT_OF_MEMORY and the next one asks again",
          static_cast<unsigned long long>(r->waited_ms));
    } else {
      open = false;
      rc = CUDA_ERROR_OPERATING_SYSTEM;
      log(LogLevel::error,
          "this process was moved to host memory and the driver could not bring it back (see vlaked's log); "
          "its GPU work cannot go on");
    }
    lock.lock();
    g_asking = false;
    g_answer = rc;
    if (open) g_swap_gate_closed.store(false, std::memory_order_release);
    lock.unlock();
    g_cv.notify_all();
    return rc;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace

CUresult on_cuLaunchKernel(bool ptds, CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                           unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                           unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  return pass<Row::cuLaunchKernel>(ptds, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                   sharedMemBytes, hStream, kernelParams, extra);
}

CUresult on_cuLaunchCooperativeKernel(bool ptds, CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                      unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                      unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                      void** kernelParams) {
  return pass<Row::cuLaunchCooperativeKernel>(ptds, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                              sharedMemBytes, hStream, kernelParams);
}

CUresult on_cuLaunchHostFunc(bool ptds, CUstream hStream, CUhostFn fn, void* userData) {
  return pass<Row::cuLaunchHostFunc>(ptds, hStream, fn, userData);
}

CUresult on_cuLaunchKernelEx(bool ptds, const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  return pass<Row::cuLaunchKernelEx>(ptds, config, f, kernelParams, extra);
}

}  // namespace vlake::hook
