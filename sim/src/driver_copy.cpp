// The simulated driver's linear copies and memsets: cuMemcpy{HtoD,DtoH,DtoD}_v2 and their
// Async variants, cuMemsetD{8,32}_v2, cuMemsetD{8,32}Async and the per-thread variants. A copy
// checks, under the shared lock, that the current context's device may write the destination
// and read the source; a refused copy returns rules::kCopyBadAccess (see refused()).
#include "vlake/common/cuda_api.hpp"

#include "call_counts.hpp"
#include "driver_internal.hpp"
#include "process.hpp"
#include "rules.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <shared_mutex>

using vlake::sim::Mapping;
using vlake::sim::Phys;
using namespace vlake::sim::internal;
namespace rules = vlake::sim::rules;

namespace {

// ---- Copies ---------------------------------------------------------------------------------

CUresult copy_checked(std::uintptr_t dst, bool dst_device, std::uintptr_t src, bool src_device, std::size_t n) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if ((!dst_device && dst == 0) || (!src_device && src == 0)) return CUDA_ERROR_INVALID_VALUE;
  std::shared_lock lock(g_proc->mu);
  if (dst_device && !accessible(dst, n, ctx->device, true)) return refused(ctx);
  if (src_device && !accessible(src, n, ctx->device, false)) return refused(ctx);
  std::memmove(as_ptr(dst), as_ptr(src), n);
  return CUDA_SUCCESS;
}

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

CUresult memset_checked(std::uintptr_t dst, std::size_t elem, unsigned value, std::size_t count) {
  CUctx_st* ctx = nullptr;
  if (CUresult rc = check_ctx(ctx); rc != CUDA_SUCCESS) return rc;
  if (elem == 4 && dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  if (count == 0) return CUDA_SUCCESS;
  if (count > SIZE_MAX / elem) return CUDA_ERROR_INVALID_VALUE;
  std::shared_lock lock(g_proc->mu);
  if (!accessible(dst, count * elem, ctx->device, true)) return refused(ctx);
  if ((value & (elem == 1 ? 0xffu : ~0u)) == 0) {
    zero_fill(dst, count * elem);
    return CUDA_SUCCESS;
  }
  if (elem == 1) {
    std::memset(as_ptr(dst), static_cast<int>(value & 0xffu), count);
  } else {
    auto* p = static_cast<std::uint32_t*>(as_ptr(dst));
    std::fill(p, p + count, static_cast<std::uint32_t>(value));
  }
  return CUDA_SUCCESS;
}

}  // namespace

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
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return copy_checked(as_addr(dstDevice), true, reinterpret_cast<std::uintptr_t>(srcHost), false, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoHAsync_v2);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return copy_checked(reinterpret_cast<std::uintptr_t>(dstHost), false, as_addr(srcDevice), true, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                            CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemcpyDtoDAsync_v2);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return copy_checked(as_addr(dstDevice), true, as_addr(srcDevice), true, ByteCount);
  });
}

VLAKE_SIM_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD8_v2);
  return guarded([&] { return memset_checked(as_addr(dstDevice), 1, uc, N); });
}

VLAKE_SIM_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD32_v2);
  return guarded([&] { return memset_checked(as_addr(dstDevice), 4, ui, N); });
}

VLAKE_SIM_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD8Async);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return memset_checked(as_addr(dstDevice), 1, uc, N);
  });
}

VLAKE_SIM_API CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD32Async);
  return guarded([&]() -> CUresult {
    if (CUresult rc = check_async_stream(hStream); rc != CUDA_SUCCESS) return rc;
    return memset_checked(as_addr(dstDevice), 4, ui, N);
  });
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

VLAKE_SIM_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD8_v2_ptds);
  return cuMemsetD8_v2(dstDevice, uc, N);
}

VLAKE_SIM_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  VLAKE_SIM_COUNT(cuMemsetD32_v2_ptds);
  return cuMemsetD32_v2(dstDevice, ui, N);
}

VLAKE_SIM_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD8Async_ptsz);
  return cuMemsetD8Async(dstDevice, uc, N, hStream);
}

VLAKE_SIM_API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  VLAKE_SIM_COUNT(cuMemsetD32Async_ptsz);
  return cuMemsetD32Async(dstDevice, ui, N, hStream);
}
