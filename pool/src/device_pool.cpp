#include "vlake/pool/device_pool.hpp"

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace vlake::pool {

namespace {

// Runs f() and folds its duration into `costs` (also when it throws: a failed call took time too,
// but its duration says little; only successes are folded).
template <class F>
auto timed(CostModel& costs, CostModel::Call call, Bytes bytes, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  if constexpr (std::is_void_v<decltype(f())>) {
    f();
    costs.observe(
        call,
        static_cast<double>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()),
        bytes);
  } else {
    auto r = f();
    costs.observe(
        call,
        static_cast<double>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()),
        bytes);
    return r;
  }
}

}  // namespace

DevicePool::DevicePool(Driver& driver, DeviceOrdinal device, const Logger& log, Bytes bulk)
    : driver_(driver),
      device_(device),
      log_(log),
      granularity_(driver.granularity(device)),
      bulk_(round_up(std::max(bulk, granularity_), granularity_)) {}

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
  h->handle = timed(costs_, CostModel::Call::create, size, [&] { return driver_.create(device_, size); });
  bool reserved = false;
  bool mapped = false;
  try {
    h->fd = timed(costs_, CostModel::Call::export_fd, size, [&] { return driver_.export_fd(h->handle); });
    h->va = driver_.reserve(size, granularity_);
    reserved = true;
    timed(costs_, CostModel::Call::map, size, [&] { driver_.map(h->va, size, h->handle); });
    mapped = true;
    timed(costs_, CostModel::Call::set_access, size,
          [&] { driver_.set_access(h->va, size, device_, Access::read_write); });
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
  peak_bytes_ = std::max(peak_bytes_, pool_bytes_);
  return h;
}

void DevicePool::destroy(std::unique_ptr<PoolHandle> h) noexcept {
  if (!h) return;
  try {
    timed(costs_, CostModel::Call::release, h->size, [&] {
      driver_.unmap(h->va, h->size);
      driver_.free_reservation(h->va, h->size);
      driver_.release(h->handle);
    });
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
  timed(costs_, CostModel::Call::scrub, h.size, [&] {
    driver_.fill_u8(h.va, 0, h.size);
    driver_.synchronize();
  });
}

Bytes DevicePool::device_free() { return driver_.memory_info(device_).free; }

PlanInput DevicePool::plan_input(Bytes size, TenantId tenant, std::uint32_t max_handles, Bytes dev_free) const {
  PlanInput in;
  in.bytes = size;
  in.tenant = tenant;
  in.device_free = dev_free;
  in.max_handles = max_handles;
  in.free.reserve(free_.size());
  for (const auto& h : free_) in.free.push_back(FreeHandleView{h->size, h->last_tenant, h->clean, h->freed_seq});
  return in;
}

Bytes DevicePool::shortfall(Bytes size) {
  const std::uint64_t have = device_free().value() + free_bytes_.value();
  return Bytes{size.value() > have ? size.value() - have : 0};
}

DevicePool::Served DevicePool::serve(Bytes size, TenantId tenant, std::uint32_t max_handles) {
  Served out;
  // An exact fit is the cheapest plan whatever the GPU's free memory (cost model, docs/pool.md):
  // skip the driver query (cuMemGetInfo, several microseconds) on that path.
  const bool exact_fit =
      std::any_of(free_.begin(), free_.end(), [size](const std::unique_ptr<PoolHandle>& h) { return h->size == size; });
  Bytes dev_free = exact_fit ? Bytes{0} : device_free();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const PlanInput in = plan_input(size, tenant, max_handles, dev_free);
    const Plan p = plan(in, costs_);
    if (log_.enabled(LogLevel::debug)) {
      log_.debug("device " + std::to_string(device_.value()) + ": plan for " + std::to_string(size.value()) +
                 " bytes: " + plan_kind_name(p.kind) + " (" + std::to_string(p.use.size()) + " free, " +
                 std::to_string(p.release.size()) + " released, est " + std::to_string(p.cost_ns / 1000.0) + " us)");
    }
    if (p.kind == PlanKind::none) {
      throw PoolOutOfMemory("no free handles add up to " + std::to_string(size.value()) +
                            " bytes and the GPU has no room for a new handle");
    }
    if (p.kind == PlanKind::exact || p.kind == PlanKind::stitch) {
      // Take the handles out of the free list (indices refer to free_ as described).
      std::vector<std::unique_ptr<PoolHandle>> taken;
      for (std::size_t i : p.use) taken.push_back(std::move(free_[i]));
      std::erase_if(free_, [](const std::unique_ptr<PoolHandle>& h) { return !h; });
      for (const auto& h : taken) free_bytes_ -= h->size;
      for (std::size_t k = 0; k < taken.size(); ++k) {
        PoolHandle& h = *taken[k];
        const FreeHandleView v{h.size, h.last_tenant, h.clean, h.freed_seq};
        if (!needs_scrub(v, tenant)) continue;
        try {
          scrub(h);
        } catch (...) {
          // A handle that could not be zeroed is never handed out; the others go back.
          destroy(std::move(taken[k]));
          for (auto& o : taken) {
            if (o) {
              free_bytes_ += o->size;
              free_.push_back(std::move(o));
            }
          }
          throw;
        }
        ++out.scrubbed;
      }
      out.cross_tenant = p.cross_tenant;
      out.reused = static_cast<std::uint32_t>(taken.size());
      out.kind = p.kind;
      out.handles = std::move(taken);
      break;
    }
    // create, maybe after releasing free handles
    if (p.kind == PlanKind::release_create) {
      log_.info("device " + std::to_string(device_.value()) + ": no room for " + std::to_string(size.value()) +
                " bytes; releasing " + std::to_string(p.release.size()) + " free handle(s), least recently used first");
      for (std::size_t i : p.release) {
        free_bytes_ -= free_[i]->size;
        destroy(std::move(free_[i]));
        ++out.released;
      }
      std::erase_if(free_, [](const std::unique_ptr<PoolHandle>& h) { return !h; });
    }
    try {
      out.handles.push_back(create(size));
    } catch (const DriverError& e) {
      if (e.code() != CUDA_ERROR_OUT_OF_MEMORY) throw;
      if (attempt == 0) {
        dev_free = Bytes{0};  // the GPU had less than it said: plan again without creating
        continue;
      }
      throw PoolOutOfMemory(e.what());
    }
    try {
      scrub(*out.handles.front());
    } catch (...) {
      destroy(std::move(out.handles.front()));
      throw;
    }
    out.scrubbed = 1;
    out.kind = p.kind;
    break;
  }
  for (auto& h : out.handles) {
    h->last_tenant = tenant;
    h->clean = false;
  }
  return out;
}

std::uint64_t DevicePool::refill(Bytes target, std::uint64_t max_handles) {
  std::uint64_t made = 0;
  const std::uint64_t small_target =
      std::min<std::uint64_t>(target.value() / 8 / granularity_.value() * granularity_.value(), 32ull << 20);
  while (made < max_handles && free_bytes_ < target) {
    const std::uint64_t deficit = (target - free_bytes_).value();
    const std::uint64_t small_have = free_small_handles() * granularity_.value();
    Bytes size = granularity_;
    if (small_have >= small_target && deficit >= bulk_.value()) size = bulk_;
    std::unique_ptr<PoolHandle> h;
    try {
      h = create(size);
      scrub(*h);
    } catch (const DriverError& e) {
      if (h) destroy(std::move(h));
      if (e.code() == CUDA_ERROR_OUT_OF_MEMORY) break;
      throw;
    }
    h->clean = true;
    h->freed_seq = ++freed_seq_;
    free_bytes_ += h->size;
    free_.push_back(std::move(h));
    ++made;
  }
  return made;
}

void DevicePool::forget_tenant(TenantId tenant) noexcept {
  for (auto& h : free_) {
    if (h->last_tenant == tenant) h->last_tenant.reset();
  }
}

void DevicePool::put_back(std::unique_ptr<PoolHandle> h, TenantId releaser) {
  if (!h) return;
  h->last_tenant = releaser;
  h->clean = false;
  h->freed_seq = ++freed_seq_;
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

std::uint64_t DevicePool::free_small_handles() const noexcept {
  return static_cast<std::uint64_t>(
      std::count_if(free_.begin(), free_.end(), [&](const auto& h) { return h->size == granularity_; }));
}

std::uint64_t DevicePool::free_bulk_handles() const noexcept {
  return static_cast<std::uint64_t>(
      std::count_if(free_.begin(), free_.end(), [&](const auto& h) { return h->size == bulk_; }));
}

}  // namespace vlake::pool
