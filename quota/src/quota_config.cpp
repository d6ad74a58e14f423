#include "vlake/quota/quota_config.hpp"

#include <grp.h>
#include <pwd.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

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
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::uint64_t v = bytes_.value();
  int u = 0;
  while (u < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + kUnits[u];
}

Limit parse_limit(const std::string& raw) {
  const std::string text = trim(raw);
  auto fail = [&](const std::string& why) -> Limit {
    throw std::invalid_argument("bad size '" + raw + "': " + why);
  };
  if (text.empty()) return fail("empty");
  if (text[0] == '-') return fail("must be positive");
  if (text[0] == '+') return fail("expected a number");
  std::size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) ++i;
  if (i == 0) return fail("expected a number");
  const std::string whole = text.substr(0, i);
  std::string frac;
  if (i < text.size() && text[i] == '.') {
    std::size_t j = i + 1;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])) != 0) ++j;
    frac = text.substr(i + 1, j - i - 1);
    if (frac.empty()) return fail("expected digits after '.'");
    i = j;
  }
  const std::string unit = trim(text.substr(i));
  if (whole.size() > 19) return fail("too large");
  const std::uint64_t w = std::stoull(whole);

  if (unit == "%") {
    if (frac.size() > 4) return fail("at most 4 decimals in a percentage");
    std::string f = frac;
    f.append(4 - f.size(), '0');
    if (w > 100) return fail("percentage over 100");
    const std::uint64_t ppm = w * 10'000 + std::stoull(f);
    if (ppm > 1'000'000) return fail("percentage over 100");
    if (ppm == 0) return fail("must be greater than zero");
    return Limit::percent_ppm(static_cast<std::uint32_t>(ppm));
  }
  if (!frac.empty()) return fail("a size must be a whole number (use a smaller unit)");
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "KiB") shift = 10;
  else if (unit == "MiB") shift = 20;
  else if (unit == "GiB") shift = 30;
  else if (unit == "TiB") shift = 40;
  if (shift < 0) return fail("unknown unit '" + unit + "' (use B, KiB, MiB, GiB, TiB or %)");
  if (w > (std::numeric_limits<std::uint64_t>::max() >> shift)) return fail("too large");
  if (w == 0) return fail("must be greater than zero");
  return Limit::bytes(Bytes{w << shift});
}

namespace {

class Parser {
 public:
  Parser(const std::string& name) : name_(name) {}

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& what) const {
    if (m.is_null()) throw ConfigError(name_, 0, 0, what);
    throw ConfigError(name_, m.line + 1, m.column + 1, what);
  }

  // Every key of map `node` must be one of `allowed`.
  void check_keys(const YAML::Node& node, std::initializer_list<const char*> allowed,
                  const std::string& where) const {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) fail(key.Mark(), "keys in " + where + " must be names");
      const std::string k = key.Scalar();
      const bool ok = std::any_of(allowed.begin(), allowed.end(),
                                  [&](const char* a) { return k == a; });
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        fail(key.Mark(), "unknown key '" + k + "' in " + where + " (allowed: " + list + ")");
      }
    }
  }

  Limit limit(const YAML::Node& entry, const std::string& where) const {
    const YAML::Node v = entry["limit"];
    if (!v) fail(entry.Mark(), "missing 'limit' in " + where);
    if (!v.IsScalar()) fail(v.Mark(), "'limit' in " + where + " must be a size");
    try {
      return parse_limit(v.Scalar());
    } catch (const std::invalid_argument& e) {
      fail(v.Mark(), e.what());
    }
  }

  std::uint32_t id(const YAML::Node& v, const char* what) const {
    if (!v.IsScalar()) fail(v.Mark(), std::string(what) + " must be a number");
    const std::string s = trim(v.Scalar());
    if (s.empty() || s.size() > 10 ||
        !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
      fail(v.Mark(), std::string("bad ") + what + " '" + s + "': expected a number 0..4294967294");
    }
    const std::uint64_t n = std::stoull(s);
    if (n >= 0xffffffffULL) fail(v.Mark(), std::string("bad ") + what + " '" + s + "': out of range");
    return static_cast<std::uint32_t>(n);
  }

  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

}  // namespace

QuotaConfig::QuotaConfig() : default_(Limit::percent_ppm(1'000'000)) {}

QuotaConfig QuotaConfig::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path, 0, 0, "cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

QuotaConfig QuotaConfig::parse(const std::string& text, const std::string& name) {
  Parser p(name);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    p.fail(e.mark, "YAML syntax: " + e.msg);
  }
  if (!root || root.IsNull()) throw ConfigError(name, 0, 0, "empty configuration (expected 'version: 1')");
  if (!root.IsMap()) p.fail(root.Mark(), "the configuration must be a mapping");
  p.check_keys(root, {"version", "default", "users", "groups"}, "the top level");

  const YAML::Node version = root["version"];
  if (!version) p.fail(root.Mark(), "missing 'version' (expected 1)");
  if (!version.IsScalar() || trim(version.Scalar()) != "1") {
    p.fail(version.Mark(), "unsupported version '" + (version.IsScalar() ? version.Scalar() : std::string("?")) +
                               "' (this vlake reads version 1)");
  }

  QuotaConfig cfg;
  if (const YAML::Node def = root["default"]) {
    if (!def.IsMap()) p.fail(def.Mark(), "'default' must be a mapping with 'limit'");
    p.check_keys(def, {"limit"}, "'default'");
    cfg.default_ = p.limit(def, "'default'");
  }

  if (const YAML::Node users = root["users"]) {
    if (!users.IsSequence()) p.fail(users.Mark(), "'users' must be a list");
    std::set<uid_t> seen;
    for (const YAML::Node& u : users) {
      if (!u.IsMap()) p.fail(u.Mark(), "a 'users' entry must be a mapping (uid or name, limit)");
      p.check_keys(u, {"uid", "name", "limit"}, "a 'users' entry");
      const YAML::Node uid = u["uid"];
      const YAML::Node nm = u["name"];
      if (uid && nm) p.fail(u.Mark(), "a 'users' entry has both 'uid' and 'name' (give one)");
      if (!uid && !nm) p.fail(u.Mark(), "a 'users' entry needs 'uid' or 'name'");
      UserEntry e{0, {}, p.limit(u, "a 'users' entry")};
      YAML::Mark at;
      if (uid) {
        e.uid = p.id(uid, "uid");
        e.label = std::to_string(e.uid);
        at = uid.Mark();
      } else {
        if (!nm.IsScalar() || nm.Scalar().empty()) p.fail(nm.Mark(), "'name' must be a user name");
        const passwd* pw = ::getpwnam(nm.Scalar().c_str());
        if (pw == nullptr) p.fail(nm.Mark(), "unknown user '" + nm.Scalar() + "'");
        e.uid = pw->pw_uid;
        e.label = nm.Scalar();
        at = nm.Mark();
      }
      if (!seen.insert(e.uid).second) p.fail(at, "duplicate uid " + std::to_string(e.uid) + " in 'users'");
      cfg.users_.push_back(std::move(e));
    }
  }

  if (const YAML::Node groups = root["groups"]) {
    if (!groups.IsSequence()) p.fail(groups.Mark(), "'groups' must be a list");
    std::set<gid_t> seen;
    for (const YAML::Node& g : groups) {
      if (!g.IsMap()) p.fail(g.Mark(), "a 'groups' entry must be a mapping (gid or name, limit)");
      p.check_keys(g, {"gid", "name", "limit"}, "a 'groups' entry");
      const YAML::Node gid = g["gid"];
      const YAML::Node nm = g["name"];
      if (gid && nm) p.fail(g.Mark(), "a 'groups' entry has both 'gid' and 'name' (give one)");
      if (!gid && !nm) p.fail(g.Mark(), "a 'groups' entry needs 'gid' or 'name'");
      GroupEntry e{0, {}, p.limit(g, "a 'groups' entry")};
      YAML::Mark at;
      if (gid) {
        e.gid = p.id(gid, "gid");
        e.label = std::to_string(e.gid);
        at = gid.Mark();
      } else {
        if (!nm.IsScalar() || nm.Scalar().empty()) p.fail(nm.Mark(), "'name' must be a group name");
        const group* gr = ::getgrnam(nm.Scalar().c_str());
        if (gr == nullptr) p.fail(nm.Mark(), "unknown group '" + nm.Scalar() + "'");
        e.gid = gr->gr_gid;
        e.label = nm.Scalar();
        at = nm.Mark();
      }
      if (!seen.insert(e.gid).second) p.fail(at, "duplicate gid " + std::to_string(e.gid) + " in 'groups'");
      cfg.groups_.push_back(std::move(e));
    }
  }
  return cfg;
}

TenantSpec QuotaConfig::resolve(uid_t uid, gid_t gid, std::span<const gid_t> groups) const {
  for (const UserEntry& u : users_) {
    if (u.uid == uid) return TenantSpec{"user:" + u.label, u.limit};
  }
  for (const GroupEntry& g : groups_) {
    if (g.gid == gid || std::find(groups.begin(), groups.end(), g.gid) != groups.end()) {
      return TenantSpec{"group:" + g.label, g.limit};
    }
  }
  return TenantSpec{"uid:" + std::to_string(uid), default_};
}

}  // namespace vlake::quota
