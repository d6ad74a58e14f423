// The simulator's unified, pitched and 3D copies and its 16-bit and 2D memsets
// (docs/simulator.md, "Copies and memsets"): what lands where, the argument rules, and that a
// refused copy or memset moves no byte. Each entry point and its per-thread variant.
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

using namespace simtest;

namespace {

// A cuMemAlloc allocation of `bytes`, zeroed, freed at scope exit.
struct DeviceBuffer {
  CUdeviceptr p = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    REQUIRE(cuMemAlloc_v2(&p, n) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD8_v2(p, 0, n) == CUDA_SUCCESS);
  }
  ~DeviceBuffer() { cuMemFree_v2(p); }
  std::vector<std::uint8_t> read() const {
    std::vector<std::uint8_t> out(bytes);
    REQUIRE(cuMemcpyDtoH_v2(out.data(), p, bytes) == CUDA_SUCCESS);
    return out;
  }
};

// Mapped VMM memory no device may access (every copy into or out of it is refused).
struct NoAccess : MappedAllocation {
  NoAccess() : MappedAllocation(device_prop(0), kGran) {}
};

CUDA_MEMCPY2D copy2d(CUmemorytype src_type, const void* src_host, CUdeviceptr src_dev, size_t src_pitch,
                     CUmemorytype dst_type, void* dst_host, CUdeviceptr dst_dev, size_t dst_pitch, size_t width,
                     size_t height) {
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = src_type;
  c.srcHost = src_host;
  c.srcDevice = src_dev;
  c.srcPitch = src_pitch;
  c.dstMemoryType = dst_type;
  c.dstHost = dst_host;
  c.dstDevice = dst_dev;
  c.dstPitch = dst_pitch;
  c.WidthInBytes = width;
  c.Height = height;
  return c;
}

// One side of a 3D copy of the test: 5 bytes x 2 rows x 2 slices.
struct Side3d {
  CUmemorytype type;
  void* host;
  CUdeviceptr dev;
  size_t pitch;
  size_t height;
};

CUDA_MEMCPY3D copy3d(const Side3d& src, const Side3d& dst) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = src.type;
  c.srcHost = src.host;
  c.srcDevice = src.dev;
  c.srcPitch = src.pitch;
  c.srcHeight = src.height;
  c.dstMemoryType = dst.type;
  c.dstHost = dst.host;
  c.dstDevice = dst.dev;
  c.dstPitch = dst.pitch;
  c.dstHeight = dst.height;
  c.WidthInBytes = 5;
  c.Height = 2;
  c.Depth = 2;
  return c;
}

}  // namespace

TEST_CASE("cuMemcpy and cuMemcpyAsync tell device from host memory by address", "[sim][copy]") {
  init_ctx();
  DeviceBuffer a(4096);
  DeviceBuffer b(4096);
  const std::uint32_t in[4] = {1, 2, 3, 4};
  std::uint32_t out[4] = {};
  CHECK(cuMemcpy(a.p, reinterpret_cast<CUdeviceptr>(in), sizeof in) == CUDA_SUCCESS);              // host -> device
  CHECK(cuMemcpyAsync(b.p + 16, a.p, sizeof in, nullptr) == CUDA_SUCCESS);                         // device -> device
  CHECK(cuMemcpy_ptds(reinterpret_cast<CUdeviceptr>(out), b.p + 16, sizeof out) == CUDA_SUCCESS);  // device -> host
  CHECK(std::memcmp(in, out, sizeof in) == 0);
  std::uint32_t host_copy[4] = {};
  CHECK(cuMemcpyAsync_ptsz(reinterpret_cast<CUdeviceptr>(host_copy), reinterpret_cast<CUdeviceptr>(in), sizeof in,
                           CU_STREAM_PER_THREAD) == CUDA_SUCCESS);  // host -> host
  CHECK(host_copy[3] == 4);

  CHECK(cuMemcpy(a.p, 0, 4) == CUDA_ERROR_INVALID_VALUE);                      // a null host side
  CHECK(cuMemcpy(a.p, reinterpret_cast<CUdeviceptr>(in), 0) == CUDA_SUCCESS);  // empty
  CHECK(cuMemcpyAsync(a.p, b.p, 4, reinterpret_cast<CUstream>(&a)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMemcpy(a.p + 4094, reinterpret_cast<CUdeviceptr>(in), 4) == CUDA_ERROR_INVALID_VALUE);  // past the end
  NoAccess none;
  CHECK(cuMemcpy(reinterpret_cast<CUdeviceptr>(out), none.va, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);  // a refused copy leaves the context usable
}

TEST_CASE("cuMemsetD16 sets 16-bit words of aligned device memory", "[sim][memset]") {
  init_ctx();
  DeviceBuffer a(64);
  CHECK(cuMemsetD16_v2(a.p, 0xBEEF, 4) == CUDA_SUCCESS);
  CHECK(cuMemsetD16Async(a.p + 8, 0x1234, 2, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemsetD16_v2_ptds(a.p + 12, 0, 1) == CUDA_SUCCESS);
  CHECK(cuMemsetD16Async_ptsz(a.p + 14, 0x0101, 1, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  std::uint16_t words[8] = {};
  REQUIRE(cuMemcpyDtoH_v2(words, a.p, sizeof words) == CUDA_SUCCESS);
  const std::uint16_t expected[8] = {0xBEEF, 0xBEEF, 0xBEEF, 0xBEEF, 0x1234, 0x1234, 0, 0x0101};
  CHECK(std::memcmp(words, expected, sizeof words) == 0);
  CHECK(cuMemsetD16_v2(a.p + 1, 1, 1) == CUDA_ERROR_INVALID_VALUE);   // misaligned
  CHECK(cuMemsetD16_v2(a.p + 62, 1, 2) == CUDA_ERROR_INVALID_VALUE);  // past the end
  CHECK(cuMemsetD16Async(a.p, 1, 1, reinterpret_cast<CUstream>(&a)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(a.read()[63] == 0);
}

TEST_CASE("cuMemsetD2D8/16/32 set a rectangle of pitched memory and nothing else", "[sim][memset]") {
  init_ctx();
  CUdeviceptr p = 0;
  size_t pitch = 0;
  REQUIRE(cuMemAllocPitch_v2(&p, &pitch, 64, 4, 4) == CUDA_SUCCESS);
  REQUIRE(pitch == 512);
  REQUIRE(cuMemsetD8_v2(p, 0, pitch * 4) == CUDA_SUCCESS);
  auto byte_at = [&](size_t row, size_t col) {
    std::uint8_t b = 0;
    REQUIRE(cuMemcpyDtoH_v2(&b, p + row * pitch + col, 1) == CUDA_SUCCESS);
    return b;
  };
  CHECK(cuMemsetD2D8_v2(p, pitch, 0xAB, 16, 3) == CUDA_SUCCESS);
  CHECK(byte_at(0, 0) == 0xAB);
  CHECK(byte_at(2, 15) == 0xAB);
  CHECK(byte_at(2, 16) == 0);  // right of the rectangle
  CHECK(byte_at(3, 0) == 0);   // below it
  CHECK(cuMemsetD2D16_v2(p + 32, pitch, 0x0102, 4, 2) == CUDA_SUCCESS);
  CHECK(byte_at(1, 32) == 0x02);
  CHECK(byte_at(1, 39) == 0x01);
  CHECK(byte_at(1, 40) == 0);
  CHECK(cuMemsetD2D32_v2(p + 64, pitch, 0x0A0B0C0D, 2, 4) == CUDA_SUCCESS);
  CHECK(byte_at(3, 64) == 0x0D);
  CHECK(byte_at(3, 71) == 0x0A);
  CHECK(cuMemsetD2D8Async(p, pitch, 1, 1, 1, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D16Async(p + 2, pitch, 0x0202, 1, 1, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D32Async(p + 4, pitch, 0x03030303, 1, 1, nullptr) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D8_v2_ptds(p + 8, pitch, 4, 1, 1) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D16_v2_ptds(p + 10, pitch, 0x0505, 1, 1) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D32_v2_ptds(p + 12, pitch, 0x06060606, 1, 1) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D8Async_ptsz(p + 16, pitch, 7, 1, 1, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D16Async_ptsz(p + 18, pitch, 0x0808, 1, 1, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D32Async_ptsz(p + 20, pitch, 0x09090909, 1, 1, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  for (std::uint8_t i = 0; i < 24; ++i) {
    INFO("byte " << int(i));
    const std::uint8_t want = i < 1    ? 1
                              : i < 2  ? 0xAB
                              : i < 4  ? 2
                              : i < 8  ? 3
                              : i < 9  ? 4
                              : i < 10 ? 0xAB
                              : i < 12 ? 5
                              : i < 16 ? 6
                              : i < 17 ? 7
                              : i < 18 ? 0
                              : i < 20 ? 8
                                       : 9;
    CHECK(byte_at(0, i) == want);
  }

  // Argument rules: the row within the pitch, aligned element size, every row accessible.
  CHECK(cuMemsetD2D8_v2(p, 8, 1, 16, 2) == CUDA_ERROR_INVALID_VALUE);  // width > pitch
  CHECK(cuMemsetD2D16_v2(p + 1, pitch, 1, 1, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD2D32_v2(p, pitch + 2, 1, 1, 2) == CUDA_ERROR_INVALID_VALUE);      // pitch not aligned
  CHECK(cuMemsetD2D8_v2(p, pitch, 0xEE, 8, 0) == CUDA_SUCCESS);                    // empty
  CHECK(cuMemsetD2D8_v2(p + 256, pitch, 0xEE, 8, 5) == CUDA_ERROR_INVALID_VALUE);  // row 4 is past the end
  CHECK(byte_at(0, 256) == 0);                                                     // refused before any row was written
  CHECK(cuMemsetD2D8Async(p, pitch, 1, 1, 1, reinterpret_cast<CUstream>(&p)) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuMemFree_v2(p) == CUDA_SUCCESS);
}

TEST_CASE("cuMemcpy2D copies rectangles between host and pitched device memory", "[sim][copy]") {
  init_ctx();
  DeviceBuffer dev(4 * 256);
  std::vector<std::uint8_t> host(8 * 32);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint8_t>(i);
  // Rows 1..3, bytes 4..11 of the host image (pitch 32) into device rows 0..2 at x = 16 (pitch 256).
  CUDA_MEMCPY2D up = copy2d(CU_MEMORYTYPE_HOST, host.data(), 0, 32, CU_MEMORYTYPE_DEVICE, nullptr, dev.p, 256, 8, 3);
  up.srcXInBytes = 4;
  up.srcY = 1;
  up.dstXInBytes = 16;
  CHECK(cuMemcpy2D_v2(&up) == CUDA_SUCCESS);
  const auto img = dev.read();
  CHECK(img[16] == 36);             // host row 1, byte 4
  CHECK(img[256 * 2 + 23] == 107);  // host row 3, byte 11
  CHECK(img[15] == 0);
  CHECK(img[24] == 0);
  CHECK(img[256 * 3 + 16] == 0);

  // Back down through the other variants, unified addressing on the device side.
  std::vector<std::uint8_t> back(3 * 8);
  CUDA_MEMCPY2D down =
      copy2d(CU_MEMORYTYPE_UNIFIED, nullptr, dev.p + 16, 256, CU_MEMORYTYPE_HOST, back.data(), 0, 8, 8, 3);
  for (auto* fn : {&cuMemcpy2DUnaligned_v2, &cuMemcpy2D_v2_ptds, &cuMemcpy2DUnaligned_v2_ptds}) {
    std::fill(back.begin(), back.end(), 0);
    CHECK(fn(&down) == CUDA_SUCCESS);
    CHECK(back[0] == 36);
    CHECK(back[23] == 107);
  }
  std::fill(back.begin(), back.end(), 0);
  CHECK(cuMemcpy2DAsync_v2(&down, nullptr) == CUDA_SUCCESS);
  CHECK(back[8] == 68);
  std::fill(back.begin(), back.end(), 0);
  CHECK(cuMemcpy2DAsync_v2_ptsz(&down, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(back[8] == 68);

  // Argument rules.
  CHECK(cuMemcpy2D_v2(nullptr) == CUDA_ERROR_INVALID_VALUE);
  CUDA_MEMCPY2D bad = down;
  bad.dstPitch = 4;  // rows of 8 bytes do not fit a 4-byte pitch
  CHECK(cuMemcpy2D_v2(&bad) == CUDA_ERROR_INVALID_VALUE);
  bad = down;
  bad.srcXInBytes = 250;  // 250 + 8 > 256
  CHECK(cuMemcpy2D_v2(&bad) == CUDA_ERROR_INVALID_VALUE);
  bad = down;
  bad.srcMemoryType = CU_MEMORYTYPE_ARRAY;  // no CUDA arrays in the simulator
  CHECK(cuMemcpy2D_v2(&bad) == CUDA_ERROR_INVALID_VALUE);
  bad = down;
  bad.Height = 0;
  CHECK(cuMemcpy2D_v2(&bad) == CUDA_SUCCESS);
  CHECK(cuMemcpy2DAsync_v2(&down, reinterpret_cast<CUstream>(&bad)) == CUDA_ERROR_INVALID_HANDLE);
  // A copy whose last row leaves the allocation is refused whole: no row lands.
  NoAccess none;
  std::vector<std::uint8_t> ones(4 * 256, 1);
  CUDA_MEMCPY2D over = copy2d(CU_MEMORYTYPE_HOST, ones.data(), 0, 256, CU_MEMORYTYPE_DEVICE, nullptr, dev.p, 256, 8, 5);
  CHECK(cuMemcpy2D_v2(&over) == CUDA_ERROR_INVALID_VALUE);
  CHECK(dev.read()[0] == 0);
  over.dstDevice = none.va;
  over.Height = 1;
  CHECK(cuMemcpy2D_v2(&over) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("cuMemcpy3D copies a box between slices", "[sim][copy]") {
  init_ctx();
  // Source: 2 slices of 4 rows of 64 bytes; each byte = slice * 100 + row * 10 + (x % 10).
  std::vector<std::uint8_t> host(2 * 4 * 64);
  for (size_t z = 0; z < 2; ++z) {
    for (size_t y = 0; y < 4; ++y) {
      for (size_t x = 0; x < 64; ++x) host[(z * 4 + y) * 64 + x] = static_cast<std::uint8_t>(z * 100 + y * 10 + x % 10);
    }
  }
  DeviceBuffer dev(2 * 3 * 128);
  CUDA_MEMCPY3D c = copy3d({CU_MEMORYTYPE_HOST, host.data(), 0, 64, 4}, {CU_MEMORYTYPE_DEVICE, nullptr, dev.p, 128, 3});
  c.srcXInBytes = 2;
  c.srcY = 1;
  CHECK(cuMemcpy3D_v2(&c) == CUDA_SUCCESS);
  auto img = dev.read();
  CHECK(img[0] == 12);         // slice 0, row 1, x 2
  CHECK(img[128 + 4] == 26);   // slice 0, row 2, x 6
  CHECK(img[3 * 128] == 112);  // slice 1 starts 3 rows in
  CHECK(img[3 * 128 + 128 + 4] == 126);
  CHECK(img[5] == 0);
  CHECK(img[2 * 128] == 0);  // the third row of a destination slice stays untouched

  std::fill(host.begin(), host.end(), 0);
  const CUDA_MEMCPY3D down =
      copy3d({CU_MEMORYTYPE_DEVICE, nullptr, dev.p, 128, 3}, {CU_MEMORYTYPE_HOST, host.data(), 0, 64, 4});
  for (auto* fn : {&cuMemcpy3D_v2, &cuMemcpy3D_v2_ptds}) {
    std::fill(host.begin(), host.end(), 0);
    CHECK(fn(&down) == CUDA_SUCCESS);
    CHECK(host[4 * 64 + 64 + 4] == 126);
  }
  std::fill(host.begin(), host.end(), 0);
  CHECK(cuMemcpy3DAsync_v2(&down, nullptr) == CUDA_SUCCESS);
  CHECK(host[4 * 64] == 112);
  std::fill(host.begin(), host.end(), 0);
  CHECK(cuMemcpy3DAsync_v2_ptsz(&down, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(host[64 + 4] == 26);

  CUDA_MEMCPY3D bad = down;
  bad.srcHeight = 1;  // 2 rows per slice do not fit a 1-row slice
  CHECK(cuMemcpy3D_v2(&bad) == CUDA_ERROR_INVALID_VALUE);
  bad = down;
  bad.srcLOD = 1;
  CHECK(cuMemcpy3D_v2(&bad) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpy3D_v2(nullptr) == CUDA_ERROR_INVALID_VALUE);
  bad = down;
  bad.Depth = 3;  // the third source slice is past the allocation
  CHECK(cuMemcpy3D_v2(&bad) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpy3DAsync_v2(&down, reinterpret_cast<CUstream>(&bad)) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("cuMemcpyPeerAsync copies between two devices' memory", "[sim][copy][peer]") {
  CUcontext c0 = init_ctx(0);
  CUcontext c1 = init_ctx(1);
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  REQUIRE(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc_v2(&a, 64) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc_v2(&b, 64) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD32_v2(a, 0x11111111, 16) == CUDA_SUCCESS);
  CHECK(cuMemcpyPeerAsync(b, c1, a, c0, 16, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD32_v2(a, 0x22222222, 16) == CUDA_SUCCESS);
  CHECK(cuMemcpyPeerAsync_ptsz(b + 16, c1, a, c0, 16, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD32_v2(a, 0x33333333, 16) == CUDA_SUCCESS);
  CHECK(cuMemcpyPeer_ptds(b + 32, c1, a, c0, 16) == CUDA_SUCCESS);
  std::uint32_t words[12] = {};
  REQUIRE(cuMemcpyDtoH_v2(words, b, sizeof words) == CUDA_SUCCESS);
  CHECK(words[0] == 0x11111111u);
  CHECK(words[4] == 0x22222222u);
  CHECK(words[8] == 0x33333333u);
  CHECK(cuMemcpyPeerAsync(b, c1, a, nullptr, 4, nullptr) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuMemcpyPeerAsync(b, c1, a, c0, 4, reinterpret_cast<CUstream>(&a)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMemcpyPeerAsync(b + 62, c1, a, c0, 4, nullptr) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemFree_v2(a) == CUDA_SUCCESS);
  REQUIRE(cuMemFree_v2(b) == CUDA_SUCCESS);
}
