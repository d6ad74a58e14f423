// The codec conformance suite (contracts/codec.hpp): the one encoder/decoder that vlaked, the
// hook, the hook tests' fake daemon and the pool tests' client share. Every message round-trips
// byte for byte; every malformed datagram is refused with its reason and the kind of check that
// failed; the wire format stays what protocol version 1 says. tests/pool sends the client
// rejections of the same corpus (corpus.hpp) to a real vlaked.
#include <catch2/catch.hpp>

#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "vlake/contracts/codec.hpp"

using namespace vlake;
using namespace vlake::contracts_test;
using proto::DecodeError;

namespace {

proto::Decoded decode_bytes(const std::vector<std::byte>& b, std::size_t descriptors = 0) {
  return proto::decode(std::span<const std::byte>(b.data(), b.size()), descriptors);
}

// The reason decode() gives, "" when it accepts the datagram.
std::string reason(const std::vector<std::byte>& b, std::size_t descriptors = 0) {
  const proto::Decoded d = decode_bytes(b, descriptors);
  return d ? std::string() : d.error().reason;
}

template <class T>
std::vector<std::byte> with(const T& m, std::size_t offset, const void* value, std::size_t n) {
  std::vector<std::byte> b = wire(m);
  std::memcpy(b.data() + offset, value, n);
  return b;
}

}  // namespace

#define VLAKE_ALL_MESSAGES                                                                                            \
  proto::Hello, proto::HelloAck, proto::GrantRequest, proto::GrantReply, proto::Release, proto::ReleaseAck,           \
      proto::UsageQuery, proto::UsageReply, proto::Error, proto::GuardEvent, proto::Pressure, proto::ReserveReport,   \
      proto::ShareRequest, proto::ShareReply, proto::ShareCommit, proto::ShareAck, proto::ReadOnlyWrite, proto::Drop, \
      proto::Dropped, proto::SwapNotice, proto::SwapReady, proto::SwapIn, proto::SwapInReply, proto::ContextRequest,  \
      proto::ContextReply, proto::TierNotice, proto::TierStep, proto::TierPlan

// ---------------------------------------------------------------------------------------------
// round trips

TEMPLATE_TEST_CASE("codec: every message round-trips byte for byte", "[contracts][codec]", VLAKE_ALL_MESSAGES) {
  const TestType m = sample<TestType>();
  const auto bytes = proto::encode(m);
  CHECK(bytes.size() == sizeof(TestType));
  CHECK(bytes.size() == proto::size_of(proto::MessageTraits<TestType>::type));
  CHECK(static_cast<const void*>(bytes.data()) == static_cast<const void*>(&m));  // a view, no copy

  const std::vector<std::byte> b(bytes.begin(), bytes.end());
  const proto::Decoded d = decode_bytes(b, proto::descriptor_count(m));
  REQUIRE(d.ok());
  const TestType* back = d.get<TestType>();
  REQUIRE(back != nullptr);
  CHECK(std::memcmp(back, &m, sizeof m) == 0);
  CHECK(std::holds_alternative<TestType>(d.message()));
  REQUIRE(d.header() != nullptr);
  CHECK(d.header()->type == proto::MessageTraits<TestType>::type);
  CHECK(d.header()->request_id == m.h.request_id);
  CHECK(std::string(proto::message_name(proto::MessageTraits<TestType>::type)) == proto::MessageTraits<TestType>::name);
}

TEMPLATE_TEST_CASE("codec: make() fills the header and zeroes the body", "[contracts][codec]", VLAKE_ALL_MESSAGES) {
  const TestType m = proto::make<TestType>(1234);
  CHECK(m.h.magic == proto::kMagic);
  CHECK(m.h.version == proto::kVersion);
  CHECK(m.h.type == proto::MessageTraits<TestType>::type);
  CHECK(m.h.size == sizeof(TestType));
  CHECK(m.h.reserved == 0);
  CHECK(m.h.request_id == 1234);
  const auto* body = reinterpret_cast<const unsigned char*>(&m) + sizeof(proto::Header);
  bool zero = true;
  for (std::size_t i = 0; i < sizeof(TestType) - sizeof(proto::Header); ++i) zero = zero && body[i] == 0;
  CHECK(zero);
}

TEMPLATE_TEST_CASE("codec: any other type is not mistaken for this one", "[contracts][codec]", VLAKE_ALL_MESSAGES) {
  const proto::Decoded d = decode_bytes(wire(sample<TestType>()), proto::descriptor_count(sample<TestType>()));
  REQUIRE(d.ok());
  int matches = 0;
  std::visit([&](const auto& m) { matches += std::is_same_v<std::decay_t<decltype(m)>, TestType> ? 1 : 0; },
             d.message());
  CHECK(matches == 1);
  if constexpr (!std::is_same_v<TestType, proto::Hello>) CHECK(d.get<proto::Hello>() == nullptr);
  if constexpr (!std::is_same_v<TestType, proto::Error>) CHECK(d.get<proto::Error>() == nullptr);
}

TEMPLATE_TEST_CASE("codec: every truncation and extension of a message is refused", "[contracts][codec]",
                   VLAKE_ALL_MESSAGES) {
  const std::vector<std::byte> full = wire(sample<TestType>());
  for (std::size_t n = 0; n < full.size(); ++n) {
    std::vector<std::byte> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    const proto::Decoded d = decode_bytes(cut, proto::descriptor_count(sample<TestType>()));
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().kind == DecodeError::Kind::frame);
    CHECK(d.error().reason ==
          (n < sizeof(proto::Header) ? "shorter than a header" : "size does not match the message type"));
  }
  std::vector<std::byte> longer = full;
  longer.push_back(std::byte{0});
  CHECK(reason(longer, proto::descriptor_count(sample<TestType>())) == "size does not match the message type");
}

TEST_CASE("codec: decoding needs no alignment", "[contracts][codec]") {
  const proto::GrantReply m = sample<proto::GrantReply>();
  std::vector<std::byte> buf(sizeof m + 1);
  std::memcpy(buf.data() + 1, &m, sizeof m);
  const proto::Decoded d = proto::decode(std::span<const std::byte>(buf.data() + 1, sizeof m), 2);
  REQUIRE(d.ok());
  CHECK(std::memcmp(d.get<proto::GrantReply>(), &m, sizeof m) == 0);
}

// ---------------------------------------------------------------------------------------------
// framing

TEST_CASE("codec: framing rejections name their reason", "[contracts][codec]") {
  const proto::Hello hello = sample<proto::Hello>();

  SECTION("empty and short datagrams") {
    CHECK(reason({}) == "shorter than a header");
    CHECK(reason(std::vector<std::byte>(sizeof(proto::Header) - 1)) == "shorter than a header");
    const proto::Decoded d = decode_bytes(std::vector<std::byte>(10));
    CHECK(d.error().kind == DecodeError::Kind::frame);
    CHECK(d.header() == nullptr);
  }
  SECTION("bad magic") {
    const std::uint32_t magic = 0x12345678;
    const auto b = with(hello, offsetof(proto::Header, magic), &magic, sizeof magic);
    const proto::Decoded d = decode_bytes(b);
    CHECK(d.error().reason == "bad magic");
    CHECK(d.error().kind == DecodeError::Kind::frame);
    CHECK(d.header() == nullptr);  // nothing of it can be trusted
  }
  SECTION("another protocol version: kind version, header kept for the version_mismatch answer") {
    for (std::uint16_t v : {std::uint16_t{0}, std::uint16_t{1}, std::uint16_t{7}, std::uint16_t{0xffff}}) {
      const auto b = with(hello, offsetof(proto::Header, version), &v, sizeof v);
      const proto::Decoded d = decode_bytes(b);
      REQUIRE_FALSE(d.ok());
      CHECK(d.error().kind == DecodeError::Kind::version);
      CHECK(d.error().reason == "unsupported protocol version");
      REQUIRE(d.header() != nullptr);
      CHECK(d.header()->version == v);
      CHECK(d.header()->type == proto::MsgType::hello);
      CHECK(d.header()->request_id == 42);
    }
  }
  SECTION("a Hello of the next version and another size is still a version mismatch, not a size error") {
    std::vector<std::byte> b = wire(hello);
    b.resize(b.size() + 16);
    const std::uint16_t v = proto::kVersion + 1;
    std::memcpy(b.data() + offsetof(proto::Header, version), &v, sizeof v);
    CHECK(decode_bytes(b).error().kind == DecodeError::Kind::version);
  }
  SECTION("unknown message types") {
    for (std::uint16_t t : {std::uint16_t{0}, std::uint16_t{35}, std::uint16_t{99}, std::uint16_t{0xffff}}) {
      const auto b = with(hello, offsetof(proto::Header, type), &t, sizeof t);
      CHECK(reason(b) == "unknown message type");
      CHECK(proto::message_name(static_cast<proto::MsgType>(t)) == nullptr);
    }
  }
  SECTION("size field disagrees with the type or the datagram") {
    const std::uint32_t size = sizeof(proto::Hello) - 1;
    CHECK(reason(with(hello, offsetof(proto::Header, size), &size, sizeof size)) ==
          "size does not match the message type");
    // A well-sized datagram whose header names another type.
    const auto t = proto::MsgType::release;
    CHECK(reason(with(hello, offsetof(proto::Header, type), &t, sizeof t)) == "size does not match the message type");
  }
  SECTION("reserved header field") {
    const std::uint32_t one = 1;
    const auto b = with(hello, offsetof(proto::Header, reserved), &one, sizeof one);
    CHECK(reason(b) == "reserved header field is not zero");
    CHECK(decode_bytes(b).error().kind == DecodeError::Kind::frame);
  }
  SECTION("check_frame alone agrees") {
    const auto b = wire(hello);
    CHECK(proto::check_frame(std::span<const std::byte>(b)) == nullptr);
    CHECK(std::string(proto::check_frame(std::span<const std::byte>(b.data(), 3))) == "shorter than a header");
  }
}

// ---------------------------------------------------------------------------------------------
// fields

TEST_CASE("codec: every field check refuses with the daemon's wording", "[contracts][codec]") {
  const auto cases = field_rejections();
  for (const Rejection& r : cases) {
    INFO(r.name);
    const proto::Decoded d = decode_bytes(r.bytes, r.descriptors);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().kind == r.kind);
    CHECK(d.error().reason == r.reason);
    // The header is good: the receiver may still look at it (request id, type).
    REQUIRE(d.header() != nullptr);
    CHECK(d.header()->type == r.type);
    CHECK(d.get<proto::Hello>() == nullptr);
    // An Error carries 127 characters of reason: every reason fits.
    CHECK(r.reason.size() < sizeof(proto::Error::message));
  }
  // Every message type with a body check is covered.
  for (proto::MsgType t : {proto::MsgType::hello, proto::MsgType::hello_ack, proto::MsgType::grant_request,
                           proto::MsgType::grant_reply, proto::MsgType::release, proto::MsgType::release_ack,
                           proto::MsgType::usage_reply, proto::MsgType::error, proto::MsgType::guard_event,
                           proto::MsgType::pressure, proto::MsgType::reserve_report, proto::MsgType::share_request,
                           proto::MsgType::share_reply, proto::MsgType::share_commit, proto::MsgType::share_ack}) {
    bool covered = false;
    for (const Rejection& r : cases) covered = covered || r.type == t;
    INFO(proto::message_name(t));
    CHECK(covered);
  }
}

TEST_CASE("codec: the first failing check is the one reported, in the daemon's order", "[contracts][codec]") {
  auto g = sample<proto::GrantRequest>();
  g.flags = 1u << 7;
  g.purpose = static_cast<proto::GrantPurpose>(9);
  g.bytes = 0;
  CHECK(reason(wire(g)) == "GrantRequest has unknown flags");
  g.flags = proto::kGrantNoWait;
  CHECK(reason(wire(g)) == "GrantRequest purpose 9 out of range");

  auto e = sample<proto::GuardEvent>();
  e.kind = proto::GuardKind::canary;
  e.suspect_count = 100;
  CHECK(reason(wire(e)) == "GuardEvent kind 2 out of range");
  e.kind = static_cast<proto::GuardKind>(5);
  CHECK(reason(wire(e)) == "GuardEvent kind 5 out of range");

  // ReadOnlyWrite ranges (the corpus has the daemon-checked cases; these are the codec's rest).
  auto w = sample<proto::ReadOnlyWrite>();
  CHECK(reason(wire(w)).empty());
  w.reserved = 1;
  CHECK(reason(wire(w)) == "ReadOnlyWrite reserved field is not zero");
  w = sample<proto::ReadOnlyWrite>();
  w.bytes = ~std::uint64_t{0};
  CHECK(reason(wire(w)) == "ReadOnlyWrite range wraps around");
  w = sample<proto::ReadOnlyWrite>();
  w.alloc_bytes = 0;
  CHECK(reason(wire(w)) == "ReadOnlyWrite with an empty range");
  w = sample<proto::ReadOnlyWrite>();
  w.shared_bytes = 0;
  CHECK(reason(wire(w)) == "ReadOnlyWrite with an empty range");
  w = sample<proto::ReadOnlyWrite>();
  w.shared_offset = ~std::uint64_t{0} - w.alloc_address;
  CHECK(reason(wire(w)) == "ReadOnlyWrite range wraps around");
  w = sample<proto::ReadOnlyWrite>();
  w.alloc_bytes = ~std::uint64_t{0};
  CHECK(reason(wire(w)) == "ReadOnlyWrite range wraps around");
  w = sample<proto::ReadOnlyWrite>();
  w.shared_bytes = 2 * kMiB;  // 1 MiB past the destination's end
  CHECK(reason(wire(w)) == "ReadOnlyWrite shared range outside the destination");
  w.shared_bytes = kMiB;  // exactly to the destination's end
  CHECK(reason(wire(w)).empty());

  // Framing comes before fields: a bad body with a bad header reports the header.
  auto h = sample<proto::Hello>();
  h.flags = ~0u;
  h.h.reserved = 1;
  CHECK(reason(wire(h)) == "reserved header field is not zero");
}

TEST_CASE("codec: values the protocol allows are accepted", "[contracts][codec]") {
  SECTION("every grant purpose and release flag combination") {
    for (auto p : {proto::GrantPurpose::alloc, proto::GrantPurpose::create, proto::GrantPurpose::counted}) {
      auto m = sample<proto::GrantRequest>();
      m.purpose = p;
      CHECK(reason(wire(m)).empty());
    }
    for (std::uint32_t f : {0u, std::uint32_t{proto::kReleaseExported}}) {
      auto m = sample<proto::Release>();
      m.flags = f;
      CHECK(reason(wire(m)).empty());
    }
  }
  SECTION("guard events: fault and fault_maps_shared, 0..kMaxGuardSuspects suspects") {
    for (auto k : {proto::GuardKind::fault, proto::GuardKind::fault_maps_shared}) {
      for (std::uint32_t n = 0; n <= proto::kMaxGuardSuspects; ++n) {
        auto m = sample<proto::GuardEvent>();
        m.kind = k;
        m.suspect_count = n;
        CHECK(reason(wire(m)).empty());
      }
    }
  }
  SECTION("strings of the full length minus the NUL") {
    auto h = sample<proto::Hello>();
    std::memset(h.client, 'c', sizeof h.client - 1);
    h.client[sizeof h.client - 1] = '\0';
    CHECK(reason(wire(h)).empty());
    auto e = sample<proto::Error>();
    std::memset(e.message, 'm', sizeof e.message);
    e.message[sizeof e.message - 1] = '\0';
    CHECK(reason(wire(e)).empty());
  }
  SECTION("unknown status values (a receiver treats them as a refusal)") {
    auto r = sample<proto::GrantReply>();
    r.status = static_cast<proto::Status>(1000);
    r.handle_count = 0;
    CHECK(reason(wire(r)).empty());
  }
  SECTION("counts at their arrays' size") {
    auto a = sample<proto::HelloAck>();
    a.device_count = proto::kMaxDevices;
    CHECK(reason(wire(a)).empty());
    auto g = sample<proto::GrantReply>();
    g.handle_count = proto::kMaxHandlesPerGrant;
    CHECK(reason(wire(g), proto::kMaxHandlesPerGrant).empty());
    auto s = proto::make<proto::ShareReply>(1);
    s.piece_count = proto::kMaxHandlesPerGrant;
    s.total_pieces = proto::kMaxHandlesPerGrant;
    CHECK(reason(wire(s), proto::kMaxHandlesPerGrant).empty());
  }
  SECTION("a refusal's reply: zero counts, zero descriptors") {
    auto g = proto::make<proto::GrantReply>(1);
    g.status = proto::Status::over_limit;
    CHECK(reason(wire(g)).empty());
    auto s = proto::make<proto::ShareReply>(1);
    s.status = proto::Status::unknown_grant;
    CHECK(reason(wire(s)).empty());
  }
  SECTION("a reserve report of 0 bytes in 0 blocks; blocks == bytes") {
    auto m = sample<proto::ReserveReport>();
    m.bytes = 0;
    m.blocks = 0;
    CHECK(reason(wire(m)).empty());
    m.bytes = m.blocks = 5;
    CHECK(reason(wire(m)).empty());
    m.flags = proto::kReportReclaim;
    CHECK(reason(wire(m)).empty());
    m.flags = proto::kReportReclaim | proto::kReportActive;
    CHECK(reason(wire(m)).empty());
    m.flags = proto::kReportActive << 1;
    CHECK(reason(wire(m)) == "ReserveReport has unknown flags");
    m.flags = 0;
    m.reserved = 1;
    CHECK(reason(wire(m)) == "ReserveReport reserved field is not zero");
  }
  SECTION("a Hello's and a HelloAck's wait for memory is at most 10 minutes") {
    auto h = sample<proto::Hello>();
    h.flags = proto::kHelloWait;
    h.wait_ms = proto::kMaxWaitMs;
    CHECK(reason(wire(h)).empty());
    h.wait_ms = proto::kMaxWaitMs + 1;
    CHECK(reason(wire(h)) == "Hello wait_ms 600001 out of range");
    h.wait_ms = 0;
    h.reserved = 1;
    CHECK(reason(wire(h)) == "Hello reserved field is not zero");
    auto a = sample<proto::HelloAck>();
    a.wait_ms = proto::kMaxWaitMs + 1;
    CHECK(reason(wire(a)) == "HelloAck wait_ms 600001 out of range");
    a.wait_ms = 0;
    a.flags = proto::kAckOvercommit;
    CHECK(reason(wire(a)).empty());
    a.flags = 2;
    CHECK(reason(wire(a)) == "HelloAck flags 2 unknown");
  }
}

// ---------------------------------------------------------------------------------------------
// descriptors

TEST_CASE("codec: descriptors must be those the message carries", "[contracts][codec]") {
  SECTION("one per GrantReply handle") {
    const auto g = sample<proto::GrantReply>();
    CHECK(proto::descriptor_count(g) == 2);
    CHECK(reason(wire(g), 2).empty());
    const proto::Decoded d = decode_bytes(wire(g), 1);
    CHECK(d.error().kind == DecodeError::Kind::descriptors);
    CHECK(d.error().reason == "GrantReply with 1 descriptors instead of 2");
    CHECK(reason(wire(g), 3) == "GrantReply with 3 descriptors instead of 2");
  }
  SECTION("a counted grant's reply carries none") {
    auto g = sample<proto::GrantReply>();
    g.handle_count = 0;
    CHECK(reason(wire(g), 0).empty());
    CHECK(reason(wire(g), 1) == "descriptors attached to a GrantReply, which carries none");
  }
  SECTION("one per ShareReply piece that is not kept") {
    const auto s = sample<proto::ShareReply>();
    CHECK(proto::descriptor_count(s) == 2);  // keep, shared, copy
    CHECK(reason(wire(s), 2).empty());
    CHECK(reason(wire(s), 3) == "ShareReply with 3 descriptors instead of 2");
  }
  SECTION("no other message carries any (the daemon's 'descriptors attached' case)") {
    CHECK(reason(wire(sample<proto::UsageQuery>()), 1) == "descriptors attached to a UsageQuery, which carries none");
    CHECK(reason(wire(sample<proto::Pressure>()), 1) == "descriptors attached to a Pressure, which carries none");
    CHECK(decode_bytes(wire(sample<proto::Hello>()), 2).error().kind == DecodeError::Kind::descriptors);
  }
}

// ---------------------------------------------------------------------------------------------
// the two ends

TEST_CASE("codec: what the hook sends, the daemon accepts, and back", "[contracts][codec]") {
  // The hook builds its requests as client.cpp does: make<T>(), fields, encode().
  SECTION("client requests") {
    auto hello = proto::make<proto::Hello>(1);
    hello.pid = 99;
    hello.flags = proto::kHelloPressure;
    std::snprintf(hello.client, sizeof hello.client, "vlake-hook 0.1.0");
    CHECK(reason(wire(hello)).empty());
    auto grant = proto::make<proto::GrantRequest>(2);
    sample_uuid().copy_to(grant.device_uuid);
    grant.bytes = 1;
    for (auto p : {proto::GrantPurpose::alloc, proto::GrantPurpose::create, proto::GrantPurpose::counted}) {
      grant.purpose = p;
      CHECK(reason(wire(grant)).empty());
    }
    auto release = proto::make<proto::Release>(3);
    release.grant_id = 1;
    release.flags = proto::kReleaseExported;
    CHECK(reason(wire(release)).empty());
    auto usage = proto::make<proto::UsageQuery>(4);
    CHECK(reason(wire(usage)).empty());
    auto report = proto::make<proto::ReserveReport>(5);
    CHECK(reason(wire(report)).empty());
    auto share = proto::make<proto::ShareRequest>(6);
    share.flags = proto::kShareTransparent;
    share.bytes = 2 * kMiB;
    CHECK(reason(wire(share)).empty());
    for (std::uint32_t c : {0u, 1u}) {
      auto commit = proto::make<proto::ShareCommit>(7);
      commit.commit = c;
      CHECK(reason(wire(commit)).empty());
    }
    // A GuardEvent as hook.cpp builds it: value-initialized, kind and call set, header stamped
    // when sent.
    proto::GuardEvent ev{};
    ev.kind = proto::GuardKind::fault_maps_shared;
    std::snprintf(ev.call, sizeof ev.call, "%s", "cuCtxSynchronize_v2");
    ev.h = proto::make<proto::GuardEvent>(8).h;
    CHECK(reason(wire(ev)).empty());
    // A ReadOnlyWrite as hook.cpp builds it: a memset that starts in the private edge of an
    // allocation and ends exactly at the end of its first shared chunk.
    proto::ReadOnlyWrite w{};
    w.alloc_address = 0x7f0000000000;
    w.alloc_bytes = 20 * kMiB;
    w.address = w.alloc_address + kMiB;
    w.bytes = 2 * kMiB;
    w.shared_offset = 2 * kMiB;
    w.shared_bytes = kMiB;
    w.cuda_status = 1;
    std::snprintf(w.call, sizeof w.call, "%s", "cuMemsetD8Async");
    w.h = proto::make<proto::ReadOnlyWrite>(9).h;
    CHECK(reason(wire(w)).empty());
  }
  SECTION("daemon replies, value-initialized then filled, as vlaked builds them") {
    auto ack = proto::make<proto::HelloAck>(1);
    ack.device_count = 1;
    ack.guard_mode = proto::GuardMode::canary;
    CHECK(reason(wire(ack)).empty());
    auto err = proto::make<proto::Error>(0);
    err.status = proto::Status::bad_request;
    CHECK(reason(wire(err)).empty());
    auto p = proto::make<proto::Pressure>(0);
    p.reason = proto::PressureReason::pool_exhausted;
    CHECK(reason(wire(p)).empty());
    for (auto m : {wire(proto::make<proto::ReleaseAck>(1)), wire(proto::make<proto::UsageReply>(1)),
                   wire(proto::make<proto::ShareAck>(1))}) {
      CHECK(reason(m).empty());
    }
  }
}

TEST_CASE("codec: the wire format is protocol version 6's, byte for byte", "[contracts][codec]") {
  // Header: magic "VLK1", version 6, type, size, reserved, request id; host-endian.
  auto m = proto::make<proto::ReleaseAck>(0x1122334455667788ull);
  m.status = proto::Status::unknown_grant;
  m.used = 0x0102030405060708ull;
  const std::vector<std::byte> b = wire(m);
  const unsigned char expect[40] = {
      'V',  'L',  'K',  '1',                           // magic 0x314b4c56
      6,    0,                                         // version
      6,    0,                                         // type release_ack
      40,   0,    0,    0,                             // size
      0,    0,    0,    0,                             // reserved
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // request id
      5,    0,    0,    0,                             // status unknown_grant
      0,    0,    0,    0,                             // reserved
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // used
  };
  static_assert(std::endian::native == std::endian::little, "the expected bytes are little-endian");
  REQUIRE(b.size() == sizeof expect);
  CHECK(std::memcmp(b.data(), expect, sizeof expect) == 0);
  // Field offsets every version-3 peer relies on.
  CHECK(offsetof(proto::GrantRequest, device_uuid) == 24);
  CHECK(offsetof(proto::GrantRequest, bytes) == 40);
  CHECK(offsetof(proto::GrantRequest, purpose) == 48);
  CHECK(offsetof(proto::GrantRequest, flags) == 52);  // version 6
  CHECK(offsetof(proto::ReserveReport, flags) == 56);
  CHECK(offsetof(proto::GrantReply, handles) == 64);
  CHECK(offsetof(proto::HandleDesc, key) == 16);  // version 2
  CHECK(sizeof(proto::HandleDesc) == 24);
  CHECK(offsetof(proto::HelloAck, tenant_name) == 56);
  CHECK(offsetof(proto::HelloAck, devices) == 120);
  CHECK(offsetof(proto::GuardEvent, suspects) == 88);
  CHECK(offsetof(proto::ShareReply, pieces) == 72);
  CHECK(offsetof(proto::Error, message) == 32);
}

TEST_CASE("codec: random datagrams never crash the decoder, and what it accepts re-encodes identically",
          "[contracts][codec]") {
  std::mt19937_64 rng(20240611);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    // Start from a good message of a random type and flip a few random bytes of it.
    std::vector<std::byte> b;
    switch (rng() % 4) {
      case 0: b = wire(sample<proto::GrantRequest>()); break;
      case 1: b = wire(sample<proto::GuardEvent>()); break;
      case 2: b = wire(sample<proto::ShareReply>()); break;
      default: b = wire(sample<proto::Hello>()); break;
    }
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<std::byte>(rng());
    if (rng() % 8 == 0) b.resize(rng() % (b.size() + 8));
    const proto::Decoded d = decode_bytes(b, rng() % 3);
    if (!d) {
      CHECK_FALSE(d.error().reason.empty());
      continue;
    }
    ++accepted;
    const auto again = std::visit([](const auto& m) { return wire(m); }, d.message());
    CHECK(again == b);
  }
  CHECK(accepted > 0);
}
