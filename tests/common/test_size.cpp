// vlake's one size grammar (common/size.hpp): what it accepts, what it refuses and the message
// it gives, and the one exact formatter.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "refusals.hpp"
#include "vlake/common/size.hpp"

using vlake::Bytes;
using vlake::SizeError;

namespace {

auto parse = [](const std::string& text) { return vlake::parse_size(text); };
std::string error_of(const std::string& text) { return vlake::test::error_of(parse, text); }
void check_refusals(const std::vector<vlake::test::Refusal>& cases) { vlake::test::check_refusals(parse, cases); }

}  // namespace

TEST_CASE("size: binary units", "[common][size]") {
  CHECK(vlake::parse_size("0") == Bytes{0});
  CHECK(vlake::parse_size("0B") == Bytes{0});
  CHECK(vlake::parse_size("4096B") == Bytes{4096});
  CHECK(vlake::parse_size("007B") == Bytes{7});
  CHECK(vlake::parse_size("3KiB") == Bytes{3072});
  CHECK(vlake::parse_size("512MiB") == Bytes{512ull << 20});
  CHECK(vlake::parse_size("1GiB") == Bytes{1073741824});
  CHECK(vlake::parse_size("2TiB") == Bytes{2ull << 40});
  CHECK(vlake::parse_size("18446744073709551615B") == Bytes{~0ull});
  CHECK(vlake::parse_size("16777215TiB") == Bytes{16777215ull << 40});
}

TEST_CASE("size: a bare number is refused, 0 excepted", "[common][size]") {
  CHECK(vlake::parse_size("000") == Bytes{0});
  const std::string use = "a size needs a unit; write ";
  check_refusals({{"8", use + "8B, 8KiB, 8MiB or 8GiB"},
                  {"4096", use + "4096B, 4096KiB, 4096MiB or 4096GiB"},
                  {" 1 ", use + "1B, 1KiB, 1MiB or 1GiB"},
                  {"1.5", "a size needs a unit; write a whole number of B, KiB, MiB or GiB"},
                  {"18446744073709551616", use + "18446744073709551616B, 18446744073709551616KiB, "
                                                 "18446744073709551616MiB or 18446744073709551616GiB"}});
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
  check_refusals({{"8 G iB", "unexpected \"G iB\" after the number; use B, KiB, MiB, GiB or TiB (or Ki, Mi, Gi, Ti)"}});
}

TEST_CASE("size: decimal and single-letter units are refused with what to write", "[common][size]") {
  const std::string dec = "decimal units are ambiguous; write ";
  const std::string one = "single-letter units are ambiguous; write ";
  check_refusals({{"1GB", dec + "1GiB (1073741824 bytes)"},
                  {"8GB", dec + "8GiB (8589934592 bytes)"},
                  {"500MB", dec + "500MiB (524288000 bytes)"},
                  {"4kB", dec + "4KiB (4096 bytes)"},
                  {"2TB", dec + "2TiB (2199023255552 bytes)"},
                  {"1.5GB", dec + "1536MiB (1610612736 bytes)"},
                  {"2G", one + "2GiB (2147483648 bytes)"},
                  {"20M", one + "20MiB (20971520 bytes)"},
                  {"512K", one + "512KiB (524288 bytes)"},
                  {"1T", one + "1TiB (1099511627776 bytes)"},
                  {"99999999999GB", dec + "a whole number of B, KiB, MiB, GiB or TiB"}});
  for (const char* t : {"1gb", "1Gb", "1gB", "1g", "1mb", "1k", "1KB", "1tb"}) {
    INFO(t);
    CHECK_THAT(error_of(t), Catch::Contains("units are ambiguous; write 1"));
  }
}

TEST_CASE("size: fractions, signs, junk and overflow are refused clearly", "[common][size]") {
  const std::string units = "use B, KiB, MiB, GiB or TiB (or Ki, Mi, Gi, Ti)";
  const std::string too_large = "too large (at most 18446744073709551615 bytes)";
  check_refusals({{"1.5GiB", "a size is a whole number; write 1536MiB"},
                  {"0.5KiB", "a size is a whole number; write 512B"},
                  {"1.1GiB", "a size is a whole number; use a smaller unit"},
                  {"1.5B", "a byte count is a whole number"},
                  {"1.", "expected digits after '.'"},
                  {"", "empty; write a size such as 512MiB or 2GiB"},
                  {"   ", "empty; write a size such as 512MiB or 2GiB"},
                  {"-1", "a size cannot be negative"},
                  {"-1GiB", "a size cannot be negative"},
                  {"+1GiB", "expected a number, such as 512MiB or 2GiB"},
                  {"GiB", "expected a number, such as 512MiB or 2GiB"},
                  {"lots", "expected a number, such as 512MiB or 2GiB"},
                  {"12XB", "unknown unit \"XB\"; " + units},
                  {"1PiB", "unknown unit \"PiB\"; " + units},
                  {"1gib", "unknown unit \"gib\" (units are case-sensitive: write GiB)"},
                  {"0x100000", "unexpected \"x100000\" after the number; " + units},
                  {"1b", "unknown unit \"b\" (units are case-sensitive: write B)"},
                  {"1e9", "unexpected \"e9\" after the number; " + units},
                  {"50%", "a percentage is not allowed here; write a size such as 8GiB"},
                  {"18446744073709551616B", too_large},
                  {"99999999999999999999999B", too_large},
                  {"16777216TiB", too_large},
                  {"20000000TiB", too_large}});
}

TEST_CASE("size: bounds", "[common][size]") {
  CHECK(vlake::parse_size("2MiB", Bytes{2ull << 20}, Bytes{1ull << 40}) == Bytes{2ull << 20});
  CHECK_THROWS_WITH(vlake::parse_size("1MiB", Bytes{2ull << 20}, Bytes{1ull << 40}), "\"1MiB\": must be at least 2MiB");
  CHECK_THROWS_WITH(vlake::parse_size("2TiB", Bytes{2ull << 20}, Bytes{1ull << 40}), "\"2TiB\": must be at most 1TiB");
  CHECK_THROWS_WITH(vlake::parse_size("0", Bytes{1}, Bytes{~0ull}), "\"0\": must be greater than zero");
  CHECK_THROWS_WITH(vlake::parse_size("8", Bytes{1}, Bytes{~0ull}),
                    "\"8\": a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB");
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
                    "\"8GB\": decimal units are ambiguous; write 8GiB (8589934592 bytes)");
  CHECK_THROWS_WITH(vlake::parse_size_or_percent("8"), "\"8\": a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB");
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
