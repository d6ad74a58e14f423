// vlake::ctl::CtlOptions — vlakectl's command line.
//
//   vlakectl [--state NAME] [--json] COMMAND
//   COMMAND: top [--watch [DURATION]] | tenants | pool | events | quota check FILE [--gpu-memory SIZE] | quota grammar
//
// Global options may come before or after the command. `--state` defaults to $VLAKE_STATE,
// then "vlake-state". Options taking a value accept `--opt VALUE` and `--opt=VALUE`; `--watch`
// takes an optional value (the next word is taken only if it starts with a digit or '.'): a
// duration of vlake's one grammar (vlake/common/duration.hpp), 100ms..24h, so "--watch 1" is
// refused ("write 1s or 1ms"); --gpu-memory takes a size (vlake/common/size.hpp).
//
// Contract: parse() is pure (the environment value is passed in) and thread-safe. It returns
// the options, or throws UsageError with a one-line message naming what is wrong. `--help`
// anywhere sets `help` and nothing else is checked (the caller prints usage(), exit 0).
#pragma once

#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "vlake/common/strong_types.hpp"

namespace vlake::ctl {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Command { none, top, tenants, processes, waits, pool, events, quota_check, quota_grammar };

inline constexpr const char* kDefaultState = "vlake-state";
inline constexpr double kDefaultWatchSeconds = 2.0;
inline constexpr double kMinWatchSeconds = 0.1;
inline constexpr double kMaxWatchSeconds = 86400.0;

struct CtlOptions {
  std::string state = kDefaultState;  // POSIX shm name: /dev/shm/<state>
  bool json = false;
  bool help = false;
  Command command = Command::none;
  std::optional<double> watch_seconds;  // top --watch: redraw period
  std::string quota_file;               // quota check FILE
  std::optional<Bytes> gpu_memory;      // quota check --gpu-memory SIZE: check sums against it

  // `args` excludes argv[0]. `env_state`: the value of $VLAKE_STATE, or nullptr if unset
  // (an empty value counts as unset).
  static CtlOptions parse(std::span<const std::string> args, const char* env_state);
  static std::string usage();
};

}  // namespace vlake::ctl
