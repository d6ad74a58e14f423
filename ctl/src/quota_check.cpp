#include "vlake/ctl/quota_check.hpp"

#include <yaml-cpp/yaml.h>

#include "vlake/ctl/json.hpp"
#include "vlake/quota/grammar.hpp"
#include "vlake/quota/quota_config.hpp"

namespace vlake::ctl {

std::string QuotaIssue::text() const {
  return file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message;
}

namespace {

QuotaIssue issue_from(const std::string& path, const quota::ConfigError& e) {
  QuotaIssue i;
  i.file = path;
  i.line = e.line();
  i.column = e.column();
  const std::string what = e.what();
  const std::string pre = path + ":" + std::to_string(e.line()) + ":" + std::to_string(e.column()) + ": ";
  i.message = what.rfind(pre, 0) == 0 ? what.substr(pre.size()) : what;
  return i;
}

void summarize_node(const YAML::Node& root, QuotaCheckResult& r) {
  try {
    if (!root.IsMap()) return;
    for (const auto& kv : root) {
      const std::string k = kv.first.as<std::string>("?");
      if (k == "version" && kv.second.IsScalar()) {
        r.version = kv.second.Scalar();
      } else if (kv.second.IsSequence() || (kv.second.IsMap() && k != "default")) {
        r.sections.emplace_back(k, kv.second.size());
      }
    }
  } catch (const std::exception&) {
    // The summary is best effort.
  }
}

void summarize(const std::string& path, QuotaCheckResult& r) {
  try {
    summarize_node(YAML::LoadFile(path), r);
  } catch (const std::exception&) {
    // The file changed after validation.
  }
}

}  // namespace

QuotaCheckResult check_quota_file(const std::string& path, std::optional<Bytes> gpu_memory) {
  QuotaCheckResult r;
  r.file = path;
  for (const quota::ConfigError& e : quota::check_file(path, gpu_memory)) r.errors.push_back(issue_from(path, e));
  r.ok = r.errors.empty();
  if (r.ok) {
    try {
      r.default_limit = quota::QuotaConfig::load(path).default_limit().to_string();
    } catch (const std::exception& e) {  // the file changed since it was checked
      r.ok = false;
      r.errors.push_back(QuotaIssue{path, 0, 0, e.what()});
    }
  }
  if (r.ok) summarize(path, r);
  return r;
}

QuotaCheckResult check_quota_text(const std::string& text, const std::string& name, std::optional<Bytes> gpu_memory) {
  QuotaCheckResult r;
  r.file = name;
  try {
    const quota::QuotaConfig cfg = quota::QuotaConfig::parse(text, name);
    if (gpu_memory) cfg.check_device(*gpu_memory);
    r.default_limit = cfg.default_limit().to_string();
    r.ok = true;
  } catch (const quota::ConfigError& e) {
    r.errors.push_back(issue_from(name, e));
  } catch (const std::exception& e) {
    r.errors.push_back(QuotaIssue{name, 0, 0, e.what()});
  }
  if (r.ok) summarize_node(YAML::Load(text), r);
  return r;
}

std::string render_quota_text(const QuotaCheckResult& r) {
  if (!r.ok) {
    std::string out;
    for (const auto& e : r.errors) out += e.text() + "\n";
    return out;
  }
  std::string out = r.file + ": ok\n";
  if (!r.version.empty()) out += "  version: " + r.version + "\n";
  out += "  default limit: " + r.default_limit + " per GPU (each unlisted uid is its own tenant)\n";
  for (const auto& [name, n] : r.sections) {
    out += "  " + name + ": " + std::to_string(n) + (n == 1 ? " entry" : " entries") + "\n";
  }
  return out;
}

std::string render_quota_json(const QuotaCheckResult& r) {
  JsonWriter j;
  j.begin_object();
  j.field("file", r.file);
  j.field_bool("ok", r.ok);
  j.key("errors").begin_array();
  for (const auto& e : r.errors) {
    j.begin_object();
    j.field("file", e.file);
    j.key("line").sint(e.line);
    j.key("column").sint(e.column);
    j.field("message", e.message);
    j.field("text", e.text());
    j.end_object();
  }
  j.end_array();
  j.key("summary");
  if (!r.ok) {
    j.null();
  } else {
    j.begin_object();
    j.field("version", r.version);
    j.field("default_limit", r.default_limit);
    j.key("sections").begin_object();
    for (const auto& [name, n] : r.sections) j.field_uint(name, n);
    j.end_object();
    j.end_object();
  }
  j.end_object();
  return j.str();
}

std::string render_grammar_json() {
  namespace g = quota::grammar;
  JsonWriter w;
  w.begin_object().field_uint("version", 1).key("sections").begin_object();
  for (const g::Section& s : g::kSections) {
    w.key(s.name).begin_array();
    for (const g::Key& k : s.keys) {
      w.begin_object().field("key", k.name).field("kind", g::kind_name(k.kind));
      if (!k.choices.empty()) {
        w.key("choices").begin_array();
        for (std::string_view c : k.choices) w.string(c);
        w.end_array();
      }
      if (!k.section.empty()) w.field("section", k.section);
      w.end_object();
    }
    w.end_array();
  }
  w.end_object().field("example", g::example_document()).end_object();
  return w.str();
}

std::string render_grammar_text() {
  namespace g = quota::grammar;
  std::string out;
  for (const g::Section& s : g::kSections) {
    out += std::string(s.name) + ":";
    for (const g::Key& k : s.keys) {
      out += " " + std::string(k.name) + " (" + std::string(g::kind_name(k.kind));
      for (std::size_t i = 0; i < k.choices.size(); ++i) out += (i == 0 ? ": " : "|") + std::string(k.choices[i]);
      out += ")";
    }
    out += "\n";
  }
  return out;
}

}  // namespace vlake::ctl
