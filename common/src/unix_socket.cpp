#include "vlake/common/unix_socket.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace vlake {

namespace {
[[noreturn]] void throw_errno(const char* what) { throw std::system_error(errno, std::generic_category(), what); }
}  // namespace

void send_with_fds(int socket, std::span<const std::byte> payload, std::span<const int> fds) {
  if (payload.empty() || payload.size() > kMaxPayload) {
    throw std::invalid_argument("send_with_fds: payload must be 1.." + std::to_string(kMaxPayload) + " bytes");
  }
  if (fds.size() > kMaxFds) throw std::invalid_argument("send_with_fds: too many descriptors");

  iovec iov{const_cast<std::byte*>(payload.data()), payload.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr) throw std::logic_error("send_with_fds: no room for SCM_RIGHTS");
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<std::size_t>(n) != payload.size()) {
        throw std::runtime_error("send_with_fds: short send");
      }
      return;
    }
    if (errno != EINTR) throw_errno("sendmsg");
  }
}

Received recv_with_fds(int socket, std::span<std::byte> payload) {
  iovec iov{payload.data(), payload.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds), 0);
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();

  ssize_t n = -1;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) throw_errno("recvmsg");

  Received out;
  out.bytes = static_cast<std::size_t>(n);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    throw std::runtime_error("recv_with_fds: descriptors truncated (too many sent)");
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    throw std::runtime_error("recv_with_fds: message larger than " + std::to_string(payload.size()) + " bytes");
  }
  return out;
}

SocketPair make_socket_pair(bool inheritable) {
  int sv[2] = {-1, -1};
  const int type = SOCK_SEQPACKET | (inheritable ? 0 : SOCK_CLOEXEC);
  if (::socketpair(AF_UNIX, type, 0, sv) != 0) throw_errno("socketpair");
  return SocketPair{UniqueFd(sv[0]), UniqueFd(sv[1])};
}

}  // namespace vlake
