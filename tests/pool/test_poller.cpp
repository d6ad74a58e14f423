// The event loop's epoll set (pool/src/io/poller.hpp): a token carries the source kind and a
// 56-bit serial back out of epoll_wait; a connection reports writable only while watched.
#include <catch2/catch.hpp>

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <system_error>
#include <vector>

#include "poller.hpp"

using namespace vlake::pool;

namespace {

std::vector<epoll_event> wait_events(const Poller& p) {
  std::vector<epoll_event> ev(8);
  const int n = ::epoll_wait(p.fd(), ev.data(), static_cast<int>(ev.size()), 0);
  ev.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return ev;
}

}  // namespace

TEST_CASE("poller: a token gives back its source and serial", "[poller]") {
  const std::uint64_t max_serial = (1ULL << 56) - 1;
  for (Source k : {Source::listen, Source::conn, Source::alloc_timer}) {
    for (std::uint64_t serial : {std::uint64_t{0}, std::uint64_t{1}, max_serial}) {
      const std::uint64_t t = Poller::token(k, serial);
      CHECK(Poller::source_of(t) == k);
      CHECK(Poller::serial_of(t) == serial);
    }
  }
}

TEST_CASE("poller: a readable descriptor comes back with its token", "[poller]") {
  Poller p;
  vlake::UniqueFd ev(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  REQUIRE(ev);
  p.add(ev.get(), Source::builds, 77);
  CHECK(wait_events(p).empty());
  const std::uint64_t one = 1;
  REQUIRE(::write(ev.get(), &one, sizeof one) == sizeof one);
  const auto got = wait_events(p);
  REQUIRE(got.size() == 1);
  CHECK(Poller::source_of(got[0].data.u64) == Source::builds);
  CHECK(Poller::serial_of(got[0].data.u64) == 77);
  // Added twice: refused. Removed: silent, even twice.
  CHECK_THROWS_AS(p.add(ev.get(), Source::builds, 78), std::system_error);
  p.del(ev.get());
  p.del(ev.get());
  CHECK(wait_events(p).empty());
}

TEST_CASE("poller: a connection reports writable only while watched", "[poller]") {
  Poller p;
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
  vlake::UniqueFd a(sv[0]);
  vlake::UniqueFd b(sv[1]);
  p.add(a.get(), Source::conn, 5);
  CHECK(wait_events(p).empty());  // writable, but not watched for it
  p.watch_writable(a.get(), Source::conn, 5, true);
  auto got = wait_events(p);
  REQUIRE(got.size() == 1);
  CHECK((got[0].events & EPOLLOUT) != 0);
  CHECK(Poller::serial_of(got[0].data.u64) == 5);
  p.watch_writable(a.get(), Source::conn, 5, false);
  CHECK(wait_events(p).empty());
  CHECK_THROWS_AS(p.watch_writable(b.get(), Source::conn, 6, true), std::system_error);  // never added
}
