// vlake::quota grammar — the keys of the quota file (docs/quota.md), written once.
//
// What it is
//   For each mapping of the file (the top level, `default`, a `namespaces` entry, a `users`
//   entry, a `groups` entry) the keys it may hold, each with the kind of value it takes and, for
//   a choice, its words. The parser (quota_config.cpp) accepts exactly these keys and reports
//   the others with this list; `vlakectl quota grammar` prints it as JSON with example_document(),
//   and the chart's values schema is checked against that print (tests/charts, charts.grammar),
//   so that every key vlaked reads can be set through Helm values.
// Contract: constant data, no allocation; thread-safe. example_document() is a quota file that
//   uses every key of every section and passes the parser (tests/quota checks both).
#pragma once

#include <array>
#include <span>
#include <string_view>

namespace vlake::quota::grammar {

enum class Kind {
  version,   // the file's version: 1
  size,      // vlake's size grammar, or a percentage of the GPU (limit, guaranteed, pod_limit)
  duration,  // vlake's duration grammar (kill_grace)
  wait,      // a duration of at most 10m (wait)
  flag,      // true or false
  choice,    // one of `choices`
  domain,    // a DNS label (a namespace name, a dedup or IPC trust domain)
  priority,  // an integer in [-1000000, 1000000]
  id,        // a uid or gid: a non-negative integer
  name,      // a user or group name known to the node
  members,   // a list of user (or group) names or ids
  mapping,   // a mapping: one of the sections below
  list,      // a list of mappings: one of the sections below
};

struct Key {
  std::string_view name;
  Kind kind;
  std::span<const std::string_view> choices = {};
  std::string_view section = {};  // mapping, list: the section of its value(s)
};

struct Section {
  std::string_view name;
  std::span<const Key> keys;
};

inline constexpr std::array<std::string_view, 3> kGuardModes = {"off", "canary", "fault"};
inline constexpr std::array<std::string_view, 2> kDedupModes = {"off", "transparent"};
inline constexpr std::array<std::string_view, 3> kEnforceModes = {"account", "refuse", "kill"};

inline constexpr std::array kTopKeys = {
    Key{"version", Kind::version},
    Key{"default", Kind::mapping, {}, "default"},
    Key{"namespaces", Kind::list, {}, "namespace"},
    Key{"users", Kind::list, {}, "user"},
    Key{"groups", Kind::list, {}, "group"},
};
// Keys several sections take, each defined once.
inline constexpr Key kLimit{"limit", Kind::size};
inline constexpr Key kGuard{"guard", Kind::choice, kGuardModes};
inline constexpr Key kDedup{"dedup", Kind::choice, kDedupModes};
inline constexpr Key kEnforce{"enforce", Kind::choice, kEnforceModes};
inline constexpr Key kKillGrace{"kill_grace", Kind::duration};
inline constexpr Key kAllowDisable{"allow_disable", Kind::flag};
inline constexpr Key kDedupDomain{"dedup_domain", Kind::domain};
inline constexpr Key kWait{"wait", Kind::wait};
inline constexpr Key kOvercommit{"overcommit", Kind::flag};
inline constexpr Key kEntryName{"name", Kind::name};
inline constexpr Key kEntryNamespace{"namespace", Kind::domain};

// In the order the parser's messages list them.
inline constexpr std::array kDefaultKeys = {kLimit,        kGuard,       kDedup, kEnforce,   kKillGrace,
                                            kAllowDisable, kDedupDomain, kWait,  kOvercommit};
inline constexpr std::array kNamespaceKeys = {Key{"name", Kind::domain},
                                              kLimit,
                                              Key{"guaranteed", Kind::size},
                                              Key{"priority", Kind::priority},
                                              Key{"pod_limit", Kind::size},
                                              Key{"users", Kind::members},
                                              Key{"groups", Kind::members},
                                              kGuard,
                                              kDedup,
                                              kEnforce,
                                              kKillGrace,
                                              kAllowDisable,
                                              kDedupDomain,
                                              Key{"ipc_domain", Kind::domain},
                                              kWait,
                                              kOvercommit};
// A users entry has `uid` or `name`, a groups entry `gid` or `name` (not both).
inline constexpr std::array kUserKeys = {Key{"uid", Kind::id}, kEntryName, kLimit, kEntryNamespace, kGuard};
inline constexpr std::array kGroupKeys = {Key{"gid", Kind::id}, kEntryName, kLimit, kEntryNamespace, kGuard};

inline constexpr std::array kSections = {
    Section{"top", kTopKeys},   Section{"default", kDefaultKeys}, Section{"namespace", kNamespaceKeys},
    Section{"user", kUserKeys}, Section{"group", kGroupKeys},
};

// The section named `name` (empty keys when there is none).
constexpr std::span<const Key> keys_of(std::string_view name) noexcept {
  for (const Section& s : kSections) {
    if (s.name == name) return s.keys;
  }
  return {};
}

// A word for a kind (the JSON of `vlakectl quota grammar`).
constexpr std::string_view kind_name(Kind k) noexcept {
  switch (k) {
    case Kind::version: return "version";
    case Kind::size: return "size";
    case Kind::duration: return "duration";
    case Kind::wait: return "wait";
    case Kind::flag: return "flag";
    case Kind::choice: return "choice";
    case Kind::domain: return "domain";
    case Kind::priority: return "priority";
    case Kind::id: return "id";
    case Kind::name: return "name";
    case Kind::members: return "members";
    case Kind::mapping: return "mapping";
    case Kind::list: return "list";
  }
  return "?";
}

// A quota file that uses every key of every section (user and group names: root, which every
// node has).
constexpr std::string_view example_document() noexcept {
  return "version: 1\n"
         "default:\n"
         "  limit: 8GiB\n"
         "  guard: off\n"
         "  dedup: off\n"
         "  enforce: kill\n"
         "  kill_grace: 30s\n"
         "  allow_disable: false\n"
         "  dedup_domain: shared\n"
         "  wait: 0\n"
         "  overcommit: false\n"
         "namespaces:\n"
         "  - name: research\n"
         "    limit: 60%\n"
         "    guaranteed: 16GiB\n"
         "    priority: 10\n"
         "    pod_limit: 8GiB\n"
         "    users: [1002]\n"
         "    groups: [2002]\n"
         "    guard: canary\n"
         "    dedup: transparent\n"
         "    enforce: refuse\n"
         "    kill_grace: 1m\n"
         "    allow_disable: true\n"
         "    dedup_domain: research\n"
         "    ipc_domain: research\n"
         "    wait: 2m\n"
         "    overcommit: true\n"
         "users:\n"
         "  - {uid: 1000, limit: 4GiB, namespace: research, guard: fault}\n"
         "  - {name: root, limit: 50%}\n"
         "groups:\n"
         "  - {gid: 2000, limit: 16GiB, namespace: research, guard: off}\n"
         "  - {name: root, limit: 16GiB}\n";
}

}  // namespace vlake::quota::grammar
