// Outbox (pool/include/vlake/pool/outbox.hpp): replies a connection could not take at once are
// kept in order, with their descriptors, within bounds.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <system_error>
#include <vector>

#include "vlake/pool/outbox.hpp"

using vlake::UniqueFd;
using vlake::pool::Outbox;

namespace {

// A socket that takes messages while `open` is true; records what it took.
struct FakeSocket {
  bool open = true;
  bool broken = false;
  std::vector<std::string> taken;
  std::vector<ino_t> fd_inodes;
  Outbox::SendFn fn() {
    return [this](std::span<const std::byte> b, std::span<const int> fds) {
      if (broken) throw std::system_error(EPIPE, std::generic_category(), "sendmsg");
      if (!open) return false;
      taken.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
      for (int fd : fds) {
        struct stat st {};
        REQUIRE(::fstat(fd, &st) == 0);
        fd_inodes.push_back(st.st_ino);
      }
      return true;
    };
  }
};

std::span<const std::byte> bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace

TEST_CASE("outbox: sends at once while the socket takes messages", "[outbox]") {
  Outbox o;
  FakeSocket sock;
  CHECK(o.send(bytes("a"), {}, 0, sock.fn()) == Outbox::Result::sent);
  CHECK(o.empty());
  CHECK(sock.taken == std::vector<std::string>{"a"});
}

TEST_CASE("outbox: queues when the socket would block and keeps the order", "[outbox]") {
  Outbox o;
  FakeSocket sock;
  sock.open = false;
  CHECK(o.send(bytes("one"), {}, 7, sock.fn()) == Outbox::Result::queued);
  sock.open = true;
  // Something is queued: a later message waits behind it even though the socket would take it.
  CHECK(o.send(bytes("two"), {}, 0, sock.fn()) == Outbox::Result::queued);
  CHECK(sock.taken.empty());
  CHECK(o.messages() == 2);
  CHECK(o.bytes() == 6);
  CHECK(o.grants() == std::vector<std::uint64_t>{7});
  CHECK(o.flush(sock.fn()));
  CHECK(sock.taken == std::vector<std::string>{"one", "two"});
  CHECK(o.empty());
  CHECK(o.bytes() == 0);
  CHECK(o.grants().empty());
}

TEST_CASE("outbox: a flush stops at the first message the socket does not take", "[outbox]") {
  Outbox o;
  FakeSocket sock;
  sock.open = false;
  (void)o.send(bytes("x"), {}, 1, sock.fn());
  (void)o.send(bytes("y"), {}, 2, sock.fn());
  CHECK_FALSE(o.flush(sock.fn()));
  CHECK(o.messages() == 2);
  CHECK(o.grants() == std::vector<std::uint64_t>{1, 2});
}

TEST_CASE("outbox: queued descriptors are duplicates that outlive the caller's", "[outbox]") {
  Outbox o;
  FakeSocket sock;
  sock.open = false;
  char path[] = "/tmp/vlake-outbox-XXXXXX";
  UniqueFd file(::mkstemp(path));
  REQUIRE(file);
  ::unlink(path);
  struct stat st {};
  REQUIRE(::fstat(file.get(), &st) == 0);
  const int fds[] = {file.get()};
  CHECK(o.send(bytes("grant"), fds, 3, sock.fn()) == Outbox::Result::queued);
  file.reset();  // the pool may close or reuse its descriptor meanwhile
  sock.open = true;
  CHECK(o.flush(sock.fn()));
  REQUIRE(sock.fd_inodes.size() == 1);
  CHECK(sock.fd_inodes[0] == st.st_ino);
}

TEST_CASE("outbox: past its bounds a message is refused and not queued", "[outbox]") {
  FakeSocket sock;
  sock.open = false;
  Outbox by_count;
  for (std::size_t i = 0; i < Outbox::kMaxMessages; ++i) {
    REQUIRE(by_count.send(bytes("m"), {}, 0, sock.fn()) == Outbox::Result::queued);
  }
  CHECK(by_count.send(bytes("m"), {}, 0, sock.fn()) == Outbox::Result::overflow);
  CHECK(by_count.messages() == Outbox::kMaxMessages);
  Outbox by_bytes;
  const std::string big(Outbox::kMaxBytes / 2, 'b');
  CHECK(by_bytes.send(bytes(big), {}, 0, sock.fn()) == Outbox::Result::queued);
  CHECK(by_bytes.send(bytes(big), {}, 0, sock.fn()) == Outbox::Result::queued);
  CHECK(by_bytes.send(bytes("c"), {}, 0, sock.fn()) == Outbox::Result::overflow);
}

TEST_CASE("outbox: a broken connection is an exception and not a queued message", "[outbox]") {
  Outbox o;
  FakeSocket sock;
  sock.broken = true;
  CHECK_THROWS_AS(o.send(bytes("z"), {}, 0, sock.fn()), std::system_error);
  CHECK(o.empty());
  sock.broken = false;
  sock.open = false;
  (void)o.send(bytes("q"), {}, 0, sock.fn());
  sock.broken = true;
  CHECK_THROWS_AS(o.flush(sock.fn()), std::system_error);
}
