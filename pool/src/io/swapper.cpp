// vlake::pool::Swapper (contract in the header).
#include "vlake/pool/swapper.hpp"

#include <cuda.h>
#include <pthread.h>

#include <csignal>

namespace vlake::pool {

Swapper::Swapper(Driver& driver, std::function<void()> on_ready)
    : driver_(driver), on_ready_(std::move(on_ready)), thread_([this] { main(); }) {}

Swapper::~Swapper() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Swapper::submit(const SwapJob& job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(job);
  }
  cv_.notify_all();
}

std::vector<Swapper::Done> Swapper::take() {
  std::lock_guard lock(mu_);
  return std::exchange(done_, {});
}

Swapper::Done Swapper::run(const SwapJob& job) {
  Done d;
  d.job = job;
  const auto start = std::chrono::steady_clock::now();
  const int pid = static_cast<int>(job.pid);
  try {
    if (!driver_.checkpoint_supported()) {
      throw DriverError(CUDA_ERROR_NOT_SUPPORTED, "cuCheckpointProcessLock", "this driver has no checkpoint API");
    }
    if (job.restore) {
      driver_.restore_process(pid);
      driver_.unlock_process(pid);
    } else {
      const Bytes before = driver_.memory_info(job.device).free;
      driver_.lock_process(pid, kLockTimeoutMs);
      try {
        driver_.checkpoint_process(pid);
      } catch (...) {
        try {
          driver_.unlock_process(pid);
        } catch (...) {
        }
        throw;
      }
      const Bytes after = driver_.memory_info(job.device).free;
      d.freed = after > before ? after - before : Bytes{0};
    }
    d.ok = true;
  } catch (const std::exception& e) {
    d.error = e.what();
  }
  d.took = std::chrono::steady_clock::now() - start;
  return d;
}

void Swapper::main() {
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  ::pthread_setname_np(::pthread_self(), "vlaked-swap");
  for (;;) {
    SwapJob job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = jobs_.front();
      jobs_.pop_front();
    }
    Done d = run(job);
    {
      std::lock_guard lock(mu_);
      done_.push_back(std::move(d));
    }
    if (on_ready_) on_ready_();
  }
}

}  // namespace vlake::pool
