// Unix-domain socket helpers: pass file descriptors with SCM_RIGHTS next to a small payload.
//
// Contract
// - send_with_fds() sends `payload` (1..kMaxPayload bytes) and `fds` (0..kMaxFds) as one
//   message; it retries on EINTR and throws std::system_error on any other failure.
// - recv_with_fds() receives one message into `payload` and returns the descriptors that came
//   with it, each owned by a UniqueFd (so none leaks, also on error). It returns the number of
//   payload bytes; 0 means the peer closed the connection. A message whose descriptors or
//   payload were truncated (MSG_CTRUNC / MSG_TRUNC on SOCK_SEQPACKET) throws std::runtime_error
//   after closing whatever arrived. Received descriptors are close-on-exec.
// - Both are safe to call from several threads on different sockets; one socket needs external
//   ordering.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "vlake/common/unique_fd.hpp"

namespace vlake {

inline constexpr std::size_t kMaxFds = 64;
inline constexpr std::size_t kMaxPayload = 64 * 1024;

void send_with_fds(int socket, std::span<const std::byte> payload, std::span<const int> fds);

struct Received {
  std::size_t bytes = 0;
  std::vector<UniqueFd> fds;
};
Received recv_with_fds(int socket, std::span<std::byte> payload);

// A connected pair of SOCK_SEQPACKET sockets (close-on-exec unless `inheritable`).
struct SocketPair {
  UniqueFd first;
  UniqueFd second;
};
SocketPair make_socket_pair(bool inheritable = false);

}  // namespace vlake
