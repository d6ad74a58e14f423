// The codec conformance corpus: a well-formed sample of every message, and every way a message
// can be malformed with the reason the codec (and therefore vlaked) gives. tests/contracts runs
// it against the codec; tests/pool sends the client messages of it to a real vlaked and expects
// the same reasons in its Error replies, so the daemon's path cannot drift from the codec.
//
// Header-only test support; not thread-safe (plain functions returning values).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "vlake/common/uuid.hpp"
#include "vlake/contracts/codec.hpp"

namespace vlake::contracts_test {

inline constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// A GPU UUID for the samples.
inline Uuid sample_uuid() {
  Uuid u;
  for (std::size_t i = 0; i < Uuid::kBytes; ++i) u[i] = static_cast<std::uint8_t>(0xa0 + i);
  return u;
}

template <std::size_t N>
void set_text(char (&dst)[N], const char* text) {
  std::memset(dst, 0, N);
  std::memcpy(dst, text, std::min(std::strlen(text), N - 1));
}

// A well-formed message of each type with distinctive non-zero fields (request id 42).
template <class T>
T sample();

template <>
inline proto::Hello sample<proto::Hello>() {
  auto m = proto::make<proto::Hello>(42);
  m.pid = 4242;
  m.flags = proto::kHelloPressure | proto::kHelloWait;
  m.old_session = 77;
  set_text(m.client, "vlake-hook 0.1.0");
  m.wait_ms = 30000;
  return m;
}
template <>
inline proto::HelloAck sample<proto::HelloAck>() {
  auto m = proto::make<proto::HelloAck>(42);
  m.status = proto::Status::ok;
  m.tenant_id = 3;
  m.session_id = 9;
  m.granularity = 2 * kMiB;
  m.device_count = 2;
  m.guard_mode = proto::GuardMode::fault;
  set_text(m.tenant_name, "research/user:alice");
  m.wait_ms = 30000;
  for (std::uint32_t i = 0; i < m.device_count; ++i) {
    Uuid u = sample_uuid();
    u[0] = static_cast<std::uint8_t>(i);
    u.copy_to(m.devices[i].uuid);
    m.devices[i].total = 80ull << 30;
    m.devices[i].limit = 8ull << 30;
    m.devices[i].used = 2 * kMiB * (i + 1);
  }
  return m;
}
template <>
inline proto::GrantRequest sample<proto::GrantRequest>() {
  auto m = proto::make<proto::GrantRequest>(42);
  sample_uuid().copy_to(m.device_uuid);
  m.bytes = 3 * kMiB;
  m.purpose = proto::GrantPurpose::alloc;
  return m;
}
template <>
inline proto::GrantReply sample<proto::GrantReply>() {
  auto m = proto::make<proto::GrantReply>(42);
  m.status = proto::Status::ok;
  m.handle_count = 2;
  m.grant_id = 5;
  m.bytes = 4 * kMiB;
  m.limit = 8ull << 30;
  m.used = 6 * kMiB;
  m.handles[0] = proto::HandleDesc{2 * kMiB, 0, 7};
  m.handles[1] = proto::HandleDesc{2 * kMiB, 2 * kMiB, 0};
  return m;
}
template <>
inline proto::Release sample<proto::Release>() {
  auto m = proto::make<proto::Release>(42);
  m.grant_id = 5;
  m.flags = proto::kReleaseExported;
  return m;
}
template <>
inline proto::ReleaseAck sample<proto::ReleaseAck>() {
  auto m = proto::make<proto::ReleaseAck>(42);
  m.status = proto::Status::ok;
  m.used = 2 * kMiB;
  return m;
}
template <>
inline proto::UsageQuery sample<proto::UsageQuery>() {
  auto m = proto::make<proto::UsageQuery>(42);
  sample_uuid().copy_to(m.device_uuid);
  return m;
}
template <>
inline proto::UsageReply sample<proto::UsageReply>() {
  auto m = proto::make<proto::UsageReply>(42);
  m.status = proto::Status::ok;
  m.total = 80ull << 30;
  m.limit = 8ull << 30;
  m.used = 6 * kMiB;
  return m;
}
template <>
inline proto::Error sample<proto::Error>() {
  auto m = proto::make<proto::Error>(42);
  m.status = proto::Status::bad_request;
  set_text(m.message, "GrantRequest for 0 bytes");
  return m;
}
template <>
inline proto::GuardEvent sample<proto::GuardEvent>() {
  auto m = proto::make<proto::GuardEvent>(42);
  m.kind = proto::GuardKind::fault;
  m.suspect_count = 2;
  sample_uuid().copy_to(m.device_uuid);
  m.cuda_status = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS
  m.live_allocations = 3;
  set_text(m.call, "cuStreamSynchronize");
  m.suspects[0] = proto::GuardSuspect{0x7f0000200000, 3 * kMiB, 1000};
  m.suspects[1] = proto::GuardSuspect{0x7f0000000000, kMiB, 2000};
  return m;
}
template <>
inline proto::Pressure sample<proto::Pressure>() {
  auto m = proto::make<proto::Pressure>(0);
  sample_uuid().copy_to(m.device_uuid);
  m.bytes = 64 * kMiB;
  m.reason = proto::PressureReason::low_memory;
  return m;
}
template <>
inline proto::ReserveReport sample<proto::ReserveReport>() {
  auto m = proto::make<proto::ReserveReport>(42);
  sample_uuid().copy_to(m.device_uuid);
  m.bytes = 8 * kMiB;
  m.blocks = 3;
  m.flags = proto::kReportReclaim;
  return m;
}
template <>
inline proto::ShareRequest sample<proto::ShareRequest>() {
  auto m = proto::make<proto::ShareRequest>(42);
  m.grant_id = 5;
  m.offset = 2 * kMiB;
  m.bytes = 4 * kMiB;
  m.first_piece = 0;
  m.flags = proto::kShareTransparent;
  return m;
}
template <>
inline proto::ShareReply sample<proto::ShareReply>() {
  auto m = proto::make<proto::ShareReply>(42);
  m.status = proto::Status::ok;
  m.piece_count = 3;
  m.first_piece = 1;
  m.total_pieces = 4;
  m.grant_id = 5;
  m.shared_bytes = 4 * kMiB;
  m.merged_bytes = 2 * kMiB;
  m.copied_bytes = 2 * kMiB;
  m.pieces[0] = proto::SharePiece{2 * kMiB, 0, proto::kShareKeep, 0};
  m.pieces[1] = proto::SharePiece{2 * kMiB, 2 * kMiB, proto::kShareReadOnly, 0};
  m.pieces[2] = proto::SharePiece{2 * kMiB, 4 * kMiB, 0, 0};
  return m;
}
template <>
inline proto::ShareCommit sample<proto::ShareCommit>() {
  auto m = proto::make<proto::ShareCommit>(42);
  m.grant_id = 5;
  m.commit = 1;
  return m;
}
template <>
inline proto::ShareAck sample<proto::ShareAck>() {
  auto m = proto::make<proto::ShareAck>(42);
  m.status = proto::Status::ok;
  m.shared_bytes = 4 * kMiB;
  return m;
}

template <>
inline proto::IpcExport sample<proto::IpcExport>() {
  auto m = proto::make<proto::IpcExport>(42);
  m.grant_id = 5;
  return m;
}
template <>
inline proto::IpcExportReply sample<proto::IpcExportReply>() {
  auto m = proto::make<proto::IpcExportReply>(42);
  m.status = proto::Status::ok;
  m.grant_id = 5;
  m.token = 9;
  m.secret = 0x1234567890abcdefULL;
  m.bytes = 6 * kMiB;
  return m;
}
template <>
inline proto::IpcOpen sample<proto::IpcOpen>() {
  auto m = proto::make<proto::IpcOpen>(42);
  m.token = 9;
  m.secret = 0x1234567890abcdefULL;
  return m;
}
template <>
inline proto::IpcOpenReply sample<proto::IpcOpenReply>() {
  auto m = proto::make<proto::IpcOpenReply>(42);
  m.status = proto::Status::ok;
  m.piece_count = 2;
  m.import_id = 3;
  m.bytes = 4 * kMiB;
  sample_uuid().copy_to(m.device_uuid);
  m.owner_tenant = 1;
  m.pieces[0] = proto::SharePiece{2 * kMiB, 0, 0, 0};
  m.pieces[1] = proto::SharePiece{2 * kMiB, 2 * kMiB, proto::kShareReadOnly, 0};
  return m;
}
template <>
inline proto::IpcClose sample<proto::IpcClose>() {
  auto m = proto::make<proto::IpcClose>(42);
  m.import_id = 3;
  return m;
}
template <>
inline proto::IpcCloseAck sample<proto::IpcCloseAck>() {
  auto m = proto::make<proto::IpcCloseAck>(42);
  m.status = proto::Status::ok;
  return m;
}

template <>
inline proto::ReadOnlyWrite sample<proto::ReadOnlyWrite>() {
  // A 1 MiB memset from 1 MiB into a 20 MiB allocation whose chunks [2 MiB, 18 MiB) are shared.
  auto m = proto::make<proto::ReadOnlyWrite>(42);
  sample_uuid().copy_to(m.device_uuid);
  m.grant_id = 7;
  m.alloc_address = 0x7f0000000000;
  m.alloc_bytes = 20 * kMiB;
  m.alloc_age_ns = 5000;
  m.address = m.alloc_address + kMiB;
  m.bytes = 2 * kMiB;
  m.shared_offset = 2 * kMiB;
  m.shared_bytes = kMiB;
  m.cuda_status = 1;  // CUDA_ERROR_INVALID_VALUE
  set_text(m.call, "cuMemsetD8");
  return m;
}

template <>
inline proto::Drop sample<proto::Drop>() {
  auto m = proto::make<proto::Drop>();
  m.count = 2;
  m.keys[0] = 11;
  m.keys[1] = (1ULL << 56) + 3;
  return m;
}

template <>
inline proto::Dropped sample<proto::Dropped>() {
  auto m = proto::make<proto::Dropped>();
  m.count = 1;
  m.keys[0] = 11;
  return m;
}

template <>
inline proto::SwapNotice sample<proto::SwapNotice>() {
  auto m = proto::make<proto::SwapNotice>();
  m.phase = proto::SwapPhase::out;
  m.swap_id = 7;
  return m;
}

template <>
inline proto::SwapReady sample<proto::SwapReady>() {
  auto m = proto::make<proto::SwapReady>();
  m.swap_id = 7;
  return m;
}

template <>
inline proto::SwapIn sample<proto::SwapIn>() {
  return proto::make<proto::SwapIn>();
}

template <>
inline proto::SwapInReply sample<proto::SwapInReply>() {
  auto m = proto::make<proto::SwapInReply>();
  m.status = proto::Status::ok;
  m.waited_ms = 1200;
  return m;
}

template <>
inline proto::ContextRequest sample<proto::ContextRequest>() {
  auto m = proto::make<proto::ContextRequest>(12);
  m.device_uuid[0] = 0x5a;
  m.op = proto::ContextOp::admit;
  return m;
}

template <>
inline proto::ContextReply sample<proto::ContextReply>() {
  auto m = proto::make<proto::ContextReply>(12);
  m.status = proto::Status::over_limit;
  m.contexts = 1;
  m.bytes = 518ULL << 20;
  m.limit = 2ULL << 30;
  m.used = 1554ULL << 20;
  return m;
}

template <>
inline proto::TierNotice sample<proto::TierNotice>() {
  auto m = proto::make<proto::TierNotice>();
  m.direction = proto::TierDirection::to_host;
  m.move_id = 5;
  return m;
}

template <>
inline proto::TierStep sample<proto::TierStep>() {
  auto m = proto::make<proto::TierStep>(13);
  m.move_id = 5;
  m.grant_id = 9;
  m.result = proto::TierResult::moved;
  return m;
}

template <>
inline proto::TierPlan sample<proto::TierPlan>() {
  auto m = proto::make<proto::TierPlan>(13);
  m.status = proto::Status::ok;
  m.move_id = 5;
  m.grant_id = 9;
  m.bytes = 6ULL << 20;
  m.direction = proto::TierDirection::to_host;
  m.total_pieces = 2;
  m.piece_count = 2;
  m.pieces[0] = {4ULL << 20, 0};
  m.pieces[1] = {2ULL << 20, 4ULL << 20};
  return m;
}

template <proto::Message T>
std::vector<std::byte> wire(const T& m) {
  const auto s = proto::encode(m);
  return {s.begin(), s.end()};
}

// A message the codec must refuse for a reason of its body.
struct Rejection {
  std::string name;              // what is wrong, for test output
  proto::MsgType type;           // of the message
  bool from_client;              // a client -> daemon message (vlaked must refuse it too)
  std::vector<std::byte> bytes;  // the datagram
  std::size_t descriptors;       // attached to it
  proto::DecodeError::Kind kind;
  std::string reason;  // exactly
};

namespace detail {
template <proto::Message T>
Rejection reject(std::string name, bool from_client, const std::function<void(T&)>& spoil, std::string reason,
                 proto::DecodeError::Kind kind = proto::DecodeError::Kind::fields) {
  T m = sample<T>();
  spoil(m);
  return Rejection{std::move(name),  proto::MessageTraits<T>::type,        from_client,
                   wire(m),          proto::descriptor_count(sample<T>()), kind,
                   std::move(reason)};
}
template <std::size_t N>
void fill(char (&s)[N]) {
  std::memset(s, 'x', N);
}
}  // namespace detail

// Every stateless field check of the codec, with its reason (the daemon's wording), in the
// order the checks run: each spoils one field of a sample.
inline std::vector<Rejection> field_rejections() {
  using namespace proto;
  using detail::fill;
  using detail::reject;
  constexpr bool client = true;
  constexpr bool daemon = false;
  return {
      reject<Hello>(
          "Hello unknown flag", client, [](Hello& m) { m.flags |= 1u << 7; }, "Hello has unknown flags"),
      reject<Hello>(
          "Hello client not terminated", client, [](Hello& m) { fill(m.client); }, "Hello client name not terminated"),
      reject<HelloAck>(
          "HelloAck device_count", daemon, [](HelloAck& m) { m.device_count = kMaxDevices + 1; },
          "HelloAck device_count 17 out of range"),
      reject<HelloAck>(
          "HelloAck guard_mode", daemon, [](HelloAck& m) { m.guard_mode = static_cast<GuardMode>(3); },
          "HelloAck guard_mode 3 out of range"),
      reject<HelloAck>(
          "HelloAck tenant not terminated", daemon, [](HelloAck& m) { fill(m.tenant_name); },
          "HelloAck tenant name not terminated"),
      reject<GrantRequest>(
          "GrantRequest flags", client, [](GrantRequest& m) { m.flags = 1u << 9; }, "GrantRequest has unknown flags"),
      reject<GrantRequest>(
          "GrantRequest purpose 0", client, [](GrantRequest& m) { m.purpose = static_cast<GrantPurpose>(0); },
          "GrantRequest purpose 0 out of range"),
      reject<GrantRequest>(
          "GrantRequest purpose 4", client, [](GrantRequest& m) { m.purpose = static_cast<GrantPurpose>(4); },
          "GrantRequest purpose 4 out of range"),
      reject<GrantRequest>(
          "GrantRequest 0 bytes", client, [](GrantRequest& m) { m.bytes = 0; }, "GrantRequest for 0 bytes"),
      reject<GrantReply>(
          "GrantReply handle_count", daemon, [](GrantReply& m) { m.handle_count = kMaxHandlesPerGrant + 1; },
          "GrantReply handle_count 33 out of range"),
      reject<Release>(
          "Release reserved", client, [](Release& m) { m.reserved = 1; }, "Release reserved field is not zero"),
      reject<Release>(
          "Release unknown flag", client, [](Release& m) { m.flags = 4; }, "Release has unknown flags"),
      reject<ReleaseAck>(
          "ReleaseAck reserved", daemon, [](ReleaseAck& m) { m.reserved = 1; },
          "ReleaseAck reserved field is not zero"),
      reject<UsageReply>(
          "UsageReply reserved", daemon, [](UsageReply& m) { m.reserved = 1; },
          "UsageReply reserved field is not zero"),
      reject<Error>(
          "Error reserved", daemon, [](Error& m) { m.reserved = 1; }, "Error reserved field is not zero"),
      reject<Error>(
          "Error message not terminated", daemon, [](Error& m) { fill(m.message); }, "Error message not terminated"),
      reject<GuardEvent>(
          "GuardEvent kind 0", client, [](GuardEvent& m) { m.kind = static_cast<GuardKind>(0); },
          "GuardEvent kind 0 out of range"),
      reject<GuardEvent>(
          "GuardEvent kind canary (the daemon's finding, never a client's)", client,
          [](GuardEvent& m) { m.kind = GuardKind::canary; }, "GuardEvent kind 2 out of range"),
      reject<GuardEvent>(
          "GuardEvent kind readonly_write (travels as ReadOnlyWrite)", client,
          [](GuardEvent& m) { m.kind = GuardKind::readonly_write; }, "GuardEvent kind 4 out of range"),
      reject<GuardEvent>(
          "GuardEvent suspect_count", client, [](GuardEvent& m) { m.suspect_count = kMaxGuardSuspects + 1; },
          "GuardEvent suspect_count 9 out of range"),
      reject<GuardEvent>(
          "GuardEvent call not terminated", client, [](GuardEvent& m) { fill(m.call); },
          "GuardEvent call name not terminated"),
      reject<Pressure>(
          "Pressure reserved", daemon, [](Pressure& m) { m.reserved = 1; }, "Pressure reserved field is not zero"),
      reject<Pressure>(
          "Pressure reason 0", daemon, [](Pressure& m) { m.reason = static_cast<PressureReason>(0); },
          "Pressure reason 0 out of range"),
      reject<Pressure>(
          "Pressure reason 3", daemon, [](Pressure& m) { m.reason = static_cast<PressureReason>(3); },
          "Pressure reason 3 out of range"),
      reject<ReserveReport>(
          "ReserveReport blocks > bytes", client, [](ReserveReport& m) { m.blocks = m.bytes + 1; },
          "ReserveReport has more blocks than bytes"),
      reject<ShareRequest>(
          "ShareRequest unknown flag", client, [](ShareRequest& m) { m.flags |= 1u << 5; },
          "ShareRequest has unknown flags"),
      reject<ShareReply>(
          "ShareReply piece_count", daemon,
          [](ShareReply& m) {
            m.piece_count = kMaxHandlesPerGrant + 1;
            m.total_pieces = 100;
          },
          "ShareReply piece_count 33 out of range"),
      reject<ShareReply>(
          "ShareReply first_piece beyond total", daemon, [](ShareReply& m) { m.first_piece = 5; },
          "ShareReply pieces beyond total_pieces"),
      reject<ShareReply>(
          "ShareReply batch beyond total", daemon, [](ShareReply& m) { m.total_pieces = 3; },
          "ShareReply pieces beyond total_pieces"),
      reject<ShareReply>(
          "ShareReply piece flag", daemon, [](ShareReply& m) { m.pieces[2].flags = 1u << 2; },
          "ShareReply piece 2 has unknown flags"),
      reject<ShareCommit>(
          "ShareCommit reserved", client, [](ShareCommit& m) { m.reserved = 1; },
          "ShareCommit reserved field is not zero"),
      reject<ShareCommit>(
          "ShareCommit commit 2", client, [](ShareCommit& m) { m.commit = 2; }, "ShareCommit commit out of range"),
      reject<ShareAck>(
          "ShareAck reserved", daemon, [](ShareAck& m) { m.reserved = 1; }, "ShareAck reserved field is not zero"),
      reject<IpcExportReply>(
          "IpcExportReply reserved", daemon, [](IpcExportReply& m) { m.reserved = 1; },
          "IpcExportReply reserved field is not zero"),
      reject<IpcOpenReply>(
          "IpcOpenReply reserved", daemon, [](IpcOpenReply& m) { m.reserved = 1; },
          "IpcOpenReply reserved field is not zero"),
      reject<IpcOpenReply>(
          "IpcOpenReply piece_count", daemon, [](IpcOpenReply& m) { m.piece_count = kMaxHandlesPerGrant + 1; },
          "IpcOpenReply piece_count 33 out of range"),
      reject<IpcOpenReply>(
          "IpcOpenReply piece flag", daemon, [](IpcOpenReply& m) { m.pieces[1].flags = proto::kShareKeep; },
          "IpcOpenReply piece 1 has unknown flags"),
      reject<TierNotice>(
          "TierNotice direction", daemon, [](TierNotice& m) { m.direction = static_cast<TierDirection>(3); },
          "TierNotice direction 3 out of range"),
      reject<TierNotice>(
          "TierNotice no id", daemon, [](TierNotice& m) { m.move_id = 0; }, "TierNotice move_id is 0"),
      reject<TierStep>(
          "TierStep result", client, [](TierStep& m) { m.result = static_cast<TierResult>(6); },
          "TierStep result 6 out of range"),
      reject<TierStep>(
          "TierStep busy grant", client, [](TierStep& m) { m.result = TierResult::busy; },
          "TierStep busy names a grant"),
      reject<TierStep>(
          "TierStep outcome without grant", client, [](TierStep& m) { m.grant_id = 0; },
          "TierStep result without a grant"),
      reject<TierPlan>(
          "TierPlan piece outside", daemon, [](TierPlan& m) { m.pieces[1].offset = 5ULL << 20; },
          "TierPlan piece 1 lies outside the grant"),
      reject<TierPlan>(
          "TierPlan batch beyond total", daemon, [](TierPlan& m) { m.first_piece = 1; },
          "TierPlan pieces 1+2 of 2 out of range"),
      reject<TierPlan>(
          "TierPlan empty piece", daemon, [](TierPlan& m) { m.pieces[0].size = 0; }, "TierPlan piece 0 is empty"),
      reject<IpcCloseAck>(
          "IpcCloseAck reserved", daemon, [](IpcCloseAck& m) { m.reserved = 1; },
          "IpcCloseAck reserved field is not zero"),
      reject<ReadOnlyWrite>(
          "ReadOnlyWrite empty destination", client, [](ReadOnlyWrite& m) { m.bytes = 0; },
          "ReadOnlyWrite with an empty range"),
      reject<ReadOnlyWrite>(
          "ReadOnlyWrite shared range before the destination", client, [](ReadOnlyWrite& m) { m.shared_offset = 0; },
          "ReadOnlyWrite shared range outside the destination"),
      reject<ReadOnlyWrite>(
          "ReadOnlyWrite call not terminated", client, [](ReadOnlyWrite& m) { fill(m.call); },
          "ReadOnlyWrite call name not terminated"),
      reject<Drop>(
          "Drop reserved", daemon, [](Drop& m) { m.reserved = 1; }, "Drop reserved field is not zero"),
      reject<Drop>(
          "Drop empty", daemon, [](Drop& m) { m.count = 0; }, "Drop count 0 out of range"),
      reject<Dropped>(
          "Dropped reserved", client, [](Dropped& m) { m.reserved = 1; }, "Dropped reserved field is not zero"),
      reject<Dropped>(
          "Dropped too many keys", client, [](Dropped& m) { m.count = kMaxDropKeys + 1; },
          "Dropped count 65 out of range"),
      reject<SwapNotice>(
          "SwapNotice phase", daemon, [](SwapNotice& m) { m.phase = static_cast<SwapPhase>(4); },
          "SwapNotice phase 4 out of range"),
      reject<SwapNotice>(
          "SwapNotice no id", daemon, [](SwapNotice& m) { m.swap_id = 0; }, "SwapNotice swap_id is 0"),
      reject<SwapReady>(
          "SwapReady no id", client, [](SwapReady& m) { m.swap_id = 0; }, "SwapReady swap_id is 0"),
      reject<SwapIn>(
          "SwapIn reserved", client, [](SwapIn& m) { m.reserved = 1; }, "SwapIn reserved field is not zero"),
      reject<SwapInReply>(
          "SwapInReply reserved", daemon, [](SwapInReply& m) { m.reserved = 1; },
          "SwapInReply reserved field is not zero"),
      reject<ContextRequest>(
          "ContextRequest op", client, [](ContextRequest& m) { m.op = static_cast<ContextOp>(3); },
          "ContextRequest op 3 out of range"),
      reject<ContextRequest>(
          "ContextRequest reserved", client, [](ContextRequest& m) { m.reserved = 1; },
          "ContextRequest reserved field is not zero"),
  };
}

}  // namespace vlake::contracts_test
