// vlake::Uuid (common/uuid.hpp): the one GPU UUID type, its NVML text form and its parser.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>

#include "vlake/common/uuid.hpp"

using vlake::Uuid;

namespace {
Uuid counting() {
  Uuid u;
  for (std::size_t i = 0; i < Uuid::kBytes; ++i) u[i] = static_cast<std::uint8_t>(i * 17);
  return u;
}
}  // namespace

TEST_CASE("uuid: to_string is NVML's form", "[common][uuid]") {
  CHECK(counting().to_string() == "GPU-00112233-4455-6677-8899-aabbccddeeff");
  CHECK(Uuid{}.to_string() == "GPU-00000000-0000-0000-0000-000000000000");
  CHECK(counting().to_string().size() == Uuid::kStringLength);
}

TEST_CASE("uuid: parse accepts the form with or without the prefix, either case", "[common][uuid]") {
  const Uuid u = counting();
  CHECK(Uuid::parse("GPU-00112233-4455-6677-8899-aabbccddeeff") == u);
  CHECK(Uuid::parse("00112233-4455-6677-8899-aabbccddeeff") == u);
  CHECK(Uuid::parse("GPU-00112233-4455-6677-8899-AABBCCDDEEFF") == u);
  // Every byte value survives the round trip.
  for (int b = 0; b < 256; ++b) {
    Uuid v;
    v.bytes.fill(static_cast<std::uint8_t>(b));
    v[15] = static_cast<std::uint8_t>(255 - b);
    REQUIRE(Uuid::parse(v.to_string()) == v);
  }
  static_assert(Uuid::parse("GPU-00112233-4455-6677-8899-aabbccddeeff").has_value());
}

TEST_CASE("uuid: parse refuses junk", "[common][uuid]") {
  for (const char* junk : {
           "",
           "GPU-",
           "GPU-0011",
           "GPU-zz112233-4455-6677-8899-aabbccddeeff",      // not hex
           "GPU-00112233-4455-6677-8899-aabbccddeef",       // one digit short
           "GPU-00112233-4455-6677-8899-aabbccddeeff0",     // one digit long
           "GPU-001122334-455-6677-8899-aabbccddeeff",      // a dash misplaced
           "GPU-00112233445566778899aabbccddeeff",          // no dashes
           "GPU-00112233_4455_6677_8899_aabbccddeeff",      // other separators
           "gpu-00112233-4455-6677-8899-aabbccddeeff",      // prefix is case-sensitive
           "MIG-00112233-4455-6677-8899-aabbccddeeff",      // a MIG instance, not a GPU
           "GPU-GPU-00112233-4455-6677-8899-aabbccddeeff",  // prefix twice
           " GPU-00112233-4455-6677-8899-aabbccddeeff",     // surrounding text
           "GPU-00112233-4455-6677-8899-aabbccddeeff\n",
       }) {
    INFO(junk);
    CHECK_FALSE(Uuid::parse(junk).has_value());
  }
}

TEST_CASE("uuid: raw bytes, comparison, ordering", "[common][uuid]") {
  const std::uint8_t raw[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const Uuid u = Uuid::from_bytes(raw);
  std::uint8_t back[16] = {};
  u.copy_to(back);
  CHECK(std::equal(raw, raw + 16, back));
  CHECK(u[0] == 1);
  CHECK(u[15] == 16);
  CHECK_FALSE(u.is_nil());
  CHECK(Uuid{}.is_nil());
  CHECK(u == Uuid::from_bytes(raw));
  CHECK(Uuid{} < u);
  std::map<Uuid, int> m{{u, 1}, {Uuid{}, 0}};
  CHECK(m.begin()->second == 0);
}
