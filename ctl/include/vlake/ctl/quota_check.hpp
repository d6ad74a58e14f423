// vlake::ctl quota check — `vlakectl quota check FILE`: validates a quota file exactly as vlaked
// does at start-up (quota::QuotaConfig::load) and summarizes it.
//
// Contract: check_quota_file() never throws for a bad or unreadable file: the result lists the
// errors (today QuotaConfig stops at the first one, so there is at most one; the list is ready
// for a checker that reports several). The summary lists, in file order, every top-level
// section that is a list or map with its entry count, so new sections (namespaces, pods) show
// up without a change here. Thread-safe (no shared state; reads the file and the user/group
// databases).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::ctl {

struct QuotaIssue {
  std::string file;
  int line = 0;  // 1-based; 0 when no position applies
  int column = 0;
  std::string message;                     // without the "file:line:col: " prefix
  [[nodiscard]] std::string text() const;  // "file:line:col: message"
};

struct QuotaCheckResult {
  std::string file;
  bool ok = false;
  std::vector<QuotaIssue> errors;
  // Only when ok:
  std::string version;        // as written
  std::string default_limit;  // "8GiB", "100%" (built-in when the file has no `default`)
  std::vector<std::pair<std::string, std::uint64_t>> sections;  // e.g. {"users", 2}
};

// Runs vlaked's own validation (quota::check_file); with `gpu_memory`, also checks that the
// guarantees fit a GPU of that size.
QuotaCheckResult check_quota_file(const std::string& path, std::optional<Bytes> gpu_memory = std::nullopt);
// The same for a file's text (`vlakectl quota check -`: standard input); `name` is what the
// messages call it ("<stdin>").
QuotaCheckResult check_quota_text(const std::string& text, const std::string& name,
                                  std::optional<Bytes> gpu_memory = std::nullopt);
std::string render_quota_text(const QuotaCheckResult& r);  // "FILE: ok" + summary, or errors
std::string render_quota_json(const QuotaCheckResult& r);
// `vlakectl quota grammar`: the quota file's keys (vlake/quota/grammar.hpp) as JSON: {"version":
// 1, "sections": {NAME: [{"key", "kind", "choices"?, "section"?}, ...]}, "example": TEXT} (the
// chart's schema test reads it), or as text, one section per line.
std::string render_grammar_json();
std::string render_grammar_text();

}  // namespace vlake::ctl
