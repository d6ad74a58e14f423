// The simulated driver's linear copies and memsets: cuMemcpy{HtoD,DtoH,DtoD}_v2 and their
// Async variants, cuMemcpy and cuMemcpyAsync (unified addressing: a pointer inside a mapping is
// device memory, any other host memory), cuMemsetD{8,16,32}_v2, cuMemsetD{8,16,32}Async and the
// per-thread variants; copy_rows and memset_rows, which the 2D/3D calls share
// (driver_copy2d.cpp). A copy checks, under the shared lock, that the current context's device
// may write every destination row and read every source row before it moves a byte; a refused
// copy returns rules::kCopyBadAccess (see refused()). A copy or memset touching host-located
// memory on a device side lasts at least its bytes over VLAKE_SIM_LINK_BANDWIDTH (pace_link).
// Streams are synchronous: an Async call checks its stream, then does what its synchronous twin
// does.
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <shared_mutex>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

// Zeroes [dst, dst + n) (accessible, checked by the caller) as a GPU would, fast: whole pages of
// the memfds behind the range are punched out (they read as zero in every process mapping them,
// and take no host memory until written again); only partial pages are written. A scrub of a
// 64 MiB handle then costs microseconds, as on the GPU, not a host memset faulting in 64 MiB.
void zero_fill(std::uintptr_t dst, std::size_t n) {
  constexpr std::uintptr_t kPage = 4096;
  const std::uintptr_t end = dst + n;
  std::uintptr_t cur = dst;
  for (auto it = mapping_at(cur); cur < end && it != g_proc->mappings.end(); ++it) {
    const std::uintptr_t limit = std::min<std::uintptr_t>(end, it->first + it->second.visible);
    const std::uintptr_t first_page = (cur + kPage - 1) & ~(kPage - 1);
    const std::uintptr_t last_page = limit & ~(kPage - 1);
    bool punched = false;
    if (first_page < last_page && it->second.phys != nullptr && it->second.phys->fd >= 0) {
      punched =
          ::fallocate(it->second.phys->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(first_page - it->first), static_cast<off_t>(last_page - first_page)) == 0;
    }
    if (punched) {
      std::memset(as_ptr(cur), 0, first_page - cur);
      std::memset(as_ptr(last_page), 0, limit - last_page);
    } else {
      std::memset(as_ptr(cur), 0, limit - cur);
    }
    cur = limit;
  }
}

template <class T>
void fill_row(std::uintptr_t dst, std::size_t count, unsigned value) {
  auto* p = static_cast<T*>(as_ptr(dst));
  std::fill(p, p + count, static_cast<T>(value));
}

// A device side: CU_MEMORYTYPE_DEVICE, or CU_MEMORYTYPE_UNIFIED inside a mapping. Caller holds mu.
bool on_device(const CopySide& s) {
  return s.type == CU_MEMORYTYPE_DEVICE ||
         (s.type == CU_MEMORYTYPE_UNIFIED && mapping_at(s.base) != g_proc->mappings.end());
}

CUresult copy_checked(std::uintptr_t dst, bool dst_device, std::uintptr_t src, bool src_device, std::size_t n) {
  return copy_rows({dst_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST, dst},
                   {src_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST, src}, n, 1, 1);
}

CUresult copy_unified(CUdeviceptr dst, CUdeviceptr src, std::size_t n) {
  return copy_rows({CU_MEMORYTYPE_UNIFIED, as_addr(dst)}, {CU_MEMORYTYPE_UNIFIED, as_addr(src)}, n, 1, 1);
}

}  // namespace

namespace vlake::sim::internal {

CUresult copy_rows(const CopySide& dst, const CopySide& src, std::size_t width, std::size_t height, std::size_t depth) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  if (width == 0 || height == 0 || depth == 0) return CUDA_SUCCESS;
  std::shared_lock lock(g_proc->mu);
  const bool dst_device = on_device(dst);
  const bool src_device = on_device(src);
  if ((!dst_device && dst.base == 0) || (!src_device && src.base == 0)) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t z = 0; z < depth; ++z) {
    for (std::size_t y = 0; y < height; ++y) {
      if (dst_device && !accessible(dst.row(y, z), width, ctx->device, true)) return refused(ctx);
      if (src_device && !accessible(src.row(y, z), width, ctx->device, false)) return refused(ctx);
    }
  }
  // Host-located memory on either device side: the copy takes the link's time (pace_link).
  const auto start = std::chrono::steady_clock::now();
  auto span = [&](const CopySide& s) { return s.row(height - 1, depth - 1) + width - s.base; };
  const bool link =
      (dst_device && touches_host(dst.base, span(dst))) || (src_device && touches_host(src.base, span(src)));
  for (std::size_t z = 0; z < depth; ++z) {
    for (std::size_t y = 0; y < height; ++y) std::memmove(as_ptr(dst.row(y, z)), as_ptr(src.row(y, z)), width);
  }
  lock.unlock();
  if (link) pace_link(start, width * height * depth);
  return CUDA_SUCCESS;
}

CUresult memset_rows(std::uintptr_t dst, std::size_t pitch, std::size_t elem, unsigned value, std::size_t width,
                     std::size_t height) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  if (dst % elem != 0 || (height > 1 && pitch % elem != 0)) return CUDA_ERROR_INVALID_VALUE;
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (width > SIZE_MAX / elem) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t row_bytes = width * elem;
  if (height > 1 && (row_bytes > pitch || height - 1 > (SIZE_MAX - row_bytes) / pitch)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_lock lock(g_proc->mu);
  for (std::size_t y = 0; y < height; ++y) {
    if (!accessible(dst + y * pitch, row_bytes, ctx->device, true)) return refused(ctx);
  }
  const auto start = std::chrono::steady_clock::now();
  const bool link = touches_host(dst, (height - 1) * pitch + row_bytes);
  const unsigned mask = elem == 1 ? 0xffu : elem == 2 ? 0xffffu : ~0u;
  for (std::size_t y = 0; y < height; ++y) {
    const std::uintptr_t row = dst + y * pitch;
    if ((value & mask) == 0) {
      zero_fill(row, row_bytes);
    } else if (elem == 1) {
      std::memset(as_ptr(row), static_cast<int>(value & mask), width);
    } else if (elem == 2) {
      fill_row<std::uint16_t>(row, width, value);
    } else {
      fill_row<std::uint32_t>(row, width, value);
    }
  }
  lock.unlock();
  if (link) pace_link(start, row_bytes * height);
  return CUDA_SUCCESS;
}

}  // namespace vlake::sim::internal

VLAKE_SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyHtoD_v2);
  return guarded([&] {
    return copy_checked(as_addr(dstDevice), true, reinterpret_cast<std::uintptr_t>(srcHost), false, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoH_v2);
  return guarded([&] {
    return copy_checked(reinterpret_cast<std::uintptr_t>(dstHost), false, as_addr(srcDevice), true, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoD_v2);
  return guarded([&] { return copy_checked(as_addr(dstDevice), true, as_addr(srcDevice), true, ByteCount); });
}

VLAKE_SIM_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                            CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyHtoDAsync_v2);
  return on_stream(hStream, [&] {
    return copy_checked(as_addr(dstDevice), true, reinterpret_cast<std::uintptr_t>(srcHost), false, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoHAsync_v2);
  return on_stream(hStream, [&] {
    return copy_checked(reinterpret_cast<std::uintptr_t>(dstHost), false, as_addr(srcDevice), true, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                            CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoDAsync_v2);
  return on_stream(hStream,
                   [&] { return copy_checked(as_addr(dstDevice), true, as_addr(srcDevice), true, ByteCount); });
}

VLAKE_SIM_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpy);
  return guarded([&] { return copy_unified(dst, src, ByteCount); });
}

VLAKE_SIM_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyAsync);
  return on_stream(hStream, [&] { return copy_unified(dst, src, ByteCount); });
}

VLAKE_SIM_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyHtoD_v2_ptds);
  return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoH_v2_ptds);
  return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpyDtoD_v2_ptds);
  return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                                 CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyHtoDAsync_v2_ptsz);
  return cuMemcpyHtoDAsync_v2(dstDevice, srcHost, ByteCount, hStream);
}

VLAKE_SIM_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                                 CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoHAsync_v2_ptsz);
  return cuMemcpyDtoHAsync_v2(dstHost, srcDevice, ByteCount, hStream);
}

VLAKE_SIM_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                                 CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoDAsync_v2_ptsz);
  return cuMemcpyDtoDAsync_v2(dstDevice, srcDevice, ByteCount, hStream);
}

VLAKE_SIM_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  VLAKE_SIM_COUNT(cuMemcpy_ptds);
  return cuMemcpy(dst, src, ByteCount);
}

VLAKE_SIM_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyAsync_ptsz);
  return cuMemcpyAsync(dst, src, ByteCount, hStream);
}

// cuMemsetD<bits>_v2, cuMemsetD<bits>Async and their per-thread variants: N elements of `elem`
// bytes (type T) set to `value`.
#define VLAKE_SIM_MEMSET(bits, T, elem)                                                                            \
  VLAKE_SIM_API CUresult cuMemsetD##bits##_v2(CUdeviceptr dstDevice, T value, size_t N) {                          \
    VLAKE_SIM_COUNT(cuMemsetD##bits##_v2);                                                                         \
    return guarded([&] { return memset_rows(as_addr(dstDevice), 0, elem, value, N, 1); });                         \
  }                                                                                                                \
  VLAKE_SIM_API CUresult cuMemsetD##bits##Async(CUdeviceptr dstDevice, T value, size_t N, CUstream hStream) {      \
    VLAKE_SIM_COUNT(cuMemsetD##bits##Async);                                                                       \
    return on_stream(hStream, [&] { return memset_rows(as_addr(dstDevice), 0, elem, value, N, 1); });              \
  }                                                                                                                \
  VLAKE_SIM_API CUresult cuMemsetD##bits##_v2_ptds(CUdeviceptr dstDevice, T value, size_t N) {                     \
    VLAKE_SIM_COUNT(cuMemsetD##bits##_v2_ptds);                                                                    \
    return cuMemsetD##bits##_v2(dstDevice, value, N);                                                              \
  }                                                                                                                \
  VLAKE_SIM_API CUresult cuMemsetD##bits##Async_ptsz(CUdeviceptr dstDevice, T value, size_t N, CUstream hStream) { \
    VLAKE_SIM_COUNT(cuMemsetD##bits##Async_ptsz);                                                                  \
    return cuMemsetD##bits##Async(dstDevice, value, N, hStream);                                                   \
  }

VLAKE_SIM_MEMSET(8, unsigned char, 1)
VLAKE_SIM_MEMSET(16, unsigned short, 2)
VLAKE_SIM_MEMSET(32, unsigned int, 4)
#undef VLAKE_SIM_MEMSET
