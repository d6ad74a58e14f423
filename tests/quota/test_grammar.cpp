// The quota grammar (vlake/quota/grammar.hpp): the parser accepts exactly its keys, and its
// example document uses every key of every section and is a valid quota file.
#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include "vlake/quota/grammar.hpp"
#include "vlake/quota/quota_config.hpp"

namespace grammar = vlake::quota::grammar;
using vlake::quota::ConfigError;
using vlake::quota::QuotaConfig;

namespace {

// The keys a mapping of the example holds, section by section (every entry of a list counted).
void collect(const YAML::Node& map, std::string_view section, std::map<std::string, std::set<std::string>>& seen) {
  for (const auto& kv : map) {
    const std::string k = kv.first.as<std::string>();
    seen[std::string(section)].insert(k);
    for (const grammar::Key& key : grammar::keys_of(section)) {
      if (key.name != k) continue;
      if (key.kind == grammar::Kind::mapping) collect(kv.second, key.section, seen);
      if (key.kind == grammar::Kind::list) {
        for (const YAML::Node& entry : kv.second) collect(entry, key.section, seen);
      }
    }
  }
}

}  // namespace

TEST_CASE("grammar: the example document uses every key of every section and is a valid quota file",
          "[quota][grammar]") {
  const std::string text(grammar::example_document());
  REQUIRE_NOTHROW(QuotaConfig::parse(text, "example.yaml"));
  std::map<std::string, std::set<std::string>> seen;
  collect(YAML::Load(text), "top", seen);
  for (const grammar::Section& s : grammar::kSections) {
    for (const grammar::Key& k : s.keys) {
      INFO("section " << s.name << ", key " << k.name);
      CHECK(seen[std::string(s.name)].count(std::string(k.name)) == 1);
    }
  }
}

TEST_CASE("grammar: every section's key is accepted where it belongs and refused elsewhere, naming the grammar's list",
          "[quota][grammar]") {
  // ipc_domain belongs to namespaces only; the refusal lists the default section's keys in order.
  try {
    (void)QuotaConfig::parse("version: 1\ndefault: {limit: 1GiB, ipc_domain: x}\n", "q.yaml");
    FAIL("ipc_domain accepted in default");
  } catch (const ConfigError& e) {
    std::string list;
    for (const grammar::Key& k : grammar::keys_of("default")) list += (list.empty() ? "" : ", ") + std::string(k.name);
    CHECK(std::string(e.what()).find("unknown key 'ipc_domain' in 'default' (allowed: " + list + ")") !=
          std::string::npos);
  }
  // Choices are the parser's words.
  for (std::string_view mode : grammar::kEnforceModes) {
    CHECK_NOTHROW(QuotaConfig::parse("version: 1\ndefault: {enforce: " + std::string(mode) + "}\n", "q.yaml"));
  }
  for (std::string_view mode : grammar::kDedupModes) {
    CHECK_NOTHROW(QuotaConfig::parse("version: 1\ndefault: {dedup: " + std::string(mode) + "}\n", "q.yaml"));
  }
  for (std::string_view mode : grammar::kGuardModes) {
    CHECK_NOTHROW(QuotaConfig::parse("version: 1\ndefault: {guard: " + std::string(mode) + "}\n", "q.yaml"));
  }
  CHECK_THROWS_AS(QuotaConfig::parse("version: 1\ndefault: {enforce: maybe}\n", "q.yaml"), ConfigError);
}
