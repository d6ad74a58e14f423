// The one encoder/decoder of the vlaked wire protocol (protocol.hpp). The daemon, the hook and
// every test client decode with it, so what one side sends and the other accepts cannot drift.
//
// Contract
// - encode(m) is the datagram of message `m`: its bytes, nothing added (the wire format is the
//   struct, host-endian). make<T>(request_id) gives a zeroed message with its header filled.
// - decode(datagram, descriptors) checks, in this order, and stops at the first failure:
//     1. framing (check_frame): at least a header, magic, version, a known type, a size equal
//        to that type's struct and to the datagram's, the header's reserved field zero;
//     2. the body's stateless fields (check_fields): reserved fields zero, enums in range,
//        known flag bits only, NUL-terminated strings, counts within their arrays;
//     3. the number of descriptors (SCM_RIGHTS) that came with it (descriptor_count).
//   It returns a Decoded holding the typed message, or a DecodeError whose kind says which
//   step failed and whose reason is the text the daemon logs and answers with (Error message,
//   Status::bad_request). Checks that need state (a known grant, a GPU of this node, sizes
//   against the GPU's memory or the granularity) are the receiver's.
// - Version mismatch: a datagram with the right magic and another version fails with kind
//   `version`, and header() still gives its header, so the daemon can answer a Hello of another
//   version with Status::version_mismatch.
// - Header-only, standard library only, no global state: the hook includes it (it must not
//   link anything of vlake). Thread-safe. decode() copies the body (no alignment needed); it
//   allocates only to build an error's reason (and may then throw std::bad_alloc).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "vlake/contracts/protocol.hpp"

namespace vlake::proto {

// ---------------------------------------------------------------------------------------------
// message types

// MessageTraits<T>: the type number and the name of message struct T (for reasons and logs).
template <class T>
struct MessageTraits;

#define VLAKE_PROTO_MESSAGE(T, enumerator)               \
  template <>                                            \
  struct MessageTraits<T> {                              \
    static constexpr MsgType type = MsgType::enumerator; \
    static constexpr const char* name = #T;              \
  }
VLAKE_PROTO_MESSAGE(Hello, hello);
VLAKE_PROTO_MESSAGE(HelloAck, hello_ack);
VLAKE_PROTO_MESSAGE(GrantRequest, grant_request);
VLAKE_PROTO_MESSAGE(GrantReply, grant_reply);
VLAKE_PROTO_MESSAGE(Release, release);
VLAKE_PROTO_MESSAGE(ReleaseAck, release_ack);
VLAKE_PROTO_MESSAGE(UsageQuery, usage_query);
VLAKE_PROTO_MESSAGE(UsageReply, usage_reply);
VLAKE_PROTO_MESSAGE(Error, error);
VLAKE_PROTO_MESSAGE(GuardEvent, guard_event);
VLAKE_PROTO_MESSAGE(Pressure, pressure);
VLAKE_PROTO_MESSAGE(ReserveReport, reserve_report);
VLAKE_PROTO_MESSAGE(ShareRequest, share_request);
VLAKE_PROTO_MESSAGE(ShareReply, share_reply);
VLAKE_PROTO_MESSAGE(ShareCommit, share_commit);
VLAKE_PROTO_MESSAGE(ShareAck, share_ack);
VLAKE_PROTO_MESSAGE(IpcExport, ipc_export);
VLAKE_PROTO_MESSAGE(IpcExportReply, ipc_export_reply);
VLAKE_PROTO_MESSAGE(IpcOpen, ipc_open);
VLAKE_PROTO_MESSAGE(IpcOpenReply, ipc_open_reply);
VLAKE_PROTO_MESSAGE(IpcClose, ipc_close);
VLAKE_PROTO_MESSAGE(IpcCloseAck, ipc_close_ack);
VLAKE_PROTO_MESSAGE(ReadOnlyWrite, readonly_write);
VLAKE_PROTO_MESSAGE(Drop, drop);
VLAKE_PROTO_MESSAGE(Dropped, dropped);
VLAKE_PROTO_MESSAGE(SwapNotice, swap_notice);
VLAKE_PROTO_MESSAGE(SwapReady, swap_ready);
VLAKE_PROTO_MESSAGE(SwapIn, swap_in);
VLAKE_PROTO_MESSAGE(SwapInReply, swap_in_reply);
VLAKE_PROTO_MESSAGE(ContextRequest, context_request);
VLAKE_PROTO_MESSAGE(ContextReply, context_reply);
VLAKE_PROTO_MESSAGE(TierNotice, tier_notice);
VLAKE_PROTO_MESSAGE(TierStep, tier_step);
VLAKE_PROTO_MESSAGE(TierPlan, tier_plan);
#undef VLAKE_PROTO_MESSAGE

// A struct that travels as one message.
template <class T>
concept Message = std::is_trivially_copyable_v<T> && requires {
  { MessageTraits<T>::type } -> std::convertible_to<MsgType>;
};

// Every message, alternative i being the struct of MsgType i + 1.
using AnyMessage =
    std::variant<Hello, HelloAck, GrantRequest, GrantReply, Release, ReleaseAck, UsageQuery, UsageReply, Error,
                 GuardEvent, Pressure, ReserveReport, ShareRequest, ShareReply, ShareCommit, ShareAck, IpcExport,
                 IpcExportReply, IpcOpen, IpcOpenReply, IpcClose, IpcCloseAck, ReadOnlyWrite, Drop, Dropped, SwapNotice,
                 SwapReady, SwapIn, SwapInReply, ContextRequest, ContextReply, TierNotice, TierStep, TierPlan>;
namespace detail {
template <std::size_t... I>
constexpr bool numbered_in_order(std::index_sequence<I...>) {
  return ((MessageTraits<std::variant_alternative_t<I, AnyMessage>>::type == static_cast<MsgType>(I + 1) &&
           size_of(static_cast<MsgType>(I + 1)) == sizeof(std::variant_alternative_t<I, AnyMessage>)) &&
          ...);
}
}  // namespace detail
static_assert(detail::numbered_in_order(std::make_index_sequence<std::variant_size_v<AnyMessage>>()),
              "AnyMessage must list every message in MsgType order; add a new type to both");
static_assert(size_of(static_cast<MsgType>(std::variant_size_v<AnyMessage> + 1)) == 0);

// The name of a message type ("GrantRequest"), or nullptr for an unknown number.
constexpr const char* message_name(MsgType t) noexcept {
  return [t]<std::size_t... I>(std::index_sequence<I...>) {
    const char* name = nullptr;
    ((MessageTraits<std::variant_alternative_t<I, AnyMessage>>::type == t
          ? (name = MessageTraits<std::variant_alternative_t<I, AnyMessage>>::name, true)
          : false) ||
     ...);
    return name;
  }
  (std::make_index_sequence<std::variant_size_v<AnyMessage>>());
}

// ---------------------------------------------------------------------------------------------
// encoding

// A zeroed T with its header filled (magic, version, type, size, request_id).
template <Message T>
constexpr T make(std::uint64_t request_id = 0) noexcept {
  T m{};
  m.h = make_header<T>(MessageTraits<T>::type, request_id);
  return m;
}

// The datagram of `m` (a view of `m`: keep `m` alive while the view is used).
template <Message T>
std::span<const std::byte> encode(const T& m) noexcept {
  return std::as_bytes(std::span<const T, 1>(&m, 1));
}

// ---------------------------------------------------------------------------------------------
// checks

// The framing of one datagram: nullptr if well-formed, else a static reason.
inline const char* check_frame(std::span<const std::byte> datagram) noexcept {
  if (datagram.size() < sizeof(Header)) return "shorter than a header";
  Header h;
  std::memcpy(&h, datagram.data(), sizeof h);
  if (h.magic != kMagic) return "bad magic";
  if (h.version != kVersion) return "unsupported protocol version";
  const std::size_t want = size_of(h.type);
  if (want == 0) return "unknown message type";
  if (h.size != want || datagram.size() != want) return "size does not match the message type";
  if (h.reserved != 0) return "reserved header field is not zero";
  return nullptr;
}

namespace detail {
template <std::size_t N>
constexpr bool terminated(const char (&s)[N]) noexcept {
  for (char c : s) {
    if (c == '\0') return true;
  }
  return false;
}
inline std::string number(std::uint64_t v) { return std::to_string(v); }
template <class E>
std::string number(E e) requires std::is_enum_v<E> {
  return std::to_string(static_cast<std::underlying_type_t<E>>(e));
}
}  // namespace detail

// The stateless field checks of each message's body: nullopt if fine, else the reason.
// (Status values are not checked: a receiver treats a non-ok status it does not know as a
// refusal, protocol.hpp.)
inline std::optional<std::string> check_fields(const Hello& m) {
  if ((m.flags & ~kHelloKnownFlags) != 0) return "Hello has unknown flags";
  if (!detail::terminated(m.client)) return "Hello client name not terminated";
  if (m.wait_ms > kMaxWaitMs) return "Hello wait_ms " + detail::number(m.wait_ms) + " out of range";
  if (m.reserved != 0) return "Hello reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const HelloAck& m) {
  if (m.device_count > kMaxDevices) return "HelloAck device_count " + detail::number(m.device_count) + " out of range";
  if (m.guard_mode != GuardMode::off && m.guard_mode != GuardMode::canary && m.guard_mode != GuardMode::fault) {
    return "HelloAck guard_mode " + detail::number(m.guard_mode) + " out of range";
  }
  if (!detail::terminated(m.tenant_name)) return "HelloAck tenant name not terminated";
  if (m.wait_ms > kMaxWaitMs) return "HelloAck wait_ms " + detail::number(m.wait_ms) + " out of range";
  if ((m.flags & ~kAckKnownFlags) != 0) return "HelloAck flags " + detail::number(m.flags) + " unknown";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const GrantRequest& m) {
  if ((m.flags & ~kGrantKnownFlags) != 0) return "GrantRequest has unknown flags";
  if (m.purpose != GrantPurpose::alloc && m.purpose != GrantPurpose::create && m.purpose != GrantPurpose::counted) {
    return "GrantRequest purpose " + detail::number(m.purpose) + " out of range";
  }
  if (m.bytes == 0) return "GrantRequest for 0 bytes";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const GrantReply& m) {
  if (m.handle_count > kMaxHandlesPerGrant) {
    return "GrantReply handle_count " + detail::number(m.handle_count) + " out of range";
  }
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const Release& m) {
  if (m.reserved != 0) return "Release reserved field is not zero";
  if ((m.flags & ~std::uint32_t{kReleaseExported | kReleaseKeepMapped}) != 0) return "Release has unknown flags";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ReleaseAck& m) {
  if (m.reserved != 0) return "ReleaseAck reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const UsageQuery&) { return std::nullopt; }
inline std::optional<std::string> check_fields(const UsageReply& m) {
  if (m.reserved != 0) return "UsageReply reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const Error& m) {
  if (m.reserved != 0) return "Error reserved field is not zero";
  if (!detail::terminated(m.message)) return "Error message not terminated";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const GuardEvent& m) {
  // A client reports a kernel fault (with or without shared chunks mapped on that GPU). Canary
  // alarms are the daemon's own finding; refused writes travel as ReadOnlyWrite.
  if (m.kind != GuardKind::fault && m.kind != GuardKind::fault_maps_shared) {
    return "GuardEvent kind " + detail::number(m.kind) + " out of range";
  }
  if (m.suspect_count > kMaxGuardSuspects) {
    return "GuardEvent suspect_count " + detail::number(m.suspect_count) + " out of range";
  }
  if (!detail::terminated(m.call)) return "GuardEvent call name not terminated";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const Drop& m) {
  if (m.reserved != 0) return "Drop reserved field is not zero";
  if (m.count == 0 || m.count > kMaxDropKeys) return "Drop count " + detail::number(m.count) + " out of range";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const SwapNotice& m) {
  if (m.phase != SwapPhase::out && m.phase != SwapPhase::back && m.phase != SwapPhase::host) {
    return "SwapNotice phase " + detail::number(m.phase) + " out of range";
  }
  if (m.reserved != 0) return "SwapNotice reserved field is not zero";
  if (m.swap_id == 0) return "SwapNotice swap_id is 0";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const SwapReady& m) {
  if (m.swap_id == 0) return "SwapReady swap_id is 0";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const SwapIn& m) {
  if (m.reserved != 0) return "SwapIn reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const SwapInReply& m) {
  if (m.reserved != 0) return "SwapInReply reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ContextRequest& m) {
  if (m.op != ContextOp::admit && m.op != ContextOp::release) {
    return "ContextRequest op " + detail::number(m.op) + " out of range";
  }
  if (m.reserved != 0) return "ContextRequest reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const Dropped& m) {
  if (m.reserved != 0) return "Dropped reserved field is not zero";
  if (m.count == 0 || m.count > kMaxDropKeys) return "Dropped count " + detail::number(m.count) + " out of range";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ReadOnlyWrite& m) {
  if (m.reserved != 0) return "ReadOnlyWrite reserved field is not zero";
  if (m.bytes == 0 || m.alloc_bytes == 0 || m.shared_bytes == 0) return "ReadOnlyWrite with an empty range";
  if (m.bytes > UINT64_MAX - m.address || m.alloc_bytes > UINT64_MAX - m.alloc_address ||
      m.shared_offset > UINT64_MAX - m.alloc_address ||
      m.shared_bytes > UINT64_MAX - m.alloc_address - m.shared_offset) {
    return "ReadOnlyWrite range wraps around";
  }
  // The overlapped shared bytes lie in the destination and in the allocation's mapping.
  const std::uint64_t lo = m.alloc_address + m.shared_offset;
  if (lo < m.address || lo + m.shared_bytes > m.address + m.bytes) {
    return "ReadOnlyWrite shared range outside the destination";
  }
  if (!detail::terminated(m.call)) return "ReadOnlyWrite call name not terminated";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const Pressure& m) {
  if (m.reserved != 0) return "Pressure reserved field is not zero";
  if (m.reason != PressureReason::pool_exhausted && m.reason != PressureReason::low_memory) {
    return "Pressure reason " + detail::number(m.reason) + " out of range";
  }
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ReserveReport& m) {
  if (m.blocks > m.bytes) return "ReserveReport has more blocks than bytes";
  if ((m.flags & ~kReportKnownFlags) != 0) return "ReserveReport has unknown flags";
  if (m.reserved != 0) return "ReserveReport reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ShareRequest& m) {
  if ((m.flags & ~std::uint32_t{kShareTransparent}) != 0) return "ShareRequest has unknown flags";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ShareReply& m) {
  if (m.piece_count > kMaxHandlesPerGrant) {
    return "ShareReply piece_count " + detail::number(m.piece_count) + " out of range";
  }
  if (m.first_piece > m.total_pieces || m.piece_count > m.total_pieces - m.first_piece) {
    return "ShareReply pieces beyond total_pieces";
  }
  constexpr std::uint32_t known = kShareReadOnly | kShareKeep;
  for (std::uint32_t i = 0; i < m.piece_count; ++i) {
    const std::uint32_t f = m.pieces[i].flags;
    if ((f & ~known) != 0) {
      return "ShareReply piece " + detail::number(i) + " has unknown flags";
    }
  }
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ShareCommit& m) {
  if (m.reserved != 0) return "ShareCommit reserved field is not zero";
  if (m.commit > 1) return "ShareCommit commit out of range";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ShareAck& m) {
  if (m.reserved != 0) return "ShareAck reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const IpcExport&) { return std::nullopt; }
inline std::optional<std::string> check_fields(const IpcExportReply& m) {
  if (m.reserved != 0) return "IpcExportReply reserved field is not zero";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const IpcOpen&) { return std::nullopt; }
inline std::optional<std::string> check_fields(const IpcOpenReply& m) {
  if (m.reserved != 0) return "IpcOpenReply reserved field is not zero";
  if (m.piece_count > kMaxHandlesPerGrant) {
    return "IpcOpenReply piece_count " + detail::number(m.piece_count) + " out of range";
  }
  for (std::uint32_t i = 0; i < m.piece_count; ++i) {
    if ((m.pieces[i].flags & ~std::uint32_t{kShareReadOnly}) != 0) {
      return "IpcOpenReply piece " + detail::number(i) + " has unknown flags";
    }
  }
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const ContextReply&) { return std::nullopt; }
inline std::optional<std::string> check_fields(const TierNotice& m) {
  if (m.direction != TierDirection::to_host && m.direction != TierDirection::to_device) {
    return "TierNotice direction " + detail::number(m.direction) + " out of range";
  }
  if (m.reserved != 0) return "TierNotice reserved field is not zero";
  if (m.move_id == 0) return "TierNotice move_id is 0";
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const TierStep& m) {
  if (m.move_id == 0) return "TierStep move_id is 0";
  if (static_cast<std::uint32_t>(m.result) > static_cast<std::uint32_t>(TierResult::released)) {
    return "TierStep result " + detail::number(m.result) + " out of range";
  }
  if (m.result == TierResult::busy && m.grant_id != 0) return "TierStep busy names a grant";
  if (m.grant_id == 0 && m.result != TierResult::none && m.result != TierResult::busy) {
    return "TierStep result without a grant";
  }
  if (m.first_piece >= kMaxHandlesPerGrant * kMaxHandlesPerGrant) {
    return "TierStep first_piece " + detail::number(m.first_piece) + " out of range";
  }
  return std::nullopt;
}
inline std::optional<std::string> check_fields(const TierPlan& m) {
  if (m.reserved != 0) return "TierPlan reserved field is not zero";
  if (m.piece_count > kMaxHandlesPerGrant)
    return "TierPlan piece_count " + detail::number(m.piece_count) + " out of range";
  if (m.grant_id != 0 && m.direction != TierDirection::to_host && m.direction != TierDirection::to_device) {
    return "TierPlan direction " + detail::number(m.direction) + " out of range";
  }
  if (m.grant_id == 0 && m.piece_count != 0) return "TierPlan without a grant lists pieces";
  if (m.grant_id != 0 && m.status == Status::ok && m.piece_count == 0) return "TierPlan grant without pieces";
  if (m.total_pieces > kMaxHandlesPerGrant * kMaxHandlesPerGrant ||
      static_cast<std::uint64_t>(m.first_piece) + m.piece_count > m.total_pieces) {
    return "TierPlan pieces " + detail::number(m.first_piece) + "+" + detail::number(m.piece_count) + " of " +
           detail::number(m.total_pieces) + " out of range";
  }
  for (std::uint32_t i = 0; i < m.piece_count; ++i) {
    if (m.pieces[i].size == 0) return "TierPlan piece " + detail::number(i) + " is empty";
    if (m.pieces[i].offset > m.bytes || m.pieces[i].size > m.bytes - m.pieces[i].offset) {
      return "TierPlan piece " + detail::number(i) + " lies outside the grant";
    }
  }
  return std::nullopt;
}

inline std::optional<std::string> check_fields(const IpcClose&) { return std::nullopt; }
inline std::optional<std::string> check_fields(const IpcCloseAck& m) {
  if (m.reserved != 0) return "IpcCloseAck reserved field is not zero";
  return std::nullopt;
}

// The descriptors (SCM_RIGHTS) that travel with a well-formed message, in order: one per
// handle of a GrantReply, one per piece of a ShareReply batch without kShareKeep, one per piece
// of an IpcOpenReply or a TierPlan, none with any other message.
template <Message T>
constexpr std::size_t descriptor_count(const T&) noexcept {
  return 0;
}
constexpr std::size_t descriptor_count(const GrantReply& m) noexcept { return m.handle_count; }
constexpr std::size_t descriptor_count(const IpcOpenReply& m) noexcept { return m.piece_count; }
constexpr std::size_t descriptor_count(const TierPlan& m) noexcept { return m.piece_count; }
constexpr std::size_t descriptor_count(const ShareReply& m) noexcept {
  std::size_t n = 0;
  for (std::uint32_t i = 0; i < m.piece_count && i < kMaxHandlesPerGrant; ++i) {
    if ((m.pieces[i].flags & kShareKeep) == 0) ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// decoding

struct DecodeError {
  enum class Kind : std::uint8_t {
    frame,        // check_frame failed (other than the version)
    version,      // right magic, another protocol version
    fields,       // check_fields failed
    descriptors,  // the descriptors that came with it are not the ones it carries
  };
  Kind kind = Kind::frame;
  std::string reason;
};

// The outcome of decode(): a typed message, or an error.
class Decoded {
 public:
  explicit Decoded(AnyMessage m) noexcept : message_(std::move(m)) {}
  Decoded(DecodeError e, std::optional<Header> h) noexcept : header_(h), error_(std::move(e)) {}

  [[nodiscard]] bool ok() const noexcept { return message_.has_value(); }
  explicit operator bool() const noexcept { return ok(); }

  // The message; precondition ok() (throws std::bad_optional_access otherwise).
  [[nodiscard]] const AnyMessage& message() const { return message_.value(); }
  // The message if it is a T, else nullptr (also when !ok()).
  template <Message T>
  [[nodiscard]] const T* get() const noexcept {
    return message_ ? std::get_if<T>(&*message_) : nullptr;
  }
  // The header as received: always when ok(); on an error, whenever the datagram held a header
  // with the right magic (its fields are trustworthy only as far as the error's kind says:
  // with `version`, magic and version; with `fields`/`descriptors`, all of them).
  [[nodiscard]] const Header* header() const noexcept {
    if (message_) return std::visit([](const auto& m) -> const Header* { return &m.h; }, *message_);
    return header_ ? &*header_ : nullptr;
  }
  // The error; meaningful only when !ok().
  [[nodiscard]] const DecodeError& error() const noexcept { return error_; }

 private:
  std::optional<AnyMessage> message_;
  std::optional<Header> header_;
  DecodeError error_;
};

namespace detail {
template <Message T>
Decoded decode_body(std::span<const std::byte> datagram, std::size_t descriptors) {
  T m;
  std::memcpy(&m, datagram.data(), sizeof m);
  if (std::optional<std::string> why = check_fields(m)) {
    return Decoded(DecodeError{DecodeError::Kind::fields, std::move(*why)}, m.h);
  }
  if (const std::size_t want = descriptor_count(m); want != descriptors) {
    std::string why = want == 0
                          ? std::string("descriptors attached to a ") + MessageTraits<T>::name + ", which carries none"
                          : std::string(MessageTraits<T>::name) + " with " + std::to_string(descriptors) +
                                " descriptors instead of " + std::to_string(want);
    return Decoded(DecodeError{DecodeError::Kind::descriptors, std::move(why)}, m.h);
  }
  return Decoded(AnyMessage(std::in_place_type<T>, m));
}
}  // namespace detail

// Decodes one datagram that came with `descriptors` descriptors attached (see the contract at
// the top of this file).
inline Decoded decode(std::span<const std::byte> datagram, std::size_t descriptors = 0) {
  if (const char* why = check_frame(datagram)) {
    std::optional<Header> h;
    if (datagram.size() >= sizeof(Header)) {
      Header raw;
      std::memcpy(&raw, datagram.data(), sizeof raw);
      if (raw.magic == kMagic) h = raw;
    }
    const bool version = h && h->version != kVersion;
    return Decoded(DecodeError{version ? DecodeError::Kind::version : DecodeError::Kind::frame, why}, h);
  }
  Header h;
  std::memcpy(&h, datagram.data(), sizeof h);
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    std::optional<Decoded> out;
    ((MessageTraits<std::variant_alternative_t<I, AnyMessage>>::type == h.type
          ? (out.emplace(detail::decode_body<std::variant_alternative_t<I, AnyMessage>>(datagram, descriptors)), true)
          : false) ||
     ...);
    return std::move(*out);  // check_frame() accepted the type: one alternative matched
  }
  (std::make_index_sequence<std::variant_size_v<AnyMessage>>());
}

}  // namespace vlake::proto
