// The hook's configuration: read once from the environment when the hook initializes (never on
// the hot path).
//
// Contract
// - Config::parse(lookup) reads the variables below through `lookup` (getenv in production, a
//   map in tests). A malformed value keeps the default and adds a line to `problems` (the hook
//   prints them once, at warn level).
//     VLAKE_SOCKET             daemon socket path        default /run/vlake/vlaked.sock
//     VLAKE_ON_UNREACHABLE     refuse | passthrough      default refuse
//     VLAKE_RECONNECT_TIMEOUT  duration                  default 5 s
//     VLAKE_TIMEOUT            duration (per socket op)  default 10 s
//     VLAKE_LOG                error|warn|info|debug     default warn
//     VLAKE_DISABLE            1/true/yes/on = ask vlaked to pass everything through (granted
//                              only where the quota file has allow_disable: true; docs/hook.md)
//     VLAKE_RESERVE            local reserve cap (size)  default 512MiB; 0 = no reserve
//     VLAKE_RESERVE_AGE        idle time before a reserved block goes back   default 5 s
//     VLAKE_KEEP_MAPPED        1/0: keep released single-handle grants mapped (docs/hook.md,
//                              "Kept mappings")                                default 1
//     VLAKE_PROFILE            1 = print the cold path's time per phase at exit
//     VLAKE_PREFETCH           blocks of one size fetched ahead at most (docs/hook.md,
//                              "Prefetch")                                      default 0 = off
//   A size follows vlake's one grammar (vlake/common/size.hpp, docs/grammar.md): a whole number
//   with B, KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti), or 0; a bare number ("8") and decimal units
//   such as 1GB are rejected with a message that says what to write (and the default is kept).
//   VLAKE_LOG takes the level names of vlake/common/log.hpp (any case; "warning" = warn).
//   A duration follows vlake's one grammar (vlake/common/duration.hpp, docs/grammar.md): a
//   number with ms, s, m or h ("500ms", "2.5s", "1m"); a bare number other than 0 is refused
//   ("VLAKE_TIMEOUT=30": write 30s or 30ms) and the default is kept. VLAKE_TIMEOUT and
//   VLAKE_RESERVE_AGE must be more than 0, VLAKE_WAIT at most 10m; all at most 1000000s.
// - Plain value type; thread-safe as any value once built.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vlake/common/log.hpp"

namespace vlake::hook {

enum class OnUnreachable { refuse, passthrough };

struct Config {
  std::string socket_path = "/run/vlake/vlaked.sock";
  OnUnreachable on_unreachable = OnUnreachable::refuse;
  std::chrono::milliseconds reconnect_timeout{5000};
  std::chrono::milliseconds timeout{10000};
  // VLAKE_WAIT (docs/quota.md, "Waiting for memory"): how long an allocation that no memory can
  // serve now waits for memory; nullopt: the namespace's `wait`.
  std::optional<std::chrono::milliseconds> wait;
  LogLevel log_level = LogLevel::warn;
  bool disabled = false;
  // Chosen from measurements (docs/hook.md, "Choosing the reserve's defaults").
  std::uint64_t reserve_bytes = 512ULL << 20;
  std::chrono::milliseconds reserve_age{5000};
  bool profile = false;
  bool keep_mapped = true;     // VLAKE_KEEP_MAPPED
  std::uint32_t prefetch = 0;  // VLAKE_PREFETCH: per size, blocks fetched ahead at most (0: off)
  std::string reserve_stats;   // VLAKE_RESERVE_STATS: where to write the reserve's reuse statistics
  std::vector<std::string> problems;

  using Lookup = std::function<const char*(const char*)>;
  [[nodiscard]] static Config parse(const Lookup& lookup);
  [[nodiscard]] static Config from_environment();
};

}  // namespace vlake::hook
