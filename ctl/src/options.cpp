#include "vlake/ctl/options.hpp"

#include "vlake/common/duration.hpp"
#include "vlake/common/size.hpp"
#include "vlake/contracts/state.hpp"

#include <chrono>
#include <vector>

namespace vlake::ctl {

namespace {

void check_state_name(const std::string& name) {
  if (name.empty()) throw UsageError("--state needs a non-empty name");
  if (const std::string bad = state::check_state_spec(name); !bad.empty()) {
    throw UsageError("--state '" + name + "': " + bad + " (a name is read in $VLAKE_STATE_DIR, default " +
                     state::kDefaultStateDir + ")");
  }
}

// --watch's DURATION (vlake/common/duration.hpp), 100ms..24h, in seconds.
double parse_seconds(const std::string& text) {
  using std::chrono::milliseconds;
  try {
    const milliseconds d = parse_duration(text, milliseconds(static_cast<long long>(kMinWatchSeconds * 1000)),
                                          milliseconds(static_cast<long long>(kMaxWatchSeconds * 1000)));
    return static_cast<double>(d.count()) / 1000.0;
  } catch (const DurationError& e) {
    throw UsageError("--watch: " + std::string(e.what()));
  }
}

bool looks_numeric(const std::string& s) { return !s.empty() && ((s[0] >= '0' && s[0] <= '9') || s[0] == '.'); }

}  // namespace

CtlOptions CtlOptions::parse(std::span<const std::string> args, const char* env_state) {
  CtlOptions o;
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      o.help = true;
      return o;
    }
  }
  if (env_state != nullptr && *env_state != '\0') {
    check_state_name(env_state);
    o.state = env_state;
  }
  std::vector<std::string> words;  // positional words in order
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o.json = true;
    } else if (a == "--state" || a.rfind("--state=", 0) == 0) {
      std::string v;
      if (a == "--state") {
        if (i + 1 >= args.size()) throw UsageError("--state needs a value (a segment name or path)");
        v = args[++i];
      } else {
        v = a.substr(8);
      }
      check_state_name(v);
      o.state = v;
    } else if (a == "--watch" || a.rfind("--watch=", 0) == 0) {
      if (a == "--watch") {
        if (i + 1 < args.size() && looks_numeric(args[i + 1])) {
          o.watch_seconds = parse_seconds(args[++i]);
        } else {
          o.watch_seconds = kDefaultWatchSeconds;
        }
      } else {
        o.watch_seconds = parse_seconds(a.substr(8));
      }
    } else if (a == "--gpu-memory") {
      if (i + 1 >= args.size()) throw UsageError("--gpu-memory needs a size (e.g. 80GiB)");
      const std::string v = args[++i];
      try {
        o.gpu_memory = parse_size(v, Bytes{1}, Bytes{~std::uint64_t{0}});
      } catch (const SizeError& e) {
        throw UsageError("--gpu-memory: " + std::string(e.what()));
      }
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + a + "'");
    } else {
      words.push_back(a);
    }
  }
  if (words.empty())
    throw UsageError("no command given (top, tenants, processes, waits, pool, events or quota check FILE)");
  const std::string& cmd = words[0];
  std::size_t used = 1;
  if (cmd == "top") {
    o.command = Command::top;
  } else if (cmd == "tenants") {
    o.command = Command::tenants;
  } else if (cmd == "processes" || cmd == "ps") {
    o.command = Command::processes;
  } else if (cmd == "waits") {
    o.command = Command::waits;
  } else if (cmd == "pool") {
    o.command = Command::pool;
  } else if (cmd == "events") {
    o.command = Command::events;
  } else if (cmd == "quota") {
    if (words.size() >= 2 && words[1] == "grammar") {
      o.command = Command::quota_grammar;
      used = 2;
    } else {
      if (words.size() < 2 || words[1] != "check") {
        throw UsageError(words.size() < 2
                             ? "quota: missing subcommand (quota check FILE, quota grammar)"
                             : "quota: unknown subcommand '" + words[1] + "' (quota check FILE, quota grammar)");
      }
      if (words.size() < 3) throw UsageError("quota check: missing FILE");
      o.command = Command::quota_check;
      o.quota_file = words[2];
      used = 3;
    }
  } else {
    throw UsageError("unknown command '" + cmd +
                     "' (top, tenants, processes, waits, pool, events or quota check FILE)");
  }
  if (words.size() > used) throw UsageError("unexpected argument '" + words[used] + "' after '" + cmd + "'");
  if (o.watch_seconds && o.command != Command::top && o.command != Command::processes && o.command != Command::waits) {
    throw UsageError("--watch only applies to 'top', 'processes' and 'waits'");
  }
  if (o.gpu_memory && o.command != Command::quota_check) {
    throw UsageError("--gpu-memory only applies to 'quota check'");
  }
  return o;
}

std::string CtlOptions::usage() {
  return "usage: vlakectl [--state NAME|PATH] [--json] COMMAND\n"
         "\n"
         "Shows what vlaked holds on this node (read-only; reads its state segment).\n"
         "\n"
         "commands:\n"
         "  top [--watch [DURATION]] per GPU, one line per tenant: used, limit, guaranteed, share\n"
         "                           of the GPU, idle time, processes; then who waits for memory;\n"
         "                           --watch redraws every DURATION (default 2s; e.g. 1s, 500ms)\n"
         "                           until interrupted\n"
         "                           (also for processes and waits)\n"
         "  tenants                  every tenant: per GPU used/granted/non-pool/limit, sessions\n"
         "                           (pids), grant count, refusals, idle time\n"
         "  processes (ps)           every process with a session: idle time (last CUDA call),\n"
         "                           reclaim, where it is (GPU or host memory), what it waits for\n"
         "  waits                    who waits for whom: processes waiting for memory or for their\n"
         "                           restore, and the processes their wait depends on\n"
         "  pool                     per GPU pool bytes, granted, free, handles, orphaned,\n"
         "                           non-pool; the daemon and its counters\n"
         "  events                   out-of-bounds guard alarms (docs/guard.md), then refused\n"
         "                           requests (256 of each kept, per tenant), oldest first\n"
         "  quota check FILE [--gpu-memory SIZE]\n"
         "                           validate a quota file (FILE '-': standard input; guarantee\n"
         "                           sums against SIZE if given);\n"
         "                           prints 'FILE: ok' and a summary, or\n"
         "                           each error as 'file:line:col: what'\n"
         "  quota grammar            the quota file's keys per section, their kinds and choices\n"
         "                           (--json: with a file that uses every key)\n"
         "\n"
         "options:\n"
         "  --state NAME   vlaked's state segment (default $VLAKE_STATE, else vlake-state): a file\n"
         "                 in $VLAKE_STATE_DIR (default /run/vlake/state), or an absolute path\n"
         "  --json         one JSON document instead of text (sizes in bytes)\n"
         "  --help         this text\n"
         "\n"
         "A SIZE needs a unit (B, KiB, MiB, GiB, TiB) and a DURATION one of ms, s, m, h: a bare\n"
         "number other than 0 is refused.\n"
         "\n"
         "exit codes: 0 ok, 1 quota file invalid, 2 usage error or state not readable\n";
}

}  // namespace vlake::ctl
