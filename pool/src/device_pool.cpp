#include "vlake/pool/device_pool.hpp"

#include <cuda.h>

#include <algorithm>
#include <string>

namespace vlake::pool {

DevicePool::DevicePool(Driver& driver, DeviceOrdinal device, const Logger& log)
    : driver_(driver), device_(device), log_(log), granularity_(driver.granularity(device)) {}

DevicePool::~DevicePool() { release_free(); }

void DevicePool::warm() {
  const PhysicalHandle h = driver_.create(device_, granularity_);
  try {
    UniqueFd fd = driver_.export_fd(h);
  } catch (...) {
    driver_.release(h);
    throw;
  }
  driver_.release(h);
}

std::unique_ptr<PoolHandle> DevicePool::create(Bytes size) {
  auto h = std::make_unique<PoolHandle>();
  h->size = size;
  h->handle = driver_.create(device_, size);
  bool reserved = false;
  bool mapped = false;
  try {
    h->fd = driver_.export_fd(h->handle);
    h->va = driver_.reserve(size, granularity_);
    reserved = true;
    driver_.map(h->va, size, h->handle);
    mapped = true;
    driver_.set_access(h->va, size, device_, Access::read_write);
  } catch (...) {
    try {
      if (mapped) driver_.unmap(h->va, size);
      if (reserved) driver_.free_reservation(h->va, size);
      driver_.release(h->handle);
    } catch (...) {
    }
    throw;
  }
  ++created_;
  pool_bytes_ += size;
  return h;
}

void DevicePool::destroy(std::unique_ptr<PoolHandle> h) noexcept {
  if (!h) return;
  try {
    driver_.unmap(h->va, h->size);
    driver_.free_reservation(h->va, h->size);
    driver_.release(h->handle);
  } catch (const std::exception& e) {
    log_.error("device " + std::to_string(device_.value()) + ": releasing a pool handle failed: " + e.what());
  }
  ++released_;
  pool_bytes_ -= h->size;
}

void DevicePool::scrub(PoolHandle& h) {
  // memory_info(d) makes device d's primary context current on this thread: the fill runs on
  // the GPU that owns the memory.
  (void)driver_.memory_info(device_);
  driver_.fill_u8(h.va, 0, h.size);
  driver_.synchronize();
}

DevicePool::Acquired DevicePool::acquire(Bytes size, TenantId tenant) {
  Acquired out;
  auto pick = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if ((*it)->size != size) continue;
    if ((*it)->last_tenant == tenant) {
      pick = it;
      break;
    }
    if (pick == free_.end()) pick = it;
  }
  if (pick != free_.end()) {
    out.handle = std::move(*pick);
    free_.erase(pick);
    free_bytes_ -= size;
    out.reused = true;
  } else {
    try {
      out.handle = create(size);
    } catch (const DriverError& e) {
      if (e.code() != CUDA_ERROR_OUT_OF_MEMORY) throw;
      if (free_.empty()) throw PoolOutOfMemory(e.what());
      log_.info("device " + std::to_string(device_.value()) + ": out of memory for " +
                std::to_string(size.value()) + " bytes; releasing " + std::to_string(free_.size()) +
                " free handles of other sizes");
      release_free();
      try {
        out.handle = create(size);
      } catch (const DriverError& e2) {
        if (e2.code() == CUDA_ERROR_OUT_OF_MEMORY) throw PoolOutOfMemory(e2.what());
        throw;
      }
    }
  }
  if (!out.handle->last_tenant || *out.handle->last_tenant != tenant) {
    try {
      scrub(*out.handle);
    } catch (...) {
      // A handle that could not be zeroed is never handed out.
      destroy(std::move(out.handle));
      throw;
    }
    out.scrubbed = true;
  }
  out.handle->last_tenant = tenant;
  return out;
}

void DevicePool::put_back(std::unique_ptr<PoolHandle> h, TenantId releaser) {
  if (!h) return;
  h->last_tenant = releaser;
  free_bytes_ += h->size;
  free_.push_back(std::move(h));
}

void DevicePool::retire(std::unique_ptr<PoolHandle> h) noexcept { destroy(std::move(h)); }

void DevicePool::release_free() noexcept {
  for (auto& h : free_) {
    free_bytes_ -= h->size;
    destroy(std::move(h));
  }
  free_.clear();
}

}  // namespace vlake::pool
