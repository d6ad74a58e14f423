// vlake::pool::DevicePool — the physical memory of one GPU, owned as VMM handles.
//
// Every handle is created with the POSIX-fd handle type, exported once (the descriptor is kept
// and sent on every grant; SCM_RIGHTS duplicates it), and mapped read-write in the daemon's
// own address space so it can be scrubbed. A handle is either free (in this pool) or granted
// (owned by a grant, outside the pool) — the caller moves it back with put_back() or retires
// it with retire().
//
// serve(size, tenant): the handles for one grant, chosen by the planner (planner.hpp): one free
// handle of exactly `size`, several free handles stitched (sizes summing to `size`), a new handle,
// or free handles released (least recently freed first) and then a new one. A handle is zeroed
// (fill_u8 + synchronize) before it is handed out unless it is clean (warm reserve) or its last
// tenant is the same. Every driver call the pool makes is timed into its CostModel.
//
// Binding (set_binding(true): `--handle-reuse tenant`, docs/pool.md "Handle binding"): a
// handle serve() hands out is bound to the tenant it went to, because that tenant received its
// descriptor and can import it for as long as it keeps one. A bound free handle is served to
// that tenant only (the planner never uses another tenant's bound handle); when its memory is
// needed (serve() makes room, retire_bound()) it is retired. Retiring a handle whose
// descriptor left the daemon (retire() of a bound handle, or with `charge`) releases the
// daemon's handle but keeps the daemon's exported descriptor open until settle() finds no
// other process holding that open file description (HolderScan); only then is it closed. Until
// then its bytes are "held" and charged to that tenant: retained(t) = bound free bytes of t +
// held bytes of t. Without binding (`--handle-reuse node`) free handles serve any tenant after
// a scrub, as before.
//
// Idle release (docs/pool.md, "Idle release"): release_idle() gives free handles that stayed
// free for the idle period back to the driver (plan_idle_release, idle_release.hpp): bound
// ones are retired (their descriptor stays held and charged to the tenant until settle() finds
// no other holder, as for any retired bound handle), unbound ones above the keep bound are
// released. A handle's time in the free pool starts when it enters it (put_back, adopt) by
// the clock set with set_clock(), or, without one, at the first release_idle() that sees it.
//
// Kept mappings (docs/hook.md, "Kept mappings"): every handle has a key, unique for this
// pool's life (device ordinal in the top byte), that goes to the tenant with the handle. A
// released handle whose releasing session keeps it mapped carries `kept_by` (that session) while
// free; when serve() hands it to another session or to a grant of several handles, or when it
// is retired (idle release, retire_bound, serve() making room), the keeping session must unmap
// it: the pair goes into take_drops() for the caller to send as Drop. A retired kept handle's
// descriptor is held (charged to its tenant) and is not closed by settle() until the keeper
// said Dropped (dropped()) or ended (forget_session()): the process still maps the memory.
//
// Size classes: the granularity G (tails, fragments), the bulk size B (warm reserve), and exact
// handles (a new handle always has the grant's size).
//
// Errors: serve() throws PoolOutOfMemory when no plan is possible (no free handles that add up,
// no room to create), DriverError for other driver failures (nothing leaks: a half-built handle
// is released, handles taken for a failed grant go back). retire()/release_free() never throw
// (failures are logged).
//
// Thread-safety: none; the daemon uses a pool from its event-loop thread only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/pool/handle_builder.hpp"
#include "vlake/pool/planner.hpp"
#include "vlake/pool/servable.hpp"

namespace vlake::pool {

// Holders of descriptors: for each fd (this process's), the number of other processes that
// hold the same open file description (0: none). A holder the scan cannot rule out counts as
// one. Called from the event-loop thread; must not throw (a throw counts every fd as held).
using HolderScan = std::function<std::vector<std::uint32_t>(const std::vector<int>& fds)>;

struct PoolHandle {
  PhysicalHandle handle;
  UniqueFd fd;  // the one export, kept for the handle's life
  Bytes size;
  DevicePtr va;                         // the daemon's read-write mapping
  std::optional<TenantId> last_tenant;  // nullopt: never granted
  bool clean = false;                   // known to hold zeros (warm reserve): no scrub needed
  std::uint64_t freed_seq = 0;          // when it entered the free pool (LRU order)
  std::optional<TenantId> bound;        // binding on: the tenant its descriptor went to
  // When it entered the free pool (idle release); nullopt: not yet seen by a clock.
  std::optional<std::chrono::steady_clock::time_point> freed_at;
  std::uint64_t key = 0;      // kept mappings: unique for the pool's life, nonzero
  std::uint64_t kept_by = 0;  // free: the session that keeps it mapped (0: none)
};

// A kept handle its keeper must unmap (docs/hook.md, "Kept mappings").
struct DropNote {
  std::uint64_t session = 0;
  std::uint64_t key = 0;
};

class PoolOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DevicePool {
 public:
  // bulk: the bulk size class (a multiple of the granularity; rounded up).
  DevicePool(Driver& driver, DeviceOrdinal device, const Logger& log, Bytes bulk = Bytes{64ull << 20});
  ~DevicePool();  // releases the free handles
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // Creates, exports and releases one granularity-sized handle (the first export in a process
  // is slow on real drivers).
  void warm();

  struct Served {
    std::vector<std::unique_ptr<PoolHandle>> handles;  // in VA order; sizes sum to the grant
    PlanKind kind = PlanKind::none;
    std::uint32_t reused = 0;    // handles that came from the free pool
    std::uint32_t scrubbed = 0;  // handles zeroed for this grant
    std::uint32_t clean = 0;     // handles that came clean (warm reserve or stock)
    bool cross_tenant = false;   // a handle another tenant freed
    std::uint64_t released = 0;  // free handles released to make room
  };
  // `size` must be a positive multiple of granularity(); max_handles 1..32 (1: the handle goes
  // to the application). `session`: the requesting session (kept mappings: an exact handle it
  // keeps mapped is preferred; one another session keeps is dropped there).
  Served serve(Bytes size, TenantId tenant, std::uint32_t max_handles = 32, std::uint64_t session = 0);
  // What serve(size) lacks: size minus (GPU free memory + free pool bytes), at least 0.
  [[nodiscard]] Bytes shortfall(Bytes size);
  // Warm reserve and warm stock (warm_stock.hpp): adds a handle built elsewhere
  // (handle_builder.hpp, zeroed: clean) to the free pool, unbound; its build times go into the
  // cost model. clean_stock(): the clean, unbound free handles by size. take_clean(size): one of
  // them (the least recently added) leaves the pool, its bytes no longer counted, for the caller
  // to release (release_built(), e.g. on a HandleBuilder worker: unmapping is slow on some
  // drivers); nullopt if there is none.
  void adopt(BuiltHandle b);
  [[nodiscard]] std::map<std::uint64_t, std::uint32_t> clean_stock() const;
  std::optional<BuiltHandle> take_clean(Bytes size);
  // Returns a granted handle to the free pool; `releaser` becomes its last tenant; `kept_by`:
  // the session that keeps it mapped (0: none; ignored without binding).
  void put_back(std::unique_ptr<PoolHandle> h, TenantId releaser, std::uint64_t kept_by = 0);
  // Kept mappings: `session` no longer maps these keys (Dropped) / anything (it ended). True if
  // a held descriptor became closable (call settle()).
  bool dropped(std::uint64_t session, std::span<const std::uint64_t> keys) noexcept;
  bool forget_session(std::uint64_t session) noexcept;
  // The kept handles whose keepers must unmap them, since the last call.
  [[nodiscard]] std::vector<DropNote> take_drops() noexcept { return std::exchange(drops_, {}); }
  // Retired bytes still mapped by their keeper (a Drop is on its way): memory that returns to
  // the GPU once the keeper says Dropped. `except`: not counting that session's.
  [[nodiscard]] Bytes pinned_bytes(std::uint64_t except = 0) const noexcept;
  // Bytes `session` keeps mapped: free handles it keeps + retired ones it still maps.
  [[nodiscard]] Bytes kept_by(std::uint64_t session) const noexcept;
  // Releases a granted handle for good (it may live on in processes that imported it). A
  // bound handle, or any handle with `charge` (its descriptor went to that tenant), keeps its
  // descriptor open, held and charged to that tenant, until settle() finds no other holder.
  void retire(std::unique_ptr<PoolHandle> h, std::optional<TenantId> charge = std::nullopt) noexcept;
  // Retires free handles bound to `t`, least recently freed first, until at least `bytes`
  // (all of them for Bytes{~0}) were retired; returns the bytes retired. Call settle() after.
  Bytes retire_bound(TenantId t, Bytes bytes) noexcept;
  // Scans held descriptors (one HolderScan call) and closes those nobody else holds: all of
  // them (`all`, the periodic rescan), or only those retired since the last scan (cheap when
  // nothing new was retired: no scan at all). No scan configured: every held descriptor is
  // closed. Returns true if any was closed.
  bool settle(bool all = false) noexcept;
  // Idle release: gives back to the driver the free handles plan_idle_release() picks at `now`
  // (idle period `idle`, keep bound `keep` on unbound free bytes, `warm` on clean ones), least
  // recently freed first.
  // Bound handles are retired (descriptor held and charged until settle(): call it after).
  // Never throws (failures are logged by destroy()).
  struct IdleReleased {
    std::uint64_t handles = 0;
    Bytes bytes{0};
    std::uint64_t bound = 0;  // of them, bound handles (retired)
  };
  // `protect`: per size, that many clean unbound free handles (the most recently added) are not
  // considered at all (what the warm reserve and stock want: warm_stock.hpp).
  IdleReleased release_idle(std::chrono::steady_clock::time_point now, std::chrono::milliseconds idle, Bytes keep,
                            const std::map<std::uint64_t, std::uint32_t>& protect = {}) noexcept;
  // Bytes given back by release_idle() since the pool was made.
  [[nodiscard]] Bytes idle_released_bytes() const noexcept { return idle_released_bytes_; }
  // The time put_back()/adopt() stamp a handle with (unset: release_idle() stamps it).
  void set_clock(std::function<std::chrono::steady_clock::time_point()> clock) { clock_ = std::move(clock); }
  // Releases every free handle and closes every held descriptor (shutdown).
  void release_free() noexcept;
  // The tenant's record was freed and its id may be reused: free handles it last held lose
  // their last tenant (so they are scrubbed before anyone's next grant).
  void forget_tenant(TenantId tenant) noexcept;

  // Binding and the holder scan (docs/pool.md, "Handle binding"); set before the first serve()
  // (the Node sets them when it creates the pool).
  void set_binding(bool bind);
  void set_holder_scan(HolderScan scan) { scan_ = std::move(scan); }
  [[nodiscard]] bool binding() const noexcept { return bind_; }
  // What tenant `t` can still reach of released memory here: its bound free handles + its held
  // descriptors' bytes.
  [[nodiscard]] Bytes retained(TenantId t) const noexcept;
  // Every tenant with retained bytes here (by TenantId value).
  [[nodiscard]] std::map<std::uint32_t, Bytes> retained_all() const;
  [[nodiscard]] Bytes bound_free_bytes(TenantId t) const noexcept;
  [[nodiscard]] Bytes held_fd_bytes() const noexcept { return held_bytes_; }
  [[nodiscard]] std::uint64_t held_fds() const noexcept { return held_.size(); }
  // Retired handles a scan found held by another process (each counted once).
  [[nodiscard]] std::uint64_t retired_held() const noexcept { return retired_held_; }

  [[nodiscard]] DeviceOrdinal device() const noexcept { return device_; }
  [[nodiscard]] Bytes granularity() const noexcept { return granularity_; }
  [[nodiscard]] Bytes pool_bytes() const noexcept { return pool_bytes_; }  // free + granted
  [[nodiscard]] Bytes free_bytes() const noexcept { return free_bytes_; }
  [[nodiscard]] std::uint64_t free_handles() const noexcept { return free_.size(); }
  // The largest free handle (0: none): the largest grant serve() can serve in one handle without creating
  // a handle. O(free handles).
  [[nodiscard]] Bytes largest_free_handle() const noexcept {
    Bytes m{0};
    for (const auto& h : free_) m = std::max(m, h->size);
    return m;
  }
  // The largest grant of up to `max_handles` handles the free pool serves without creating a
  // handle, for the best-placed tenant and for a tenant with no bound handle (servable.hpp;
  // bindings count only with binding on). O(free handles) after the free list changed, O(1)
  // otherwise (the state is published after every event; most events change no free handle).
  [[nodiscard]] Servable servable(std::uint32_t max_handles) const;
  [[nodiscard]] std::uint64_t handles_created() const noexcept { return created_; }
  [[nodiscard]] Bytes bulk_size() const noexcept { return bulk_; }
  [[nodiscard]] std::uint64_t free_small_handles() const noexcept;
  [[nodiscard]] std::uint64_t free_bulk_handles() const noexcept;
  [[nodiscard]] Bytes peak_bytes() const noexcept { return peak_bytes_; }  // highest pool_bytes
  [[nodiscard]] const CostModel& costs() const noexcept { return costs_; }
  CostModel& costs() noexcept { return costs_; }
  [[nodiscard]] std::uint64_t handles_released() const noexcept { return released_; }

 private:
  struct Held {
    UniqueFd fd;
    Bytes size{0};
    TenantId tenant{};
    bool seen_held = false;  // a scan found a holder (counted in retired_held_)
    bool scanned = false;    // a scan has looked at it
    std::uint64_t key = 0;
    std::uint64_t kept_by = 0;  // a session still maps it: held whatever the scan says
  };
  void note_drop(PoolHandle& h) noexcept;
  // Clears `kept_by` of the free and held handles of `session` that `match` accepts (by key);
  // true if a held one became closable.
  bool unkeep(std::uint64_t session, const std::function<bool(std::uint64_t key)>& match) noexcept;
  std::unique_ptr<PoolHandle> create(Bytes size);
  // A built handle becomes the pool's (key, counters, its build times into the cost model).
  std::unique_ptr<PoolHandle> own(BuiltHandle b);
  // `h` joins the free pool: freed now (LRU order, idle clock), counted and indexed.
  void enter_free(std::unique_ptr<PoolHandle> h);
  void destroy(std::unique_ptr<PoolHandle> h) noexcept;
  // destroy(), keeping the exported descriptor in held_ charged to `t`.
  void destroy_keep_fd(std::unique_ptr<PoolHandle> h, TenantId t) noexcept;
  // A free handle leaves the free pool (bookkeeping of free and bound bytes).
  void unfree(const PoolHandle& h) noexcept;
  void index_free(const PoolHandle& h);  // h joins free_
  void scrub(PoolHandle& h);
  PlanInput plan_input(Bytes size, TenantId tenant, std::uint32_t max_handles, Bytes device_free,
                       std::uint64_t session) const;
  Bytes device_free();

  Driver& driver_;
  DeviceOrdinal device_;
  const Logger& log_;
  Bytes granularity_;
  std::vector<std::unique_ptr<PoolHandle>> free_;
  std::uint64_t free_version_ = 0;  // +1 whenever free_ gains or loses a handle
  // The free handles' sizes, largest first: unbound ones, and per tenant those bound to it
  // (binding on only); and the counts of the two size classes. Kept with free_ (index_free(),
  // unfree()) so that publishing the figures needs no pass over every free handle.
  std::multiset<std::uint64_t, std::greater<>> unbound_sizes_;
  std::map<std::uint32_t, std::multiset<std::uint64_t, std::greater<>>> bound_sizes_;
  std::uint64_t free_small_ = 0;
  std::uint64_t free_bulk_ = 0;
  struct ServableCache {
    std::uint64_t version = 0;
    std::uint32_t max_handles = 0;
    Servable value;
  };
  mutable std::optional<ServableCache> servable_cache_;
  Bytes pool_bytes_{0};
  Bytes free_bytes_{0};
  std::uint64_t created_ = 0;
  std::uint64_t released_ = 0;
  Bytes bulk_;
  Bytes peak_bytes_{0};
  std::uint64_t freed_seq_ = 0;
  CostModel costs_;
  bool bind_ = false;
  HolderScan scan_;
  std::map<std::uint32_t, Bytes> bound_free_;  // by TenantId value
  std::vector<Held> held_;
  Bytes held_bytes_{0};
  std::uint64_t retired_held_ = 0;
  std::function<std::chrono::steady_clock::time_point()> clock_;
  Bytes idle_released_bytes_{0};
  std::uint64_t next_key_;
  std::vector<DropNote> drops_;
};

}  // namespace vlake::pool
