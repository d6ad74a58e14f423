#include "pool_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "vlake/common/unix_socket.hpp"

namespace vlake::pooltest {

PoolClient::PoolClient(const std::string& socket_path) {
  fd_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd_) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) throw std::invalid_argument("socket path too long");
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::system_error(errno, std::generic_category(), "connect " + socket_path);
  }
}

void PoolClient::send_bytes(const void* data, std::size_t n, std::span<const int> fds) {
  send_with_fds(fd_.get(), std::span<const std::byte>(static_cast<const std::byte*>(data), n), fds);
}

proto::MsgType PoolClient::Message::type() const {
  if (bytes.size() < sizeof(proto::Header)) throw ProtocolError("reply shorter than a header");
  proto::Header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  return h.type;
}

std::optional<PoolClient::Message> PoolClient::recv(int timeout_ms) {
  pollfd p{fd_.get(), POLLIN, 0};
  const int r = ::poll(&p, 1, timeout_ms);
  if (r == 0) return std::nullopt;
  if (r < 0) throw std::system_error(errno, std::generic_category(), "poll");
  Message m;
  std::vector<std::byte> buf(proto::kMaxMessageBytes + 8);
  Received got;
  try {
    got = recv_with_fds(fd_.get(), buf);
  } catch (const std::system_error& e) {
    if (e.code().value() == ECONNRESET) {
      m.closed = true;
      return m;
    }
    throw;
  }
  if (got.bytes == 0) {
    m.closed = true;
    return m;
  }
  buf.resize(got.bytes);
  m.bytes = std::move(buf);
  m.fds = std::move(got.fds);
  return m;
}

bool PoolClient::wait_closed(int timeout_ms) {
  for (int i = 0; i < 4; ++i) {
    auto m = recv(timeout_ms);
    if (!m) return false;
    if (m->closed) return true;
  }
  return false;
}

template <class R>
R PoolClient::expect(std::uint64_t request_id, std::vector<UniqueFd>* fds) {
  const int wait = static_cast<int>(reply_timeout_.count());
  auto m = recv(wait);
  // Pressure arrives unsolicited (kHelloPressure): keep it for wait_pressure() and read on.
  while (m && !m->closed && m->type() == proto::MsgType::pressure) {
    pressures.push_back(m->as<proto::Pressure>());
    m = recv(wait);
  }
  if (!m) throw ProtocolError("no reply within " + std::to_string(wait) + " ms");
  if (m->closed) throw ProtocolError("the daemon closed the connection");
  if (m->type() == proto::MsgType::error) {
    const auto e = m->as<proto::Error>();
    throw ProtocolError("Error reply, status " + std::to_string(static_cast<int>(e.status)) + ": " +
                        std::string(e.message, strnlen(e.message, sizeof e.message)));
  }
  if (m->type() != proto::MessageTraits<R>::type) {
    throw ProtocolError("unexpected reply type " + std::to_string(static_cast<int>(m->type())));
  }
  const R r = m->as<R>();  // decoded: framing, fields and descriptor count checked
  if (r.h.request_id != request_id) throw ProtocolError("reply does not echo the request id");
  if (fds != nullptr) *fds = std::move(m->fds);
  else if (!m->fds.empty()) throw ProtocolError("unexpected descriptors");
  return r;
}

std::optional<proto::Pressure> PoolClient::wait_pressure(int timeout_ms) {
  if (pressures.empty()) {
    auto m = recv(timeout_ms);
    if (!m || m->closed) return std::nullopt;
    if (m->type() != proto::MsgType::pressure) {
      throw ProtocolError("unexpected message type " + std::to_string(static_cast<int>(m->type())));
    }
    pressures.push_back(m->as<proto::Pressure>());
  }
  const proto::Pressure p = pressures.front();
  pressures.erase(pressures.begin());
  return p;
}

void PoolClient::reserve_report(const Uuid& device, std::uint64_t bytes, std::uint64_t blocks, std::uint32_t flags) {
  auto m = proto::make<proto::ReserveReport>(next_request_id());
  device.copy_to(m.device_uuid);
  m.bytes = bytes;
  m.blocks = blocks;
  m.flags = flags;
  send(m);
}

proto::HelloAck PoolClient::hello(std::uint64_t old_session, std::uint32_t flags) {
  const auto id = next_request_id();
  auto m = proto::make<proto::Hello>(id);
  m.pid = static_cast<std::uint32_t>(::getpid());
  m.old_session = old_session;
  m.flags = flags;
  std::strncpy(m.client, "vlake pool test", sizeof m.client - 1);
  send(m);
  return expect<proto::HelloAck>(id);
}

PoolClient::Granted PoolClient::grant(const Uuid& device, std::uint64_t bytes, proto::GrantPurpose purpose) {
  const auto id = next_request_id();
  auto m = proto::make<proto::GrantRequest>(id);
  device.copy_to(m.device_uuid);
  m.bytes = bytes;
  m.purpose = purpose;
  send(m);
  Granted g;
  g.reply = expect<proto::GrantReply>(id, &g.fds);  // the codec checked one descriptor per handle
  return g;
}

proto::ReleaseAck PoolClient::release(std::uint64_t grant_id, std::uint32_t flags) {
  const auto id = next_request_id();
  auto m = proto::make<proto::Release>(id);
  m.grant_id = grant_id;
  m.flags = flags;
  send(m);
  return expect<proto::ReleaseAck>(id);
}

proto::UsageReply PoolClient::usage(const Uuid& device) {
  const auto id = next_request_id();
  auto m = proto::make<proto::UsageQuery>(id);
  device.copy_to(m.device_uuid);
  send(m);
  return expect<proto::UsageReply>(id);
}

}  // namespace vlake::pooltest
