// One size grammar and one duration grammar everywhere: the same text means the same bytes or
// milliseconds (and the same error) in an environment variable (the hook's VLAKE_RESERVE,
// VLAKE_TIMEOUT), a command-line flag (vlaked's --warm-reserve, --bulk-size, --swap-idle) and the
// quota YAML (limit, wait). A bare number is refused on each of them, saying which unit to write.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>

#include "config.hpp"  // hook/src
#include "vlake/pool/options.hpp"
#include "vlake/quota/quota_config.hpp"

using vlake::Bytes;

namespace {

constexpr const char* kOneGiB = "1GiB";
constexpr std::uint64_t kOneGiBBytes = 1073741824;
constexpr const char* kWhy = "decimal units are ambiguous; write 1GiB (1073741824 bytes)";

vlake::hook::Config hook_with(const char* name, const char* value) {
  ::setenv(name, value, 1);
  vlake::hook::Config c = vlake::hook::Config::from_environment();
  ::unsetenv(name);
  return c;
}
vlake::hook::Config hook_with_reserve(const char* value) { return hook_with("VLAKE_RESERVE", value); }

vlake::pool::DaemonOptions vlaked(std::initializer_list<const char*> args) {
  const char* argv[8] = {"vlaked"};
  int argc = 1;
  for (const char* a : args) argv[argc++] = a;
  return vlake::pool::DaemonOptions::parse(argc, argv);
}

vlake::quota::QuotaConfig yaml_with(const std::string& key, const std::string& value) {
  return vlake::quota::QuotaConfig::parse("version: 1\ndefault:\n  " + key + ": " + value + "\n", "vlake.yaml");
}
vlake::quota::QuotaConfig yaml_with_limit(const std::string& value) { return yaml_with("limit", value); }

// what() of the ConfigError the YAML `key: value` raises.
std::string yaml_error(const std::string& key, const std::string& value) {
  try {
    (void)yaml_with(key, value);
  } catch (const vlake::quota::ConfigError& e) {
    return e.what();
  }
  return "accepted";
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
                    "--warm-reserve: \"64M\": single-letter units are ambiguous; write 64MiB (67108864 bytes)");
}

TEST_CASE("sizes: a bare number is refused in the environment, on the command line and in YAML", "[common][size]") {
  const std::string why = "a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB";
  const vlake::hook::Config hook = hook_with_reserve("8");
  CHECK(hook.reserve_bytes == vlake::hook::Config{}.reserve_bytes);
  REQUIRE(hook.problems.size() == 1);
  CHECK(hook.problems[0] == "ignoring VLAKE_RESERVE=\"8\": " + why);
  CHECK_THROWS_WITH(vlaked({"--warm-reserve", "8"}), "--warm-reserve: \"8\": " + why);
  CHECK(yaml_error("limit", "8") == "vlake.yaml:3:10: bad limit \"8\": " + why);
  // 0 needs no unit.
  CHECK(hook_with_reserve("0").reserve_bytes == 0);
  CHECK(vlaked({"--swap-margin", "0"}).swap_margin == 0);
}

TEST_CASE("durations: 30s is 30 seconds in the environment, on the command line and in YAML", "[common][duration]") {
  using namespace std::chrono_literals;
  const vlake::hook::Config hook = hook_with("VLAKE_TIMEOUT", "30s");
  CHECK(hook.problems.empty());
  CHECK(hook.timeout == 30s);
  CHECK(hook_with("VLAKE_WAIT", "30s").wait == std::optional<std::chrono::milliseconds>(30s));
  CHECK(vlaked({"--swap-idle", "30s"}).swap_idle == 30s);
  CHECK(vlaked({"--pool-idle-release=30s"}).pool_idle_release == 30s);
  const vlake::quota::QuotaConfig q = yaml_with("wait", "30s");
  CHECK(q.resolve(7, 7, {}).wait == 30s);
  // Fractions that are whole milliseconds, alike everywhere.
  CHECK(hook_with("VLAKE_TIMEOUT", "2.5s").timeout == 2500ms);
  CHECK(vlaked({"--swap-idle", "2.5s"}).swap_idle == 2500ms);
  CHECK(yaml_with("wait", "2.5s").resolve(7, 7, {}).wait == 2500ms);
}

TEST_CASE("durations: a bare number is refused in the environment, on the command line and in YAML",
          "[common][duration]") {
  const std::string why = "a duration needs a unit; write 30s or 30ms";
  for (const char* name : {"VLAKE_TIMEOUT", "VLAKE_WAIT"}) {
    const vlake::hook::Config hook = hook_with(name, "30");
    REQUIRE(hook.problems.size() == 1);
    CHECK(hook.problems[0] == "ignoring " + std::string(name) + "=\"30\": " + why);
  }
  CHECK(hook_with("VLAKE_TIMEOUT", "30").timeout == vlake::hook::Config{}.timeout);  // the default is kept
  CHECK_THROWS_WITH(vlaked({"--swap-idle", "30"}), "--swap-idle: \"30\": " + why);
  CHECK_THROWS_WITH(vlaked({"--pool-idle-release=30"}), "--pool-idle-release: \"30\": " + why);
  CHECK_THROWS_AS(vlaked({"--swap-idle", "30"}), vlake::pool::OptionsError);
  CHECK(yaml_error("wait", "30") == "vlake.yaml:3:9: bad wait \"30\": " + why + " in 'default'");
  CHECK(yaml_error("kill_grace", "30") == "vlake.yaml:3:15: bad kill_grace \"30\": " + why + " in 'default'");
  // 0 needs no unit; vlaked's -ms flags take plain milliseconds by their name.
  CHECK(vlaked({"--swap-idle", "0"}).swap_idle.count() == 0);
  CHECK(vlaked({"--pressure-wait-ms", "30"}).pressure_wait.count() == 30);
}

TEST_CASE("durations: the reclaim deadline and skip and the counted-grant window read the grammar, within bounds",
          "[common][duration]") {
  using namespace std::chrono_literals;
  const vlake::pool::DaemonOptions defaults = vlaked({});
  CHECK(defaults.reclaim_deadline == 250ms);
  CHECK(defaults.reclaim_skip == 1min);
  CHECK(defaults.counted_realize == 5s);
  CHECK(vlaked({"--reclaim-deadline", "1s"}).reclaim_deadline == 1s);
  CHECK(vlaked({"--reclaim-skip", "2m"}).reclaim_skip == 2min);
  CHECK(vlaked({"--counted-realize", "2.5s"}).counted_realize == 2500ms);
  CHECK(vlaked({"--counted-realize", "off"}).counted_realize.count() == 0);
  CHECK_THROWS_AS(vlaked({"--reclaim-deadline", "250"}), vlake::pool::OptionsError);
  CHECK_THROWS_AS(vlaked({"--reclaim-deadline", "5ms"}), vlake::pool::OptionsError);  // below 10ms
  CHECK_THROWS_AS(vlaked({"--reclaim-deadline", "0"}), vlake::pool::OptionsError);
  CHECK_THROWS_AS(vlaked({"--reclaim-skip", "500ms"}), vlake::pool::OptionsError);  // below 1s
  CHECK_THROWS_AS(vlaked({"--counted-realize", "2h"}), vlake::pool::OptionsError);  // above 1h
}
