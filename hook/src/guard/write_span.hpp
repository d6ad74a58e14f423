// Where a copy or memset writes device memory: its destination's first byte and the span to one
// past its last byte (docs/guard.md, "Writes into shared memory"). Used only on the failure path
// of the copy and memset wrappers (hook.cpp), to find the shared ranges a refused call overlaps.
//
// Contract: pure functions of their arguments, never throw; a span that would not fit in 64 bits
// saturates at UINT64_MAX instead of wrapping; an empty write has span 0; a destination that is
// not device memory (host, array) has span 0.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <utility>

namespace vlake::hook {

// `height` rows of `width` bytes, `pitch` bytes apart: from the first byte to one past the last.
inline std::uint64_t span_2d(std::uint64_t pitch, std::uint64_t width, std::uint64_t height) noexcept {
  if (width == 0 || height == 0) return 0;
  const std::uint64_t rows = height - 1;
  if (pitch != 0 && rows > (UINT64_MAX - width) / pitch) return UINT64_MAX;
  return rows * pitch + width;
}

// `count` elements of `elem` bytes (a 1D memset).
inline std::uint64_t span_elems(std::uint64_t elem, std::uint64_t count) noexcept {
  if (elem != 0 && count > UINT64_MAX / elem) return UINT64_MAX;
  return elem * count;
}

// The destination (first byte, span) of a 2D copy into device or unified memory.
inline std::pair<std::uint64_t, std::uint64_t> dst_2d(const CUDA_MEMCPY2D* p) noexcept {
  if (p == nullptr || (p->dstMemoryType != CU_MEMORYTYPE_DEVICE && p->dstMemoryType != CU_MEMORYTYPE_UNIFIED)) {
    return {0, 0};
  }
  const std::uint64_t first = static_cast<std::uint64_t>(p->dstDevice) + p->dstY * p->dstPitch + p->dstXInBytes;
  return {first, span_2d(p->dstPitch, p->WidthInBytes, p->Height)};
}

// The destination (first byte, span) of a 3D copy into device or unified memory: Depth slices
// of Height rows, slices dstHeight rows apart.
inline std::pair<std::uint64_t, std::uint64_t> dst_3d(const CUDA_MEMCPY3D* p) noexcept {
  if (p == nullptr || (p->dstMemoryType != CU_MEMORYTYPE_DEVICE && p->dstMemoryType != CU_MEMORYTYPE_UNIFIED)) {
    return {0, 0};
  }
  const std::uint64_t slice = static_cast<std::uint64_t>(p->dstHeight) * p->dstPitch;
  const std::uint64_t first =
      static_cast<std::uint64_t>(p->dstDevice) + p->dstZ * slice + p->dstY * p->dstPitch + p->dstXInBytes;
  const std::uint64_t plane = span_2d(p->dstPitch, p->WidthInBytes, p->Height);
  if (p->Depth == 0 || plane == 0) return {first, 0};
  const std::uint64_t depth = p->Depth - 1;
  if (slice != 0 && depth > (UINT64_MAX - plane) / slice) return {first, UINT64_MAX};
  return {first, depth * slice + plane};
}

}  // namespace vlake::hook
