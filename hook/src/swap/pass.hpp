// pass(): how the hook calls the real driver (interposer/real.hpp) for an application: the call
// marks the process active (vlakectl's IDLE column) and waits at the swap gate while the process
// is moved to host memory (swap.hpp, docs/swap.md).
//
// Contract: CUDA_ERROR_NOT_INITIALIZED when the driver has none; wait_at_swap_gate()'s CUresult
// when the process cannot be brought back. Thread-safe; while the gate is open the cost is one
// relaxed load (and a store only when the activity flag was clear).
#pragma once

#include "real.hpp"
#include "swap.hpp"

namespace vlake::hook {

template <Row R, class... A>
CUresult pass(bool ptds, A... args) {
  if (!g_cuda_active.load(std::memory_order_relaxed)) g_cuda_active.store(true, std::memory_order_relaxed);
  if (g_swap_gate_closed.load(std::memory_order_relaxed)) [[unlikely]] {
    if (const CUresult rc = wait_at_swap_gate(); rc != CUDA_SUCCESS) return rc;
  }
  return call_real<R>(ptds, args...);
}

}  // namespace vlake::hook
