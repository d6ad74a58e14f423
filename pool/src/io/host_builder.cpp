// vlake::pool::HostBuilder (contract in the header).
#include "vlake/pool/host_builder.hpp"

#include <pthread.h>

#include <algorithm>

namespace vlake::pool {

HostPiece make_host_piece(Driver& driver, Bytes size, Bytes granularity) {
  HostPiece p;
  p.size = size;
  p.handle = driver.create_host(size);
  DevicePtr va{};
  bool mapped = false;
  try {
    p.fd = driver.export_fd(p.handle);
    va = driver.reserve(size, granularity);
    try {
      driver.map(va, size, p.handle);
      mapped = true;
      driver.set_access(va, size, DeviceOrdinal{0}, Access::read_write);
      // Zeroed in 64 MiB steps (the copy engines over PCIe).
      constexpr std::uint64_t kStep = 64ull << 20;
      for (std::uint64_t off = 0; off < size.value(); off += kStep) {
        driver.fill_u8(va + Bytes{off}, 0, Bytes{std::min(kStep, size.value() - off)});
      }
      driver.synchronize();
      driver.unmap(va, size);
      mapped = false;
      driver.free_reservation(va, size);
    } catch (...) {
      if (mapped) driver.unmap(va, size);
      driver.free_reservation(va, size);
      throw;
    }
  } catch (...) {
    driver.release(p.handle);
    throw;
  }
  return p;
}

HostBuilder::HostBuilder(Driver& driver, Bytes granularity, std::function<void()> on_ready)
    : driver_(driver), granularity_(granularity), on_ready_(std::move(on_ready)), thread_([this] { main(); }) {}

HostBuilder::~HostBuilder() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Done& d : done_) {
    if (d.piece) driver_.release(d.piece->handle);
  }
  for (auto& j : jobs_) {
    if (auto* p = std::get_if<HostPiece>(&j)) driver_.release(p->handle);
  }
}

void HostBuilder::build(Bytes size) {
  {
    std::lock_guard lock(mu_);
    jobs_.emplace_back(size);
  }
  cv_.notify_all();
}

void HostBuilder::release(HostPiece piece) {
  {
    std::lock_guard lock(mu_);
    jobs_.emplace_back(std::move(piece));
  }
  cv_.notify_all();
}

std::vector<HostBuilder::Done> HostBuilder::take() {
  std::lock_guard lock(mu_);
  return std::exchange(done_, {});
}

void HostBuilder::main() {
  ::pthread_setname_np(::pthread_self(), "vlaked-host");
  for (;;) {
    std::variant<Bytes, HostPiece> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (auto* p = std::get_if<HostPiece>(&job)) {
      try {
        driver_.release(p->handle);
      } catch (...) {
        // Nothing to do: the handle is gone or the driver is; the descriptor closes below.
      }
      continue;
    }
    Done d;
    d.size = std::get<Bytes>(job);
    try {
      d.piece = make_host_piece(driver_, d.size, granularity_);
    } catch (const std::exception& e) {
      d.error = e.what();
    }
    {
      std::lock_guard lock(mu_);
      done_.push_back(std::move(d));
    }
    on_ready_();
  }
}

}  // namespace vlake::pool
