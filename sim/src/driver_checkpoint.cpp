// The simulated driver's process checkpoints (node.hpp; docs/simulator.md "Checkpoints"):
// cuCheckpointProcess{GetRestoreThreadId,GetState,Lock,Checkpoint,Restore,Unlock}. The state
// machine lives in the shared node, so any process may drive any other.
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "node.hpp"
#include "process.hpp"
#include "rules.hpp"

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

// =================================================================================================
// =================================================================================================
// Process checkpoints (node.hpp; docs/simulator.md "Checkpoints")
// =================================================================================================

VLAKE_SIM_API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  VLAKE_SIM_COUNT(cuCheckpointProcessGetRestoreThreadId);
  return initialized([&]() -> CUresult {
    if (tid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUprocessState st{};
    if (CUresult rc = g_proc->node->process_state(pid, st); rc != CUDA_SUCCESS) return rc;
    *tid = pid;  // the simulator restores from the calling process: no thread of the target
    return CUDA_SUCCESS;
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  VLAKE_SIM_COUNT(cuCheckpointProcessGetState);
  return initialized([&]() -> CUresult {
    if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return g_proc->node->process_state(pid, *state);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessLock);
  return initialized([&]() -> CUresult {
    (void)args;  // no submitted work to wait for: a timeout never expires
    return g_proc->node->lock_process(pid);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessCheckpoint);
  return initialized([&]() -> CUresult {
    (void)args;
    return g_proc->node->checkpoint_process(pid);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessRestore);
  return initialized([&]() -> CUresult {
    if (args != nullptr && args->gpuPairs != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // no GPU remapping
    return g_proc->node->restore_process(pid);
  });
}

VLAKE_SIM_API CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessUnlock);
  return initialized([&]() -> CUresult {
    (void)args;
    return g_proc->node->unlock_process(pid);
  });
}
