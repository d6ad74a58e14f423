// The simulated driver's pitched copies and memsets: cuMemcpy2D_v2, cuMemcpy2DUnaligned_v2,
// cuMemcpy2DAsync_v2, cuMemcpy3D_v2, cuMemcpy3DAsync_v2, cuMemsetD2D{8,16,32}_v2,
// cuMemsetD2D{8,16,32}Async and their per-thread variants. They run on copy_rows / memset_rows
// (driver_copy.cpp): every row is checked before any byte moves.
//
// Rules (docs/simulator.md, "Copies and memsets")
// - A side's memory type is CU_MEMORYTYPE_HOST (srcHost/dstHost), _DEVICE or _UNIFIED
//   (srcDevice/dstDevice; unified is device memory when inside a mapping, host otherwise).
//   The simulator has no CUDA arrays: CU_MEMORYTYPE_ARRAY, like any other type, is
//   CUDA_ERROR_INVALID_VALUE.
// - Several rows need XInBytes + WidthInBytes <= pitch on both sides; several slices need
//   Y + Height <= the side's slice height (srcHeight/dstHeight); LODs must be 0
//   (CUDA_ERROR_INVALID_VALUE otherwise). An empty copy (a zero extent) succeeds.
// - cuMemcpy2D_v2 and cuMemcpy2DUnaligned_v2 behave the same (no pitch alignment is required).
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "process.hpp"

#include <cstdint>

using namespace vlake::sim::internal;

namespace {

// The geometry of one side of a 2D/3D copy.
struct Geometry {
  CUmemorytype type;
  const void* host;
  CUdeviceptr device;
  std::size_t x, y, z, lod;
  std::size_t pitch;
  std::size_t height;  // rows per slice (3D)
};

CUresult side_of(const Geometry& g, std::size_t width, std::size_t height, std::size_t depth, CopySide& out) {
  if (g.type != CU_MEMORYTYPE_HOST && g.type != CU_MEMORYTYPE_DEVICE && g.type != CU_MEMORYTYPE_UNIFIED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (g.lod != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((height > 1 || depth > 1) && (g.x > g.pitch || width > g.pitch - g.x)) return CUDA_ERROR_INVALID_VALUE;
  if (depth > 1 && (g.y > g.height || height > g.height - g.y)) return CUDA_ERROR_INVALID_VALUE;
  const std::uintptr_t base =
      g.type == CU_MEMORYTYPE_HOST ? reinterpret_cast<std::uintptr_t>(g.host) : as_addr(g.device);
  out = CopySide{g.type, base + g.x + g.y * g.pitch + g.z * g.height * g.pitch, g.pitch, g.height * g.pitch};
  return CUDA_SUCCESS;
}

CUresult copy_3d(const CUDA_MEMCPY3D* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CopySide src{};
  CopySide dst{};
  const Geometry s{p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY,
                   p->srcZ,          p->srcLOD,  p->srcPitch,  p->srcHeight};
  const Geometry d{p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY,
                   p->dstZ,          p->dstLOD,  p->dstPitch,  p->dstHeight};
  if (CUresult rc = side_of(s, p->WidthInBytes, p->Height, p->Depth, src); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = side_of(d, p->WidthInBytes, p->Height, p->Depth, dst); rc != CUDA_SUCCESS) return rc;
  return copy_rows(dst, src, p->WidthInBytes, p->Height, p->Depth);
}

// A 2D copy is a 3D copy of one slice.
CUresult copy_2d(const CUDA_MEMCPY2D* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D c{};
  c.srcXInBytes = p->srcXInBytes;
  c.srcY = p->srcY;
  c.srcMemoryType = p->srcMemoryType;
  c.srcHost = p->srcHost;
  c.srcDevice = p->srcDevice;
  c.srcArray = p->srcArray;
  c.srcPitch = p->srcPitch;
  c.dstXInBytes = p->dstXInBytes;
  c.dstY = p->dstY;
  c.dstMemoryType = p->dstMemoryType;
  c.dstHost = p->dstHost;
  c.dstDevice = p->dstDevice;
  c.dstArray = p->dstArray;
  c.dstPitch = p->dstPitch;
  c.WidthInBytes = p->WidthInBytes;
  c.Height = p->Height;
  c.Depth = 1;
  return copy_3d(&c);
}

}  // namespace

// A synchronous copy entry point `name` (params -> copy(params), guarded) and its per-thread
// default-stream variant name_ptds, which forwards to it.
#define VLAKE_SIM_COPY_SYNC(name, Params, copy)             \
  VLAKE_SIM_API CUresult name(const Params* pCopy) {        \
    VLAKE_SIM_COUNT(name);                                  \
    return guarded([&] { return copy(pCopy); });            \
  }                                                         \
  VLAKE_SIM_API CUresult name##_ptds(const Params* pCopy) { \
    VLAKE_SIM_COUNT(name##_ptds);                           \
    return name(pCopy);                                     \
  }

// An asynchronous copy entry point `name` (copy(params) after on_stream's stream check) and its
// per-thread variant name_ptsz, which forwards to it.
#define VLAKE_SIM_COPY_ASYNC(name, Params, copy)                              \
  VLAKE_SIM_API CUresult name(const Params* pCopy, CUstream hStream) {        \
    VLAKE_SIM_COUNT(name);                                                    \
    return on_stream(hStream, [&] { return copy(pCopy); });                   \
  }                                                                           \
  VLAKE_SIM_API CUresult name##_ptsz(const Params* pCopy, CUstream hStream) { \
    VLAKE_SIM_COUNT(name##_ptsz);                                             \
    return name(pCopy, hStream);                                              \
  }

VLAKE_SIM_COPY_SYNC(cuMemcpy2D_v2, CUDA_MEMCPY2D, copy_2d)
VLAKE_SIM_COPY_SYNC(cuMemcpy2DUnaligned_v2, CUDA_MEMCPY2D, copy_2d)
VLAKE_SIM_COPY_ASYNC(cuMemcpy2DAsync_v2, CUDA_MEMCPY2D, copy_2d)
VLAKE_SIM_COPY_SYNC(cuMemcpy3D_v2, CUDA_MEMCPY3D, copy_3d)
VLAKE_SIM_COPY_ASYNC(cuMemcpy3DAsync_v2, CUDA_MEMCPY3D, copy_3d)
#undef VLAKE_SIM_COPY_SYNC
#undef VLAKE_SIM_COPY_ASYNC

// cuMemsetD2D<bits>_v2, cuMemsetD2D<bits>Async and their per-thread variants: Height rows,
// dstPitch bytes apart, of Width elements of `elem` bytes (type T) set to `value`.
#define VLAKE_SIM_MEMSET_2D(bits, T, elem)                                                                            \
  VLAKE_SIM_API CUresult cuMemsetD2D##bits##_v2(CUdeviceptr dstDevice, size_t dstPitch, T value, size_t Width,        \
                                                size_t Height) {                                                      \
    VLAKE_SIM_COUNT(cuMemsetD2D##bits##_v2);                                                                          \
    return guarded([&] { return memset_rows(as_addr(dstDevice), dstPitch, elem, value, Width, Height); });            \
  }                                                                                                                   \
  VLAKE_SIM_API CUresult cuMemsetD2D##bits##Async(CUdeviceptr dstDevice, size_t dstPitch, T value, size_t Width,      \
                                                  size_t Height, CUstream hStream) {                                  \
    VLAKE_SIM_COUNT(cuMemsetD2D##bits##Async);                                                                        \
    return on_stream(hStream, [&] { return memset_rows(as_addr(dstDevice), dstPitch, elem, value, Width, Height); }); \
  }                                                                                                                   \
  VLAKE_SIM_API CUresult cuMemsetD2D##bits##_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, T value, size_t Width,   \
                                                     size_t Height) {                                                 \
    VLAKE_SIM_COUNT(cuMemsetD2D##bits##_v2_ptds);                                                                     \
    return cuMemsetD2D##bits##_v2(dstDevice, dstPitch, value, Width, Height);                                         \
  }                                                                                                                   \
  VLAKE_SIM_API CUresult cuMemsetD2D##bits##Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, T value, size_t Width, \
                                                       size_t Height, CUstream hStream) {                             \
    VLAKE_SIM_COUNT(cuMemsetD2D##bits##Async_ptsz);                                                                   \
    return cuMemsetD2D##bits##Async(dstDevice, dstPitch, value, Width, Height, hStream);                              \
  }

VLAKE_SIM_MEMSET_2D(8, unsigned char, 1)
VLAKE_SIM_MEMSET_2D(16, unsigned short, 2)
VLAKE_SIM_MEMSET_2D(32, unsigned int, 4)
#undef VLAKE_SIM_MEMSET_2D
