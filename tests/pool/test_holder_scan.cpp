// The holder scan (vlake/pool/holder_scan.hpp) against real processes: a child that received a
// descriptor with SCM_RIGHTS, or inherited it, is found; a child holding its own open of the
// same file (same inode, another open file description) is not; after it closes or exits,
// nothing is found.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "fd_holder.hpp"
#include "vlake/pool/holder_scan.hpp"

using namespace vlake::pool;

namespace {

// Sends one byte, with `fd` attached when fd >= 0.
bool send_byte(int sock, char c, int fd) {
  msghdr msg{};
  iovec iov{&c, 1};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = buf;
    msg.msg_controllen = sizeof buf;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  return ::sendmsg(sock, &msg, 0) == 1;
}

// Receives one byte and the descriptor attached to it (-1: none).
char recv_byte(int sock, int& fd) {
  char c = 0;
  msghdr msg{};
  iovec iov{&c, 1};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = buf;
  msg.msg_controllen = sizeof buf;
  fd = -1;
  if (::recvmsg(sock, &msg, 0) != 1) return 0;
  if (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr && cm->cmsg_type == SCM_RIGHTS) {
    std::memcpy(&fd, CMSG_DATA(cm), sizeof fd);
  }
  return c;
}

// A child on a socketpair: opens its own /dev/null, then keeps ('k') or closes ('c') the
// descriptor it is sent, acknowledging each command; exits at end of file.
pid_t spawn_receiver(int& sock) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(sv[0]);
    const int own = ::open("/dev/null", O_RDONLY);
    int kept = -1;
    if (own < 0 || !send_byte(sv[1], 'r', -1)) ::_exit(1);
    for (;;) {
      int fd = -1;
      const char c = recv_byte(sv[1], fd);
      if (c == 'k') {
        kept = fd;
      } else if (c == 'c') {
        if (kept >= 0) ::close(kept);
        kept = -1;
      } else {
        ::_exit(0);
      }
      if (!send_byte(sv[1], c, -1)) ::_exit(1);
    }
  }
  ::close(sv[1]);
  sock = sv[0];
  int none = -1;
  REQUIRE(recv_byte(sock, none) == 'r');
  return pid;
}

}  // namespace

TEST_CASE("holder scan: a process holding a descriptor passed with SCM_RIGHTS is found, until it closes it",
          "[pool][holders]") {
  int sock = -1;
  const pid_t child = spawn_receiver(sock);
  // Opened after the fork: the child has only its own open of /dev/null (same inode and
  // device number, another open file description), as every process has its own nvidiactl.
  const int mine = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int other = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(mine >= 0);
  REQUIRE(other >= 0);
  HolderScanStats stats;
  CHECK(scan_holders({mine, other}, &stats) == std::vector<std::uint32_t>{0, 0});
  CHECK(stats.candidates >= 2);  // the child's own /dev/null matched the target, kcmp told them apart
  CHECK_FALSE(stats.kcmp_denied);

  int none = -1;
  REQUIRE(send_byte(sock, 'k', mine));
  REQUIRE(recv_byte(sock, none) == 'k');
  CHECK(scan_holders({mine, other}) == std::vector<std::uint32_t>{1, 0});

  REQUIRE(send_byte(sock, 'c', -1));
  REQUIRE(recv_byte(sock, none) == 'c');
  CHECK(scan_holders({mine, other}) == std::vector<std::uint32_t>{0, 0});

  ::close(sock);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  ::close(mine);
  ::close(other);
}

TEST_CASE("holder scan: an inherited descriptor is held until its process exits, a closed fd holds nothing",
          "[pool][holders]") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  {
    vlake::pooltest::FdHolder holder(p[0]);
    CHECK(scan_holders({p[0], p[1]}) == std::vector<std::uint32_t>{1, 0});
    holder.end();
  }
  CHECK(scan_holders({p[0], p[1]}) == std::vector<std::uint32_t>{0, 0});
  // A handle scan with the logger wrapper answers the same.
  vlake::Logger log{vlake::LogLevel::error};
  const HolderScan scan = make_holder_scan(log);
  CHECK(scan({p[0]}) == std::vector<std::uint32_t>{0});
  ::close(p[0]);
  ::close(p[1]);
  CHECK(scan_holders({p[0]}) == std::vector<std::uint32_t>{0});  // not open: nothing to hold
}
