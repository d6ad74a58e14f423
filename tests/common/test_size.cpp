// vlake's one size grammar (common/size.hpp): what it accepts, what it refuses and the message
// it gives, and the one exact formatter.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "vlake/common/size.hpp"

using vlake::Bytes;
using vlake::SizeError;

namespace {

// what() of the SizeError `text` raises, or "accepted".
std::string error_of(const std::string& text) {
  try {
    (void)vlake::parse_size(text);
  } catch (const SizeError& e) {
    CHECK(e.text() == text);
    CHECK(std::string(e.what()) == "\"" + text + "\": " + e.reason());
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("size: byte counts and binary units", "[common][size]") {
  CHECK(vlake::parse_size("0") == Bytes{0});
  CHECK(vlake::parse_size("4096") == Bytes{4096});
  CHECK(vlake::parse_size("007") == Bytes{7});
  CHECK(vlake::parse_size("4096B") == Bytes{4096});
  CHECK(vlake::parse_size("3KiB") == Bytes{3072});
  CHECK(vlake::parse_size("512MiB") == Bytes{512ull << 20});
  CHECK(vlake::parse_size("1GiB") == Bytes{1073741824});
  CHECK(vlake::parse_size("2TiB") == Bytes{2ull << 40});
  CHECK(vlake::parse_size("18446744073709551615") == Bytes{~0ull});
  CHECK(vlake::parse_size("16777215TiB") == Bytes{16777215ull << 40});
}

TEST_CASE("size: the Kubernetes spellings Ki, Mi, Gi, Ti mean the same bytes", "[common][size]") {
  CHECK(vlake::parse_size("3Ki") == vlake::parse_size("3KiB"));
  CHECK(vlake::parse_size("64Mi") == vlake::parse_size("64MiB"));
  CHECK(vlake::parse_size("1Gi") == Bytes{1073741824});
  CHECK(vlake::parse_size("1Ti") == Bytes{1ull << 40});
}

TEST_CASE("size: spaces around the number and the unit are ignored", "[common][size]") {
  CHECK(vlake::parse_size(" 8 GiB ") == Bytes{8ull << 30});
  CHECK(vlake::parse_size("\t512MiB\n") == Bytes{512ull << 20});
  CHECK(error_of("8 G iB") ==
        "\"8 G iB\": unexpected \"G iB\" after the number; use B, KiB, MiB, GiB or TiB "
        "(or Ki, Mi, Gi, Ti)");
}

TEST_CASE("size: decimal and single-letter units are refused with what to write", "[common][size]") {
  CHECK(error_of("1GB") == "\"1GB\": decimal units are ambiguous; write 1GiB (1073741824 bytes) or a byte count");
  CHECK(error_of("8GB") == "\"8GB\": decimal units are ambiguous; write 8GiB (8589934592 bytes) or a byte count");
  CHECK(error_of("500MB") == "\"500MB\": decimal units are ambiguous; write 500MiB (524288000 bytes) or a byte count");
  CHECK(error_of("4kB") == "\"4kB\": decimal units are ambiguous; write 4KiB (4096 bytes) or a byte count");
  CHECK(error_of("2TB") == "\"2TB\": decimal units are ambiguous; write 2TiB (2199023255552 bytes) or a byte count");
  CHECK(error_of("1.5GB") ==
        "\"1.5GB\": decimal units are ambiguous; write 1536MiB (1610612736 bytes) or a byte count");
  CHECK(error_of("2G") == "\"2G\": single-letter units are ambiguous; write 2GiB (2147483648 bytes) or a byte count");
  CHECK(error_of("20M") == "\"20M\": single-letter units are ambiguous; write 20MiB (20971520 bytes) or a byte count");
  CHECK(error_of("512K") == "\"512K\": single-letter units are ambiguous; write 512KiB (524288 bytes) or a byte count");
  CHECK(error_of("1T") ==
        "\"1T\": single-letter units are ambiguous; write 1TiB (1099511627776 bytes) or a byte count");
  for (const char* t : {"1gb", "1Gb", "1gB", "1g", "1mb", "1k", "1KB", "1tb"}) {
    INFO(t);
    CHECK_THAT(error_of(t), Catch::Contains("units are ambiguous; write 1"));
  }
  CHECK(error_of("99999999999GB") ==
        "\"99999999999GB\": decimal units are ambiguous; write a whole number of KiB, MiB, "
        "GiB or TiB, or a byte count");
}

TEST_CASE("size: fractions, signs, junk and overflow are refused clearly", "[common][size]") {
  CHECK(error_of("1.5GiB") == "\"1.5GiB\": a size is a whole number; write 1536MiB");
  CHECK(error_of("0.5KiB") == "\"0.5KiB\": a size is a whole number; write 512B");
  CHECK(error_of("1.1GiB") == "\"1.1GiB\": a size is a whole number; use a smaller unit or a byte count");
  CHECK(error_of("1.5") == "\"1.5\": a byte count is a whole number");
  CHECK(error_of("1.") == "\"1.\": expected digits after '.'");
  CHECK(error_of("") == "\"\": empty; write a size such as 512MiB, 2GiB or a byte count");
  CHECK(error_of("   ") == "\"   \": empty; write a size such as 512MiB, 2GiB or a byte count");
  CHECK(error_of("-1") == "\"-1\": a size cannot be negative");
  CHECK(error_of("-1GiB") == "\"-1GiB\": a size cannot be negative");
  CHECK(error_of("+1GiB") == "\"+1GiB\": expected a number, such as 512MiB, 2GiB or a byte count");
  CHECK(error_of("GiB") == "\"GiB\": expected a number, such as 512MiB, 2GiB or a byte count");
  CHECK(error_of("lots") == "\"lots\": expected a number, such as 512MiB, 2GiB or a byte count");
  CHECK(error_of("12XB") == "\"12XB\": unknown unit \"XB\"; use B, KiB, MiB, GiB or TiB (or Ki, Mi, Gi, Ti)");
  CHECK(error_of("1PiB") == "\"1PiB\": unknown unit \"PiB\"; use B, KiB, MiB, GiB or TiB (or Ki, Mi, Gi, Ti)");
  CHECK(error_of("1gib") == "\"1gib\": unknown unit \"gib\" (units are case-sensitive: write GiB)");
  CHECK(error_of("0x100000") ==
        "\"0x100000\": unexpected \"x100000\" after the number; use B, KiB, MiB, GiB or TiB (or Ki, Mi, Gi, Ti)");
  CHECK(error_of("1b") == "\"1b\": unknown unit \"b\" (units are case-sensitive: write B)");
  CHECK(error_of("1e9") ==
        "\"1e9\": unexpected \"e9\" after the number; use B, KiB, MiB, GiB or TiB (or Ki, Mi, "
        "Gi, Ti)");
  CHECK(error_of("50%") == "\"50%\": a percentage is not allowed here; write a size such as 8GiB");
  const std::string too_large = "too large (at most 18446744073709551615 bytes)";
  CHECK(error_of("18446744073709551616") == "\"18446744073709551616\": " + too_large);
  CHECK(error_of("99999999999999999999999") == "\"99999999999999999999999\": " + too_large);
  CHECK(error_of("16777216TiB") == "\"16777216TiB\": " + too_large);
  CHECK(error_of("20000000TiB") == "\"20000000TiB\": " + too_large);
}

TEST_CASE("size: bounds", "[common][size]") {
  CHECK(vlake::parse_size("2MiB", Bytes{2ull << 20}, Bytes{1ull << 40}) == Bytes{2ull << 20});
  CHECK_THROWS_WITH(vlake::parse_size("1MiB", Bytes{2ull << 20}, Bytes{1ull << 40}), "\"1MiB\": must be at least 2MiB");
  CHECK_THROWS_WITH(vlake::parse_size("2TiB", Bytes{2ull << 20}, Bytes{1ull << 40}), "\"2TiB\": must be at most 1TiB");
  CHECK_THROWS_WITH(vlake::parse_size("0", Bytes{1}, Bytes{~0ull}), "\"0\": must be greater than zero");
  CHECK_THROWS_AS(vlake::parse_size("1GB", Bytes{1}, Bytes{~0ull}), SizeError);
  CHECK_THROWS_AS(vlake::parse_size("1GB"), std::invalid_argument);  // SizeError is one
}

TEST_CASE("size: percentages where the caller allows them", "[common][size]") {
  auto pct = [](const char* t) {
    const vlake::SizeOrPercent s = vlake::parse_size_or_percent(t);
    CHECK(s.percent);
    return s.ppm;
  };
  CHECK(pct("50%") == 500'000u);
  CHECK(pct("12.5%") == 125'000u);
  CHECK(pct("0.0001%") == 1u);
  CHECK(pct("100%") == 1'000'000u);
  CHECK(pct("100.0000%") == 1'000'000u);
  CHECK(pct(" 25 % ") == 250'000u);
  CHECK(pct("0%") == 0u);
  const vlake::SizeOrPercent b = vlake::parse_size_or_percent("8GiB");
  CHECK_FALSE(b.percent);
  CHECK(b.bytes == Bytes{8ull << 30});
  CHECK_THROWS_WITH(vlake::parse_size_or_percent("101%"), "\"101%\": percentage over 100");
  CHECK_THROWS_WITH(vlake::parse_size_or_percent("100.5%"), "\"100.5%\": percentage over 100");
  CHECK_THROWS_WITH(vlake::parse_size_or_percent("1000%"), "\"1000%\": percentage over 100");
  CHECK_THROWS_WITH(vlake::parse_size_or_percent("12.34567%"), "\"12.34567%\": at most 4 decimals in a percentage");
  CHECK_THROWS_WITH(vlake::parse_size_or_percent("-5%"), "\"-5%\": a size cannot be negative");
  CHECK_THROWS_WITH(vlake::parse_size_or_percent("8GB"),
                    "\"8GB\": decimal units are ambiguous; write 8GiB (8589934592 bytes) or a byte count");
}

TEST_CASE("size: format_size is exact and parses back", "[common][size]") {
  CHECK(vlake::format_size(Bytes{0}) == "0B");
  CHECK(vlake::format_size(Bytes{1}) == "1B");
  CHECK(vlake::format_size(Bytes{1536}) == "1536B");
  CHECK(vlake::format_size(Bytes{3072}) == "3KiB");
  CHECK(vlake::format_size(Bytes{512ull << 20}) == "512MiB");
  CHECK(vlake::format_size(Bytes{1536ull << 20}) == "1536MiB");
  CHECK(vlake::format_size(Bytes{1ull << 30}) == "1GiB");
  CHECK(vlake::format_size(Bytes{2ull << 40}) == "2TiB");
  CHECK(vlake::format_size(Bytes{1ull << 50}) == "1024TiB");
  for (std::uint64_t v : {0ull, 1ull, 1023ull, 1024ull, 1025ull, 3ull << 20, (1ull << 40) + 4096, ~0ull}) {
    INFO(v);
    CHECK(vlake::parse_size(vlake::format_size(Bytes{v})) == Bytes{v});
  }
}
