// One size grammar everywhere: the same text means the same bytes (and the same error) in an
// environment variable (the hook's VLAKE_RESERVE), a command-line flag (vlaked's --warm-reserve
// and --bulk-size) and the quota YAML.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "config.hpp"  // hook/src
#include "vlake/pool/options.hpp"
#include "vlake/quota/quota_config.hpp"

using vlake::Bytes;

namespace {

constexpr const char* kOneGiB = "1GiB";
constexpr std::uint64_t kOneGiBBytes = 1073741824;
constexpr const char* kWhy = "decimal units are ambiguous; write 1GiB (1073741824 bytes) or a byte count";

vlake::hook::Config hook_with_reserve(const char* value) {
  ::setenv("VLAKE_RESERVE", value, 1);
  vlake::hook::Config c = vlake::hook::Config::from_environment();
  ::unsetenv("VLAKE_RESERVE");
  return c;
}

vlake::pool::DaemonOptions vlaked(std::initializer_list<const char*> args) {
  const char* argv[8] = {"vlaked"};
  int argc = 1;
  for (const char* a : args) argv[argc++] = a;
  return vlake::pool::DaemonOptions::parse(argc, argv);
}

vlake::quota::QuotaConfig yaml_with_limit(const std::string& value) {
  return vlake::quota::QuotaConfig::parse("version: 1\ndefault:\n  limit: " + value + "\n", "vlake.yaml");
}

}  // namespace

TEST_CASE("sizes: 1GiB is 1073741824 bytes in the environment, on the command line and in YAML", "[common][size]") {
  const vlake::hook::Config hook = hook_with_reserve(kOneGiB);
  CHECK(hook.problems.empty());
  CHECK(hook.reserve_bytes == kOneGiBBytes);

  CHECK(vlaked({"--warm-reserve", kOneGiB}).warm_reserve == kOneGiBBytes);
  CHECK(vlaked({"--bulk-size=1GiB"}).bulk_size == kOneGiBBytes);

  CHECK(yaml_with_limit(kOneGiB).default_limit() == vlake::quota::Limit::bytes(Bytes{kOneGiBBytes}));

  // The Kubernetes spelling, too.
  CHECK(hook_with_reserve("1Gi").reserve_bytes == kOneGiBBytes);
  CHECK(vlaked({"--warm-reserve", "1Gi"}).warm_reserve == kOneGiBBytes);
  CHECK(yaml_with_limit("1Gi").default_limit() == vlake::quota::Limit::bytes(Bytes{kOneGiBBytes}));
}

TEST_CASE("sizes: 1GB is refused in the environment, on the command line and in YAML, saying where and what to write",
          "[common][size]") {
  const vlake::hook::Config hook = hook_with_reserve("1GB");
  CHECK(hook.reserve_bytes == vlake::hook::Config{}.reserve_bytes);  // the default is kept
  REQUIRE(hook.problems.size() == 1);
  CHECK(hook.problems[0] == std::string("ignoring VLAKE_RESERVE=\"1GB\": ") + kWhy);

  CHECK_THROWS_WITH(vlaked({"--warm-reserve", "1GB"}), std::string("--warm-reserve: \"1GB\": ") + kWhy);
  CHECK_THROWS_WITH(vlaked({"--bulk-size=1GB"}), std::string("--bulk-size: \"1GB\": ") + kWhy);
  CHECK_THROWS_AS(vlaked({"--bulk-size=1GB"}), vlake::pool::OptionsError);

  try {
    (void)yaml_with_limit("1GB");
    FAIL("accepted");
  } catch (const vlake::quota::ConfigError& e) {
    CHECK(std::string(e.what()) == std::string("vlake.yaml:3:10: bad limit \"1GB\": ") + kWhy);
    CHECK(e.line() == 3);
    CHECK(e.column() == 10);
  }
}

TEST_CASE("sizes: vlaked's size flags keep their ranges", "[common][size]") {
  CHECK(vlaked({"--warm-reserve", "0"}).warm_reserve == 0);
  CHECK_THROWS_WITH(vlaked({"--bulk-size", "1MiB"}), "--bulk-size: \"1MiB\": must be at least 2MiB");
  CHECK_THROWS_WITH(vlaked({"--bulk-size", "2TiB"}), "--bulk-size: \"2TiB\": must be at most 1TiB");
  CHECK_THROWS_WITH(vlaked({"--warm-reserve", "2048TiB"}), "--warm-reserve: \"2048TiB\": must be at most 1024TiB");
  CHECK_THROWS_WITH(vlaked({"--warm-reserve", "64M"}),
                    "--warm-reserve: \"64M\": single-letter units are ambiguous; write 64MiB (67108864 bytes) or a "
                    "byte count");
}
