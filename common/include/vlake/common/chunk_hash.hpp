// vlake::chunk_hash_reference — the 64-bit content hash of a dedup chunk, defined once.
//
// What it is
//   The exact function Driver::hash_chunk() computes on the device (kernel vlake_hash_u64 in
//   common/src/kernels_ptx.hpp, emulated by sim/ on the host): the range is read as n/8
//   little-endian 64-bit words w[0..n/8); kHashThreads lanes each fold the words i = t,
//   t + kHashThreads, t + 2*kHashThreads, ... (strided, so a GPU thread's loads coalesce) with a
//   multiply-xorshift into a partial; the host folds the partials in lane order, starting from n.
//   Not cryptographic: equal hashes are confirmed by a byte compare before anything is shared.
//
// Contract
//   n must be a multiple of 8 (trailing bytes are ignored). Pure, header-only, thread-safe;
//   depends on <cstdint>/<cstring> only (the simulator includes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace vlake {

// Lanes (= GPU threads: kHashBlocks blocks of kHashBlockThreads) of the hash. Part of its
// definition: changing it changes every hash.
inline constexpr unsigned kHashBlockThreads = 256;
inline constexpr unsigned kHashBlocks = 4;
inline constexpr unsigned kHashThreads = kHashBlockThreads * kHashBlocks;

// Lane t's starting value.
[[nodiscard]] constexpr std::uint64_t chunk_hash_seed(std::uint64_t t) noexcept {
  return (t + 1) * 0x9e3779b97f4a7c15ull;
}

// One lane step: folds word w into accumulator acc.
[[nodiscard]] constexpr std::uint64_t chunk_hash_step(std::uint64_t acc, std::uint64_t w) noexcept {
  acc = (acc ^ w) * 0xff51afd7ed558ccdull;
  return acc ^ (acc >> 29);
}

// Folds the kHashThreads lane partials (in lane order) of an n-byte range into the hash.
[[nodiscard]] constexpr std::uint64_t chunk_hash_finish(const std::uint64_t* partials, std::uint64_t n) noexcept {
  std::uint64_t h = n;
  for (unsigned t = 0; t < kHashThreads; ++t) {
    h = (h ^ partials[t]) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 31;
  }
  return h;
}

// Lane partials of `words` 64-bit words at `data` (any alignment), written to partials[0..kHashThreads).
inline void chunk_hash_partials(const void* data, std::uint64_t words, std::uint64_t* partials) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (unsigned t = 0; t < kHashThreads; ++t) partials[t] = chunk_hash_seed(t);
  // Row-major walk (word i belongs to lane i % kHashThreads) keeps the reads sequential.
  for (std::uint64_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    const std::size_t t = static_cast<std::size_t>(i % kHashThreads);
    partials[t] = chunk_hash_step(partials[t], w);
  }
}

// The hash of n bytes at data (n a multiple of 8), computed on the host.
[[nodiscard]] inline std::uint64_t chunk_hash_reference(const void* data, std::size_t n) noexcept {
  std::uint64_t partials[kHashThreads];
  chunk_hash_partials(data, n / 8, partials);
  return chunk_hash_finish(partials, n);
}

}  // namespace vlake
