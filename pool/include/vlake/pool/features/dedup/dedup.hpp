// vlake::pool::Dedup — the node's table of shared read-only chunks (docs/dedup.md).
//
// What it does
//   A tenant asks (through the hook and the daemon's ShareRequest) to share the whole chunks
//   (granularity G) of a range of one of its alloc grants. plan() reads each chunk through the
//   daemon's own read-write mapping of the grant's handles, hashes it, looks the hash up in a
//   node-level table keyed by (GPU, chunk size, hash), confirms every candidate with a full byte
//   compare, and either takes a reference to the existing shared chunk or copies the chunk into
//   a new G-sized pool handle that becomes the shared one. Because a handle can only be mapped
//   whole, every old handle of the grant that overlaps the range is replaced: its parts outside
//   the range are copied into new private handles (one before, one after the range), its part
//   inside becomes G-sized shared chunks. Handles wholly outside the range are kept.
//   commit() makes the plan the grant's layout (the replaced handles are retired: released to
//   the driver, never pooled);
//   abort() undoes it. release_grant() drops a grant's references; a chunk whose last reference
//   goes returns to the free pool (with no last tenant, so it is scrubbed before its next grant).
//
// Accounting: a tenant stays charged the logical bytes of its grant; refs() lists a grant's
//   committed chunk references, which the daemon hands to Accounting (share() at the commit,
//   uncharge() at the grant's end) so that its guarantee rule counts each chunk once per saving
//   group (docs/quota.md). The table reports logical bytes (Σ references × chunk size) and
//   physical bytes (Σ chunk sizes) per GPU for DeviceRecord::dedup_logical_bytes /
//   dedup_physical_bytes.
//
// Errors: plan() throws PoolOutOfMemory (no room for the copies), DriverError, or
//   std::invalid_argument (range not chunk-aligned or outside the grant); on a throw nothing
//   changed. commit()/abort()/release_grant() never throw.
//
// Thread-safety: none; the daemon uses it from its event-loop thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/pool/accounting.hpp"
#include "vlake/pool/device_pool.hpp"

namespace vlake::pool {

// 64-bit hash of a chunk's bytes: vlake::chunk_hash_reference (the value Driver::hash_chunk
// computes on the device; collisions are resolved by the byte compare, so it need not be
// cryptographic). `n` must be a multiple of 8.
[[nodiscard]] std::uint64_t chunk_hash(const void* data, std::size_t n) noexcept;

class Dedup {
 public:
  Dedup(Driver& driver, const Logger& log) : driver_(driver), log_(log) {}
  Dedup(const Dedup&) = delete;
  Dedup& operator=(const Dedup&) = delete;

  enum class PieceKind { keep, copy, shared };
  struct Piece {
    Bytes offset{0};
    Bytes size{0};
    PieceKind kind = PieceKind::keep;
    std::uint32_t keep_index = 0;           // keep: the old handle's index
    std::unique_ptr<PoolHandle> handle;     // copy: the new private handle
    std::uint64_t chunk = 0;                // shared: the chunk id
    [[nodiscard]] int fd() const noexcept;  // the descriptor to send (-1 for keep)
  };
  struct Plan {
    std::uint64_t grant_id = 0;
    DeviceOrdinal device{0};
    std::vector<Piece> pieces;  // in VA order, covering the grant
    Bytes shared{0};            // bytes of the range now in shared chunks
    Bytes merged{0};            // of those, chunks that matched an existing shared chunk
    Bytes copied{0};            // bytes copied into private handles
  };

  // Plans the share of [offset, offset + bytes) of grant `grant_id` (device pool `pool`,
  // handles `handles` in VA order) for session `session`, replacing any plan the session had
  // pending (aborted). The plan holds references to its shared chunks until commit/abort.
  // Chunks are matched only against chunks created in the same `domain` (the tenant's trust
  // domain: docs/dedup.md, "Trust domains").
  const Plan& plan(std::uint64_t session, std::uint64_t grant_id, DevicePool& pool, TenantId tenant,
                   const std::string& domain, const std::vector<std::unique_ptr<PoolHandle>>& handles, Bytes offset,
                   Bytes bytes);
  [[nodiscard]] const Plan* pending(std::uint64_t session) const;
  // Makes the session's pending plan the layout of its grant: `handles` becomes the kept and
  // new private handles (VA order, shared chunks are tracked here); the replaced handles are
  // retired in `pool` (released to the driver; a descriptor another process still holds stays
  // open, charged to `tenant`, until the caller's settle() finds no holder). False if there was
  // no pending plan.
  bool commit(std::uint64_t session, std::vector<std::unique_ptr<PoolHandle>>& handles, DevicePool& pool,
              TenantId tenant) noexcept;
  // Drops the session's pending plan (new private handles and unused chunks back to `pool`).
  void abort(std::uint64_t session, DevicePool& pool, TenantId tenant) noexcept;
  // The grant ends: drops its references (and any pending plan of it); chunks without
  // references return to `pool`.
  void release_grant(std::uint64_t grant_id, DevicePool& pool) noexcept;
  // Shutdown: releases every chunk for good (tenants' imports keep the memory alive).
  void retire_all(std::map<int, DevicePool*> pools) noexcept;

  [[nodiscard]] bool is_shared(std::uint64_t grant_id) const { return grant_refs_.count(grant_id) != 0; }
  // The grant's committed chunk references (one per shared chunk it maps); empty if none.
  [[nodiscard]] std::vector<SharedRef> refs(std::uint64_t grant_id) const;
  [[nodiscard]] Bytes logical_bytes(DeviceOrdinal d) const;   // Σ committed references × size
  [[nodiscard]] Bytes physical_bytes(DeviceOrdinal d) const;  // Σ chunk sizes
  [[nodiscard]] std::uint64_t chunks() const noexcept { return chunks_.size(); }
  // The exported descriptor of a shared chunk (-1 if unknown).
  [[nodiscard]] int chunk_fd(std::uint64_t chunk) const;

 private:
  struct Chunk {
    std::uint64_t id = 0;
    DeviceOrdinal device{0};
    std::uint64_t hash = 0;
    std::string domain;
    std::unique_ptr<PoolHandle> handle;
    std::uint64_t refs = 0;  // committed grants' and pending plans' references
  };
  struct Key {
    std::string domain;
    int device;
    std::uint64_t size;
    std::uint64_t hash;
    bool operator<(const Key& o) const noexcept {
      if (device != o.device) return device < o.device;
      if (size != o.size) return size < o.size;
      if (hash != o.hash) return hash < o.hash;
      return domain < o.domain;
    }
  };
  // The chunk id holding the `size` bytes at src.va + src_offset, whose hash_chunk() is `hash`
  // (a reference taken), creating one if needed; `merged` tells whether it existed. Only
  // candidates with an equal hash are copied to the host and compared byte for byte.
  std::uint64_t find_or_add(DevicePool& pool, TenantId tenant, const std::string& domain, std::uint64_t hash,
                            Bytes size, PoolHandle& src, Bytes src_offset, bool& merged);
  void unref(std::uint64_t chunk, DevicePool& pool) noexcept;
  void drop_plan(Plan& p, DevicePool& pool, TenantId tenant) noexcept;

  Driver& driver_;
  const Logger& log_;
  std::uint64_t next_chunk_ = 1;
  std::unordered_map<std::uint64_t, std::unique_ptr<Chunk>> chunks_;
  std::multimap<Key, std::uint64_t> index_;
  std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> grant_refs_;  // grant -> chunk ids
  std::unordered_map<std::uint64_t, Plan> pending_;                           // by session
  std::vector<std::uint8_t> scratch_;                                         // candidate bytes for the compare
  std::vector<std::uint8_t> mine_;  // the tenant's bytes for the compare (loaded on demand)
};

}  // namespace vlake::pool
