// The simulator's answers for rejected operations: every code the sim returns for a rule the
// real driver enforces lives here, so a measurement on real hardware is applied in one edit.
// Codes marked "measured" were observed on an H100 (driver 580, CUDA 13.0; the project's
// measurements, mirrored in common/include/vlake/common/driver.hpp and checked by the
// conformance suite in tests/driver/); the others are documented or best-guess codes.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace vlake::sim::rules {

// ---- Facts of the simulated device --------------------------------------------------------
inline constexpr int kDriverVersion = 13000;                       // cuDriverGetVersion
inline constexpr std::size_t kGranularity = 2u << 20;              // 2 MiB, MINIMUM and RECOMMENDED (measured)
inline constexpr int kMaxDevices = 16;                             // VLAKE_SIM_DEVICE_COUNT upper bound
inline constexpr const char* kDeviceName = "vlake simulated GPU";  // also nvmlDeviceGetName
// nvmlSystemGetDriverVersion: the driver the measurements were taken with.
inline constexpr const char* kNvmlDriverVersion = "580.159.04";

// ---- cuMemMap -----------------------------------------------------------------------------
// cuMemMap with offset != 0 (measured).
inline constexpr CUresult kMapNonZeroOffset = CUDA_ERROR_NOT_SUPPORTED;
// Partial map: size != the handle's full size, smaller or larger (measured).
inline constexpr CUresult kPartialMap = CUDA_ERROR_NOT_SUPPORTED;
// Map over an existing mapping, any overlap (measured).
inline constexpr CUresult kMapOverExisting = CUDA_ERROR_INVALID_VALUE;
// Map target not inside one live reservation, or not 2 MiB aligned (measured).
inline constexpr CUresult kMapOutsideReservation = CUDA_ERROR_INVALID_VALUE;

// ---- cuMemUnmap / cuMemSetAccess ----------------------------------------------------------
// Partial unmap: the range starts or ends inside a mapping (measured). Unmapped VA inside the
// range is fine, and so is a range with no mapping at all (measured): every mapping wholly
// inside the range is unmapped.
inline constexpr CUresult kPartialUnmap = CUDA_ERROR_INVALID_VALUE;
// Unmap of a range not inside one reservation (or covering cuMemAlloc memory).
inline constexpr CUresult kUnmapNotMapped = CUDA_ERROR_INVALID_VALUE;
// Partial set-access: the range starts or ends inside a mapping, or has an unmapped hole,
// e.g. runs past the last mapping (measured).
inline constexpr CUresult kPartialSetAccess = CUDA_ERROR_INVALID_VALUE;
// Set-access on a range whose start is not mapped at all.
inline constexpr CUresult kSetAccessNotMapped = CUDA_ERROR_INVALID_VALUE;

// ---- Handles ------------------------------------------------------------------------------
// cuMemRelease / cuMemMap / export / properties of a handle this process does not hold.
inline constexpr CUresult kUnknownHandle = CUDA_ERROR_INVALID_VALUE;
// cuMemExportToShareableHandle of a handle created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
inline constexpr CUresult kExportWithoutPosixFd = CUDA_ERROR_INVALID_VALUE;
// Export / import / create asking for a handle type other than NONE / POSIX fd (fabric, win32).
inline constexpr CUresult kUnsupportedHandleType = CUDA_ERROR_NOT_SUPPORTED;
// cuMemImportFromShareableHandle of a closed descriptor (measured), or of an fd that is not an
// exported allocation (assumed the same).
inline constexpr CUresult kImportNotAnAllocation = CUDA_ERROR_UNKNOWN;
// cuMemRetainAllocationHandle of an address not mapped by cuMemMap (incl. cuMemAlloc memory).
inline constexpr CUresult kRetainNotMapped = CUDA_ERROR_INVALID_VALUE;
// cuMemCreate / granularity / set-access with a device location that is not a valid ordinal.
inline constexpr CUresult kInvalidLocation = CUDA_ERROR_INVALID_DEVICE;
// cuMemCreate / granularity with a location type other than DEVICE and HOST_NUMA (HOST,
// HOST_NUMA_CURRENT) or an allocation type other than PINNED: not simulated.
inline constexpr CUresult kUnsupportedLocation = CUDA_ERROR_NOT_SUPPORTED;
// cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA and an id other than 0 (measured on an H200 with
// one NUMA node, driver 580; the granularity query accepts any id: 2 MiB).
inline constexpr CUresult kInvalidHostLocation = CUDA_ERROR_INVALID_VALUE;
// cuMemCreate / granularity / import of host-located memory on a driver without it
// (VLAKE_SIM_HOST_VMM=0; the documented code for an unsupported allocation property).
inline constexpr CUresult kHostVmmUnsupported = CUDA_ERROR_NOT_SUPPORTED;

// ---- Address reservations -----------------------------------------------------------------
// cuMemAddressFree of a range that still has mappings.
inline constexpr CUresult kAddressFreeWithMappings = CUDA_ERROR_INVALID_VALUE;
// cuMemAddressFree of a range that is not exactly one reservation.
inline constexpr CUresult kAddressFreeUnknown = CUDA_ERROR_INVALID_VALUE;

// ---- Accesses -----------------------------------------------------------------------------
// The copy engines (cuMemcpy*, cuMemset*) on memory that is not mapped with the needed access
// (unmapped, reserved only, no access, read-only for a write, after unmap, past the end of a
// cuMemAlloc allocation): refused with this code (measured) ...
inline constexpr CUresult kCopyBadAccess = CUDA_ERROR_INVALID_VALUE;
// ... and the context stays usable (measured: false). Set to true to make such a copy poison
// the context like a kernel fault.
inline constexpr bool kCopyBadAccessIsSticky = false;
// A kernel (cuLaunchKernel) touching such memory: the launch succeeds (asynchronous), and the
// context's error becomes this code, sticky: cuCtxSynchronize and every later
// context-requiring call of the process return it (measured); VMM calls keep working.
inline constexpr CUresult kIllegalAccess = CUDA_ERROR_ILLEGAL_ADDRESS;

// ---- Modules and kernels ------------------------------------------------------------------
// cuModuleLoadData of an image that is not PTX text with at least one .entry.
inline constexpr CUresult kBadImage = CUDA_ERROR_INVALID_IMAGE;
// cuModuleGetFunction of a name the module lacks or the simulator cannot execute.
inline constexpr CUresult kNoSuchFunction = CUDA_ERROR_NOT_FOUND;
// A module or function handle that was not created (or was unloaded).
inline constexpr CUresult kBadModuleOrFunction = CUDA_ERROR_INVALID_HANDLE;

// ---- Classic allocations and pointer queries ----------------------------------------------
// cuMemFree_v2 of an address that is not the start of a cuMemAlloc allocation.
inline constexpr CUresult kFreeUnknown = CUDA_ERROR_INVALID_VALUE;
// cuMemGetAddressRange_v2 of an address the driver does not know.
inline constexpr CUresult kAddressRangeUnknown = CUDA_ERROR_NOT_FOUND;
// cuPointerGetAttribute of an address the driver does not know.
inline constexpr CUresult kPointerUnknown = CUDA_ERROR_INVALID_VALUE;

// ---- Pitched, managed and stream-ordered allocation (measured on the H100) -----------------
// cuMemAllocPitch_v2: the pitch is the width rounded up to this many bytes for every accepted
// element size (4, 8, 16; measured for widths 1..65536), and the allocation is pitch * height.
inline constexpr std::size_t kPitchAlignment = 512;
// cuMemAllocPitch_v2 with an element size other than 4, 8 or 16 (1, 2, 3, 32 measured), a zero
// width or height, or a null pitch pointer.
inline constexpr CUresult kBadPitchRequest = CUDA_ERROR_INVALID_VALUE;
// A pitch above CU_DEVICE_ATTRIBUTE_MAX_PITCH (guess: not measured).
inline constexpr CUresult kPitchTooWide = CUDA_ERROR_INVALID_VALUE;
inline constexpr std::size_t kMaxPitch = 2147483647;
// cuMemAllocManaged with flags other than CU_MEM_ATTACH_GLOBAL / CU_MEM_ATTACH_HOST (0 measured)
// or a zero size (measured).
inline constexpr CUresult kBadManagedRequest = CUDA_ERROR_INVALID_VALUE;
// cuMemFreeAsync of an address that is not the start of a live allocation (measured); a null
// address succeeds (measured), and so does cuMemAlloc memory (measured: freed).
inline constexpr CUresult kFreeAsyncUnknown = CUDA_ERROR_INVALID_VALUE;

// ---- Legacy CUDA IPC (cuIpc*Mem*, docs/simulator.md) ----------------------------------------
// cuIpcGetMemHandle of VMM memory (cuMemCreate + cuMemMap): the driver refuses it (measured:
// IS_LEGACY_CUDA_IPC_CAPABLE is 0, and the code: docs/driver.md).
inline constexpr CUresult kIpcNotCapable = CUDA_ERROR_INVALID_VALUE;
// cuIpcGetMemHandle of an address the driver does not know (measured: docs/driver.md).
inline constexpr CUresult kIpcUnknownPointer = CUDA_ERROR_INVALID_VALUE;
// cuIpcGetMemHandle of cuMemAlloc memory: the simulator does not carry classic memory across
// processes (a simulator limit; the real driver answers a handle).
inline constexpr CUresult kIpcClassicUnsupported = CUDA_ERROR_NOT_SUPPORTED;
// cuIpcOpenMemHandle_v2 of a handle the simulator never issued (every handle, see above), and
// cuIpcCloseMemHandle of a pointer no cuIpcOpenMemHandle returned (measured: docs/driver.md).
inline constexpr CUresult kIpcBadHandle = CUDA_ERROR_INVALID_VALUE;

// ---- Contexts, streams, events ------------------------------------------------------------
// A context-requiring call with no current context, or with a released primary context.
inline constexpr CUresult kNoContext = CUDA_ERROR_INVALID_CONTEXT;
// cuDevicePrimaryCtxRelease_v2 of a primary context that is not retained.
inline constexpr CUresult kReleaseUnretained = CUDA_ERROR_INVALID_CONTEXT;
// cuCtxPopCurrent_v2 with an empty context stack.
inline constexpr CUresult kPopEmpty = CUDA_ERROR_INVALID_CONTEXT;
// A stream or event handle that was not created (or was destroyed).
inline constexpr CUresult kBadStreamOrEvent = CUDA_ERROR_INVALID_HANDLE;
// cuEventElapsedTime_v2 with an event never recorded, or created with CU_EVENT_DISABLE_TIMING.
inline constexpr CUresult kElapsedUnrecorded = CUDA_ERROR_INVALID_HANDLE;

// ---- Peer access (driver_peer.cpp) --------------------------------------------------------
// cuCtxEnablePeerAccess with Flags != 0 (cuda.h: "must be 0").
inline constexpr CUresult kPeerBadFlags = CUDA_ERROR_INVALID_VALUE;
// cuCtxEnable/DisablePeerAccess of a peer context that does not exist or is not retained.
inline constexpr CUresult kPeerBadContext = CUDA_ERROR_INVALID_CONTEXT;
// cuCtxEnablePeerAccess of the current context itself (measured on the H100, driver 580:
// CUDA_ERROR_PEER_ACCESS_UNSUPPORTED; tests/gpu/driver_facts.py).
inline constexpr CUresult kPeerSelf = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
// The two devices cannot access each other (VLAKE_SIM_PEER_ACCESS=0), documented code.
inline constexpr CUresult kPeerUnsupported = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
// Enabling twice / disabling what is not enabled (documented codes).
inline constexpr CUresult kPeerAlreadyEnabled = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
inline constexpr CUresult kPeerNotEnabled = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;

// ---- Process rules ------------------------------------------------------------------------
// Any call (except error strings, version, proc address) in a fork()ed child of a process
// that called cuInit, or before cuInit.
inline constexpr CUresult kNotInitialized = CUDA_ERROR_NOT_INITIALIZED;

}  // namespace vlake::sim::rules
