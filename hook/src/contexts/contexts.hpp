// CUDA contexts (docs/hook.md, "Contexts"): a context takes device memory (about 518 MiB on an
// H100) the moment the driver creates it, before any allocation, so the hook asks vlaked to
// admit it first (ContextRequest, protocol.hpp).
//
// Contract
// - cuDevicePrimaryCtxRetain of a device whose primary context is not active (the driver's
//   cuDevicePrimaryCtxGetState, and this process's own record) first asks vlaked to admit a
//   context there. Refused (the tenant or its namespace at its limit): the call returns
//   CUDA_ERROR_OUT_OF_MEMORY without reaching the driver, and the hook prints the usual
//   out-of-memory line ("...; a CUDA context of 512 MiB refused"). Admitted: the driver creates
//   it; a driver failure gives the admission back.
// - cuDevicePrimaryCtxRelease_v2 / cuDevicePrimaryCtxReset_v2 that leave the primary context
//   inactive give its admission back. The process's exit ends its session, and with it every
//   admission (vlaked).
// - cuCtxCreate_v2/_v3/_v4 and cuGreenCtxCreate ask the same before the driver creates the
//   context (each new context takes its own memory); refused: CUDA_ERROR_OUT_OF_MEMORY and the
//   same line. cuCtxDestroy_v2 / cuGreenCtxDestroy of such a context give its admission back
//   once the driver destroyed it.
// - vlaked unreachable (or answering an Error): the context is created; vlaked's NVML sampling
//   still sees its memory. A daemon that refuses this process for a limit (Hello refused):
//   CUDA_ERROR_OUT_OF_MEMORY.
// - Thread-safety: creations and destructions are serialized by one process-local mutex (a cold
//   path: one round trip per context). Fork: lock_all()/unlock_all() hold it across fork();
//   clear_after_fork() forgets the parent's admissions in the child (its contexts are unusable
//   there, and its session is not the child's).
#pragma once

namespace vlake::hook::contexts {

void lock_all() noexcept;
void unlock_all() noexcept;
void clear_after_fork() noexcept;

}  // namespace vlake::hook::contexts
