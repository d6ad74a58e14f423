// libFuzzer target: proto::decode (contracts/codec.hpp) over arbitrary datagrams.
//
// Input: byte 0 is the number of descriptors (SCM_RIGHTS) that came with the datagram (0..255),
// the rest is the datagram. Beyond "no crash, no undefined behaviour" (the build has ASan and
// UBSan) every input must keep these invariants of the codec's contract, or the target aborts:
// - a decode is deterministic: the same input gives the same outcome, kind and reason;
// - an accepted datagram passes check_frame, re-encodes to exactly the same bytes, its message
//   passes check_fields, carries exactly the descriptors that came with it, is the variant of
//   its header's type, and one descriptor more or fewer is refused with kind `descriptors`;
// - a refused datagram has a non-empty reason; kind frame/version exactly when check_frame
//   refuses it (version: its header has the magic and another version); a header() only with
//   the right magic; kind `fields` exactly when check_fields refuses the body; kind
//   `descriptors` only when the body is fine, and then the right count is accepted.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <variant>

#include "vlake/contracts/codec.hpp"

namespace {

using vlake::proto::Decoded;
using vlake::proto::DecodeError;

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "fuzz_codec: invariant violated: %s\n", what);
  std::abort();
}
void require(bool ok, const char* what) {
  if (!ok) violated(what);
}

// The body of an accepted message against its datagram and descriptors.
void check_accepted(const Decoded& d, std::span<const std::byte> datagram, std::size_t descriptors) {
  require(vlake::proto::check_frame(datagram) == nullptr, "accepted a datagram that check_frame refuses");
  require(d.header() != nullptr, "accepted message without a header");
  std::visit(
      [&]<class T>(const T& m) {
        require(vlake::proto::MessageTraits<T>::type == d.header()->type, "variant is not the header's type");
        const auto bytes = vlake::proto::encode(m);
        require(bytes.size() == datagram.size() && std::memcmp(bytes.data(), datagram.data(), bytes.size()) == 0,
                "accepted message does not re-encode to the same bytes");
        require(!vlake::proto::check_fields(m).has_value(), "accepted message fails check_fields");
        require(vlake::proto::descriptor_count(m) == descriptors, "accepted with another descriptor count");
        require(d.get<T>() != nullptr && std::memcmp(d.get<T>(), &m, sizeof m) == 0, "get<T>() disagrees");
      },
      d.message());
  const Decoded more = vlake::proto::decode(datagram, descriptors + 1);
  require(!more && more.error().kind == DecodeError::Kind::descriptors, "one descriptor more is not refused");
  if (descriptors > 0) {
    const Decoded fewer = vlake::proto::decode(datagram, descriptors - 1);
    require(!fewer && fewer.error().kind == DecodeError::Kind::descriptors, "one descriptor fewer is not refused");
  }
}

// The body of a well-framed datagram as a T: does check_fields refuse it, and the descriptors it
// carries.
template <class T>
void check_body(std::span<const std::byte> datagram, bool& fields_fail, std::size_t& descriptors) {
  T m;
  std::memcpy(&m, datagram.data(), sizeof m);
  fields_fail = vlake::proto::check_fields(m).has_value();
  descriptors = vlake::proto::descriptor_count(m);
}

// The error of a refused datagram against what the checks say of it.
void check_refused(const Decoded& d, std::span<const std::byte> datagram, std::size_t descriptors) {
  const DecodeError& e = d.error();
  require(!e.reason.empty(), "refused without a reason");
  const char* frame = vlake::proto::check_frame(datagram);
  const bool frame_kind = e.kind == DecodeError::Kind::frame || e.kind == DecodeError::Kind::version;
  require(frame_kind == (frame != nullptr), "kind frame/version differs from check_frame");
  vlake::proto::Header raw{};
  const bool has_header = datagram.size() >= sizeof raw;
  if (has_header) std::memcpy(&raw, datagram.data(), sizeof raw);
  const bool magic = has_header && raw.magic == vlake::proto::kMagic;
  require((d.header() != nullptr) == magic, "header() given without the magic, or missing with it");
  if (e.kind == DecodeError::Kind::version) {
    require(magic && raw.version != vlake::proto::kVersion, "kind version without the magic and another version");
  }
  if (frame != nullptr) {
    require(e.reason == frame, "frame error's reason is not check_frame's");
    return;
  }
  require(std::memcmp(d.header(), datagram.data(), sizeof raw) == 0, "header() is not the datagram's header");
  // The frame is fine: check the body the way the codec does and compare.
  bool fields_fail = false;
  std::size_t want = 0;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((vlake::proto::MessageTraits<std::variant_alternative_t<I, vlake::proto::AnyMessage>>::type == raw.type &&
      (check_body<std::variant_alternative_t<I, vlake::proto::AnyMessage>>(datagram, fields_fail, want), true)) ||
     ...);
  }
  (std::make_index_sequence<std::variant_size_v<vlake::proto::AnyMessage>>());
  require((e.kind == DecodeError::Kind::fields) == fields_fail, "kind fields differs from check_fields");
  if (e.kind == DecodeError::Kind::descriptors) {
    require(want != descriptors, "refused for descriptors although the count is right");
    const Decoded right = vlake::proto::decode(datagram, want);
    require(right.ok(), "refused for descriptors but the right count is refused too");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t descriptors = data[0];
  const std::span<const std::byte> datagram(reinterpret_cast<const std::byte*>(data + 1), size - 1);

  const Decoded d = vlake::proto::decode(datagram, descriptors);
  const Decoded again = vlake::proto::decode(datagram, descriptors);
  require(d.ok() == again.ok(), "decode is not deterministic");
  if (d.ok()) {
    check_accepted(d, datagram, descriptors);
  } else {
    require(again.error().kind == d.error().kind && again.error().reason == d.error().reason,
            "decode is not deterministic (error)");
    check_refused(d, datagram, descriptors);
  }
  return 0;
}
