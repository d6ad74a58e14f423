// vlake::pool::Outbox — the replies one connection could not take at once.
//
// The daemon's connection sockets are non-blocking: a client that does not read (stopped, slow,
// or hostile) fills its socket's queue, and a send then fails with EAGAIN instead of stalling
// the event loop. Such a message is kept here, in order, with duplicates of its descriptors, and
// sent when the socket is writable again (the loop watches EPOLLOUT while the outbox is not
// empty). Later messages for the same connection queue behind it, so replies are never
// reordered. A client that lets more than kMaxMessages messages or kMaxBytes bytes pile up is
// not served further: send() answers `overflow` and the loop closes the connection with a logged
// reason. The grants whose replies are still queued when a connection closes never reached the
// client: grants() names them so that the loop undoes them.
//
// No socket of its own: the caller passes a SendFn (tests pass fakes). Errors: a SendFn throws
// for a broken connection (anything but "would block"); send() and flush() let that through.
// Thread-safety: none (the event loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "vlake/common/unique_fd.hpp"

namespace vlake::pool {

class Outbox {
 public:
  static constexpr std::size_t kMaxMessages = 64;
  static constexpr std::size_t kMaxBytes = 256 * 1024;

  // Sends one message with its descriptors: true when sent, false when the socket would block.
  using SendFn = std::function<bool(std::span<const std::byte> bytes, std::span<const int> fds)>;

  enum class Result { sent, queued, overflow };

  // Sends `bytes` (with `fds`, which stay the caller's) now if nothing is queued and the socket
  // takes it; else queues a copy (descriptors duplicated, close-on-exec) unless that would pass
  // the bounds. `grant`: the grant this message delivers (0: none). Throws what `send` throws,
  // and std::system_error when a descriptor cannot be duplicated.
  Result send(std::span<const std::byte> bytes, std::span<const int> fds, std::uint64_t grant, const SendFn& send);

  // Sends queued messages in order until one would block; true when the outbox is then empty.
  bool flush(const SendFn& send);

  [[nodiscard]] bool empty() const noexcept { return queue_.empty(); }
  [[nodiscard]] std::size_t messages() const noexcept { return queue_.size(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  // The grants whose replies are queued (undelivered).
  [[nodiscard]] std::vector<std::uint64_t> grants() const;

 private:
  struct Message {
    std::vector<std::byte> bytes;
    std::vector<UniqueFd> fds;
    std::uint64_t grant = 0;
  };
  std::deque<Message> queue_;
  std::size_t bytes_ = 0;
};

}  // namespace vlake::pool
