// vlake::pool::Accounting — per (tenant, device) and per (namespace, device) quota bookkeeping,
// with namespace guarantees.
//
// What it tracks, per (tenant, device): the limit, pool bytes granted (committed), non-pool
// bytes (sampled from NVML: contexts, modules, passthrough allocations of processes holding a
// session), unhooked bytes (sampled from NVML: processes of the tenant without a session, as far
// as its `enforce` policy charges them; set_unhooked), retained bytes (released memory the tenant
// can still reach: free handles bound to it and retired handles whose descriptor a process still
// holds, docs/pool.md "Handle binding") and bytes reserved by grants in flight. A tenant's usage
// is granted + nonpool + unhooked + retained; "held" is usage + reserved. Per (namespace,
// device): its limit, its guarantee, and the sums of its tenants' figures. Per device: its
// capacity C (set_capacity).
//
// Grant rule — reserve(t, d, r) for tenant t in namespace n succeeds only if, atomically with
// respect to every other call:
//   1. held(t) + r <= limit(t)                                     (else Refusal::tenant_limit)
//   2. held(n) + r <= limit(n)                                     (else Refusal::namespace_limit)
//   3. with U = C - sum_m G(m) (unguaranteed memory, 0 if the guarantees exceed C) and
//      borrowed(m) = max(0, held(m) - G(m)): if the grant increases borrowed(n), then after it
//      sum_m borrowed(m) <= U                                       (else Refusal::guarantee)
//   So a namespace always gets memory up to its guarantee, and above it borrows only memory
//   nobody is guaranteed. Rule 3 applies only on devices given a capacity, and not to
//   namespaces marked overcommit (set_namespace), which do not count in its sums either: their
//   processes can be moved to host memory (docs/swap.md), so their bytes may exceed the GPU.
// Shared (dedup) chunks: a tenant pays for what it maps, the node counts what exists. Rules 1
//   and 2 charge the logical bytes of a grant that maps shared chunks, as before; rule 3 counts
//   each shared chunk once per *saving group*: every namespace with a guarantee on the device is
//   a group of its own, the namespaces without one form one group together. A group's savings
//   S are Σ over chunks of (references from the group's tenants − 1) × chunk size (share(),
//   uncharge() with references), and in rule 3
//     borrowed(m) = max(0, held(m) − S(m) − G(m))        for m with a guarantee,
//     Σ over the others of borrowed = max(0, Σ held − S)  (their G is 0),
//   i.e. Σ_m max(physical(m), G(m)) <= C. Why groups: savings inside a guarantee are not lent
//   (they come back when a sharer exits, and the guarantee must still be there), and a chunk
//   mapped by two namespaces with guarantees counts in both (when one's sharers exit the other
//   still maps all of it). What a group saves only falls when its own references go, never
//   by more than the bytes uncharged with them, so releases never raise Σ borrowed.
//   Configuration changes (assign, set_namespace, remove_namespace) regroup the references.
// It returns a Reservation (RAII token). Committing moves the bytes from reserved to granted;
// rolling back (explicitly, or by destroying the token uncommitted) returns them. No
// interleaving of calls can break rules 1-3 through reserve() (set_nonpool(), restore(),
// lowering limits and moving tenants record facts and may: no revocation).
// - uncharge(t, d, n, refs) returns committed bytes (clamped at 0; a clamp is reported as false)
//   and drops the shared-chunk references the released grant held, under one lock.
// - A (tenant, device) never given a limit has limit 0: every reserve fails.
// - A tenant never assigned a namespace is in NamespaceId{0}; a namespace never configured on
//   a device has no limit and no guarantee there.
//
// Thread-safety: every method may be called from any thread (one internal mutex). A
// Reservation must not outlive its Accounting; it is move-only and not itself thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

struct NamespaceIdTag {};
// A namespace's id: its state-segment slot + 1 in the daemon; 0 = "not assigned".
using NamespaceId = StrongId<NamespaceIdTag, std::uint32_t>;

// One reference to a shared (dedup) chunk: its id in the node's dedup table and its size.
struct SharedRef {
  std::uint64_t chunk = 0;
  Bytes size{0};
};

// Why reserve() refused.
enum class Refusal : std::uint8_t { none = 0, tenant_limit = 1, namespace_limit = 2, guarantee = 3 };
const char* to_string(Refusal r) noexcept;

class Accounting {
 public:
  static constexpr Bytes kUnlimited{~0ULL};

  struct Usage {
    Bytes limit;
    Bytes granted;
    Bytes nonpool;
    Bytes reserved;
    Bytes unhooked{0};
    Bytes retained{0};
    [[nodiscard]] Bytes used() const noexcept { return granted + nonpool + unhooked + retained; }
  };
  struct NamespaceUsage {
    Bytes limit = kUnlimited;
    Bytes guaranteed{0};
    Bytes granted{0};
    Bytes nonpool{0};
    Bytes reserved{0};
    Bytes unhooked{0};
    Bytes retained{0};
    // A namespace with a guarantee on the device: what sharing saves among its tenants (its
    // saving group's S); 0 for the others (their savings are the device's unguaranteed_saved).
    Bytes dedup_saved{0};
    // `overcommit: true` (docs/swap.md): not held to rule 3 and not counted in it (its
    // processes' memory can be moved to host memory; guarantees of others are kept by swapping
    // them out when the GPU lacks room).
    bool overcommit = false;
    [[nodiscard]] Bytes used() const noexcept { return granted + nonpool + unhooked + retained; }
    [[nodiscard]] Bytes held() const noexcept { return granted + nonpool + unhooked + retained + reserved; }
  };
  struct Entry {
    TenantId tenant;
    DeviceOrdinal device;
    NamespaceId ns;
    Usage usage;
  };
  struct NamespaceEntry {
    NamespaceId ns;
    DeviceOrdinal device;
    NamespaceUsage usage;
  };
  struct DeviceEntry {
    DeviceOrdinal device;
    Bytes capacity;               // 0: not set (rule 3 off)
    Bytes guaranteed;             // sum of the namespaces' guarantees
    Bytes borrowed;               // rule 3's Σ borrowed (physical: after the counted savings)
    Bytes dedup_logical{0};       // Σ shared-chunk references × size (what tenants are charged)
    Bytes dedup_physical{0};      // Σ sizes of the chunks referenced (what exists)
    Bytes dedup_saved{0};         // savings rule 3 counts: Σ over saving groups of their S
    Bytes unguaranteed_saved{0};  // of those, the group of namespaces without a guarantee
  };
  // Everything, under one lock: what an invariant checker needs.
  struct Snapshot {
    std::vector<Entry> tenants;
    std::vector<NamespaceEntry> namespaces;
    std::vector<DeviceEntry> devices;
  };

  class Reservation {
   public:
    Reservation() = default;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { rollback(); }

    void commit() noexcept;
    void rollback() noexcept;
    [[nodiscard]] bool active() const noexcept { return owner_ != nullptr; }
    [[nodiscard]] Bytes bytes() const noexcept { return bytes_; }
    [[nodiscard]] TenantId tenant() const noexcept { return tenant_; }
    [[nodiscard]] DeviceOrdinal device() const noexcept { return device_; }

   private:
    friend class Accounting;
    Reservation(Accounting* a, TenantId t, DeviceOrdinal d, Bytes b) noexcept
        : owner_(a), tenant_(t), device_(d), bytes_(b) {}
    Accounting* owner_ = nullptr;
    TenantId tenant_{};
    DeviceOrdinal device_{};
    Bytes bytes_{};
  };

  void set_limit(TenantId t, DeviceOrdinal d, Bytes limit);
  // The device's memory C (enables rule 3 on it).
  void set_capacity(DeviceOrdinal d, Bytes capacity);
  // A namespace's limit (kUnlimited: none) and guarantee on a device.
  void set_namespace(NamespaceId n, DeviceOrdinal d, Bytes limit, Bytes guaranteed, bool overcommit = false);
  // Forgets a namespace (its tenants must have been moved away; otherwise they keep counting
  // in an unconfigured namespace of that id).
  void remove_namespace(NamespaceId n);
  // Puts a tenant in a namespace, moving its usage (on every device) along.
  void assign(TenantId t, NamespaceId n);
  [[nodiscard]] NamespaceId namespace_of(TenantId t) const;
  // Forgets a tenant (its id may be reused). Returns false, forgetting nothing, while it still
  // has usage (granted, non-pool or reserved) or shared-chunk references on any device.
  bool remove_tenant(TenantId t);

  // nullopt when the bytes do not fit; `usage_out` (optional) receives the tenant's usage seen,
  // `why` (optional) the reason of a refusal (Refusal::none on success).
  [[nodiscard]] std::optional<Reservation> reserve(TenantId t, DeviceOrdinal d, Bytes n, Usage* usage_out = nullptr,
                                                   Refusal* why = nullptr);
  // Returns false if fewer than `n` bytes were granted (granted is then set to 0), if one of
  // `refs` (the shared-chunk references of the released bytes, share()d before) was not the
  // tenant's, or if their sizes add up to more than `n` (they must not: the savings would go
  // without their bytes).
  bool uncharge(TenantId t, DeviceOrdinal d, Bytes n, const std::vector<SharedRef>& refs = {});
  // The tenant's committed grant on `d` now maps these shared chunks (one reference each): its
  // saving group's S grows by the size of each chunk the group already referenced.
  void share(TenantId t, DeviceOrdinal d, const std::vector<SharedRef>& refs);
  // Charges bytes that are already held (state recovered after a restart), limit or not.
  void restore(TenantId t, DeviceOrdinal d, Bytes n);
  void set_nonpool(TenantId t, DeviceOrdinal d, Bytes n);
  // The charged memory of the tenant's processes without a session (0 under `enforce: account`).
  void set_unhooked(TenantId t, DeviceOrdinal d, Bytes n);
  // Records the tenant's retained bytes on `d` (a fact, like set_nonpool: may exceed the limit).
  // Returns true if the figure changed.
  bool set_retained(TenantId t, DeviceOrdinal d, Bytes n);

  [[nodiscard]] Usage usage(TenantId t, DeviceOrdinal d) const;
  [[nodiscard]] NamespaceUsage namespace_usage(NamespaceId n, DeviceOrdinal d) const;
  [[nodiscard]] DeviceEntry device_usage(DeviceOrdinal d) const;
  // A consistent copy of every tenant entry (one lock).
  [[nodiscard]] std::vector<Entry> snapshot() const;
  [[nodiscard]] Snapshot snapshot_all() const;

 private:
  struct Key {
    TenantId t;
    DeviceOrdinal d;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return (static_cast<std::size_t>(k.t.value()) << 8) ^ static_cast<std::size_t>(k.d.value());
    }
  };
  using NsKey = std::pair<std::int32_t, std::uint32_t>;  // (device, namespace): by device first
  void finish(const Reservation& r, bool commit) noexcept;
  NamespaceUsage& ns_locked(NamespaceId n, DeviceOrdinal d);
  NamespaceId ns_of_locked(TenantId t) const;
  [[nodiscard]] DeviceEntry device_locked(DeviceOrdinal d) const;
  void replace_locked(TenantId t, DeviceOrdinal d, Usage& u, Bytes Usage::*field, Bytes NamespaceUsage::*ns_field,
                      Bytes n);
  // Shared chunks (rule 3's savings).
  struct Chunk {
    Bytes size{0};
    std::map<std::uint32_t, std::uint32_t> by_tenant;  // TenantId value -> references
    std::map<std::uint64_t, std::uint32_t> by_group;   // saving group -> references
  };
  using ChunkKey = std::pair<std::int32_t, std::uint64_t>;  // (device, chunk)
  static constexpr std::uint64_t kUnguaranteedGroup = 1ULL << 32;
  [[nodiscard]] std::uint64_t group_locked(TenantId t, DeviceOrdinal d) const;
  [[nodiscard]] Bytes& saved_locked(std::int32_t d, std::uint64_t group);
  [[nodiscard]] Bytes saved_of_locked(std::int32_t d, std::uint64_t group) const;
  void add_ref_locked(TenantId t, DeviceOrdinal d, const SharedRef& r);
  bool drop_ref_locked(TenantId t, DeviceOrdinal d, const SharedRef& r);
  void regroup_locked();
  // Rule 3's Σ borrowed on `d` with `extra` bytes more held by namespace `n`.
  [[nodiscard]] std::uint64_t borrowed_locked(DeviceOrdinal d, NamespaceId n, std::uint64_t extra) const;

  mutable std::mutex mu_;
  std::unordered_map<Key, Usage, KeyHash> map_;
  std::unordered_map<std::uint32_t, NamespaceId> tenant_ns_;  // by TenantId value
  std::map<NsKey, NamespaceUsage> ns_;
  std::map<std::int32_t, Bytes> capacity_;
  std::map<ChunkKey, Chunk> chunks_;
  std::map<std::int32_t, Bytes> unguaranteed_saved_;               // by device
  std::unordered_map<std::uint32_t, std::uint64_t> tenant_refs_;   // TenantId value -> references, all devices
  std::map<std::int32_t, std::pair<Bytes, Bytes>> shared_totals_;  // by device: Σ refs × size, Σ sizes
};

}  // namespace vlake::pool
