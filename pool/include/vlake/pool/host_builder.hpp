// vlake::pool::HostBuilder — vlaked's thread that makes and releases the host tier's pinned host
// memory (docs/swap.md, "Host tier"): pinning takes about 0.2 s per GiB and unpinning takes time
// too, so neither runs on the event loop.
//
// Contract
// - build(size): one HostPiece: Driver::create_host(size), its one export, zeroed (mapped in
//   this process with device 0's access, fill_u8 0 by the copy engines, synchronized, unmapped)
//   so that no tenant ever reads what the memory held before. A failure ends as a Done with
//   `error` set (nothing leaks).
// - release(piece): the piece's handle is released and its descriptor closed (processes that
//   imported it keep their own references).
// - Jobs run in order on one thread; after each build `on_ready` is called from that thread
//   (vlaked writes an eventfd) and take() hands over every finished build.
// - The destructor stops after the job in progress, releases what was built and not taken, and
//   what waits to be released.
// Thread-safety: build(), release() and take() may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/pool/features/tier/host_tier.hpp"

namespace vlake::pool {

// One piece made the way build() makes it (throws DriverError; releases what it made first).
[[nodiscard]] HostPiece make_host_piece(Driver& driver, Bytes size, Bytes granularity);

class HostBuilder {
 public:
  struct Done {
    Bytes size{0};
    std::optional<HostPiece> piece;  // nullopt: failed
    std::string error;
  };

  HostBuilder(Driver& driver, Bytes granularity, std::function<void()> on_ready);
  ~HostBuilder();
  HostBuilder(const HostBuilder&) = delete;
  HostBuilder& operator=(const HostBuilder&) = delete;

  void build(Bytes size);
  void release(HostPiece piece);
  [[nodiscard]] std::vector<Done> take();

 private:
  void main();

  Driver& driver_;
  Bytes granularity_;
  std::function<void()> on_ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::variant<Bytes, HostPiece>> jobs_;
  std::vector<Done> done_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vlake::pool
