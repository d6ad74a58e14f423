// vlake's one duration grammar (common/duration.hpp): what it accepts, what it refuses and the
// message it gives, and the one exact formatter.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "refusals.hpp"
#include "vlake/common/duration.hpp"

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using vlake::DurationError;
using vlake::parse_duration;

namespace {

auto parse_dur = [](const std::string& text) { return parse_duration(text); };
std::string duration_error_of(const std::string& text) { return vlake::test::error_of(parse_dur, text); }
void check_duration_refusals(const std::vector<vlake::test::Refusal>& cases) {
  vlake::test::check_refusals(parse_dur, cases);
}

}  // namespace

TEST_CASE("duration: a number and a unit", "[common][duration]") {
  CHECK(parse_duration("750ms") == 750ms);
  CHECK(parse_duration("30s") == 30'000ms);
  CHECK(parse_duration("2m") == 120'000ms);
  CHECK(parse_duration("1h") == 3'600'000ms);
  CHECK(parse_duration("0ms") == 0ms);
  CHECK(parse_duration("007s") == 7000ms);
  CHECK(parse_duration(" 30 s ") == 30'000ms);
  CHECK(parse_duration("\t500ms\n") == 500ms);
}

TEST_CASE("duration: fractions that are whole milliseconds", "[common][duration]") {
  CHECK(parse_duration("2.5s") == 2500ms);
  CHECK(parse_duration("0.5m") == 30'000ms);
  CHECK(parse_duration("1.5h") == 5'400'000ms);
  CHECK(parse_duration("0.001s") == 1ms);
  CHECK(parse_duration("1.0ms") == 1ms);
  CHECK(duration_error_of("1.5ms") == "\"1.5ms\": finer than a millisecond, the smallest step; write 1ms or 2ms");
  CHECK(duration_error_of("0.0001s") == "\"0.0001s\": finer than a millisecond, the smallest step; write 0ms or 1ms");
  CHECK(duration_error_of("1.0000000001s") == "\"1.0000000001s\": at most 9 decimals");
  CHECK(duration_error_of("1.s") == "\"1.s\": expected digits after '.'");
}

TEST_CASE("duration: a bare number is refused, 0 excepted", "[common][duration]") {
  CHECK(parse_duration("0") == 0ms);
  CHECK(parse_duration("000") == 0ms);
  CHECK(parse_duration("0.0") == 0ms);
  CHECK(duration_error_of("30") == "\"30\": a duration needs a unit; write 30s or 30ms");
  CHECK(duration_error_of("1") == "\"1\": a duration needs a unit; write 1s or 1ms");
  CHECK(duration_error_of("2.5") == "\"2.5\": a duration needs a unit; write 2.5s");
}

TEST_CASE("duration: other spellings say what to write", "[common][duration]") {
  const std::string finer = "is finer than a millisecond, the smallest step; use ms, s, m or h";
  check_duration_refusals({{"30S", "unknown unit \"S\" (units are case-sensitive: write 30s)"},
                           {"500MS", "unknown unit \"MS\" (units are case-sensitive: write 500ms)"},
                           {"2M", "unknown unit \"M\" (units are case-sensitive: write 2m)"},
                           {"30sec", "unknown unit \"sec\"; write 30s"},
                           {"2 minutes", "unknown unit \"minutes\"; write 2m"},
                           {"2min", "unknown unit \"min\"; write 2m"},
                           {"1hr", "unknown unit \"hr\"; write 1h"},
                           {"10msec", "unknown unit \"msec\"; write 10ms"},
                           {"1d", "unknown unit \"d\"; write 24h"},
                           {"1.5d", "unknown unit \"d\"; write 36h"},
                           {"10us", "unit \"us\" " + finer},
                           {"1m30s", "one number and one unit; write 90s"},
                           {"1h 30m", "one number and one unit; write 90m"},
                           {"1m30", "unexpected \"m30\" after the number; use ms, s, m or h"},
                           {"5fortnights", "unknown unit \"fortnights\"; use ms, s, m or h"},
                           {"1e3", "unexpected \"e3\" after the number; use ms, s, m or h"}});
}

TEST_CASE("duration: empty, signs, junk, off and overflow", "[common][duration]") {
  const std::string example = "500ms, 30s or 2m";
  check_duration_refusals({{"", "empty; write a duration such as " + example},
                           {"  ", "empty; write a duration such as " + example},
                           {"-1s", "a duration cannot be negative"},
                           {"+1s", "expected a number, such as " + example},
                           {"s", "expected a number, such as " + example},
                           {"five", "expected a number, such as " + example},
                           {"off", "'off' is not allowed here; write a duration such as 30s"},
                           {"9223372036854775808ms", "too large"},
                           {"9999999999999999h", "too large"},
                           {"99999999999999999999s", "too large"}});
  CHECK(parse_duration("9223372036854775807ms") == milliseconds::max());
  CHECK_THROWS_AS(parse_duration("30"), std::invalid_argument);  // DurationError is one
}

TEST_CASE("duration: bounds and off", "[common][duration]") {
  CHECK(parse_duration("10m", 1ms, 10min) == 10min);
  CHECK_THROWS_WITH(parse_duration("0", 1ms, 10min), "\"0\": must be greater than zero");
  CHECK_THROWS_WITH(parse_duration("5ms", 10ms, 10min), "\"5ms\": must be at least 10ms");
  CHECK_THROWS_WITH(parse_duration("11m", 0ms, 10min), "\"11m\": must be at most 10m");
  CHECK_THROWS_WITH(parse_duration("30", 0ms, 10min), "\"30\": a duration needs a unit; write 30s or 30ms");
  CHECK(vlake::parse_duration_or_off("off", 24h) == 0ms);
  CHECK(vlake::parse_duration_or_off(" off ", 24h) == 0ms);
  CHECK(vlake::parse_duration_or_off("0", 24h) == 0ms);
  CHECK(vlake::parse_duration_or_off("30s", 24h) == 30s);
  CHECK_THROWS_WITH(vlake::parse_duration_or_off("25h", 24h), "\"25h\": must be at most 24h");
  CHECK_THROWS_WITH(vlake::parse_duration_or_off("30", 24h), "\"30\": a duration needs a unit; write 30s or 30ms");
}

TEST_CASE("duration: format_duration is exact and parses back", "[common][duration]") {
  CHECK(vlake::format_duration(0ms) == "0s");
  CHECK(vlake::format_duration(1ms) == "1ms");
  CHECK(vlake::format_duration(1500ms) == "1500ms");
  CHECK(vlake::format_duration(30s) == "30s");
  CHECK(vlake::format_duration(90s) == "90s");
  CHECK(vlake::format_duration(2min) == "2m");
  CHECK(vlake::format_duration(24h) == "24h");
  CHECK(vlake::format_duration(-30s) == "-30s");
  for (const milliseconds d : {0ms, 1ms, 999ms, 1000ms, 61'000ms, 3'600'000ms, 3'600'001ms, milliseconds::max()}) {
    INFO(d.count());
    CHECK(parse_duration(vlake::format_duration(d)) == d);
  }
}
