// QuotaConfig: good files resolve as documented; bad files fail with file:line:column and a
// description of what is wrong.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "vlake/quota/quota_config.hpp"

using vlake::Bytes;
using vlake::quota::ConfigError;
using vlake::quota::Limit;
using vlake::quota::QuotaConfig;
using namespace vlake::literals;

namespace {
std::vector<gid_t> none;
}

TEST_CASE("size strings parse to bytes or percentages", "[quota]") {
  CHECK(vlake::quota::parse_limit("4096B") == Limit::bytes(Bytes{4096}));
  CHECK(vlake::quota::parse_limit("3KiB") == Limit::bytes(3_KiB));
  CHECK(vlake::quota::parse_limit("512MiB") == Limit::bytes(512_MiB));
  CHECK(vlake::quota::parse_limit(" 8 GiB ") == Limit::bytes(8_GiB));
  CHECK(vlake::quota::parse_limit("2TiB") == Limit::bytes(Bytes{2ull << 40}));
  CHECK(vlake::quota::parse_limit("50%") == Limit::percent_ppm(500'000));
  CHECK(vlake::quota::parse_limit("12.5%") == Limit::percent_ppm(125'000));
  CHECK(vlake::quota::parse_limit("100%") == Limit::percent_ppm(1'000'000));
  CHECK(vlake::quota::parse_limit("50%").on_device(1_GiB) == 512_MiB);
  CHECK(vlake::quota::parse_limit("4GiB").on_device(1_GiB) == 4_GiB);
  CHECK(vlake::quota::parse_limit("4GiB").to_string() == "4GiB");
  CHECK(vlake::quota::parse_limit("12.5%").to_string() == "12.5%");

  struct Bad {
    const char* text;
    const char* why;
  };
  const std::vector<Bad> bad = {
      {"8GB", "\"8GB\": decimal units are ambiguous; write 8GiB (8589934592 bytes)"},
      {"8", "\"8\": a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB"},
      {"4096", "\"4096\": a size needs a unit; write 4096B, 4096KiB, 4096MiB or 4096GiB"},
      {"0", "greater than zero"},
      {"0GiB", "greater than zero"},
      {"-1GiB", "cannot be negative"},
      {"101%", "percentage over 100"},
      {"100.5%", "percentage over 100"},
      {"0%", "greater than zero"},
      {"", "empty"},
      {"GiB", "expected a number"},
      {"1.5GiB", "whole number"},
      {"99999999999999999999B", "too large"},
      {"20000000TiB", "too large"},
  };
  for (const Bad& b : bad) {
    INFO(b.text);
    try {
      (void)vlake::quota::parse_limit(b.text);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains(b.why));
    }
  }
}

TEST_CASE("resolution: user entry wins, then first matching group, then default", "[quota]") {
  const QuotaConfig cfg = QuotaConfig::parse(R"(version: 1
default:
  limit: 8GiB
users:
  - uid: 1000
    limit: 4GiB
  - uid: 0
    limit: 50%
groups:
  - gid: 2000
    limit: 16GiB
  - gid: 3000
    limit: 1GiB
)",
                                             "t.yaml");
  const std::vector<gid_t> g2000{2000};
  const std::vector<gid_t> g3000_2000{3000, 2000};

  auto t = cfg.resolve(1000, 2000, g2000);
  CHECK(t.name == "user:1000");
  CHECK(t.limit == Limit::bytes(4_GiB));

  t = cfg.resolve(0, 0, none);
  CHECK(t.name == "user:0");
  CHECK(t.limit.on_device(2_GiB) == 1_GiB);

  t = cfg.resolve(1001, 2000, none);  // primary gid
  CHECK(t.name == "group:2000");
  CHECK(t.limit == Limit::bytes(16_GiB));

  t = cfg.resolve(1001, 100, g3000_2000);  // supplementary: file order decides, not list order
  CHECK(t.name == "group:2000");

  const std::vector<gid_t> g3000{3000};
  t = cfg.resolve(1001, 100, g3000);
  CHECK(t.name == "group:3000");
  CHECK(t.limit == Limit::bytes(1_GiB));

  t = cfg.resolve(1234, 100, none);
  CHECK(t.name == "uid:1234");
  CHECK(t.limit == Limit::bytes(8_GiB));
}

TEST_CASE("names resolve through the user and group databases", "[quota]") {
  // root (uid 0, gid 0) exists on every system.
  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\nusers:\n  - name: root\n    limit: 1GiB\ngroups:\n  - name: root\n    limit: 2GiB\n", "n.yaml");
  CHECK(cfg.resolve(0, 0, none).name == "user:root");
  CHECK(cfg.resolve(5, 0, none).name == "group:root");
  CHECK(cfg.resolve(5, 0, none).limit == Limit::bytes(2_GiB));
}

TEST_CASE("the built-in default and a missing default section mean 100%", "[quota]") {
  const QuotaConfig builtin;
  CHECK(builtin.resolve(42, 42, none).name == "uid:42");
  CHECK(builtin.resolve(42, 42, none).limit.on_device(1_GiB) == 1_GiB);
  const QuotaConfig cfg = QuotaConfig::parse("version: 1\n", "v.yaml");
  CHECK(cfg.default_limit() == Limit::percent_ppm(1'000'000));
}

TEST_CASE("bad files name file, line, column and the problem", "[quota]") {
  struct Case {
    const char* text;
    const char* expect;  // the start of what() after the file name
  };
  const std::vector<Case> cases = {
      {"version: 1\nfoo: 1\n", "bad.yaml:2:1: unknown key 'foo' in the top level"},
      {"version: 2\n", "bad.yaml:1:10: unsupported version '2'"},
      {"default:\n  limit: 1GiB\n", "bad.yaml:1:1: missing 'version'"},
      {"version: 1\ndefault:\n  limit: 8GB\n", "bad.yaml:3:10: bad limit \"8GB\": decimal units are ambiguous"},
      {"version: 1\ndefault:\n  limit: 0\n", "bad.yaml:3:10: bad limit \"0\": must be greater than zero"},
      {"version: 1\ndefault:\n  limit: -4GiB\n", "bad.yaml:3:10: bad limit \"-4GiB\": a size cannot be negative"},
      {"version: 1\ndefault:\n  limit: 150%\n", "bad.yaml:3:10: bad limit \"150%\": percentage over 100"},
      {"version: 1\ndefault:\n  limt: 1GiB\n", "bad.yaml:3:3: unknown key 'limt' in 'default'"},
      {"version: 1\nusers:\n  - uid: 1000\n    limit: 1GiB\n  - uid: 1000\n    limit: 2GiB\n",
       "bad.yaml:5:10: duplicate uid 1000 in 'users'"},
      {"version: 1\ngroups:\n  - gid: 7\n    limit: 1GiB\n  - gid: 7\n    limit: 1GiB\n",
       "bad.yaml:5:10: duplicate gid 7 in 'groups'"},
      {"version: 1\nusers:\n  - name: root\n    limit: 1GiB\n  - uid: 0\n    limit: 1GiB\n",
       "bad.yaml:5:10: duplicate uid 0 in 'users'"},
      {"version: 1\nusers:\n  - uid: 5\n", "bad.yaml:3:5: missing 'limit' in a 'users' entry"},
      {"version: 1\nusers:\n  - uid: 5\n    name: root\n    limit: 1GiB\n",
       "bad.yaml:3:5: a 'users' entry has both 'uid' and 'name'"},
      {"version: 1\nusers:\n  - limit: 1GiB\n", "bad.yaml:3:5: a 'users' entry needs 'uid' or 'name'"},
      {"version: 1\nusers:\n  - uid: abc\n    limit: 1GiB\n", "bad.yaml:3:10: bad uid 'abc'"},
      {"version: 1\nusers:\n  - uid: 1\n    limit: 1GiB\n    quota: 2\n",
       "bad.yaml:5:5: unknown key 'quota' in a 'users' entry"},
      {"version: 1\nusers:\n  - name: no-such-user-vlake\n    limit: 1GiB\n",
       "bad.yaml:3:11: unknown user 'no-such-user-vlake'"},
      {"version: 1\ngroups:\n  - name: no-such-group-vlake\n    limit: 1GiB\n",
       "bad.yaml:3:11: unknown group 'no-such-group-vlake'"},
      {"version: 1\nusers: 5\n", "bad.yaml:2:8: 'users' must be a list"},
      {"version: 1\ndefault: [1\n", "bad.yaml:3:1: YAML syntax"},
      {"", "bad.yaml:0:0: empty configuration"},
      {"- 1\n", "bad.yaml:1:1: the configuration must be a mapping"},
      {"version: 1\ndefault:\n  guard: on\n", "bad.yaml:3:10: bad guard mode 'on' in 'default'"},
      {"version: 1\ndefault:\n  guard: [canary]\n", "bad.yaml:3:10: bad guard mode '?' in 'default'"},
      {"version: 1\nnamespaces:\n  - name: a\n    guard: Canary\n",
       "bad.yaml:4:12: bad guard mode 'Canary' in namespace 'a'"},
      {"version: 1\nusers:\n  - uid: 5\n    guard: faults\n",
       "bad.yaml:4:12: bad guard mode 'faults' in a 'users' entry"},
      {"version: 1\ngroups:\n  - gid: 5\n    guard: 1\n", "bad.yaml:4:12: bad guard mode '1' in a 'groups' entry"},
      {"version: 1\ndefault:\n  dedup: on\n",
       "bad.yaml:3:10: bad dedup mode 'on' in 'default' (use off or transparent)"},
      {"version: 1\nnamespaces:\n  - name: infer\n    dedup: Transparent\n",
       "bad.yaml:4:12: bad dedup mode 'Transparent' in namespace 'infer' (use off or transparent)"},
      {"version: 1\nnamespaces:\n  - name: infer\n    dedup: [transparent]\n",
       "bad.yaml:4:12: bad dedup mode '?' in namespace 'infer'"},
      {"version: 1\nusers:\n  - uid: 5\n    limit: 1GiB\n    dedup: transparent\n",
       "bad.yaml:5:5: unknown key 'dedup' in a 'users' entry"},
      {"version: 1\ndefault:\n  dedup_domain: Team_A\n", "bad.yaml:3:17: bad dedup_domain 'Team_A' in 'default'"},
      {"version: 1\nnamespaces:\n  - name: infer\n    dedup_domain: [a]\n",
       "bad.yaml:4:19: bad dedup_domain '?' in namespace 'infer'"},
      {"version: 1\nusers:\n  - uid: 5\n    limit: 1GiB\n    dedup_domain: a\n",
       "bad.yaml:5:5: unknown key 'dedup_domain' in a 'users' entry"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    try {
      (void)QuotaConfig::parse(c.text, "bad.yaml");
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK_THAT(e.what(), Catch::StartsWith(c.expect));
    }
  }
}

TEST_CASE("load reads a file and reports a missing one", "[quota]") {
  char path[] = "/tmp/vlake-quota-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream out(path);
    out << "version: 1\ndefault:\n  limit: 3GiB\n";
  }
  CHECK(QuotaConfig::load(path).default_limit() == Limit::bytes(3_GiB));
  ::unlink(path);
  try {
    (void)QuotaConfig::load(path);
    FAIL("loaded a missing file");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("cannot read the file"));
  }
}

TEST_CASE("dedup modes: namespace, then default, else off", "[quota]") {
  using vlake::quota::DedupMode;
  const std::vector<gid_t> none;
  CHECK(QuotaConfig().resolve(1000, 1000, none).dedup == DedupMode::off);
  CHECK(QuotaConfig::parse("version: 1\ndefault: {limit: 1GiB}\n", "d.yaml").resolve(1, 1, none).dedup ==
        DedupMode::off);
  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\n"
      "namespaces:\n"
      "  - {name: infer, dedup: transparent, users: [7001]}\n"
      "  - {name: train, dedup: off, users: [7002]}\n"
      "  - {name: other, users: [7003]}\n",
      "d.yaml");
  CHECK(cfg.default_dedup() == DedupMode::off);
  CHECK(cfg.resolve(7001, 1, none).dedup == DedupMode::transparent);
  CHECK(cfg.resolve(7002, 1, none).dedup == DedupMode::off);
  CHECK(cfg.resolve(7003, 1, none).dedup == DedupMode::off);
  CHECK(cfg.resolve(9999, 1, none).dedup == DedupMode::off);
  REQUIRE(cfg.find_namespace("infer") != nullptr);
  CHECK(cfg.dedup_of(*cfg.find_namespace("infer")) == DedupMode::transparent);
  // `default` may give only `dedup`: it applies to namespaces without their own (and to uid
  // tenants); the limit stays 100%.
  const QuotaConfig def = QuotaConfig::parse(
      "version: 1\n"
      "default:\n"
      "  dedup: transparent\n"
      "namespaces:\n"
      "  - {name: train, dedup: off, users: [7002]}\n"
      "  - {name: other, users: [7003]}\n",
      "d.yaml");
  CHECK(def.default_dedup() == DedupMode::transparent);
  CHECK(def.default_limit() == Limit::percent_ppm(1'000'000));
  CHECK(def.resolve(7002, 1, none).dedup == DedupMode::off);
  CHECK(def.resolve(7003, 1, none).dedup == DedupMode::transparent);
  CHECK(def.resolve(9999, 1, none).dedup == DedupMode::transparent);
  CHECK(std::string(vlake::quota::dedup_mode_name(DedupMode::transparent)) == "transparent");
}

TEST_CASE("dedup domains: namespace, then default, else none", "[quota]") {
  const std::vector<gid_t> none;
  CHECK(QuotaConfig().resolve(1000, 1000, none).dedup_domain.empty());
  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\n"
      "namespaces:\n"
      "  - {name: infer, dedup_domain: serving, users: [7001]}\n"
      "  - {name: other, users: [7003]}\n",
      "d.yaml");
  CHECK(cfg.resolve(7001, 1, none).dedup_domain == "serving");
  CHECK(cfg.resolve(7003, 1, none).dedup_domain.empty());
  CHECK(cfg.resolve(9999, 1, none).dedup_domain.empty());
  CHECK(cfg.resolve_allocation("pod", "infer", Bytes{1ull << 30}, Bytes{1ull << 34}).dedup_domain == "serving");
  // `default` may give only `dedup_domain`: namespaces without their own and uid tenants join it.
  const QuotaConfig def = QuotaConfig::parse(
      "version: 1\n"
      "default:\n"
      "  dedup_domain: node-wide\n"
      "namespaces:\n"
      "  - {name: infer, dedup_domain: serving, users: [7001]}\n"
      "  - {name: other, users: [7003]}\n",
      "d.yaml");
  CHECK(def.default_limit() == Limit::percent_ppm(1'000'000));
  CHECK(def.resolve(7001, 1, none).dedup_domain == "serving");
  CHECK(def.resolve(7003, 1, none).dedup_domain == "node-wide");
  CHECK(def.resolve(9999, 1, none).dedup_domain == "node-wide");
}

TEST_CASE("ipc_domain: a namespace's own, never default's, and a bad name is a positioned error", "[quota]") {
  const std::vector<gid_t> none;
  CHECK(QuotaConfig().resolve(1000, 1000, none).ipc_domain.empty());
  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\n"
      "namespaces:\n"
      "  - {name: train, ipc_domain: team, users: [7001]}\n"
      "  - {name: serve, ipc_domain: team, users: [7002]}\n"
      "  - {name: other, users: [7003]}\n",
      "i.yaml");
  CHECK(cfg.resolve(7001, 1, none).ipc_domain == "team");
  CHECK(cfg.resolve(7002, 1, none).ipc_domain == "team");
  CHECK(cfg.resolve(7003, 1, none).ipc_domain.empty());
  CHECK(cfg.resolve(9999, 1, none).ipc_domain.empty());
  CHECK(cfg.resolve_allocation("pod", "serve", Bytes{1ull << 30}, Bytes{1ull << 34}).ipc_domain == "team");
  CHECK_THROWS_WITH(QuotaConfig::parse("version: 1\nnamespaces:\n  - {name: a, ipc_domain: Team_A}\n", "i.yaml"),
                    Catch::Contains("i.yaml:3:") && Catch::Contains("bad ipc_domain 'Team_A' in namespace 'a'"));
  CHECK_THROWS_WITH(QuotaConfig::parse("version: 1\ndefault:\n  ipc_domain: team\n", "i.yaml"),
                    Catch::Contains("ipc_domain"));
}

TEST_CASE("guard modes: user/group entry, then namespace, then default, else off", "[quota]") {
  using vlake::quota::GuardMode;
  const QuotaConfig builtin;
  CHECK(builtin.resolve(1000, 1000, none).guard == GuardMode::off);

  const QuotaConfig no_guard = QuotaConfig::parse("version: 1\ndefault: {limit: 1GiB}\n", "g.yaml");
  CHECK(no_guard.resolve(1000, 1000, none).guard == GuardMode::off);

  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\n"
      "default: {guard: canary}\n"
      "namespaces:\n"
      "  - {name: research, guard: fault, users: [7001, 7002], groups: [7100]}\n"
      "  - {name: plain, users: [7003]}\n"
      "users:\n"
      "  - {uid: 7002, guard: off}\n"
      "  - {uid: 7004, guard: fault}\n"
      "groups:\n"
      "  - {gid: 7200, guard: off, limit: 1GiB}\n",
      "g.yaml");
  // The default gave only a guard: the limit stays 100%.
  CHECK(cfg.default_limit() == Limit::percent_ppm(1'000'000));
  CHECK(cfg.default_guard() == GuardMode::canary);
  CHECK(cfg.resolve(7001, 1, none).guard == GuardMode::fault);   // namespace
  CHECK(cfg.resolve(7002, 1, none).guard == GuardMode::off);     // own entry beats namespace
  CHECK(cfg.resolve(7003, 1, none).guard == GuardMode::canary);  // namespace without: default
  CHECK(cfg.resolve(7004, 1, none).guard == GuardMode::fault);   // own entry beats default
  CHECK(cfg.resolve(7004, 1, none).limit == Limit::percent_ppm(1'000'000));
  CHECK(cfg.resolve(9999, 7100, none).guard == GuardMode::fault);  // namespace group list
  CHECK(cfg.resolve(9999, 7200, none).guard == GuardMode::off);    // group entry
  CHECK(cfg.resolve(9999, 1, none).guard == GuardMode::canary);    // uid tenant: default
  CHECK(std::string(vlake::quota::guard_mode_name(GuardMode::canary)) == "canary");
}

TEST_CASE("overcommit: per namespace, then default, else off", "[quota]") {
  const std::vector<gid_t> none;
  CHECK_FALSE(QuotaConfig().resolve(1000, 1000, none).overcommit);
  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\n"
      "default: {overcommit: true}\n"
      "namespaces:\n"
      "  - {name: nb, users: [7001]}\n"
      "  - {name: train, overcommit: false, users: [7002]}\n",
      "o.yaml");
  CHECK(cfg.resolve(7001, 1, none).overcommit);        // the default's
  CHECK_FALSE(cfg.resolve(7002, 1, none).overcommit);  // its own
  CHECK(cfg.resolve(9999, 1, none).overcommit);        // default namespace
  CHECK(cfg.resolve_allocation("pod:nb/p/c", "nb", 64_MiB, 1024_MiB).overcommit);
  CHECK_FALSE(cfg.resolve_allocation("pod:train/p/c", "train", 64_MiB, 1024_MiB).overcommit);
  try {
    (void)QuotaConfig::parse("version: 1\nnamespaces:\n  - name: nb\n    overcommit: on\n", "bad.yaml");
    FAIL("accepted");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("bad.yaml:4:17: bad overcommit 'on' in namespace 'nb' (use true or false)"));
  }
}

TEST_CASE("memory outside vlake: enforce, kill_grace and allow_disable per namespace, then default", "[quota]") {
  using vlake::quota::Enforce;
  using namespace std::chrono_literals;
  const std::vector<gid_t> none;
  // Built in: kill, 30 s, VLAKE_DISABLE not allowed.
  const auto builtin = QuotaConfig().resolve(1000, 1000, none);
  CHECK(builtin.enforce == Enforce::kill);
  CHECK(builtin.kill_grace == 30s);
  CHECK_FALSE(builtin.allow_disable);
  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\n"
      "default: {enforce: kill, kill_grace: 2m}\n"
      "namespaces:\n"
      "  - {name: lab, enforce: account, allow_disable: true, users: [7001]}\n"
      "  - {name: prod, kill_grace: 500ms, users: [7002]}\n",
      "e.yaml");
  const auto lab = cfg.resolve(7001, 1, none);
  CHECK(lab.enforce == Enforce::account);
  CHECK(lab.kill_grace == 2min);
  CHECK(lab.allow_disable);
  const auto prod = cfg.resolve(7002, 1, none);
  CHECK(prod.enforce == Enforce::kill);
  CHECK(prod.kill_grace == 500ms);
  CHECK_FALSE(prod.allow_disable);
  const auto other = cfg.resolve(9999, 1, none);
  CHECK(other.enforce == Enforce::kill);
  CHECK(other.limit == Limit::percent_ppm(1'000'000));  // `default` without a limit: 100%
  // A Kubernetes allocation's tenant gets its namespace's policy too.
  CHECK(cfg.resolve_allocation("pod:lab/p/c", "lab", 64_MiB, 1024_MiB).allow_disable);
  CHECK(std::string(vlake::quota::enforce_name(Enforce::kill)) == "kill");

  const std::vector<std::pair<const char*, const char*>> bad = {
      {"version: 1\ndefault:\n  enforce: block\n",
       "bad.yaml:3:12: bad enforce mode 'block' in 'default' (use account, refuse or kill)"},
      {"version: 1\nnamespaces:\n  - name: lab\n    kill_grace: 30sec\n",
       "bad.yaml:4:17: bad kill_grace \"30sec\": unknown unit \"sec\"; write 30s in namespace 'lab'"},
      {"version: 1\nnamespaces:\n  - name: lab\n    kill_grace: 30\n",
       "bad.yaml:4:17: bad kill_grace \"30\": a duration needs a unit; write 30s or 30ms in namespace 'lab'"},
      {"version: 1\nnamespaces:\n  - name: lab\n    allow_disable: yes\n",
       "bad.yaml:4:20: bad allow_disable 'yes' in namespace 'lab' (use true or false)"},
      {"version: 1\nusers:\n  - {uid: 5, limit: 1GiB, enforce: kill}\n",
       "bad.yaml:3:27: unknown key 'enforce' in a 'users' entry"},
  };
  for (const auto& [text, expect] : bad) {
    INFO(text);
    try {
      (void)QuotaConfig::parse(text, "bad.yaml");
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK_THAT(e.what(), Catch::StartsWith(expect));
    }
  }
}
