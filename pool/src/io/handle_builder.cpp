#include "vlake/pool/handle_builder.hpp"

#include <cuda.h>

#include <algorithm>
#include <chrono>

namespace vlake::pool {

namespace {

constexpr Bytes kZeroPiece{8ull << 20};

template <class F>
double timed_ns(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

BuiltHandle build_handle(Driver& driver, DeviceOrdinal device, Bytes size, Bytes granularity, bool zero) {
  BuiltHandle h;
  h.size = size;
  h.create_ns = timed_ns([&] { h.handle = driver.create(device, size); });
  bool reserved = false;
  bool mapped = false;
  try {
    h.export_ns = timed_ns([&] { h.fd = driver.export_fd(h.handle); });
    h.va = driver.reserve(size, granularity);
    reserved = true;
    h.map_ns = timed_ns([&] { driver.map(h.va, size, h.handle, Bytes{0}); });
    mapped = true;
    h.set_access_ns = timed_ns([&] { driver.set_access(h.va, size, device, Access::read_write); });
    if (zero) {
      driver.make_current(device);
      h.scrub_ns = timed_ns([&] {
        // In pieces: no single driver call holds the driver long (the simulator zeroes host
        // memory under its process lock, which the event loop's own driver calls wait for).
        for (std::uint64_t off = 0; off < size.value(); off += kZeroPiece.value()) {
          driver.fill_u8(DevicePtr{h.va.value() + off}, 0, Bytes{std::min(kZeroPiece.value(), size.value() - off)});
        }
        driver.synchronize();
      });
      h.zeroed = true;
    }
  } catch (...) {
    try {
      if (mapped) driver.unmap(h.va, size);
      if (reserved) driver.free_reservation(h.va, size);
      driver.release(h.handle);
    } catch (...) {
    }
    throw;
  }
  return h;
}

void release_built(Driver& driver, BuiltHandle& h) noexcept {
  try {
    driver.unmap(h.va, h.size);
    driver.free_reservation(h.va, h.size);
    driver.release(h.handle);
  } catch (...) {
    // Nothing to do: the process's exit returns it.
  }
  h.fd.reset();
}

HandleBuilder::HandleBuilder(Driver& driver, const std::vector<Gpu>& gpus, std::function<void()> on_ready)
    : driver_(driver), on_ready_(std::move(on_ready)) {
  for (const Gpu& g : gpus) {
    auto w = std::make_unique<Worker>();
    w->device = g.device;
    w->granularity = g.granularity;
    w->headroom = g.headroom;
    workers_.push_back(std::move(w));
  }
  try {
    for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { run(*p); });
  } catch (...) {
    stop_ = true;
    for (auto& w : workers_) {
      { std::lock_guard lock(w->mu); }
      w->cv.notify_all();
      if (w->thread.joinable()) w->thread.join();
    }
    throw;
  }
}

HandleBuilder::~HandleBuilder() {
  stop_ = true;
  for (auto& w : workers_) {
    { std::lock_guard lock(w->mu); }
    w->cv.notify_all();
    if (w->thread.joinable()) w->thread.join();
  }
  for (Done& d : done_) {
    if (d.handle) release_built(driver_, *d.handle);
  }
  for (auto& w : workers_) {
    for (BuiltHandle& h : w->discards) release_built(driver_, h);
  }
}

void HandleBuilder::submit(DeviceOrdinal device, Bytes size) {
  for (auto& w : workers_) {
    if (w->device != device) continue;
    {
      std::lock_guard lock(w->mu);
      w->jobs.push_back(size);
    }
    w->cv.notify_one();
    return;
  }
}

void HandleBuilder::discard(DeviceOrdinal device, BuiltHandle h) {
  for (auto& w : workers_) {
    if (w->device != device) continue;
    {
      std::lock_guard lock(w->mu);
      w->discards.push_back(std::move(h));
      w->jobs.push_back(Bytes{0});
    }
    w->cv.notify_one();
    return;
  }
  release_built(driver_, h);  // not a GPU it serves: here
}

std::vector<HandleBuilder::Done> HandleBuilder::take() {
  std::lock_guard lock(done_mu_);
  return std::exchange(done_, {});
}

void HandleBuilder::run(Worker& w) {
  for (;;) {
    Bytes size{0};
    std::optional<BuiltHandle> discard;
    {
      std::unique_lock lock(w.mu);
      w.cv.wait(lock, [&] { return stop_ || !w.jobs.empty(); });
      if (stop_) return;
      size = w.jobs.front();
      w.jobs.pop_front();
      if (size.value() == 0 && !w.discards.empty()) {
        discard.emplace(std::move(w.discards.front()));
        w.discards.pop_front();
      }
    }
    if (size.value() == 0) {
      if (discard) release_built(driver_, *discard);
      continue;
    }
    Done d;
    d.device = w.device;
    d.size = size;
    try {
      const Bytes free = driver_.memory_info(w.device).free;
      if (free < size + w.headroom) {
        d.no_room = true;
      } else {
        d.handle = build_handle(driver_, w.device, size, w.granularity, true);
      }
    } catch (const DriverError& e) {
      d.no_room = e.code() == CUDA_ERROR_OUT_OF_MEMORY;
      d.error = e.what();
    } catch (const std::exception& e) {
      d.error = e.what();
    }
    try {
      std::lock_guard lock(done_mu_);
      done_.push_back(std::move(d));
    } catch (...) {
      if (d.handle) release_built(driver_, *d.handle);
      continue;
    }
    if (on_ready_) on_ready_();
  }
}

}  // namespace vlake::pool
