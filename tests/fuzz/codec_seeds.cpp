// Writes the seed corpus of fuzz_codec into a directory: one file per input in fuzz_codec's
// format (byte 0 the descriptor count, then the datagram). The inputs are the codec
// conformance corpus (tests/contracts/corpus.hpp): the well-formed sample of every message
// with its descriptors, every field rejection, and framing failures of a sample (truncated,
// one byte too long, another version, bad magic, reserved header field, unknown type, wrong
// descriptor count). Generated at build time, so the seeds follow the protocol as it changes.
//
//   vlake_fuzz_codec_seeds DIR      # DIR must exist; files are overwritten; exits 0 on success
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "../contracts/corpus.hpp"

namespace {

using vlake::contracts_test::sample;
using vlake::contracts_test::wire;

int written = 0;
bool failed = false;

void put(const std::string& dir, const std::string& name, std::size_t descriptors, const std::vector<std::byte>& d) {
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  const char n = static_cast<char>(static_cast<std::uint8_t>(descriptors));
  out.write(&n, 1);
  out.write(reinterpret_cast<const char*>(d.data()), static_cast<std::streamsize>(d.size()));
  if (!out) {
    std::fprintf(stderr, "codec_seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
    failed = true;
  }
  ++written;
}

template <class T>
void samples_of(const std::string& dir) {
  const T m = sample<T>();
  const std::string name = vlake::proto::MessageTraits<T>::name;
  const std::size_t n = vlake::proto::descriptor_count(m);
  const std::vector<std::byte> ok = wire(m);
  put(dir, name + ".ok", n, ok);
  put(dir, name + ".descriptors+1", n + 1, ok);
  put(dir, name + ".truncated", n, {ok.begin(), ok.end() - 1});
  std::vector<std::byte> longer = ok;
  longer.push_back(std::byte{0});
  put(dir, name + ".longer", n, longer);
  T v = m;
  v.h.version = static_cast<decltype(v.h.version)>(vlake::proto::kVersion + 1);
  put(dir, name + ".version", n, wire(v));
  v = m;
  v.h.magic = static_cast<decltype(v.h.magic)>(~vlake::proto::kMagic);
  put(dir, name + ".magic", n, wire(v));
  v = m;
  v.h.reserved = 1;
  put(dir, name + ".header_reserved", n, wire(v));
  v = m;
  v.h.type = static_cast<vlake::proto::MsgType>(std::variant_size_v<vlake::proto::AnyMessage> + 1);
  put(dir, name + ".unknown_type", n, wire(v));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (samples_of<std::variant_alternative_t<I, vlake::proto::AnyMessage>>(dir), ...);
  }
  (std::make_index_sequence<std::variant_size_v<vlake::proto::AnyMessage>>());
  int i = 0;
  for (const vlake::contracts_test::Rejection& r : vlake::contracts_test::field_rejections()) {
    put(dir, "rejection." + std::to_string(i++), r.descriptors, r.bytes);
  }
  put(dir, "empty", 0, {});
  if (failed) return 1;
  std::printf("codec_seeds: %d inputs in %s\n", written, dir.c_str());
  return 0;
}
