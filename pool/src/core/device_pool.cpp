#include "vlake/pool/device_pool.hpp"

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "vlake/pool/idle_release.hpp"

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
      bulk_(round_up(std::max(bulk, granularity_), granularity_)),
      next_key_((static_cast<std::uint64_t>(device.value()) << 56) + 1) {}

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

std::unique_ptr<PoolHandle> DevicePool::own(BuiltHandle b) {
  if (b.create_ns > 0) costs_.observe(CostModel::Call::create, b.create_ns, b.size);
  if (b.export_ns > 0) costs_.observe(CostModel::Call::export_fd, b.export_ns, b.size);
  if (b.map_ns > 0) costs_.observe(CostModel::Call::map, b.map_ns, b.size);
  if (b.set_access_ns > 0) costs_.observe(CostModel::Call::set_access, b.set_access_ns, b.size);
  if (b.scrub_ns > 0) costs_.observe(CostModel::Call::scrub, b.scrub_ns, b.size);
  auto h = std::make_unique<PoolHandle>();
  h->size = b.size;
  h->handle = b.handle;
  h->fd = std::move(b.fd);
  h->va = b.va;
  h->clean = b.zeroed;
  h->key = next_key_++;
  ++created_;
  pool_bytes_ += h->size;
  peak_bytes_ = std::max(peak_bytes_, pool_bytes_);
  return h;
}

std::unique_ptr<PoolHandle> DevicePool::create(Bytes size) {
  return own(build_handle(driver_, device_, size, granularity_, false));
}

void DevicePool::adopt(BuiltHandle b) {
  try {
    free_.reserve(free_.size() + 1);
  } catch (...) {
    release_built(driver_, b);
    throw;
  }
  enter_free(own(std::move(b)));
}

void DevicePool::enter_free(std::unique_ptr<PoolHandle> h) {
  h->freed_seq = ++freed_seq_;
  h->freed_at.reset();
  if (clock_) {
    try {
      h->freed_at = clock_();
    } catch (...) {
      // No time: release_idle() stamps it.
    }
  }
  free_bytes_ += h->size;
  if (h->bound) bound_free_[h->bound->value()] += h->size;
  index_free(*h);
  free_.push_back(std::move(h));
}

std::map<std::uint64_t, std::uint32_t> DevicePool::clean_stock() const {
  std::map<std::uint64_t, std::uint32_t> out;
  for (const auto& h : free_) {
    if (h->clean && !h->bound && h->kept_by == 0) ++out[h->size.value()];
  }
  return out;
}

std::optional<BuiltHandle> DevicePool::take_clean(Bytes size) {
  std::size_t best = free_.size();
  for (std::size_t i = 0; i < free_.size(); ++i) {
    const PoolHandle& h = *free_[i];
    if (h.size != size || !h.clean || h.bound || h.kept_by != 0) continue;
    if (best == free_.size() || h.freed_seq < free_[best]->freed_seq) best = i;
  }
  if (best == free_.size()) return std::nullopt;
  std::unique_ptr<PoolHandle> h = std::move(free_[best]);
  free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
  unfree(*h);
  BuiltHandle b;
  b.handle = h->handle;
  b.fd = std::move(h->fd);
  b.va = h->va;
  b.size = h->size;
  ++released_;
  pool_bytes_ -= h->size;
  return b;
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

void DevicePool::destroy_keep_fd(std::unique_ptr<PoolHandle> h, TenantId t) noexcept {
  if (!h) return;
  Held held;
  held.fd = std::move(h->fd);
  held.size = h->size;
  held.tenant = t;
  held.key = h->key;
  held.kept_by = h->kept_by;
  if (h->kept_by != 0) note_drop(*h);
  try {
    held_.push_back(std::move(held));
    held_bytes_ += h->size;
  } catch (...) {
    // No room to remember it: closing the descriptor now is the only way out (logged).
    log_.error("device " + std::to_string(device_.value()) + ": a retired handle's descriptor was closed unscanned");
  }
  destroy(std::move(h));
}

void DevicePool::note_drop(PoolHandle& h) noexcept {
  if (h.kept_by == 0) return;
  try {
    drops_.push_back(DropNote{h.kept_by, h.key});
  } catch (...) {
    // No room for the note: the keeper keeps its mapping until it ends (charged meanwhile).
  }
}

bool DevicePool::unkeep(std::uint64_t session, const std::function<bool(std::uint64_t key)>& match) noexcept {
  bool closable = false;
  for (auto& h : free_) {
    if (h->kept_by == session && match(h->key)) h->kept_by = 0;
  }
  for (Held& h : held_) {
    if (h.kept_by == session && match(h.key)) {
      h.kept_by = 0;
      h.scanned = false;  // settle() looks at it again
      closable = true;
    }
  }
  return closable;
}

bool DevicePool::dropped(std::uint64_t session, std::span<const std::uint64_t> keys) noexcept {
  return unkeep(session, [keys](std::uint64_t k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); });
}

bool DevicePool::forget_session(std::uint64_t session) noexcept {
  std::erase_if(drops_, [&](const DropNote& n) { return n.session == session; });
  return unkeep(session, [](std::uint64_t) { return true; });
}

Bytes DevicePool::pinned_bytes(std::uint64_t except) const noexcept {
  Bytes b{0};
  for (const Held& h : held_) {
    if (h.kept_by != 0 && h.kept_by != except) b += h.size;
  }
  return b;
}

Bytes DevicePool::kept_by(std::uint64_t session) const noexcept {
  Bytes b{0};
  for (const auto& h : free_) {
    if (h->kept_by == session) b += h->size;
  }
  for (const Held& h : held_) {
    if (h.kept_by == session) b += h.size;
  }
  return b;
}

void DevicePool::set_binding(bool bind) {
  bind_ = bind;
  // The size index files handles by binding: rebuilt for any handle already free.
  unbound_sizes_.clear();
  bound_sizes_.clear();
  free_small_ = 0;
  free_bulk_ = 0;
  for (const auto& h : free_) index_free(*h);
}

void DevicePool::index_free(const PoolHandle& h) {
  ++free_version_;
  if (bind_ && h.bound) bound_sizes_[h.bound->value()].insert(h.size.value());
  else unbound_sizes_.insert(h.size.value());
  if (h.size == granularity_) ++free_small_;
  if (h.size == bulk_) ++free_bulk_;
}

void DevicePool::unfree(const PoolHandle& h) noexcept {
  ++free_version_;
  if (bind_ && h.bound) {
    auto t = bound_sizes_.find(h.bound->value());
    if (t != bound_sizes_.end()) {
      if (auto it = t->second.find(h.size.value()); it != t->second.end()) t->second.erase(it);
      if (t->second.empty()) bound_sizes_.erase(t);
    }
  } else if (auto it = unbound_sizes_.find(h.size.value()); it != unbound_sizes_.end()) {
    unbound_sizes_.erase(it);
  }
  if (h.size == granularity_) --free_small_;
  if (h.size == bulk_) --free_bulk_;
  free_bytes_ -= h.size;
  if (h.bound) {
    auto it = bound_free_.find(h.bound->value());
    if (it != bound_free_.end()) {
      it->second -= std::min(it->second, h.size);
      if (it->second.value() == 0) bound_free_.erase(it);
    }
  }
}

void DevicePool::scrub(PoolHandle& h) {
  // The fill runs on the GPU that owns the memory (no cuMemGetInfo: a scrub is on the grant path).
  driver_.make_current(device_);
  timed(costs_, CostModel::Call::scrub, h.size, [&] {
    driver_.fill_u8(h.va, 0, h.size);
    driver_.synchronize();
  });
}

Bytes DevicePool::device_free() { return driver_.memory_info(device_).free; }

PlanInput DevicePool::plan_input(Bytes size, TenantId tenant, std::uint32_t max_handles, Bytes dev_free,
                                 std::uint64_t session) const {
  PlanInput in;
  in.bytes = size;
  in.tenant = tenant;
  in.device_free = dev_free;
  in.max_handles = max_handles;
  in.free.reserve(free_.size());
  for (const auto& h : free_) {
    FreeHandleView v{h->size, h->last_tenant, h->clean, h->freed_seq, bind_ && h->bound && *h->bound != tenant};
    v.kept_here = session != 0 && h->kept_by == session;
    v.kept_elsewhere = h->kept_by != 0 && h->kept_by != session;
    in.free.push_back(v);
  }
  return in;
}

Bytes DevicePool::shortfall(Bytes size) {
  const std::uint64_t have = device_free().value() + free_bytes_.value();
  return Bytes{size.value() > have ? size.value() - have : 0};
}

DevicePool::Served DevicePool::serve(Bytes size, TenantId tenant, std::uint32_t max_handles, std::uint64_t session) {
  Served out;
  // An exact fit is the cheapest plan whatever the GPU's free memory (cost model, docs/pool.md):
  // skip the driver query (cuMemGetInfo, several microseconds) on that path.
  const bool exact_fit = std::any_of(free_.begin(), free_.end(), [&](const std::unique_ptr<PoolHandle>& h) {
    return h->size == size && !(bind_ && h->bound && *h->bound != tenant);
  });
  Bytes dev_free = exact_fit ? Bytes{0} : device_free();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const PlanInput in = plan_input(size, tenant, max_handles, dev_free, session);
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
      for (const auto& h : taken) unfree(*h);
      // A kept mapping survives only an exact reuse by its own session.
      for (auto& h : taken) {
        if (h->kept_by != 0 && (h->kept_by != session || taken.size() > 1)) note_drop(*h);
      }
      for (std::size_t k = 0; k < taken.size(); ++k) {
        PoolHandle& h = *taken[k];
        if (h.clean) ++out.clean;
        const FreeHandleView v{h.size, h.last_tenant, h.clean, h.freed_seq};
        if (!needs_scrub(v, tenant)) continue;
        try {
          scrub(h);
        } catch (...) {
          // A handle that could not be zeroed is never handed out; the others go back.
          if (const std::optional<TenantId> t = taken[k]->bound) destroy_keep_fd(std::move(taken[k]), *t);
          else destroy(std::move(taken[k]));
          for (auto& o : taken) {
            if (o) {
              const std::uint64_t seq = o->freed_seq;
              const auto at = o->freed_at;
              const TenantId releaser = o->last_tenant.value_or(tenant);
              const std::uint64_t kept = o->kept_by;
              put_back(std::move(o), releaser, kept);
              free_.back()->freed_seq = seq;
              free_.back()->freed_at = at;
            }
          }
          (void)settle();
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
      bool kept_fds = false;
      for (std::size_t i : p.release) {
        unfree(*free_[i]);
        if (free_[i]->bound) {
          // Its descriptor went to a tenant: the memory returns only once nobody holds one.
          const TenantId t = *free_[i]->bound;
          destroy_keep_fd(std::move(free_[i]), t);
          kept_fds = true;
        } else {
          destroy(std::move(free_[i]));
        }
        ++out.released;
      }
      std::erase_if(free_, [](const std::unique_ptr<PoolHandle>& h) { return !h; });
      if (kept_fds) (void)settle();
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
    h->kept_by = 0;  // granted; the release says whether it stays mapped
    if (bind_) h->bound = tenant;
  }
  return out;
}

void DevicePool::forget_tenant(TenantId tenant) noexcept {
  for (auto& h : free_) {
    if (h->last_tenant == tenant) h->last_tenant.reset();
  }
}

void DevicePool::put_back(std::unique_ptr<PoolHandle> h, TenantId releaser, std::uint64_t kept_by) {
  if (!h) return;
  h->kept_by = bind_ ? kept_by : 0;
  h->last_tenant = releaser;
  h->clean = false;
  enter_free(std::move(h));
}

void DevicePool::retire(std::unique_ptr<PoolHandle> h, std::optional<TenantId> charge) noexcept {
  if (!h) return;
  if (h->bound) charge = *h->bound;
  if (charge) destroy_keep_fd(std::move(h), *charge);
  else destroy(std::move(h));
}

Bytes DevicePool::retire_bound(TenantId t, Bytes bytes) noexcept {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]->bound && *free_[i]->bound == t) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return free_[a]->freed_seq < free_[b]->freed_seq; });
  Bytes done{0};
  for (std::size_t i : order) {
    if (done >= bytes) break;
    done += free_[i]->size;
    unfree(*free_[i]);
    destroy_keep_fd(std::move(free_[i]), t);
  }
  std::erase_if(free_, [](const std::unique_ptr<PoolHandle>& h) { return !h; });
  return done;
}

DevicePool::IdleReleased DevicePool::release_idle(std::chrono::steady_clock::time_point now,
                                                  std::chrono::milliseconds idle, Bytes keep,
                                                  const std::map<std::uint64_t, std::uint32_t>& protect) noexcept {
  IdleReleased out;
  if (idle.count() <= 0 || free_.empty()) return out;
  std::vector<IdleHandleView> views;
  std::vector<std::size_t> index;  // views[k] is free_[index[k]]
  try {
    views.reserve(free_.size());
    index.reserve(free_.size());
    // The protected handles: per size, the most recently added clean unbound ones.
    std::vector<bool> skip(free_.size(), false);
    for (const auto& [size, n] : protect) {
      std::vector<std::size_t> cand;
      for (std::size_t i = 0; i < free_.size(); ++i) {
        const PoolHandle& h = *free_[i];
        if (h.size.value() == size && h.clean && !h.bound && h.kept_by == 0) cand.push_back(i);
      }
      std::sort(cand.begin(), cand.end(),
                [&](std::size_t a, std::size_t b) { return free_[a]->freed_seq > free_[b]->freed_seq; });
      for (std::size_t k = 0; k < cand.size() && k < n; ++k) skip[cand[k]] = true;
    }
    for (std::size_t i = 0; i < free_.size(); ++i) {
      auto& h = free_[i];
      if (!h->freed_at) h->freed_at = now;  // first seen free now
      if (skip[i]) continue;
      views.push_back(IdleHandleView{h->size, bind_ && h->bound.has_value(), h->clean, h->freed_seq, *h->freed_at});
      index.push_back(i);
    }
    for (std::size_t k : plan_idle_release(views, now, idle, keep)) {
      std::unique_ptr<PoolHandle>& h = free_[index[k]];
      out.bytes += h->size;
      ++out.handles;
      unfree(*h);
      if (h->bound) {
        // Its descriptor went to a tenant: retired as docs/security.md says (held and charged
        // to that tenant until no other process holds it).
        ++out.bound;
        const TenantId t = *h->bound;
        destroy_keep_fd(std::move(h), t);
      } else {
        destroy(std::move(h));
      }
    }
  } catch (const std::exception& e) {
    log_.error("device " + std::to_string(device_.value()) + ": idle release failed: " + e.what());
  }
  std::erase_if(free_, [](const std::unique_ptr<PoolHandle>& h) { return !h; });
  idle_released_bytes_ += out.bytes;
  return out;
}

bool DevicePool::settle(bool all) noexcept {
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < held_.size(); ++i) {
    if (all || !held_[i].scanned) which.push_back(i);
  }
  if (which.empty()) return false;
  std::vector<std::uint32_t> holders;
  if (scan_) {
    try {
      std::vector<int> fds;
      fds.reserve(which.size());
      for (std::size_t i : which) fds.push_back(held_[i].fd.get());
      holders = scan_(fds);
    } catch (const std::exception& e) {
      log_.warn(std::string("holder scan failed (descriptors stay held): ") + e.what());
      holders.clear();
    }
    if (holders.size() != which.size()) holders.assign(which.size(), 1);  // failed: all held
  } else {
    holders.assign(which.size(), 0);
  }
  bool closed = false;
  for (std::size_t k = 0; k < which.size(); ++k) {
    Held& h = held_[which[k]];
    h.scanned = true;
    const std::uint32_t n = holders[k];
    if (h.kept_by != 0) continue;  // the keeper still maps it (Dropped or its end closes it)
    if (n > 0) {
      if (!h.seen_held) {
        h.seen_held = true;
        ++retired_held_;
        log_.info("device " + std::to_string(device_.value()) + ": a retired handle of " +
                  std::to_string(h.size.value()) + " bytes is still held by " + std::to_string(n) +
                  " other process(es); it stays charged to tenant " + std::to_string(h.tenant.value()));
      }
      continue;
    }
    held_bytes_ -= std::min(held_bytes_, h.size);
    h.fd.reset();
    closed = true;
  }
  std::erase_if(held_, [](const Held& h) { return !h.fd.valid(); });
  return closed;
}

void DevicePool::release_free() noexcept {
  for (auto& h : free_) {
    unfree(*h);
    destroy(std::move(h));
  }
  free_.clear();
  held_.clear();
  held_bytes_ = Bytes{0};
}

Bytes DevicePool::bound_free_bytes(TenantId t) const noexcept {
  auto it = bound_free_.find(t.value());
  return it == bound_free_.end() ? Bytes{0} : it->second;
}

Bytes DevicePool::retained(TenantId t) const noexcept {
  Bytes b = bound_free_bytes(t);
  for (const Held& h : held_) {
    if (h.tenant == t) b += h.size;
  }
  return b;
}

std::map<std::uint32_t, Bytes> DevicePool::retained_all() const {
  std::map<std::uint32_t, Bytes> m = bound_free_;
  for (const Held& h : held_) m[h.tenant.value()] += h.size;
  return m;
}

Servable DevicePool::servable(std::uint32_t max_handles) const {
  // A free handle's size and binding never change while it is free: the figure changes only
  // with the list.
  if (servable_cache_ && servable_cache_->version == free_version_ && servable_cache_->max_handles == max_handles) {
    return servable_cache_->value;
  }
  // servable.hpp's rule over the size index: O(k) per tenant with a bound handle, not a pass
  // over every free handle.
  const std::uint32_t k = std::max<std::uint32_t>(max_handles, 1);
  std::vector<std::uint64_t> top;
  for (auto it = unbound_sizes_.begin(); it != unbound_sizes_.end() && top.size() < k; ++it) top.push_back(*it);
  Servable out;
  for (const std::uint64_t v : top) out.unbound += Bytes{v};
  out.largest = out.unbound;
  for (const auto& [tenant, sizes] : bound_sizes_) {
    std::uint64_t sum = 0;
    std::size_t i = 0;
    auto b = sizes.begin();
    for (std::uint32_t n = 0; n < k; ++n) {
      if (i < top.size() && (b == sizes.end() || top[i] >= *b)) sum += top[i++];
      else if (b != sizes.end()) sum += *b++;
      else break;
    }
    out.largest = std::max(out.largest, Bytes{sum});
  }
  servable_cache_ = ServableCache{free_version_, max_handles, out};
  return out;
}

std::uint64_t DevicePool::free_small_handles() const noexcept { return free_small_; }

std::uint64_t DevicePool::free_bulk_handles() const noexcept { return free_bulk_; }

}  // namespace vlake::pool
