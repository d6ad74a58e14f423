// vlake::pool::Swapper — vlaked's thread for process checkpoints (docs/swap.md).
//
// Contract
// - submit(job) queues a SwapJob (node.hpp); one thread runs the jobs in order with the Driver:
//   a checkpoint is lock_process(pid, kLockTimeoutMs) then checkpoint_process(pid) (unlocked
//   again when the checkpoint fails), with the GPU's free memory read before and after it (what
//   it freed); a restore is restore_process(pid) then unlock_process(pid). A driver without
//   the checkpoint API fails every job.
// - After each job `on_ready` is called on that thread (vlaked writes an eventfd); take() hands
//   over every finished job since the last call.
// - The destructor stops the thread after the job in progress and joins it; jobs not started
//   are dropped (their processes stay as they are).
// Thread-safety: submit() and take() may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/pool/node.hpp"

namespace vlake::pool {

class Swapper {
 public:
  // How long a lock may wait for the process's submitted work.
  static constexpr unsigned kLockTimeoutMs = 10000;

  struct Done {
    SwapJob job;
    bool ok = false;
    Bytes freed{0};  // checkpoints: free memory after minus before (0 when it did not grow)
    std::chrono::nanoseconds took{0};
    std::string error;  // the driver's error when !ok
  };

  Swapper(Driver& driver, std::function<void()> on_ready);
  ~Swapper();
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  void submit(const SwapJob& job);
  [[nodiscard]] std::vector<Done> take();

 private:
  void main();
  Done run(const SwapJob& job);

  Driver& driver_;
  std::function<void()> on_ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SwapJob> jobs_;
  std::vector<Done> done_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vlake::pool
