#include "vlake/quota/quota_config.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include "vlake/common/duration.hpp"
#include "vlake/common/excerpt.hpp"
#include "vlake/common/size.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/quota/grammar.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

namespace vlake::quota {

namespace {

std::string trim(const std::string& s) {
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])) != 0) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])) != 0) --e;
  return s.substr(b, e - b);
}

std::string format_position(const std::string& file, int line, int column, const std::string& what) {
  return file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + what;
}

}  // namespace

const char* dedup_mode_name(DedupMode m) noexcept { return m == DedupMode::transparent ? "transparent" : "off"; }

const char* guard_mode_name(GuardMode m) noexcept {
  switch (m) {
    case GuardMode::off: return "off";
    case GuardMode::canary: return "canary";
    case GuardMode::fault: return "fault";
  }
  return "unknown";
}

const char* enforce_name(Enforce e) noexcept {
  switch (e) {
    case Enforce::account: return "account";
    case Enforce::refuse: return "refuse";
    case Enforce::kill: return "kill";
  }
  return "unknown";
}

ConfigError::ConfigError(const std::string& file, int line, int column, const std::string& what)
    : std::runtime_error(format_position(file, line, column, what)), line_(line), column_(column) {}

Bytes Limit::on_device(Bytes total) const noexcept {
  if (!is_percent()) return bytes_;
  // total * ppm / 1e6 without overflow (ppm <= 1e6).
  const std::uint64_t t = total.value();
  return Bytes{t / 1'000'000u * ppm_ + t % 1'000'000u * ppm_ / 1'000'000u};
}

std::string Limit::to_string() const {
  if (is_percent()) {
    std::string s = std::to_string(ppm_ / 10'000);
    std::uint32_t frac = ppm_ % 10'000;
    if (frac != 0) {
      std::string f = std::to_string(frac);
      f.insert(0, 4 - f.size(), '0');
      while (!f.empty() && f.back() == '0') f.pop_back();
      s += "." + f;
    }
    return s + "%";
  }
  return vlake::format_size(bytes_);
}

Limit parse_limit(const std::string& text) {
  const SizeOrPercent s = parse_size_or_percent(text);
  if (s.percent ? s.ppm == 0 : s.bytes == Bytes{0}) throw SizeError(text, "must be greater than zero");
  return s.percent ? Limit::percent_ppm(s.ppm) : Limit::bytes(s.bytes);
}

std::string describe_size(Bytes b) {
  const std::string exact = vlake::format_size(b);
  if (b.value() < 1024 || exact[exact.size() - 2] == 'i') return exact;  // "…KiB" etc.
  // Not a whole number of any unit: bytes, and an approximation.
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b.value()) / 1024.0;
  int u = 0;
  while (u < 3 && v >= 1024.0) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return std::to_string(b.value()) + " bytes (" + buf + kUnits[u] + ")";
}

Bytes NamespaceSpec::limit_on(Bytes total) const noexcept {
  if (!limit) return total;
  return std::min(limit->on_device(total), total);
}

Bytes NamespaceSpec::guaranteed_on(Bytes total) const noexcept {
  return guaranteed ? guaranteed->on_device(total) : Bytes{0};
}

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
}

bool dns_label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

// Node helpers with positioned errors.
class Parser {
 public:
  explicit Parser(const std::string& name) : name_(name) {}

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& what) const {
    if (m.is_null()) throw ConfigError(name_, 0, 0, what);
    throw ConfigError(name_, m.line + 1, m.column + 1, what);
  }

  // Every key of map `node` must be one of section `section`'s (grammar.hpp).
  void check_keys(const YAML::Node& node, std::string_view section, const std::string& where) const {
    const std::span<const grammar::Key> allowed = grammar::keys_of(section);
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) fail(key.Mark(), "keys in " + where + " must be names");
      const std::string k = key.Scalar();
      const bool ok = std::any_of(allowed.begin(), allowed.end(), [&](const grammar::Key& a) { return k == a.name; });
      if (!ok) {
        std::string list;
        for (const grammar::Key& a : allowed) list += (list.empty() ? "" : ", ") + std::string(a.name);
        fail(key.Mark(), "unknown key '" + excerpt(k) + "' in " + where + " (allowed: " + list + ")");
      }
    }
  }

  // The size under `key` of `entry`, if present.
  std::optional<Limit> size(const YAML::Node& entry, const char* key, const std::string& where) const {
    const YAML::Node v = entry[key];
    if (!v) return std::nullopt;
    if (!v.IsScalar()) fail(v.Mark(), "'" + std::string(key) + "' in " + where + " must be a size");
    try {
      return parse_limit(v.Scalar());
    } catch (const SizeError& e) {
      fail(v.Mark(), "bad " + std::string(key) + " " + e.what());  // bad limit "8GB": decimal units …
    }
  }

  std::uint32_t id(const YAML::Node& v, const char* what) const {
    if (!v.IsScalar()) fail(v.Mark(), std::string(what) + " must be a number");
    const std::string s = trim(v.Scalar());
    if (s.size() > 10 || !all_digits(s)) {
      fail(v.Mark(), std::string("bad ") + what + " '" + excerpt(s) + "': expected a number 0..4294967294");
    }
    const std::uint64_t n = std::stoull(s);
    if (n >= 0xffffffffULL) fail(v.Mark(), std::string("bad ") + what + " '" + excerpt(s) + "': out of range");
    return static_cast<std::uint32_t>(n);
  }

  // A user (`group` false) or group named by name or number: its id.
  std::uint32_t principal(const YAML::Node& v, bool group, const std::string& where) const {
    const char* kind = group ? "group" : "user";
    if (!v.IsScalar() || trim(v.Scalar()).empty()) {
      fail(v.Mark(), std::string("a ") + kind + " in " + where + " must be a name or a " + (group ? "gid" : "uid"));
    }
    const std::string s = trim(v.Scalar());
    if (all_digits(s)) return id(v, group ? "gid" : "uid");
    std::vector<char> buf(16384);
    if (group) {
      struct group gr {};
      struct group* res = nullptr;
      while (::getgrnam_r(s.c_str(), &gr, buf.data(), buf.size(), &res) == ERANGE && buf.size() < (1u << 20)) {
        buf.resize(buf.size() * 4);
      }
      if (res == nullptr) fail(v.Mark(), "unknown group '" + excerpt(s) + "'");
      return gr.gr_gid;
    }
    passwd pw{};
    passwd* res = nullptr;
    while (::getpwnam_r(s.c_str(), &pw, buf.data(), buf.size(), &res) == ERANGE && buf.size() < (1u << 20)) {
      buf.resize(buf.size() * 4);
    }
    if (res == nullptr) fail(v.Mark(), "unknown user '" + excerpt(s) + "'");
    return pw.pw_uid;
  }

  std::int32_t priority(const YAML::Node& v) const {
    const std::string s = v.IsScalar() ? trim(v.Scalar()) : std::string("?");
    const bool neg = !s.empty() && s[0] == '-';
    const std::string digits = neg ? s.substr(1) : s;
    if (!v.IsScalar() || digits.size() > 10 || !all_digits(digits)) {
      fail(v.Mark(), "bad priority '" + excerpt(s) + "': expected an integer");
    }
    const long long n = (neg ? -1 : 1) * std::stoll(digits);
    if (n < -1'000'000 || n > 1'000'000)
      fail(v.Mark(), "bad priority '" + excerpt(s) + "': must be within -1000000..1000000");
    return static_cast<std::int32_t>(n);
  }

  // The value named under `key` of `entry`, one of `names`, if present; else "bad <what> '<text>'
  // in <where> (use a, b or c)".
  template <class T>
  std::optional<T> choice(const YAML::Node& entry, const char* key, const std::string& what, const std::string& where,
                          std::initializer_list<std::pair<const char*, T>> names) const {
    const YAML::Node v = entry[key];
    if (!v) return std::nullopt;
    const std::string s = v.IsScalar() ? trim(v.Scalar()) : std::string("?");
    std::string use;
    std::size_t i = 0;
    for (const auto& [name, value] : names) {
      if (v.IsScalar() && s == name) return value;
      use += std::string(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + name;
      ++i;
    }
    fail(v.Mark(), "bad " + what + " '" + excerpt(s) + "' in " + where + " (use " + use + ")");
  }

  // The guard mode under `guard` of `entry`, if present.
  std::optional<GuardMode> guard(const YAML::Node& entry, const std::string& where) const {
    return choice<GuardMode>(entry, "guard", "guard mode", where,
                             {{"off", GuardMode::off}, {"canary", GuardMode::canary}, {"fault", GuardMode::fault}});
  }

  // The dedup mode under `dedup` of `entry`, if present.
  std::optional<DedupMode> dedup(const YAML::Node& entry, const std::string& where) const {
    return choice<DedupMode>(entry, "dedup", "dedup mode", where,
                             {{"off", DedupMode::off}, {"transparent", DedupMode::transparent}});
  }

  // No mapping anywhere in the document has the same key twice (YAML forbids it; yaml-cpp
  // keeps both and a lookup would silently take one). Iterative, with a visit budget: aliases
  // may make a small document a very wide tree.
  void check_duplicate_keys(const YAML::Node& root) const {
    constexpr std::size_t kMaxVisits = 1'000'000;
    std::vector<YAML::Node> stack{root};
    std::size_t visits = 0;
    while (!stack.empty()) {
      const YAML::Node n = stack.back();
      stack.pop_back();
      if (++visits > kMaxVisits) {
        fail(n.Mark(), "the document expands to more than " + std::to_string(kMaxVisits) +
                           " nodes (aliases?); a quota file is a few mappings and lists");
      }
      if (n.IsSequence()) {
        for (const YAML::Node& item : n) stack.push_back(item);
      } else if (n.IsMap()) {
        std::map<std::string, YAML::Mark> seen;
        for (auto it = n.begin(); it != n.end(); ++it) {
          const YAML::Node key = it->first;
          if (key.IsScalar()) {
            const auto [at, inserted] = seen.emplace(key.Scalar(), key.Mark());
            if (!inserted) {
              fail(key.Mark(), "duplicate key '" + excerpt(key.Scalar()) + "' (first at line " +
                                   std::to_string(line(at->second)) + ", column " + std::to_string(column(at->second)) +
                                   ")");
            }
          } else {
            stack.push_back(key);
          }
          stack.push_back(it->second);
        }
      }
    }
  }

  // The policy for memory outside vlake under `enforce` of `entry`, if present.
  std::optional<Enforce> enforce(const YAML::Node& entry, const std::string& where) const {
    return choice<Enforce>(entry, "enforce", "enforce mode", where,
                           {{"account", Enforce::account}, {"refuse", Enforce::refuse}, {"kill", Enforce::kill}});
  }

  // The duration under `key` of `entry` (vlake/common/duration.hpp), at most `max`, if present.
  std::optional<std::chrono::milliseconds> duration(const YAML::Node& entry, const char* key, const std::string& where,
                                                    std::chrono::milliseconds max) const {
    const YAML::Node v = entry[key];
    if (!v) return std::nullopt;
    if (!v.IsScalar()) fail(v.Mark(), "'" + std::string(key) + "' in " + where + " must be a duration (e.g. 30s)");
    try {
      return vlake::parse_duration(v.Scalar(), std::chrono::milliseconds(0), max);
    } catch (const DurationError& e) {
      fail(v.Mark(), "bad " + std::string(key) + " " + e.what() + " in " + where);  // bad wait "30": … unit
    }
  }
  std::optional<std::chrono::milliseconds> kill_grace(const YAML::Node& entry, const std::string& where) const {
    return duration(entry, "kill_grace", where, std::chrono::milliseconds::max());
  }
  // `wait`: at most 10 minutes (kMaxWait).
  std::optional<std::chrono::milliseconds> wait(const YAML::Node& entry, const std::string& where) const {
    return duration(entry, "wait", where, kMaxWait);
  }

  // The boolean `key` of `entry` (allow_disable, overcommit), if present.
  std::optional<bool> flag(const YAML::Node& entry, const char* key, const std::string& where) const {
    return choice<bool>(entry, key, key, where, {{"true", true}, {"false", false}});
  }

  // The dedup trust domain under `dedup_domain` of `entry`, if present (a DNS label).
  std::optional<std::string> dedup_domain(const YAML::Node& entry, const std::string& where) const {
    return domain(entry, "dedup_domain", where);
  }
  // A trust domain under `key` of `entry` (dedup_domain, ipc_domain), if present (a DNS label).
  std::optional<std::string> domain(const YAML::Node& entry, const char* key, const std::string& where) const {
    const YAML::Node v = entry[key];
    if (!v) return std::nullopt;
    const std::string s = v.IsScalar() ? trim(v.Scalar()) : std::string("?");
    if (!v.IsScalar() || !dns_label(s)) {
      fail(v.Mark(), "bad " + std::string(key) + " '" + s + "' in " + where +
                         " (use a DNS label: a-z, 0-9 and '-', at most 63, not starting or ending with '-')");
    }
    return s;
  }

  static int line(const YAML::Mark& m) { return m.is_null() ? 0 : m.line + 1; }
  static int column(const YAML::Mark& m) { return m.is_null() ? 0 : m.column + 1; }

 private:
  std::string name_;
};

// Both absolute or both percentages: is a > b? nullopt when they cannot be compared without a
// GPU size.
std::optional<bool> greater(const Limit& a, const Limit& b) {
  if (a.is_percent() != b.is_percent()) return std::nullopt;
  if (a.is_percent()) return a.ppm() > b.ppm();
  return a.absolute() > b.absolute();
}

// A member listed in a namespace's users/groups list.
struct Listed {
  std::uint32_t id;
  std::string label;
  std::size_t ns;
  int line;
};

}  // namespace

QuotaConfig::QuotaConfig() : default_(Limit::percent_ppm(1'000'000)) {
  NamespaceSpec d;
  d.name = kDefaultNamespace;
  d.declared = false;
  namespaces_.push_back(d);
}

std::size_t QuotaConfig::default_index() const noexcept {
  for (std::size_t i = 0; i < namespaces_.size(); ++i) {
    if (namespaces_[i].name == kDefaultNamespace) return i;
  }
  return 0;  // unreachable: the constructor and parse() always add it
}

const NamespaceSpec* QuotaConfig::find_namespace(const std::string& name) const noexcept {
  for (const NamespaceSpec& n : namespaces_) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

FileRead read_file(const std::string& path, std::size_t max_bytes) {
  FileRead r;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    r.status = (err == ENOENT || err == ENOTDIR) ? FileRead::Status::missing : FileRead::Status::rejected;
    r.error = std::string("cannot open the file: ") + std::strerror(err);
    return r;
  }
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0) {
    r.status = FileRead::Status::rejected;
    r.error = std::string("cannot stat the file: ") + std::strerror(errno);
    return r;
  }
  r.dev = static_cast<std::uint64_t>(sb.st_dev);
  r.ino = static_cast<std::uint64_t>(sb.st_ino);
  r.mtime_ns = static_cast<std::int64_t>(sb.st_mtim.tv_sec) * 1'000'000'000LL + sb.st_mtim.tv_nsec;
  r.size = static_cast<std::int64_t>(sb.st_size);
  r.type = static_cast<std::uint32_t>(sb.st_mode & S_IFMT);
  r.status = FileRead::Status::rejected;
  if (!S_ISREG(sb.st_mode)) {
    const char* kind = S_ISFIFO(sb.st_mode)   ? "a FIFO"
                       : S_ISCHR(sb.st_mode)  ? "a character device"
                       : S_ISBLK(sb.st_mode)  ? "a block device"
                       : S_ISDIR(sb.st_mode)  ? "a directory"
                       : S_ISSOCK(sb.st_mode) ? "a socket"
                                              : "not a file";
    r.error = std::string("not a regular file (") + kind +
              "); the quota file must be a regular file (a symlink to one is fine)";
    return r;
  }
  auto too_large = [&](const std::string& size) {
    r.error = "the file is " + size + " bytes, over the " + std::to_string(max_bytes) + "-byte (" +
              format_size(Bytes{max_bytes}) + ") limit for a quota file";
  };
  if (static_cast<std::uint64_t>(sb.st_size) > max_bytes) {
    too_large(std::to_string(sb.st_size));
    return r;
  }
  std::string data;
  data.resize(max_bytes + 1);
  std::size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.error = std::string("cannot read the file: ") + std::strerror(errno);
      return r;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes) {
    too_large("at least " + std::to_string(got));  // it grew while being read
    return r;
  }
  data.resize(got);
  r.text = std::move(data);
  r.status = FileRead::Status::ok;
  return r;
}

QuotaConfig QuotaConfig::load(const std::string& path) {
  FileRead r = read_file(path);
  if (r.status == FileRead::Status::missing) throw ConfigError(path, 0, 0, "cannot read the file");
  if (r.status != FileRead::Status::ok) throw ConfigError(path, 0, 0, r.error);
  return parse(r.text, path);
}

QuotaConfig QuotaConfig::parse(const std::string& text, const std::string& name) {
  Parser p(name);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    p.fail(e.mark, "YAML syntax: " + e.msg);
  }
  p.check_duplicate_keys(root);
  if (!root || root.IsNull()) throw ConfigError(name, 0, 0, "empty configuration (expected 'version: 1')");
  if (!root.IsMap()) p.fail(root.Mark(), "the configuration must be a mapping");
  p.check_keys(root, "top", "the top level");

  const YAML::Node version = root["version"];
  if (!version) p.fail(root.Mark(), "missing 'version' (expected 1)");
  if (!version.IsScalar() || trim(version.Scalar()) != "1") {
    p.fail(version.Mark(), "unsupported version '" +
                               (version.IsScalar() ? excerpt(version.Scalar()) : std::string("?")) +
                               "' (this vlake reads version 1)");
  }

  QuotaConfig cfg;
  cfg.file_ = name;
  cfg.namespaces_.clear();
  if (const YAML::Node def = root["default"]) {
    if (!def.IsMap()) p.fail(def.Mark(), "'default' must be a mapping with 'limit'");
    p.check_keys(def, "default", "'default'");
    const auto l = p.size(def, "limit", "'default'");
    cfg.default_guard_ = p.guard(def, "'default'");
    cfg.default_dedup_ = p.dedup(def, "'default'");
    cfg.default_enforce_ = p.enforce(def, "'default'");
    cfg.default_kill_grace_ = p.kill_grace(def, "'default'");
    cfg.default_wait_ = p.wait(def, "'default'");
    cfg.default_allow_disable_ = p.flag(def, "allow_disable", "'default'");
    cfg.default_overcommit_ = p.flag(def, "overcommit", "'default'");
    cfg.default_dedup_domain_ = p.dedup_domain(def, "'default'");
    if (!l && !cfg.default_guard_ && !cfg.default_dedup_ && !cfg.default_enforce_ && !cfg.default_kill_grace_ &&
        !cfg.default_allow_disable_ && !cfg.default_dedup_domain_ && !cfg.default_wait_ && !cfg.default_overcommit_) {
      p.fail(def.Mark(), "missing 'limit' in 'default'");
    }
    if (l) {
      cfg.default_ = *l;
      cfg.default_given_ = true;
    }
  }

  // Namespaces first: users and groups entries refer to them.
  std::vector<Listed> listed_users;
  std::vector<Listed> listed_groups;
  if (const YAML::Node nss = root["namespaces"]) {
    if (!nss.IsSequence()) p.fail(nss.Mark(), "'namespaces' must be a list");
    std::uint64_t percent_sum = 0;
    for (const YAML::Node& n : nss) {
      if (!n.IsMap()) p.fail(n.Mark(), "a 'namespaces' entry must be a mapping (name, limit, guaranteed, ...)");
      p.check_keys(n, "namespace", "a 'namespaces' entry");
      const YAML::Node nm = n["name"];
      if (!nm) p.fail(n.Mark(), "a 'namespaces' entry needs 'name'");
      if (!nm.IsScalar() || !dns_label(nm.Scalar())) {
        p.fail(nm.Mark(), "bad namespace name '" + (nm.IsScalar() ? excerpt(nm.Scalar()) : std::string("?")) +
                              "': use a DNS label (a-z, 0-9 and '-', at most 63, not starting or ending with '-')");
      }
      NamespaceSpec ns;
      ns.name = nm.Scalar();
      ns.line = Parser::line(n.Mark());
      ns.column = Parser::column(n.Mark());
      for (const NamespaceSpec& other : cfg.namespaces_) {
        if (other.name == ns.name) {
          p.fail(nm.Mark(), "duplicate namespace '" + ns.name + "' (first at line " + std::to_string(other.line) + ")");
        }
      }
      const std::string where = "namespace '" + ns.name + "'";
      ns.limit = p.size(n, "limit", where);
      ns.guaranteed = p.size(n, "guaranteed", where);
      ns.pod_limit = p.size(n, "pod_limit", where);
      ns.guard = p.guard(n, where);
      ns.dedup = p.dedup(n, where);
      ns.enforce = p.enforce(n, where);
      ns.kill_grace = p.kill_grace(n, where);
      ns.wait = p.wait(n, where);
      ns.allow_disable = p.flag(n, "allow_disable", where);
      ns.overcommit = p.flag(n, "overcommit", where);
      ns.dedup_domain = p.dedup_domain(n, where);
      ns.ipc_domain = p.domain(n, "ipc_domain", where);
      if (ns.limit) {
        ns.limit_line = Parser::line(n["limit"].Mark());
        ns.limit_column = Parser::column(n["limit"].Mark());
      }
      if (ns.guaranteed) {
        const YAML::Mark gm = n["guaranteed"].Mark();
        ns.guaranteed_line = Parser::line(gm);
        ns.guaranteed_column = Parser::column(gm);
        if (ns.limit && greater(*ns.guaranteed, *ns.limit).value_or(false)) {
          p.fail(gm, "guaranteed " + ns.guaranteed->to_string() + " is more than the limit " + ns.limit->to_string() +
                         " of " + where);
        }
        if (ns.guaranteed->is_percent()) {
          percent_sum += ns.guaranteed->ppm();
          if (percent_sum > 1'000'000) {
            p.fail(gm, "guarantees add up to " +
                           Limit::percent_ppm(static_cast<std::uint32_t>(percent_sum)).to_string() +
                           " of the GPU (more than 100%)");
          }
        }
      }
      if (const YAML::Node pr = n["priority"]) ns.priority = p.priority(pr);
      const std::size_t index = cfg.namespaces_.size();
      for (const bool group : {false, true}) {
        const char* key = group ? "groups" : "users";
        const YAML::Node list = n[key];
        if (!list) continue;
        if (!list.IsSequence()) p.fail(list.Mark(), "'" + std::string(key) + "' in " + where + " must be a list");
        auto& into = group ? listed_groups : listed_users;
        for (const YAML::Node& item : list) {
          const std::uint32_t id = p.principal(item, group, where);
          const std::string label = trim(item.Scalar());
          for (const Listed& l : into) {
            if (l.id != id) continue;
            const std::string what = std::string(group ? "group '" : "user '") + label + "' (" +
                                     (group ? "gid " : "uid ") + std::to_string(id) + ")";
            if (l.ns == index) p.fail(item.Mark(), "duplicate " + what + " in " + where);
            p.fail(item.Mark(), what + " is already in namespace '" + cfg.namespaces_[l.ns].name + "' (line " +
                                    std::to_string(l.line) + ")");
          }
          into.push_back(Listed{id, label, index, Parser::line(item.Mark())});
        }
      }
      cfg.namespaces_.push_back(std::move(ns));
    }
  }
  if (cfg.find_namespace(kDefaultNamespace) == nullptr) {
    NamespaceSpec d;
    d.name = kDefaultNamespace;
    d.declared = false;
    cfg.namespaces_.push_back(d);
  }
  const std::size_t default_ns = cfg.default_index();

  auto namespace_of = [&](const YAML::Node& entry, const std::vector<Listed>& listed, std::uint32_t id,
                          const std::string& what) -> std::size_t {
    const Listed* in_list = nullptr;
    for (const Listed& l : listed) {
      if (l.id == id) in_list = &l;
    }
    const YAML::Node nsn = entry["namespace"];
    if (!nsn) return in_list != nullptr ? in_list->ns : default_ns;
    if (!nsn.IsScalar()) p.fail(nsn.Mark(), "'namespace' must be a namespace name");
    const std::string want = trim(nsn.Scalar());
    std::size_t idx = cfg.namespaces_.size();
    for (std::size_t i = 0; i < cfg.namespaces_.size(); ++i) {
      if (cfg.namespaces_[i].name == want) idx = i;
    }
    if (idx == cfg.namespaces_.size())
      p.fail(nsn.Mark(), "unknown namespace '" + excerpt(want) + "' (not in 'namespaces')");
    if (in_list != nullptr && in_list->ns != idx) {
      p.fail(nsn.Mark(), what + " is listed in namespace '" + cfg.namespaces_[in_list->ns].name + "' (line " +
                             std::to_string(in_list->line) + "), not '" + want + "'");
    }
    return idx;
  };

  for (const bool group : {false, true}) {
    const char* key = group ? "groups" : "users";
    const std::string entry_what = std::string("a '") + key + "' entry";
    const char* id_key = group ? "gid" : "uid";
    const YAML::Node list = root[key];
    std::set<std::uint32_t> seen;
    if (list) {
      if (!list.IsSequence()) p.fail(list.Mark(), "'" + std::string(key) + "' must be a list");
      for (const YAML::Node& u : list) {
        if (!u.IsMap()) p.fail(u.Mark(), entry_what + " must be a mapping (" + id_key + " or name, limit)");
        p.check_keys(u, group ? "group" : "user", entry_what);
        const YAML::Node idn = u[id_key];
        const YAML::Node nm = u["name"];
        if (idn && nm) p.fail(u.Mark(), entry_what + " has both '" + id_key + "' and 'name' (give one)");
        if (!idn && !nm) p.fail(u.Mark(), entry_what + " needs '" + id_key + "' or 'name'");
        const std::optional<Limit> limit = p.size(u, "limit", entry_what);
        const std::optional<GuardMode> guard = p.guard(u, entry_what);
        if (!limit && !u["namespace"] && !guard) {
          p.fail(u.Mark(), "missing 'limit' in " + entry_what + " (give 'limit', 'namespace' or 'guard')");
        }
        std::uint32_t id = 0;
        std::string label;
        YAML::Mark at;
        if (idn) {
          id = p.id(idn, id_key);
          label = std::to_string(id);
          at = idn.Mark();
        } else {
          if (!nm.IsScalar() || nm.Scalar().empty()) {
            p.fail(nm.Mark(), std::string("'name' must be a ") + (group ? "group" : "user") + " name");
          }
          id = p.principal(nm, group, entry_what);
          label = nm.Scalar();
          at = nm.Mark();
        }
        if (!seen.insert(id).second) {
          p.fail(at, std::string("duplicate ") + id_key + " " + std::to_string(id) + " in '" + key + "'");
        }
        const std::string what = std::string(group ? "group '" : "user '") + label + "'";
        const std::size_t ns = namespace_of(u, group ? listed_groups : listed_users, id, what);
        if (group) cfg.groups_.push_back(GroupEntry{id, label, limit, ns, guard});
        else cfg.users_.push_back(UserEntry{id, label, limit, ns, guard});
      }
    }
    // Listed in a namespace without an entry of its own: a tenant with the pod limit.
    for (const Listed& l : group ? listed_groups : listed_users) {
      if (seen.count(l.id) != 0) continue;
      if (group) cfg.groups_.push_back(GroupEntry{l.id, l.label, std::nullopt, l.ns, std::nullopt});
      else cfg.users_.push_back(UserEntry{l.id, l.label, std::nullopt, l.ns, std::nullopt});
    }
  }
  return cfg;
}

void QuotaConfig::check_device(Bytes total) const {
  Bytes sum{0};
  for (const NamespaceSpec& n : namespaces_) {
    if (!n.guaranteed) continue;
    const Bytes g = n.guaranteed->on_device(total);
    if (n.limit && g > n.limit->on_device(total)) {
      throw ConfigError(file_, n.guaranteed_line, n.guaranteed_column,
                        "guaranteed " + n.guaranteed->to_string() + " is more than the limit " + n.limit->to_string() +
                            " of namespace '" + n.name + "' on a GPU of " + describe_size(total) + " (" +
                            describe_size(g) + " > " + describe_size(n.limit->on_device(total)) + ")");
    }
    sum += g;
    if (sum > total) {
      throw ConfigError(file_, n.guaranteed_line, n.guaranteed_column,
                        "guarantees add up to " + describe_size(sum) + ", more than the GPU's " + describe_size(total));
    }
  }
}

TenantSpec QuotaConfig::make_spec(const std::string& kind, const std::string& label, const std::optional<Limit>& own,
                                  std::size_t ns, const std::optional<GuardMode>& guard) const {
  const NamespaceSpec& n = namespaces_.at(ns);
  Limit limit = Limit::percent_ppm(1'000'000);
  if (own) limit = *own;
  else if (n.name == kDefaultNamespace && default_given_) limit = default_;
  else if (n.pod_limit) limit = *n.pod_limit;
  else if (n.limit) limit = *n.limit;
  TenantSpec t{(n.name == kDefaultNamespace ? std::string() : n.name + "/") + kind + ":" + label,
               limit,
               n.name,
               guard.value_or(n.guard.value_or(default_guard())),
               dedup_of(n),
               enforce_of(n),
               kill_grace_of(n),
               allow_disable_of(n),
               dedup_domain_of(n),
               n.ipc_domain.value_or(std::string()),
               wait_of(n),
               overcommit_of(n)};
  return t;
}

TenantSpec QuotaConfig::resolve(uid_t uid, gid_t gid, std::span<const gid_t> groups) const {
  for (const UserEntry& u : users_) {
    if (u.uid == uid) return make_spec("user", u.label, u.limit, u.ns, u.guard);
  }
  for (const GroupEntry& g : groups_) {
    if (g.gid == gid || std::find(groups.begin(), groups.end(), g.gid) != groups.end()) {
      return make_spec("group", g.label, g.limit, g.ns, g.guard);
    }
  }
  return make_spec("uid", std::to_string(uid), std::nullopt, default_index(), std::nullopt);
}

TenantSpec QuotaConfig::resolve_allocation(const std::string& name, const std::string& ns, Bytes allocated,
                                           Bytes total) const {
  const NamespaceSpec* n = find_namespace(ns);
  if (n == nullptr) n = &namespaces_.at(default_index());
  Bytes limit = allocated;
  if (n->pod_limit) limit = std::min(limit, n->pod_limit->on_device(total));
  return TenantSpec{name,
                    Limit::bytes(limit),
                    n->name,
                    n->guard.value_or(default_guard()),
                    dedup_of(*n),
                    enforce_of(*n),
                    kill_grace_of(*n),
                    allow_disable_of(*n),
                    dedup_domain_of(*n),
                    n->ipc_domain.value_or(std::string()),
                    wait_of(*n),
                    overcommit_of(*n)};
}

std::vector<ConfigError> check_file(const std::string& path, std::optional<Bytes> gpu_memory) {
  std::vector<ConfigError> errors;
  try {
    const QuotaConfig cfg = QuotaConfig::load(path);
    if (gpu_memory) cfg.check_device(*gpu_memory);
  } catch (const ConfigError& e) {
    errors.push_back(e);
  } catch (const std::exception& e) {
    errors.emplace_back(path, 0, 0, e.what());
  }
  return errors;
}

}  // namespace vlake::quota
