// vlake::pool::DevicePool — the physical memory of one GPU, owned as VMM handles.
//
// Every handle is created with the POSIX-fd handle type, exported once (the descriptor is kept
// and sent on every grant; SCM_RIGHTS duplicates it), and mapped read-write in the daemon's
// own address space so it can be scrubbed. A handle is either free (in this pool) or granted
// (owned by a grant, outside the pool) — the caller moves it back with put_back() or retires
// it with retire().
//
// acquire(size, tenant): a free handle of exactly `size` (preferring one last used by the same
// tenant), else a new one; if creating fails with CUDA_ERROR_OUT_OF_MEMORY while free handles
// of other sizes exist, those are released and creation is retried once. A handle is zeroed
// (fill_u8 + synchronize) before it is handed out if it is new or its last tenant differs.
//
// Errors: acquire() throws PoolOutOfMemory when no memory can be had, DriverError for other
// driver failures (nothing leaks: a half-built handle is released). retire()/release_free()
// never throw (failures are logged).
//
// Thread-safety: none; the daemon uses a pool from its event-loop thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/pool/log.hpp"

namespace vlake::pool {

struct PoolHandle {
  PhysicalHandle handle;
  UniqueFd fd;                          // the one export, kept for the handle's life
  Bytes size;
  DevicePtr va;                         // the daemon's read-write mapping
  std::optional<TenantId> last_tenant;  // nullopt: never granted
};

class PoolOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DevicePool {
 public:
  DevicePool(Driver& driver, DeviceOrdinal device, const Logger& log);
  ~DevicePool();  // releases the free handles
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // Creates, exports and releases one granularity-sized handle (the first export in a process
  // is slow on real drivers).
  void warm();

  struct Acquired {
    std::unique_ptr<PoolHandle> handle;
    bool reused = false;    // came from the free pool
    bool scrubbed = false;  // was zeroed for this grant
  };
  // `size` must be a positive multiple of granularity().
  Acquired acquire(Bytes size, TenantId tenant);
  // Returns a granted handle to the free pool; `releaser` becomes its last tenant.
  void put_back(std::unique_ptr<PoolHandle> h, TenantId releaser);
  // Releases a granted handle for good (it may live on in processes that imported it).
  void retire(std::unique_ptr<PoolHandle> h) noexcept;
  // Releases every free handle.
  void release_free() noexcept;

  [[nodiscard]] DeviceOrdinal device() const noexcept { return device_; }
  [[nodiscard]] Bytes granularity() const noexcept { return granularity_; }
  [[nodiscard]] Bytes pool_bytes() const noexcept { return pool_bytes_; }  // free + granted
  [[nodiscard]] Bytes free_bytes() const noexcept { return free_bytes_; }
  [[nodiscard]] std::uint64_t free_handles() const noexcept { return free_.size(); }
  // The largest free handle (0: none): the largest grant acquire() can serve without creating
  // a handle. O(free handles).
  [[nodiscard]] Bytes largest_free_handle() const noexcept {
    Bytes m{0};
    for (const auto& h : free_) m = std::max(m, h->size);
    return m;
  }
  [[nodiscard]] std::uint64_t handles_created() const noexcept { return created_; }
  [[nodiscard]] std::uint64_t handles_released() const noexcept { return released_; }

 private:
  std::unique_ptr<PoolHandle> create(Bytes size);
  void destroy(std::unique_ptr<PoolHandle> h) noexcept;
  void scrub(PoolHandle& h);

  Driver& driver_;
  DeviceOrdinal device_;
  const Logger& log_;
  Bytes granularity_;
  std::vector<std::unique_ptr<PoolHandle>> free_;
  Bytes pool_bytes_{0};
  Bytes free_bytes_{0};
  std::uint64_t created_ = 0;
  std::uint64_t released_ = 0;
};

}  // namespace vlake::pool
