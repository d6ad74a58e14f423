// vlake::quota::QuotaConfig — the quota file: which tenant (and namespace) a Unix process
// belongs to, how much GPU memory that tenant and its namespace may hold on each GPU, and how
// much of each GPU is guaranteed to a namespace. Full reference: docs/quota.md.
//
// File format (YAML, version 1; every version-1 file of earlier vlake releases stays valid):
//   version: 1
//   default: {limit: 8GiB}            # tenants not covered below: one tenant per uid ("uid:<n>")
//   namespaces:
//     - name: research                # DNS label; "default" configures the implicit namespace
//       limit: 60%                    # all its tenants together, per GPU (absent: the whole GPU)
//       guaranteed: 16GiB             # never lent to tenants outside it (<= limit; absent: 0)
//       priority: 10                  # integer, default 0 (who gives memory back under pressure)
//       pod_limit: 8GiB               # each of its tenants' default limit (absent: its limit)
//       users: [alice, 1002]          # host mode: these users are tenants of it
//       groups: [ml]                  # host mode: processes in these groups are tenants of it
//   users:  [{uid: 1000, limit: 4GiB}, {name: alice, limit: 50%, namespace: research}]
//   groups: [{gid: 2000, limit: 16GiB}, {name: ml, limit: 16GiB}]
// Out-of-bounds guards (docs/guard.md): `guard: off|canary|fault` may appear in `default`, in a
// namespace, and in a users/groups entry. A tenant's mode: its own users/groups entry's
// `guard`, else its namespace's, else (any namespace) the top-level `default.guard`, else off.
// A users/groups entry or `default` may give only `guard` (the limit then comes as usual).
// Dedup (docs/dedup.md): `dedup: off|transparent` may appear in `default` and in a namespace. A
// namespace's mode: its own `dedup`, else the top-level `default.dedup`, else off. `transparent`:
// the hook offers whole-allocation host-to-device uploads for sharing without code changes.
// Memory outside vlake (docs/quota.md, "Memory outside vlake"): `enforce: account|refuse|kill`,
// `kill_grace: <duration>` and `allow_disable: true|false` may appear in `default` and in a
// namespace; a namespace's value is its own, else the top-level default's, else kill / 30s /
// false. `enforce` says what the GPU memory of a tenant's processes without a session (NVML's
// per-process figure) does: account = shown only; refuse = it counts toward the tenant's and its
// namespace's usage when grants are admitted; kill (the default) = refuse, and those processes
// are killed when the tenant is still over a limit `kill_grace` later (so no tenant keeps memory
// above its limit past the grace; account and refuse are opt-ins that allow it). `allow_disable`: whether
// VLAKE_DISABLE=1 turns the hook off for the namespace's tenants. A duration follows vlake's one grammar
// (vlake/common/duration.hpp): a number with ms, s, m or h ("500ms", "2.5s", "2m"), or 0; a bare
// number such as `wait: 30` is an error that says what to write.
// Waiting for memory: `wait: <duration>` (at most 10m) may appear in `default` and in a namespace
// (its own, else the top-level default's, else 0): an allocation of its tenants that no memory
// can serve now waits that long for memory before it fails.
// Overcommit (docs/swap.md): `overcommit: true|false` may appear in `default` and in a namespace
// (its own, else the top-level default's, else false): its tenants' processes allocate GPU memory
// of their own (charged to their limits as before, but not from the pool), so that vlaked can move
// an idle one to host memory when the GPU is full and bring it back when it runs again.
// Dedup trust domains: `dedup_domain: <DNS label>` may appear in `default` and in a namespace. A
// namespace's domain: its own, else the top-level `default.dedup_domain`, else none. Tenants
// share chunks only with tenants of the same domain (a tenant holding a chunk's descriptor can
// map it writable: a domain is a set of tenants that trust each other); without a domain a
// tenant dedups only with its own processes.
// CUDA IPC domains: `ipc_domain: <DNS label>` may appear in a namespace only (not in `default`).
// A tenant's IPC handles may be opened by its own processes and by tenants of namespaces that
// declare the same domain (docs/ipc.md); without a domain only by the tenant itself.
// Sizes: vlake's one size grammar (vlake/common/size.hpp): a whole number with B, KiB, MiB, GiB,
// TiB (or Ki, Mi, Gi, Ti); a bare number (`limit: 8`) and decimal units such as 8GB are errors. Here also a
// percentage of the GPU ("50%", up to 4 decimals, 0 < p <= 100). Limits and guarantees are per
// GPU: each GPU is enforced on its own.
//
// Resolution of a process (uid, primary gid, supplementary gids):
//   1. a user tenant for the uid: a `users` entry, or a namespace's `users` list;
//   2. otherwise the first group tenant whose gid matches: `groups` entries in file order,
//      then namespaces' `groups` lists (namespaces in file order) for gids without an entry;
//   3. otherwise "uid:<n>" in namespace "default" with the top-level default limit.
// A tenant's limit: its own entry's `limit`, else its namespace's `pod_limit`, else the
// namespace's `limit`, else 100%. For the "default" namespace the top-level `default.limit`
// comes first. Tenant names: `user:<name or uid>`, `group:<name or gid>` (as written),
// `uid:<n>`, prefixed with "<namespace>/" unless the namespace is "default".
//
// Errors: load()/parse() throw ConfigError whose what() reads "<file>:<line>:<column>: <what
// is wrong>" (1-based line/column; 0:0 when no position applies, e.g. an unreadable file).
// Checked at parse: YAML syntax, unknown keys at every level, version, sizes (units, zero,
// negative, > 100%), duplicate uids/gids/namespaces, users/groups in two namespaces, unknown
// user/group/namespace names, DNS-label namespace names, priorities, guaranteed > limit when
// both are absolute or both percentages, percentage guarantees adding up to more than 100%.
// check_device(total) adds the checks that need a GPU size (absolute or mixed guarantees).
//
// Also checked at parse: duplicate keys in any mapping ("duplicate key 'limit' (first at line
// 3, column 5)"). Every value quoted in an error is cut to vlake::kExcerptBytes with
// "…(N bytes)" (vlake/common/excerpt.hpp), so an error stays one bounded line.
//
// Reading (read_file, load): the file is opened with O_NONBLOCK and must be a regular file (a
// symlink to one is followed: ConfigMap mounts are symlinks) of at most kMaxFileBytes; a FIFO,
// a device, a directory or a larger file is rejected without being read.
//
// Thread-safety: a QuotaConfig is immutable after construction; every const method may be
// called from any thread. parse() and load() may run on any thread (names given as `name:` are
// resolved at parse time with getpwnam_r/getgrnam_r).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
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

// A per-GPU size: an absolute size or a fraction of the GPU's memory.
class Limit {
 public:
  static Limit bytes(Bytes b) noexcept { return Limit(b, 0); }
  // `ppm`: parts per million of the GPU's memory, 1..1'000'000.
  static Limit percent_ppm(std::uint32_t ppm) noexcept { return Limit(Bytes{0}, ppm); }

  [[nodiscard]] bool is_percent() const noexcept { return ppm_ != 0; }
  [[nodiscard]] std::uint32_t ppm() const noexcept { return ppm_; }
  [[nodiscard]] Bytes absolute() const noexcept { return bytes_; }
  // The size on a GPU with `total` bytes (a percentage rounds down to a byte).
  [[nodiscard]] Bytes on_device(Bytes total) const noexcept;
  // "4GiB", "50%", "1234B" — for logs.
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const Limit&, const Limit&) = default;

 private:
  Limit(Bytes b, std::uint32_t ppm) noexcept : bytes_(b), ppm_(ppm) {}
  Bytes bytes_{0};
  std::uint32_t ppm_ = 0;
};

// The name of the implicit namespace of tenants not placed in any other.
inline constexpr const char* kDefaultNamespace = "default";

// Dedup mode of a namespace (docs/dedup.md). The explicit share API works in every mode.
enum class DedupMode : std::uint8_t { off = 0, transparent = 1 };

// "off" / "transparent" (for logs and messages).
const char* dedup_mode_name(DedupMode m) noexcept;

// Out-of-bounds guard mode of a tenant (docs/guard.md). The daemon tells the hook over the
// protocol; the numbering is quota's own.
enum class GuardMode : std::uint8_t { off = 0, canary = 1, fault = 2 };

// What memory of a tenant's processes without a session does (docs/quota.md). The numbering
// is TenantRecord::enforce's (contracts/state.hpp).
enum class Enforce : std::uint8_t { account = 0, refuse = 1, kill = 2 };

// "account" / "refuse" / "kill" (for logs and messages).
const char* enforce_name(Enforce e) noexcept;

inline constexpr std::chrono::milliseconds kDefaultKillGrace{30'000};
// The longest `wait` the quota file accepts (docs/quota.md, "Waiting for memory").
inline constexpr std::chrono::milliseconds kMaxWait{600'000};

struct TenantSpec {
  std::string name;                    // e.g. "research/user:alice", "uid:1000"
  Limit limit;                         // per GPU
  std::string ns = kDefaultNamespace;  // its namespace
  GuardMode guard = GuardMode::off;    // out-of-bounds guard mode (docs/guard.md)
  DedupMode dedup = DedupMode::off;    // its namespace's dedup mode (resolved)
  Enforce enforce = Enforce::kill;     // its namespace's (resolved)
  std::chrono::milliseconds kill_grace = kDefaultKillGrace;
  bool allow_disable = false;  // VLAKE_DISABLE=1 honoured for it
  std::string dedup_domain;    // its namespace's dedup trust domain; "": none
  std::string ipc_domain;      // its namespace's CUDA IPC domain (docs/ipc.md); "": none
  // How long an allocation that no memory can serve now waits for memory (docs/quota.md,
  // "Waiting for memory"); 0: it fails at once unless other processes are being asked.
  std::chrono::milliseconds wait{0};
  // Its namespace's `overcommit`: its processes allocate their own memory and may be swapped
  // out to host memory when idle (docs/swap.md).
  bool overcommit = false;
};

// "off" / "canary" / "fault" (for logs and messages).
const char* guard_mode_name(GuardMode m) noexcept;

struct NamespaceSpec {
  std::string name;
  std::optional<Limit> limit;       // nullopt: no limit beyond the GPU
  std::optional<Limit> guaranteed;  // nullopt: nothing guaranteed
  std::int32_t priority = 0;
  std::optional<Limit> pod_limit;                       // nullopt: `limit` (or 100%)
  bool declared = true;                                 // false: the implicit "default" namespace
  std::optional<GuardMode> guard;                       // nullopt: the top-level default's (or off)
  std::optional<DedupMode> dedup;                       // nullopt: the top-level default's (or off)
  std::optional<Enforce> enforce;                       // nullopt: the top-level default's (or kill)
  std::optional<std::chrono::milliseconds> kill_grace;  // nullopt: the top-level default's (or 30s)
  std::optional<std::chrono::milliseconds> wait;        // nullopt: the top-level default's (or 0)
  std::optional<bool> allow_disable;                    // nullopt: the top-level default's (or false)
  std::optional<bool> overcommit;                       // nullopt: the top-level default's (or false)
  std::optional<std::string> dedup_domain;              // nullopt: the top-level default's (or none)
  std::optional<std::string> ipc_domain;                // nullopt: none (namespace-level only)
  // Positions (1-based; 0 when absent) for errors found later (check_device).
  int line = 0, column = 0;
  int limit_line = 0, limit_column = 0;
  int guaranteed_line = 0, guaranteed_column = 0;

  // The namespace's limit / guarantee on a GPU of `total` bytes (limit: at most `total`).
  [[nodiscard]] Bytes limit_on(Bytes total) const noexcept;
  [[nodiscard]] Bytes guaranteed_on(Bytes total) const noexcept;
};

// Parses a size string ("8GiB", "4096B", "50%", "12.5%"; a bare "4096" is refused) with
// vlake::parse_size_or_percent and rejects zero. Throws vlake::SizeError (a std::invalid_argument): `"<text>": <what is
// wrong>` (decimal unit, zero, negative, percentage over 100, ...).
Limit parse_limit(const std::string& text);

// A byte count for messages: vlake::format_size() when that is a whole number of a unit
// ("1536MiB", "1000B"), else the bytes and an approximation ("1610612737 bytes (1.5GiB)").
std::string describe_size(Bytes b);

// The largest quota file read (1 MiB); real ones are a few KiB.
inline constexpr std::size_t kMaxFileBytes = 1u << 20;

// One read of a quota file and what identifies that version of it.
struct FileRead {
  enum class Status { ok, missing, rejected };
  Status status = Status::missing;
  std::string text;   // ok: the content
  std::string error;  // rejected (and missing): why, without the file name ("not a regular file (a FIFO) ...")
  // fstat of what was opened (symlinks followed); zero when missing.
  std::uint64_t dev = 0;
  std::uint64_t ino = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t size = 0;
  std::uint32_t type = 0;  // st_mode & S_IFMT
};

// Opens `path` with O_RDONLY|O_NONBLOCK|O_CLOEXEC (following symlinks), fstats it and reads it
// only when it is a regular file of at most `max_bytes` (a file that grows past the cap while
// being read is rejected too). missing: ENOENT/ENOTDIR. Never blocks on a FIFO or a device;
// never throws except std::bad_alloc. Thread-safe.
FileRead read_file(const std::string& path, std::size_t max_bytes = kMaxFileBytes);

class QuotaConfig {
 public:
  // The built-in configuration used when no file exists: every uid its own tenant, 100%,
  // only the implicit "default" namespace.
  QuotaConfig();

  // Throw ConfigError (see above). load() reads with read_file(): a file that is missing, not
  // regular or over kMaxFileBytes is a ConfigError at 0:0 saying so.
  static QuotaConfig load(const std::string& path);
  static QuotaConfig parse(const std::string& text, const std::string& name);

  // The checks that need a GPU's size: every namespace's guarantee fits its limit on it, and
  // the guarantees add up to at most `total`. Throws a positioned ConfigError.
  void check_device(Bytes total) const;

  [[nodiscard]] TenantSpec resolve(uid_t uid, gid_t gid, std::span<const gid_t> groups) const;
  // A Kubernetes allocation's tenant (docs/device-plugin.md), named `name`: in namespace `ns`
  // when this file configures it (else "default"); its limit on the allocation's GPU (of
  // `total` bytes) is the allocation's `allocated` bytes, capped by the namespace's pod_limit;
  // guard and dedup as for any tenant of that namespace.
  [[nodiscard]] TenantSpec resolve_allocation(const std::string& name, const std::string& ns, Bytes allocated,
                                              Bytes total) const;

  [[nodiscard]] const Limit& default_limit() const noexcept { return default_; }
  // The top-level `default.guard` (off when absent).
  [[nodiscard]] GuardMode default_guard() const noexcept { return default_guard_.value_or(GuardMode::off); }
  // The top-level `default.dedup` (off when absent).
  [[nodiscard]] DedupMode default_dedup() const noexcept { return default_dedup_.value_or(DedupMode::off); }
  // The dedup mode in force for namespace `ns`: its own, else default_dedup().
  [[nodiscard]] DedupMode dedup_of(const NamespaceSpec& ns) const noexcept {
    return ns.dedup.value_or(default_dedup());
  }
  // The policy for memory outside vlake in force for namespace `ns`: its own, else the
  // top-level default's, else kill / 30s / false.
  [[nodiscard]] Enforce enforce_of(const NamespaceSpec& ns) const noexcept {
    return ns.enforce.value_or(default_enforce_.value_or(Enforce::kill));
  }
  [[nodiscard]] std::chrono::milliseconds wait_of(const NamespaceSpec& ns) const noexcept {
    return ns.wait.value_or(default_wait_.value_or(std::chrono::milliseconds(0)));
  }
  [[nodiscard]] std::chrono::milliseconds kill_grace_of(const NamespaceSpec& ns) const noexcept {
    return ns.kill_grace.value_or(default_kill_grace_.value_or(kDefaultKillGrace));
  }
  [[nodiscard]] bool allow_disable_of(const NamespaceSpec& ns) const noexcept {
    return ns.allow_disable.value_or(default_allow_disable_.value_or(false));
  }
  [[nodiscard]] bool overcommit_of(const NamespaceSpec& ns) const noexcept {
    return ns.overcommit.value_or(default_overcommit_.value_or(false));
  }
  // The dedup trust domain of namespace `ns`: its own, else `default.dedup_domain`, else "".
  [[nodiscard]] std::string dedup_domain_of(const NamespaceSpec& ns) const {
    return ns.dedup_domain.value_or(default_dedup_domain_.value_or(std::string()));
  }
  // Every namespace: the declared ones in file order; the implicit "default" (declared ==
  // false) last unless the file declares it.
  [[nodiscard]] const std::vector<NamespaceSpec>& namespaces() const noexcept { return namespaces_; }
  [[nodiscard]] const NamespaceSpec* find_namespace(const std::string& name) const noexcept;
  [[nodiscard]] const std::string& file() const noexcept { return file_; }

 private:
  struct UserEntry {
    uid_t uid;
    std::string label;  // name or uid as written
    std::optional<Limit> limit;
    std::size_t ns;  // index into namespaces_
    std::optional<GuardMode> guard;
  };
  struct GroupEntry {
    gid_t gid;
    std::string label;
    std::optional<Limit> limit;
    std::size_t ns;
    std::optional<GuardMode> guard;
  };
  [[nodiscard]] std::size_t default_index() const noexcept;
  [[nodiscard]] TenantSpec make_spec(const std::string& kind, const std::string& label, const std::optional<Limit>& own,
                                     std::size_t ns, const std::optional<GuardMode>& guard) const;

  std::string file_ = "<built-in>";
  Limit default_;
  bool default_given_ = false;
  std::optional<GuardMode> default_guard_;
  std::optional<DedupMode> default_dedup_;
  std::optional<Enforce> default_enforce_;
  std::optional<std::chrono::milliseconds> default_kill_grace_;
  std::optional<std::chrono::milliseconds> default_wait_;
  std::optional<bool> default_allow_disable_;
  std::optional<bool> default_overcommit_;
  std::optional<std::string> default_dedup_domain_;
  std::vector<NamespaceSpec> namespaces_;
  std::vector<UserEntry> users_;
  std::vector<GroupEntry> groups_;
};

// What `vlakectl quota check FILE [--gpu-memory SIZE]` runs: load(path) and, with a GPU size,
// check_device(*gpu_memory). Returns the errors found (empty: the file is valid); parsing
// stops at the first structural error, so today at most one error is returned. Never throws
// (an unreadable file is an error with position 0:0). Thread-safe.
std::vector<ConfigError> check_file(const std::string& path, std::optional<Bytes> gpu_memory = std::nullopt);

}  // namespace vlake::quota
