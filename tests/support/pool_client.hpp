// A small vlaked protocol client for the tests (the real client is the hook). Speaks
// protocol.hpp over the daemon's SOCK_SEQPACKET socket, building and checking every message
// with the codec all ends share (codec.hpp); also sends raw bytes for the malformed-message
// tests.
//
// Contract: one object per connection, not thread-safe. Request helpers throw ProtocolError
// when the daemon answers with something else than the expected reply (the Error message's
// text is included) or closes the connection; recv() waits at most `timeout_ms`.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "vlake/common/unique_fd.hpp"
#include "vlake/common/uuid.hpp"
#include "vlake/contracts/codec.hpp"

namespace vlake::pooltest {

class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class PoolClient {
 public:
  explicit PoolClient(const std::string& socket_path);  // connects; throws std::system_error
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }

  void send_bytes(const void* data, std::size_t n, std::span<const int> fds = {});
  template <class T>
  void send(const T& m, std::span<const int> fds = {}) {
    send_bytes(&m, sizeof m, fds);
  }

  struct Message {
    bool closed = false;  // the daemon closed the connection
    std::vector<std::byte> bytes;
    std::vector<UniqueFd> fds;
    [[nodiscard]] proto::MsgType type() const;
    // The message decoded as a T (with its descriptors); throws ProtocolError when it is
    // malformed or of another type.
    template <proto::Message T>
    [[nodiscard]] T as() const {
      const proto::Decoded d = proto::decode(bytes, fds.size());
      if (!d) throw ProtocolError("malformed reply: " + d.error().reason);
      const T* t = d.get<T>();
      if (t == nullptr) {
        throw ProtocolError(std::string("reply is not a ") + proto::MessageTraits<T>::name);
      }
      return *t;
    }
  };
  // nullopt on timeout.
  std::optional<Message> recv(int timeout_ms = 5000);
  // True if the daemon closes the connection within `timeout_ms` (skipping any reply, e.g.
  // an Error, that comes before the close).
  bool wait_closed(int timeout_ms = 5000);

  proto::HelloAck hello(std::uint64_t old_session = 0, std::uint32_t flags = 0);
  // ReserveReport (no reply); `flags`: proto::kReportReclaim, kReportActive.
  void reserve_report(const Uuid& device, std::uint64_t bytes, std::uint64_t blocks, std::uint32_t flags = 0);
  // The next Pressure message (one skipped while waiting for a reply, or one read now);
  // nullopt if none comes within `timeout_ms`. Throws ProtocolError on another message.
  std::optional<proto::Pressure> wait_pressure(int timeout_ms);
  std::vector<proto::Pressure> pressures;  // received, not yet taken by wait_pressure()
  struct Granted {
    proto::GrantReply reply{};
    std::vector<UniqueFd> fds;
  };
  Granted grant(const Uuid& device, std::uint64_t bytes, proto::GrantPurpose purpose = proto::GrantPurpose::alloc);
  proto::ReleaseAck release(std::uint64_t grant_id, std::uint32_t flags = 0);
  proto::UsageReply usage(const Uuid& device);

  std::uint64_t next_request_id() noexcept { return ++request_id_; }
  // How long the request helpers wait for their reply (10 s unless set; a grant that waits for
  // a swap-out under a sanitizer on 2 loaded cores needs longer).
  void set_reply_timeout(std::chrono::milliseconds t) noexcept { reply_timeout_ = t; }

 private:
  template <class R>
  R expect(std::uint64_t request_id, std::vector<UniqueFd>* fds = nullptr);

  UniqueFd fd_;
  std::uint64_t request_id_ = 100;
  std::chrono::milliseconds reply_timeout_{10000};
};

}  // namespace vlake::pooltest
