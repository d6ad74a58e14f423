// The full quota model: namespaces (limit, guaranteed, priority, pod_limit, users/groups
// lists), users/groups placed in namespaces, resolution, per-GPU checks, check_file(), and a
// table of malformed configurations, each with its exact positioned message.
#include <catch2/catch.hpp>

#include <unistd.h>

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

const std::vector<gid_t> kNoGroups;

// The issue's example, with users and groups that exist on every Debian system
// (root = uid 0, daemon = gid 1).
const char* const kExample = R"(version: 1
default:
  limit: 8GiB
namespaces:
  - name: research
    limit: 60%
    guaranteed: 16GiB
    priority: 10
    pod_limit: 8GiB
    users: [root, 1002]
    groups: [daemon]
  - name: batch
    limit: 24GiB
    guaranteed: 10%
    users: [1003]
users:
  - name: root
    limit: 4GiB
    namespace: research
  - uid: 1004
    namespace: batch
groups:
  - name: daemon
    limit: 16GiB
)";

std::string temp_file(const std::string& text) {
  char path[] = "/tmp/vlake-quota-model-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("model: the documented example resolves tenants into namespaces", "[quota][model]") {
  const QuotaConfig cfg = QuotaConfig::parse(kExample, "ex.yaml");

  // A users entry placed in a namespace: its own limit wins over pod_limit.
  auto t = cfg.resolve(0, 0, kNoGroups);
  CHECK(t.name == "research/user:root");
  CHECK(t.ns == "research");
  CHECK(t.limit == Limit::bytes(4_GiB));
  // Listed under the namespace, no entry of its own: pod_limit.
  t = cfg.resolve(1002, 50, kNoGroups);
  CHECK(t.name == "research/user:1002");
  CHECK(t.limit == Limit::bytes(8_GiB));
  // A namespace without pod_limit: its limit.
  t = cfg.resolve(1003, 50, kNoGroups);
  CHECK(t.name == "batch/user:1003");
  CHECK(t.ns == "batch");
  CHECK(t.limit == Limit::bytes(24_GiB));
  // A users entry with only `namespace:`: that namespace's default.
  t = cfg.resolve(1004, 50, kNoGroups);
  CHECK(t.name == "batch/user:1004");
  CHECK(t.limit == Limit::bytes(24_GiB));
  // A group listed under the namespace and with an entry: the entry's limit, the namespace.
  const std::vector<gid_t> daemon_group{1};
  t = cfg.resolve(1500, 100, daemon_group);
  CHECK(t.name == "research/group:daemon");
  CHECK(t.ns == "research");
  CHECK(t.limit == Limit::bytes(16_GiB));
  // Everybody else: one tenant per uid in "default" with the top-level default.
  t = cfg.resolve(1500, 100, kNoGroups);
  CHECK(t.name == "uid:1500");
  CHECK(t.ns == "default");
  CHECK(t.limit == Limit::bytes(8_GiB));

  REQUIRE(cfg.namespaces().size() == 3);
  const auto* r = cfg.find_namespace("research");
  REQUIRE(r != nullptr);
  CHECK(r->declared);
  CHECK(r->priority == 10);
  CHECK(r->limit == Limit::percent_ppm(600'000));
  CHECK(r->guaranteed == Limit::bytes(16_GiB));
  CHECK(r->pod_limit == Limit::bytes(8_GiB));
  CHECK(r->limit_on(80_GiB) == 48_GiB);
  CHECK(r->guaranteed_on(80_GiB) == 16_GiB);
  const auto* b = cfg.find_namespace("batch");
  REQUIRE(b != nullptr);
  CHECK(b->priority == 0);
  CHECK(b->guaranteed_on(80_GiB) == 8_GiB);
  const auto& d = cfg.namespaces().back();
  CHECK(d.name == "default");
  CHECK_FALSE(d.declared);
  CHECK_FALSE(d.limit.has_value());
  CHECK(d.limit_on(80_GiB) == 80_GiB);  // no limit beyond the GPU
  CHECK(d.guaranteed_on(80_GiB) == 0_B);

  // Per-GPU checks: fine on an 80 GiB GPU; on an 8 GiB one research's guarantee is more than
  // its 60% limit.
  CHECK_NOTHROW(cfg.check_device(80_GiB));
  try {
    cfg.check_device(8_GiB);
    FAIL("accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) ==
          "ex.yaml:7:17: guaranteed 16GiB is more than the limit 60% of namespace 'research' on a GPU of 8GiB "
          "(16GiB > 5153960755 bytes (4.8GiB))");
  }
}

TEST_CASE("model: a declared 'default' namespace configures the implicit one", "[quota][model]") {
  const QuotaConfig cfg = QuotaConfig::parse(R"(version: 1
namespaces:
  - name: default
    limit: 50%
    guaranteed: 10%
    pod_limit: 25%
    users: [1010]
)",
                                             "d.yaml");
  REQUIRE(cfg.namespaces().size() == 1);
  CHECK(cfg.namespaces()[0].declared);
  auto t = cfg.resolve(7, 7, kNoGroups);
  CHECK(t.name == "uid:7");  // no "default/" prefix
  CHECK(t.ns == "default");
  CHECK(t.limit == Limit::percent_ppm(250'000));  // no top-level default: pod_limit
  t = cfg.resolve(1010, 7, kNoGroups);
  CHECK(t.name == "user:1010");
  CHECK(t.limit == Limit::percent_ppm(250'000));
  // With a top-level default, that is the limit of uid tenants.
  const QuotaConfig cfg2 = QuotaConfig::parse(
      "version: 1\ndefault:\n  limit: 1GiB\nnamespaces:\n  - name: default\n    limit: 50%\n", "d2.yaml");
  CHECK(cfg2.resolve(7, 7, kNoGroups).limit == Limit::bytes(1_GiB));
}

TEST_CASE("model: wait for memory: a namespace's own, else the top-level default's, else 0", "[quota][model]") {
  const QuotaConfig cfg = QuotaConfig::parse(R"(version: 1
default:
  limit: 4GiB
  wait: 5s
namespaces:
  - name: notebooks
    wait: 2m
    users: [1010]
  - name: batch
    users: [1011]
)",
                                             "w.yaml");
  CHECK(cfg.resolve(1010, 7, kNoGroups).wait == std::chrono::minutes(2));
  CHECK(cfg.resolve(1011, 7, kNoGroups).wait == std::chrono::seconds(5));
  CHECK(cfg.resolve(7, 7, kNoGroups).wait == std::chrono::seconds(5));
  const QuotaConfig none = QuotaConfig::parse("version: 1\ndefault:\n  limit: 4GiB\n", "n.yaml");
  CHECK(none.resolve(7, 7, kNoGroups).wait == std::chrono::milliseconds(0));
  try {
    (void)QuotaConfig::parse("version: 1\nnamespaces:\n  - name: a\n    wait: 11m\n", "q.yaml");
    FAIL("a wait above 10m was accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) == "q.yaml:4:11: bad wait \"11m\": must be at most 10m in namespace 'a'");
  }
  try {
    (void)QuotaConfig::parse("version: 1\ndefault:\n  wait: soon\n", "q.yaml");
    FAIL("a bad wait was accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).rfind("q.yaml:3:9: ", 0) == 0);
    CHECK(std::string(e.what()) ==
          "q.yaml:3:9: bad wait \"soon\": expected a number, such as 500ms, 30s or 2m in 'default'");
  }
  try {
    (void)QuotaConfig::parse("version: 1\ndefault:\n  wait: 30\n", "q.yaml");
    FAIL("a wait without a unit was accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) ==
          "q.yaml:3:9: bad wait \"30\": a duration needs a unit; write 30s or 30ms in 'default'");
  }
}

TEST_CASE("model: files of the first release keep their meaning", "[quota][model]") {
  const QuotaConfig cfg = QuotaConfig::parse(
      "version: 1\ndefault:\n  limit: 2GiB\nusers:\n  - uid: 1000\n    limit: 4GiB\ngroups:\n  - gid: 2000\n"
      "    limit: 16GiB\n",
      "old.yaml");
  const std::vector<gid_t> g2000{2000};
  CHECK(cfg.resolve(1000, 5, kNoGroups).name == "user:1000");
  CHECK(cfg.resolve(1000, 5, kNoGroups).ns == "default");
  CHECK(cfg.resolve(1001, 5, g2000).name == "group:2000");
  CHECK(cfg.resolve(1001, 5, kNoGroups).limit == Limit::bytes(2_GiB));
  REQUIRE(cfg.namespaces().size() == 1);
  CHECK_FALSE(cfg.namespaces()[0].declared);
}

TEST_CASE("model: malformed configurations, each with its positioned message", "[quota][model]") {
  struct Case {
    std::string text;
    std::string expect;  // the whole what()
  };
  const std::string ns = "version: 1\nnamespaces:\n";
  const std::string a = ns + "  - name: a\n";
  const std::vector<Case> cases = {
      {"version: 1\nnamespaces: {a: 1}\n", "q.yaml:2:13: 'namespaces' must be a list"},
      {ns + "  - research\n", "q.yaml:3:5: a 'namespaces' entry must be a mapping (name, limit, guaranteed, ...)"},
      {a + "    limits: 8GiB\n",
       "q.yaml:4:5: unknown key 'limits' in a 'namespaces' entry (allowed: name, limit, guaranteed, priority, "
       "pod_limit, users, groups, guard, dedup, enforce, kill_grace, allow_disable, dedup_domain, ipc_domain, wait, "
       "overcommit)"},
      {a + "    guard: strict\n", "q.yaml:4:12: bad guard mode 'strict' in namespace 'a' (use off, canary or fault)"},
      {"version: 1\ndefault:\n  guard: yes\n",
       "q.yaml:3:10: bad guard mode 'yes' in 'default' (use off, canary or fault)"},
      {ns + "  - limit: 8GiB\n", "q.yaml:3:5: a 'namespaces' entry needs 'name'"},
      {ns + "  - name: Research\n",
       "q.yaml:3:11: bad namespace name 'Research': use a DNS label (a-z, 0-9 and '-', at most 63, not starting "
       "or ending with '-')"},
      {ns + "  - name: " + std::string(64, 'a') + "\n",
       "q.yaml:3:11: bad namespace name '" + std::string(64, 'a') +
           "': use a DNS label (a-z, 0-9 and '-', at most 63, not starting or ending with '-')"},
      {ns + "  - name: ml-\n",
       "q.yaml:3:11: bad namespace name 'ml-': use a DNS label (a-z, 0-9 and '-', at most 63, not starting or "
       "ending with '-')"},
      {a + "  - name: a\n", "q.yaml:4:11: duplicate namespace 'a' (first at line 3)"},
      {a + "    limit: 8GB\n",
       "q.yaml:4:12: bad limit \"8GB\": decimal units are ambiguous; write 8GiB (8589934592 bytes)"},
      {a + "    limit: 150%\n", "q.yaml:4:12: bad limit \"150%\": percentage over 100"},
      {a + "    limit: [1]\n", "q.yaml:4:12: 'limit' in namespace 'a' must be a size"},
      {a + "    guaranteed: 0\n", "q.yaml:4:17: bad guaranteed \"0\": must be greater than zero"},
      {a + "    pod_limit: -1GiB\n", "q.yaml:4:16: bad pod_limit \"-1GiB\": a size cannot be negative"},
      {a + "    limit: 8GiB\n    guaranteed: 16GiB\n",
       "q.yaml:5:17: guaranteed 16GiB is more than the limit 8GiB of namespace 'a'"},
      {a + "    limit: 40%\n    guaranteed: 50%\n",
       "q.yaml:5:17: guaranteed 50% is more than the limit 40% of namespace 'a'"},
      {a + "    guaranteed: 60%\n  - name: b\n    guaranteed: 40.5%\n",
       "q.yaml:6:17: guarantees add up to 100.5% of the GPU (more than 100%)"},
      {a + "    priority: high\n", "q.yaml:4:15: bad priority 'high': expected an integer"},
      {a + "    priority: 99999999\n", "q.yaml:4:15: bad priority '99999999': must be within -1000000..1000000"},
      {a + "    users: alice\n", "q.yaml:4:12: 'users' in namespace 'a' must be a list"},
      {a + "    users: [{uid: 1}]\n", "q.yaml:4:13: a user in namespace 'a' must be a name or a uid"},
      {a + "    users: [no-such-user-vlake]\n", "q.yaml:4:13: unknown user 'no-such-user-vlake'"},
      {a + "    groups: [no-such-group-vlake]\n", "q.yaml:4:14: unknown group 'no-such-group-vlake'"},
      {a + "    users: [1002, 1002]\n", "q.yaml:4:19: duplicate user '1002' (uid 1002) in namespace 'a'"},
      {a + "    users: [1002]\n  - name: b\n    users: [1002]\n",
       "q.yaml:6:13: user '1002' (uid 1002) is already in namespace 'a' (line 4)"},
      {a + "    groups: [daemon]\n  - name: b\n    groups: [1]\n",
       "q.yaml:6:14: group '1' (gid 1) is already in namespace 'a' (line 4)"},
      {"version: 1\nusers:\n  - uid: 5\n    namespace: nope\n",
       "q.yaml:4:16: unknown namespace 'nope' (not in 'namespaces')"},
      {a + "    users: [5]\n  - name: b\nusers:\n  - uid: 5\n    namespace: b\n",
       "q.yaml:8:16: user '5' is listed in namespace 'a' (line 4), not 'b'"},
      {"version: 1\nusers:\n  - uid: 5\n    ns: a\n",
       "q.yaml:4:5: unknown key 'ns' in a 'users' entry (allowed: uid, name, limit, namespace, guard)"},
      {"version: 1\ngroups:\n  - gid: 5\n",
       "q.yaml:3:5: missing 'limit' in a 'groups' entry (give 'limit', 'namespace' or 'guard')"},
      {"version: 1\ndefault:\n  guaranteed: 1GiB\n",
       "q.yaml:3:3: unknown key 'guaranteed' in 'default' (allowed: limit, guard, dedup, enforce, kill_grace, "
       "allow_disable, dedup_domain, wait, overcommit)"},
      {"version: 1\ndefault: {}\n", "q.yaml:2:10: missing 'limit' in 'default'"},
      {"version: 1\nnamespace:\n  - name: a\n",
       "q.yaml:2:1: unknown key 'namespace' in the top level (allowed: version, default, namespaces, users, groups)"},
      {"version: 1\nusers:\n  - uid: 7\n    limit: 1GiB\n  - uid: 7\n    limit: 1GiB\n",
       "q.yaml:5:10: duplicate uid 7 in 'users'"},
  };
  REQUIRE(cases.size() >= 25);
  for (const Case& c : cases) {
    INFO(c.text);
    try {
      (void)QuotaConfig::parse(c.text, "q.yaml");
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()) == c.expect);
    }
  }
}

TEST_CASE("model: guarantees are checked against a GPU's size", "[quota][model]") {
  struct Case {
    std::string text;
    Bytes gpu;
    std::string expect;  // "" = valid
  };
  const std::string a = "version: 1\nnamespaces:\n  - name: a\n";
  const std::vector<Case> cases = {
      {a + "    guaranteed: 600MiB\n  - name: b\n    guaranteed: 600MiB\n", 1_GiB,
       "g.yaml:6:17: guarantees add up to 1200MiB, more than the GPU's 1GiB"},
      {a + "    guaranteed: 600MiB\n  - name: b\n    guaranteed: 600MiB\n", 2_GiB, ""},
      {a + "    limit: 50%\n    guaranteed: 600MiB\n", 1_GiB,
       "g.yaml:5:17: guaranteed 600MiB is more than the limit 50% of namespace 'a' on a GPU of 1GiB "
       "(600MiB > 512MiB)"},
      {a + "    limit: 50%\n    guaranteed: 600MiB\n", 2_GiB, ""},
      {a + "    guaranteed: 60%\n  - name: b\n    guaranteed: 500MiB\n", 1_GiB,
       "g.yaml:6:17: guarantees add up to 1168533094 bytes (1.1GiB), more than the GPU's 1GiB"},
      {a + "    guaranteed: 100%\n", 1_GiB, ""},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    const QuotaConfig cfg = QuotaConfig::parse(c.text, "g.yaml");  // valid without a GPU size
    if (c.expect.empty()) {
      CHECK_NOTHROW(cfg.check_device(c.gpu));
      continue;
    }
    try {
      cfg.check_device(c.gpu);
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()) == c.expect);
    }
  }
}

TEST_CASE("model: check_file is what `vlakectl quota check` runs", "[quota][model]") {
  const std::string good = temp_file(kExample);
  CHECK(vlake::quota::check_file(good).empty());
  CHECK(vlake::quota::check_file(good, 80_GiB).empty());
  auto errors = vlake::quota::check_file(good, 8_GiB);  // research's 16GiB > 60% of 8 GiB
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].line() == 7);
  CHECK(errors[0].column() == 17);
  CHECK_THAT(errors[0].what(), Catch::StartsWith(good + ":7:17: guaranteed 16GiB is more than the limit 60%"));

  const std::string bad = temp_file("version: 1\nnamespaces:\n  - name: a\n    limit: 8GB\n");
  errors = vlake::quota::check_file(bad);
  REQUIRE(errors.size() == 1);
  CHECK(std::string(errors[0].what()) ==
        bad + ":4:12: bad limit \"8GB\": decimal units are ambiguous; write 8GiB (8589934592 bytes)");
  ::unlink(good.c_str());
  ::unlink(bad.c_str());
  errors = vlake::quota::check_file(bad);
  REQUIRE(errors.size() == 1);
  CHECK(std::string(errors[0].what()) == bad + ":0:0: cannot read the file");
}

TEST_CASE("model: a Kubernetes allocation's tenant is resolved like any other", "[quota][model]") {
  const QuotaConfig cfg = QuotaConfig::parse(R"(version: 1
default: {limit: 8GiB, guard: fault, dedup: transparent}
namespaces:
  - {name: team, pod_limit: 4GiB, guard: canary, dedup: off}
  - {name: open}
)",
                                             "k8s.yaml");
  using vlake::quota::DedupMode;
  using vlake::quota::GuardMode;
  // A configured namespace: the allocation's bytes, capped by pod_limit; its guard and dedup.
  auto t = cfg.resolve_allocation("pod:team/a/main", "team", 6_GiB, 80_GiB);
  CHECK(t.name == "pod:team/a/main");
  CHECK(t.ns == "team");
  CHECK(t.limit == Limit::bytes(4_GiB));
  CHECK(t.guard == GuardMode::canary);
  CHECK(t.dedup == DedupMode::off);
  CHECK(cfg.resolve_allocation("pod:team/b/main", "team", 2_GiB, 80_GiB).limit == Limit::bytes(2_GiB));
  // No pod_limit: the allocation's bytes; the top-level defaults for guard and dedup.
  t = cfg.resolve_allocation("pod:open/c/main", "open", 6_GiB, 80_GiB);
  CHECK(t.limit == Limit::bytes(6_GiB));
  CHECK(t.guard == GuardMode::fault);
  CHECK(t.dedup == DedupMode::transparent);
  // A namespace the file does not know: the default namespace (no owner yet, too).
  t = cfg.resolve_allocation("alloc:0123456789abcdef", "elsewhere", 6_GiB, 80_GiB);
  CHECK(t.ns == "default");
  CHECK(t.limit == Limit::bytes(6_GiB));
}
