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

// cuCheckpointProcess<step>: the node's <method>(pid). Its args carry nothing the simulator uses
// (no submitted work to wait for: a lock's timeout never expires).
#define VLAKE_SIM_CHECKPOINT_STEP(step, method)                                               \
  VLAKE_SIM_API CUresult cuCheckpointProcess##step(int pid, CUcheckpoint##step##Args* args) { \
    VLAKE_SIM_COUNT(cuCheckpointProcess##step);                                               \
    (void)args;                                                                               \
    return initialized([&] { return g_proc->node->method(pid); });                            \
  }

VLAKE_SIM_CHECKPOINT_STEP(Lock, lock_process)
VLAKE_SIM_CHECKPOINT_STEP(Checkpoint, checkpoint_process)
VLAKE_SIM_CHECKPOINT_STEP(Unlock, unlock_process)
#undef VLAKE_SIM_CHECKPOINT_STEP

VLAKE_SIM_API CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  VLAKE_SIM_COUNT(cuCheckpointProcessRestore);
  return initialized([&]() -> CUresult {
    if (args != nullptr && args->gpuPairs != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // no GPU remapping
    return g_proc->node->restore_process(pid);
  });
}
