// vlake::quota::QuotaConfig — the quota file: which tenant a Unix process belongs to and how
// much GPU memory that tenant may hold on each GPU.
//
// File format (YAML, version 1; see docs/daemon.md):
//   version: 1
//   default: {limit: 8GiB}          # every uid not listed: one tenant per uid ("uid:<n>")
//   users:  [{uid: 1000, limit: 4GiB}, {name: alice, limit: 50%}]
//   groups: [{gid: 2000, limit: 16GiB}, {name: ml, limit: 16GiB}]
// Sizes: a byte count, or a number with B, KiB, MiB, GiB, TiB (binary units), or a percentage
// of the GPU ("50%", decimals allowed, 0 < p <= 100). A missing `default` means 100%.
//
// Resolution: a `users` entry for the uid wins; otherwise the first `groups` entry (file
// order) whose gid is the primary or a supplementary gid; otherwise the default. Tenant names:
// `user:<name or uid>`, `group:<name or gid>` (as the entry was written), `uid:<n>`.
//
// Errors: load()/parse() throw ConfigError whose what() reads "<file>:<line>:<column>: <what
// is wrong>" (1-based line/column; 0:0 when no position applies, e.g. an unreadable file).
//
// Thread-safety: a QuotaConfig is immutable after construction; resolve() is const and may be
// called from any thread. Names given as `name:` are resolved (getpwnam/getgrnam) at parse
// time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::quota {

class ConfigError : public std::runtime_error {
 public:
  ConfigError(const std::string& file, int line, int column, const std::string& what);
  [[nodiscard]] int line() const noexcept { return line_; }
  [[nodiscard]] int column() const noexcept { return column_; }

 private:
  int line_;
  int column_;
};

// A per-GPU limit: an absolute size or a fraction of the GPU's memory.
class Limit {
 public:
  static Limit bytes(Bytes b) noexcept { return Limit(b, 0); }
  // `ppm`: parts per million of the GPU's memory, 1..1'000'000.
  static Limit percent_ppm(std::uint32_t ppm) noexcept { return Limit(Bytes{0}, ppm); }

  [[nodiscard]] bool is_percent() const noexcept { return ppm_ != 0; }
  [[nodiscard]] std::uint32_t ppm() const noexcept { return ppm_; }
  [[nodiscard]] Bytes absolute() const noexcept { return bytes_; }
  // The limit on a GPU with `total` bytes (a percentage rounds down to a byte).
  [[nodiscard]] Bytes on_device(Bytes total) const noexcept;
  // "4GiB", "50%", "1234B" — for logs.
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const Limit&, const Limit&) = default;

 private:
  Limit(Bytes b, std::uint32_t ppm) noexcept : bytes_(b), ppm_(ppm) {}
  Bytes bytes_{0};
  std::uint32_t ppm_ = 0;
};

struct TenantSpec {
  std::string name;
  Limit limit;
};

// Parses a size string ("8GiB", "4096", "50%", "12.5%"). Throws std::invalid_argument with a
// description of what is wrong (bad unit, zero, negative, percentage over 100, ...).
Limit parse_limit(const std::string& text);

class QuotaConfig {
 public:
  // The built-in configuration used when no file exists: every uid its own tenant, 100%.
  QuotaConfig();

  static QuotaConfig load(const std::string& path);
  static QuotaConfig parse(const std::string& text, const std::string& name);

  [[nodiscard]] TenantSpec resolve(uid_t uid, gid_t gid, std::span<const gid_t> groups) const;

  [[nodiscard]] const Limit& default_limit() const noexcept { return default_; }

 private:
  struct UserEntry {
    uid_t uid;
    std::string label;  // name or uid as written
    Limit limit;
  };
  struct GroupEntry {
    gid_t gid;
    std::string label;
    Limit limit;
  };
  Limit default_;
  std::vector<UserEntry> users_;
  std::vector<GroupEntry> groups_;
};

}  // namespace vlake::quota
