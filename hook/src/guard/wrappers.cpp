// The synchronizing, copy and memset wrappers (hook.hpp): passed through; failures are reported
// (guard/fault.cpp), uploads offered for transparent dedup (share.hpp).
#include "hook.hpp"

#include "alloc/internal.hpp"
#include "ipc.hpp"
#include "profile.hpp"
#include "share.hpp"
#include "write_span.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace vlake::hook {

using proto::GrantPurpose;
using proto::Status;

// ---- Synchronizing calls ------------------------------------------------------------------------
// On success (and any other error) the cost is one compare.

namespace {

// After a call that may report a sticky fault: reported (report_fault()). `synchronized`: the
// call waits for work; on success counted pools are re-read and stream-ordered frees looked at.
inline CUresult after_call(CUresult rc, const char* call, bool synchronized) {
  if (synchronized && rc == CUDA_SUCCESS) {
    after_synchronize();
    wake_for_frees();
  }
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) [[unlikely]]
    report_fault(call, rc);
  return rc;
}

}  // namespace

CUresult on_cuCtxSynchronize(bool ptds) {
  return after_call(pass<Row::cuCtxSynchronize>(ptds), "cuCtxSynchronize", true);
}

CUresult on_cuCtxSynchronize_v2(bool ptds, CUcontext ctx) {
  return after_call(pass<Row::cuCtxSynchronize_v2>(ptds, ctx), "cuCtxSynchronize_v2", true);
}

CUresult on_cuStreamSynchronize(bool ptds, CUstream hStream) {
  return after_call(pass<Row::cuStreamSynchronize>(ptds, hStream), "cuStreamSynchronize", true);
}

CUresult on_cuStreamQuery(bool ptds, CUstream hStream) {
  return after_call(pass<Row::cuStreamQuery>(ptds, hStream), "cuStreamQuery", false);
}

CUresult on_cuEventSynchronize(bool ptds, CUevent hEvent) {
  return after_call(pass<Row::cuEventSynchronize>(ptds, hEvent), "cuEventSynchronize", true);
}

CUresult on_cuEventQuery(bool ptds, CUevent hEvent) {
  return after_call(pass<Row::cuEventQuery>(ptds, hEvent), "cuEventQuery", false);
}

CUresult on_cuMemcpyDtoH_v2(bool ptds, void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return after_call(pass<Row::cuMemcpyDtoH_v2>(ptds, dstHost, srcDevice, ByteCount), "cuMemcpyDtoH", false);
}

CUresult on_cuMemcpyDtoHAsync_v2(bool ptds, void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return after_call(pass<Row::cuMemcpyDtoHAsync_v2>(ptds, dstHost, srcDevice, ByteCount, hStream), "cuMemcpyDtoHAsync",
                    false);
}

namespace {

// The failure path of a call that writes device memory from `dst` over `span` bytes: a sticky
// fault is reported as a kernel fault, a refusal (CUDA_ERROR_INVALID_VALUE) whose destination
// overlaps shared read-only chunks as a refused write. Returns rc.
__attribute__((cold, noinline)) CUresult after_write(CUresult rc, const char* call, std::uint64_t dst,
                                                     std::uint64_t span) noexcept {
  if (rc == CUDA_ERROR_ILLEGAL_ADDRESS) report_fault(call, rc);
  else if (rc == CUDA_ERROR_INVALID_VALUE) report_refused_write(call, dst, span, rc);
  return rc;
}

// Passes call R through; when it fails, hands its destination ({address, bytes}) to
// after_write(). `dst` is that pair, or a function giving it, for destinations that must be read
// from the call's descriptor (2D/3D copies): those are read only on failure.
using Dst = std::pair<std::uint64_t, std::uint64_t>;
template <Row R, class DstOrFn, class... A>
CUresult pass_write(bool ptds, const char* call, DstOrFn dst, A... args) {
  const CUresult rc = pass<R>(ptds, args...);
  if (rc != CUDA_SUCCESS) [[unlikely]] {
    Dst d;
    if constexpr (std::is_invocable_v<DstOrFn>) {
      d = dst();
    } else {
      d = dst;
    }
    return after_write(rc, call, d.first, d.second);
  }
  return rc;
}

// The 2D and 3D copies: the destination is read from the descriptor `pCopy`, on failure only.
template <Row R, class Copy, class... Stream>
CUresult pass_copy(bool ptds, const char* call, const Copy* pCopy, Stream... stream) {
  return pass_write<R>(
      ptds, call,
      [=] {
        if constexpr (std::is_same_v<Copy, CUDA_MEMCPY2D>) {
          return dst_2d(pCopy);
        } else {
          return dst_3d(pCopy);
        }
      },
      pCopy, stream...);
}

// The memsets of `Elem`-byte values: N values from dstDevice (1D), or Height rows of Width
// values, dstPitch bytes apart (2D); `stream` is the Async variants' stream.
template <Row R, std::uint64_t Elem, class V, class... Stream>
CUresult pass_memset(bool ptds, const char* call, CUdeviceptr dstDevice, V value, size_t N, Stream... stream) {
  return pass_write<R>(
      ptds, call,
      [=] {
        return Dst{addr(dstDevice), span_elems(Elem, N)};
      },
      dstDevice, value, N, stream...);
}

template <Row R, std::uint64_t Elem, class V, class... Stream>
CUresult pass_memset_2d(bool ptds, const char* call, CUdeviceptr dstDevice, size_t dstPitch, V value, size_t Width,
                        size_t Height, Stream... stream) {
  return pass_write<R>(
      ptds, call,
      [=] {
        return Dst{addr(dstDevice), span_2d(dstPitch, span_elems(Elem, Width), Height)};
      },
      dstDevice, dstPitch, value, Width, Height, stream...);
}

}  // namespace

// Copies and memsets into device memory: passed through; the checks run only on failure.
CUresult on_cuMemcpyDtoD_v2(bool ptds, CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return pass_write<Row::cuMemcpyDtoD_v2>(ptds, "cuMemcpyDtoD", Dst{addr(dstDevice), ByteCount}, dstDevice, srcDevice,
                                          ByteCount);
}

CUresult on_cuMemcpyDtoDAsync_v2(bool ptds, CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                 CUstream hStream) {
  return pass_write<Row::cuMemcpyDtoDAsync_v2>(ptds, "cuMemcpyDtoDAsync", Dst{addr(dstDevice), ByteCount}, dstDevice,
                                               srcDevice, ByteCount, hStream);
}

CUresult on_cuMemcpy(bool ptds, CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return pass_write<Row::cuMemcpy>(ptds, "cuMemcpy", Dst{addr(dst), ByteCount}, dst, src, ByteCount);
}

CUresult on_cuMemcpyAsync(bool ptds, CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return pass_write<Row::cuMemcpyAsync>(ptds, "cuMemcpyAsync", Dst{addr(dst), ByteCount}, dst, src, ByteCount, hStream);
}

CUresult on_cuMemcpyPeer(bool ptds, CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                         CUcontext srcContext, size_t ByteCount) {
  return pass_write<Row::cuMemcpyPeer>(ptds, "cuMemcpyPeer", Dst{addr(dstDevice), ByteCount}, dstDevice, dstContext,
                                       srcDevice, srcContext, ByteCount);
}

CUresult on_cuMemcpyPeerAsync(bool ptds, CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                              CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  return pass_write<Row::cuMemcpyPeerAsync>(ptds, "cuMemcpyPeerAsync", Dst{addr(dstDevice), ByteCount}, dstDevice,
                                            dstContext, srcDevice, srcContext, ByteCount, hStream);
}

CUresult on_cuMemcpy2D_v2(bool ptds, const CUDA_MEMCPY2D* pCopy) {
  return pass_copy<Row::cuMemcpy2D_v2>(ptds, "cuMemcpy2D", pCopy);
}

CUresult on_cuMemcpy2DUnaligned_v2(bool ptds, const CUDA_MEMCPY2D* pCopy) {
  return pass_copy<Row::cuMemcpy2DUnaligned_v2>(ptds, "cuMemcpy2DUnaligned", pCopy);
}

CUresult on_cuMemcpy2DAsync_v2(bool ptds, const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return pass_copy<Row::cuMemcpy2DAsync_v2>(ptds, "cuMemcpy2DAsync", pCopy, hStream);
}

CUresult on_cuMemcpy3D_v2(bool ptds, const CUDA_MEMCPY3D* pCopy) {
  return pass_copy<Row::cuMemcpy3D_v2>(ptds, "cuMemcpy3D", pCopy);
}

CUresult on_cuMemcpy3DAsync_v2(bool ptds, const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return pass_copy<Row::cuMemcpy3DAsync_v2>(ptds, "cuMemcpy3DAsync", pCopy, hStream);
}

// Memsets: N elements of 1, 2 or 4 bytes; 2D: Height rows of Width elements, dstPitch bytes apart.
CUresult on_cuMemsetD8_v2(bool ptds, CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return pass_memset<Row::cuMemsetD8_v2, 1>(ptds, "cuMemsetD8", dstDevice, uc, N);
}

CUresult on_cuMemsetD16_v2(bool ptds, CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return pass_memset<Row::cuMemsetD16_v2, 2>(ptds, "cuMemsetD16", dstDevice, us, N);
}

CUresult on_cuMemsetD32_v2(bool ptds, CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return pass_memset<Row::cuMemsetD32_v2, 4>(ptds, "cuMemsetD32", dstDevice, ui, N);
}

CUresult on_cuMemsetD8Async(bool ptds, CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  return pass_memset<Row::cuMemsetD8Async, 1>(ptds, "cuMemsetD8Async", dstDevice, uc, N, hStream);
}

CUresult on_cuMemsetD16Async(bool ptds, CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  return pass_memset<Row::cuMemsetD16Async, 2>(ptds, "cuMemsetD16Async", dstDevice, us, N, hStream);
}

CUresult on_cuMemsetD32Async(bool ptds, CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  return pass_memset<Row::cuMemsetD32Async, 4>(ptds, "cuMemsetD32Async", dstDevice, ui, N, hStream);
}

CUresult on_cuMemsetD2D8_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
                            size_t Height) {
  return pass_memset_2d<Row::cuMemsetD2D8_v2, 1>(ptds, "cuMemsetD2D8", dstDevice, dstPitch, uc, Width, Height);
}

CUresult on_cuMemsetD2D16_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                             size_t Height) {
  return pass_memset_2d<Row::cuMemsetD2D16_v2, 2>(ptds, "cuMemsetD2D16", dstDevice, dstPitch, us, Width, Height);
}

CUresult on_cuMemsetD2D32_v2(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
                             size_t Height) {
  return pass_memset_2d<Row::cuMemsetD2D32_v2, 4>(ptds, "cuMemsetD2D32", dstDevice, dstPitch, ui, Width, Height);
}

CUresult on_cuMemsetD2D8Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
                              size_t Height, CUstream hStream) {
  return pass_memset_2d<Row::cuMemsetD2D8Async, 1>(ptds, "cuMemsetD2D8Async", dstDevice, dstPitch, uc, Width, Height,
                                                   hStream);
}

CUresult on_cuMemsetD2D16Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
                               size_t Height, CUstream hStream) {
  return pass_memset_2d<Row::cuMemsetD2D16Async, 2>(ptds, "cuMemsetD2D16Async", dstDevice, dstPitch, us, Width, Height,
                                                    hStream);
}

CUresult on_cuMemsetD2D32Async(bool ptds, CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
                               size_t Height, CUstream hStream) {
  return pass_memset_2d<Row::cuMemsetD2D32Async, 4>(ptds, "cuMemsetD2D32Async", dstDevice, dstPitch, ui, Width, Height,
                                                    hStream);
}

// Host-to-device uploads: passed through; a successful upload that fills a whole alloc-path
// allocation is offered for transparent dedup (share.hpp, docs/dedup.md "Transparent mode").
CUresult on_cuMemcpyHtoD_v2(bool ptds, CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  const CUresult rc = pass<Row::cuMemcpyHtoD_v2>(ptds, dstDevice, srcHost, ByteCount);
  if (rc != CUDA_SUCCESS) [[unlikely]]
    return after_write(rc, "cuMemcpyHtoD", addr(dstDevice), ByteCount);
  if (State* s = active(); s != nullptr && share::may_offer(*s, ByteCount)) {
    share::offer_upload(*s, addr(dstDevice), ByteCount);  // the share fences the context
  }
  return rc;
}

CUresult on_cuMemcpyHtoDAsync_v2(bool ptds, CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                 CUstream hStream) {
  const CUresult rc = pass<Row::cuMemcpyHtoDAsync_v2>(ptds, dstDevice, srcHost, ByteCount, hStream);
  if (rc != CUDA_SUCCESS) [[unlikely]]
    return after_write(rc, "cuMemcpyHtoDAsync", addr(dstDevice), ByteCount);
  State* s = active();
  if (s == nullptr || !share::may_offer(*s, ByteCount)) return rc;
  // The copy must have landed before the daemon reads the chunks: wait for that stream (a
  // captured stream only records the copy: nothing to share).
  const CUstream stream = effective_stream(ptds, hStream);
  if (capturing(stream)) return rc;
  // Synchronize only for an offer that will be made (not ours, partial, offered before: no wait).
  if (!share::would_offer(*s, addr(dstDevice), ByteCount)) return rc;
  if (pass<Row::cuStreamSynchronize>(false, stream) != CUDA_SUCCESS) return rc;
  share::offer_upload(*s, addr(dstDevice), ByteCount);
  return rc;
}

}  // namespace vlake::hook
