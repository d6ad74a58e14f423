#include "vlake/pool/options.hpp"
#include "vlake/common/cli.hpp"
#include "vlake/common/duration.hpp"
#include "vlake/common/size.hpp"
#include "vlake/contracts/state.hpp"

#include "vlake/exporter/server.hpp"

#include <grp.h>

#include <cctype>
#include <cstdint>
#include <string_view>

namespace vlake::pool {

std::string DaemonOptions::usage() {
  return "usage: vlaked [options]\n"
         "  --config FILE            quota configuration (default /etc/vlake/vlake.yaml;\n"
         "                           a missing file means every uid may use 100% of each GPU)\n"
         "  --socket PATH            listening socket (default /run/vlake/vlaked.sock)\n"
         "  --state NAME|PATH        state segment: NAME is a file in $VLAKE_STATE_DIR (default\n"
         "                           /run/vlake/state), /PATH that file (default vlake-state); its\n"
         "                           directory must be writable by vlaked's user (or root) only\n"
         "  --driver LIB             CUDA driver library (default libcuda.so.1)\n"
         "  --nvml LIB               NVML library (default libnvidia-ml.so.1; 'none' disables:\n"
         "                           non-pool usage then counts as 0)\n"
         "  --log-level LEVEL        debug, info, warn or error (default info)\n"
         "  --sample-interval-ms N   usage sampling period, 10..3600000 (default 1000)\n"
         "  --canary-interval-ms N   canary sweep period (guard: canary), 0..86400000; 0: check only\n"
         "                           at release (default 10000; runs on the sampling tick)\n"
         "  --state-mode MODE        permissions of the state segment, octal (default 0600: root\n"
         "                           only; 0640 with --state-group lets that group run vlakectl)\n"
         "  --state-group GROUP      group owning the state segment (name or gid)\n"
         "  --metrics-address ADDR   Prometheus exporter [HOST]:PORT (default 127.0.0.1:19400,\n"
         "                           loopback only; :19400 listens on every interface, 'none'\n"
         "                           disables); serves /metrics and /healthz\n"
         "  --metrics-process-series on|off  per-process series (vlake_process_idle_seconds, labelled\n"
         "                           with pids) in /metrics (default off: whoever reaches the endpoint\n"
         "                           would see other tenants' pids and activity)\n"
         "  --bulk-size SIZE         bulk handle size class, e.g. 64MiB (default 64MiB; a multiple of\n"
         "                           the granularity, 2MiB..1TiB)\n"
         "  --warm-reserve SIZE      per GPU, free handles created (exported, zeroed) before serving\n"
         "                           and refilled off the request path (default 0; e.g. 1GiB)\n"
         "  --warm-stock SIZE        per GPU, clean handles of the sizes recent grants asked for,\n"
         "                           built ahead on a worker thread (default 0: off; e.g. 1GiB)\n"
         "  --pool-idle-release DURATION  free pool memory unused this long goes back to the driver,\n"
         "                           oldest first, down to --pool-keep (e.g. 500ms, 30s, 2m; up to 24h;\n"
         "                           default 30s; 'off' or 0: kept until a grant needs the room)\n"
         "  --pool-keep SIZE         per GPU, free pool memory the idle release keeps, counting the\n"
         "                           warm reserve's and stock's clean handles (default 0)\n"
         "  --swap-idle DURATION     a process of an overcommit namespace idle this long (no CUDA call)\n"
         "                           may be checkpointed to host memory when the GPU is full\n"
         "                           (docs/swap.md; default 30s; 'off' or 0: never)\n"
         "  --swap-margin SIZE       free GPU memory kept beyond what a grant or a restore needs\n"
         "                           before vlaked swaps processes out (default 256MiB)\n"
         "  --host-tier SIZE         pinned host memory for the host tier, made ahead: whole\n"
         "                           allocations of idle overcommit processes move there (the\n"
         "                           processes run on) when the GPU is full (docs/swap.md; default\n"
         "                           0: off, overcommit namespaces are checkpointed instead)\n"
         "  --host-tier-piece SIZE   the host tier's piece size (default 1GiB)\n"
         "  --counted-realize DURATION  a counted grant (memory the tenant's process allocates\n"
         "                           itself) that NVML does not show in the process's figure this\n"
         "                           long after it was served is revoked, and processes moved to\n"
         "                           host memory for it come back (docs/swap.md; default 5s, at\n"
         "                           least two sampling periods; up to 1h; 'off' or 0: never)\n"
         "  --context-memory auto|SIZE  what each CUDA context of a hooked process is charged against\n"
         "                           its tenant's limit from before the driver creates it (docs/quota.md,\n"
         "                           \"Contexts\"; default auto: measured per GPU through NVML; e.g. 512MiB)\n"
         "  --pressure-wait-ms N     how long a grant the pool cannot serve waits for tenants to return\n"
         "                           reserve memory, 0..60000 (default 500; 0: refuse at once)\n"
         "  --reclaim-deadline DURATION  a session asked to give memory back that gives nothing within\n"
         "                           this loses its turn, and the grant asks every other session at\n"
         "                           once (10ms..1m, default 250ms)\n"
         "  --reclaim-skip DURATION  how long a session that gave nothing when asked is not asked\n"
         "                           again, its reserve and reclaim figures not counted on (1s..1h,\n"
         "                           default 1m)\n"
         "  --handle-reuse MODE      who a freed handle may serve next: 'tenant' (default) only the\n"
         "                           tenant that held it (its descriptor may still be open there);\n"
         "                           'node' any tenant after zeroing: a tenant that keeps a\n"
         "                           descriptor can read and write the memory's next owner's data\n"
         "  --alloc-root DIR         Kubernetes allocation directories of vlake-device-plugin: one\n"
         "                           socket per allocation, tenant = its pod (default: off)\n"
         "  limits against hostile tenants (docs/daemon.md, \"Limits\"):\n"
         "  --max-sessions-per-tenant N      sessions one tenant may hold, 1..1024 (default 128)\n"
         "  --max-grants-per-tenant N        grants one tenant may hold, 1..16384 (default 2048)\n"
         "  --max-parked-per-tenant N        grants of one tenant waiting for memory at once, 1..16384\n"
         "                                   (default 32; one more is refused limit_reached)\n"
         "  --max-connections-per-uid N      connections one uid (one allocation) may hold, 1..65536\n"
         "                                   (default 256)\n"
         "  --max-unauthenticated N          connections awaiting their Hello, in all, 1..65536 (default 512)\n"
         "  --max-unauthenticated-per-uid N  connections awaiting their Hello per uid, 1..65536 (default 64)\n"
         "  --hello-timeout-ms N             a connection without Hello is closed after this, 10..600000\n"
         "                                   (default 5000)\n"
         "  --guard-event-rate N             guard events recorded per second per tenant, 1..10000 (default 10)\n"
         "  --guard-event-burst N            guard events recorded in a row per tenant, 1..10000 (default 20)\n"
         "  --help                   this text\n"
         "A SIZE needs a unit (B, KiB, MiB, GiB, TiB) and a DURATION one of ms, s, m, h; a bare\n"
         "number other than 0 is refused. Options named -ms take a plain number of milliseconds.\n";
}

DaemonOptions DaemonOptions::parse(int argc, const char* const* argv) {
  DaemonOptions o;
  for (int i = 1; i < argc; ++i) {
    static constexpr std::string_view kKnown[] = {"--config",
                                                  "--socket",
                                                  "--state",
                                                  "--driver",
                                                  "--nvml",
                                                  "--log-level",
                                                  "--sample-interval-ms",
                                                  "--state-mode",
                                                  "--state-group",
                                                  "--metrics-address",
                                                  "--metrics-process-series",
                                                  "--canary-interval-ms",
                                                  "--bulk-size",
                                                  "--warm-reserve",
                                                  "--warm-stock",
                                                  "--pressure-wait-ms",
                                                  "--reclaim-deadline",
                                                  "--reclaim-skip",
                                                  "--context-memory",
                                                  "--pool-idle-release",
                                                  "--pool-keep",
                                                  "--swap-idle",
                                                  "--swap-margin",
                                                  "--host-tier",
                                                  "--host-tier-piece",
                                                  "--counted-realize",
                                                  "--alloc-root",
                                                  "--handle-reuse",
                                                  "--max-sessions-per-tenant",
                                                  "--max-grants-per-tenant",
                                                  "--max-parked-per-tenant",
                                                  "--max-connections-per-uid",
                                                  "--max-unauthenticated",
                                                  "--max-unauthenticated-per-uid",
                                                  "--hello-timeout-ms",
                                                  "--guard-event-rate",
                                                  "--guard-event-burst"};
    const cli::Option opt = cli::read_option<OptionsError>(argc, argv, i, kKnown);
    if (opt.help) {
      o.help = true;
      continue;
    }
    const std::string& arg = opt.name;
    std::string value = opt.value;
    // A decimal number in [lo, hi], or an error naming the option and the range.
    auto number = [&](long long lo, long long hi) {
      bool digits = !value.empty() && value.size() <= 9;
      for (char c : value) digits = digits && std::isdigit(static_cast<unsigned char>(c)) != 0;
      const long long n = digits ? std::stoll(value) : -1;
      if (n < lo || n > hi) {
        throw OptionsError(arg + " must be a number " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" +
                           value + "'");
      }
      return n;
    };
    // A size in [lo, hi] (vlake/common/size.hpp), or an error naming the option.
    auto size = [&](std::uint64_t lo, std::uint64_t hi) {
      try {
        return parse_size(value, Bytes{lo}, Bytes{hi}).value();
      } catch (const SizeError& e) {
        throw OptionsError(arg + ": " + e.what());
      }
    };
    auto nonempty = [&](std::string& dst) {
      if (value.empty()) throw OptionsError("option " + arg + " needs a non-empty value");
      dst = value;
    };
    if (arg == "--config") nonempty(o.config);
    else if (arg == "--socket") nonempty(o.socket);
    else if (arg == "--state") {
      nonempty(o.state);
      if (const std::string bad = state::check_state_spec(o.state); !bad.empty()) {
        throw OptionsError("--state must be a name without '/' (at most 200 characters) or an absolute path: " + bad);
      }
    } else if (arg == "--driver") nonempty(o.driver);
    else if (arg == "--nvml") o.nvml = (value == "none") ? std::string() : value;
    else if (arg == "--log-level") {
      try {
        o.log_level = parse_log_level(value);
      } catch (const std::invalid_argument& e) {
        throw OptionsError(std::string("--log-level: ") + e.what());
      }
    } else if (arg == "--sample-interval-ms") {
      o.sample_interval = std::chrono::milliseconds(number(10, 3'600'000));
    } else if (arg == "--canary-interval-ms") {
      o.canary_interval = std::chrono::milliseconds(number(0, 86'400'000));
    } else if (arg == "--metrics-process-series") {
      if (value != "on" && value != "off") {
        throw OptionsError("--metrics-process-series must be 'on' or 'off', got '" + value + "'");
      }
      o.metrics_process_series = value == "on";
    } else if (arg == "--state-mode") {
      bool octal = !value.empty() && value.size() <= 4;
      for (char c : value) octal = octal && c >= '0' && c <= '7';
      const unsigned mode = octal ? static_cast<unsigned>(std::stoul(value, nullptr, 8)) : 01000;
      // The daemon writes the segment; others may only read it.
      if (mode > 0777 || (mode & 0600) != 0600 || (mode & 0022) != 0) {
        throw OptionsError(
            "--state-mode must be an octal mode with owner read-write and no write "
            "for group/others (e.g. 0640), got '" +
            value + "'");
      }
      o.state_mode = mode;
    } else if (arg == "--metrics-address") {
      nonempty(value);
      o.metrics_address_given = true;
      if (value == "none") {
        o.metrics_address.clear();
      } else {
        try {
          (void)exporter::parse_listen_address(value);
        } catch (const std::invalid_argument& e) {
          throw OptionsError(std::string("--metrics-address: ") + e.what());
        }
        o.metrics_address = value;
      }
    } else if (arg == "--bulk-size") {
      o.bulk_size = size(2ull << 20, 1ull << 40);
    } else if (arg == "--warm-reserve") {
      o.warm_reserve = size(0, 1ull << 50);
    } else if (arg == "--warm-stock") {
      o.warm_stock = size(0, 1ull << 50);
    } else if (arg == "--swap-margin") {
      o.swap_margin = size(0, 1ull << 50);
    } else if (arg == "--host-tier") {
      o.host_tier = size(0, 1ull << 50);
    } else if (arg == "--host-tier-piece") {
      o.host_tier_piece = size(2ull << 20, 64ull << 30);
    } else if (arg == "--context-memory") {
      if (value == "auto") {
        o.context_memory.reset();
      } else {
        o.context_memory = size(0, 1ull << 40);
      }
    } else if (arg == "--pool-keep") {
      o.pool_keep = size(0, 1ull << 50);
    } else if (arg == "--pool-idle-release" || arg == "--swap-idle") {
      try {  // DURATION|off: 'off' and 0 turn it off; at most one day
        (arg == "--swap-idle" ? o.swap_idle : o.pool_idle_release) =
            parse_duration_or_off(value, std::chrono::hours(24));
      } catch (const DurationError& e) {
        throw OptionsError(arg + ": " + e.what());
      }
    } else if (arg == "--counted-realize") {
      try {  // DURATION|off
        o.counted_realize = parse_duration_or_off(value, std::chrono::hours(1));
      } catch (const DurationError& e) {
        throw OptionsError(arg + ": " + e.what());
      }
    } else if (arg == "--reclaim-deadline" || arg == "--reclaim-skip") {
      const bool deadline = arg == "--reclaim-deadline";
      try {
        (deadline ? o.reclaim_deadline : o.reclaim_skip) =
            deadline ? parse_duration(value, std::chrono::milliseconds(10), std::chrono::minutes(1))
                     : parse_duration(value, std::chrono::seconds(1), std::chrono::hours(1));
      } catch (const DurationError& e) {
        throw OptionsError(arg + ": " + e.what());
      }
    } else if (arg == "--pressure-wait-ms") {
      o.pressure_wait = std::chrono::milliseconds(number(0, 60'000));
    } else if (arg == "--handle-reuse") {
      if (value == "tenant") o.bind_handles = true;
      else if (value == "node") o.bind_handles = false;
      else throw OptionsError("--handle-reuse must be 'tenant' or 'node', got '" + value + "'");
    } else if (arg == "--alloc-root") {
      o.alloc_root = value;
      while (o.alloc_root.size() > 1 && o.alloc_root.back() == '/') o.alloc_root.pop_back();
      // <alloc-root>/<16 hex digits>/vlaked.sock must fit a Unix socket address.
      if (o.alloc_root.size() + 29 >= 108) throw OptionsError("--alloc-root is too long for the sockets in it");
    } else if (arg == "--max-sessions-per-tenant") {
      o.max_sessions_per_tenant = static_cast<std::uint32_t>(number(1, 1024));
    } else if (arg == "--max-grants-per-tenant") {
      o.max_grants_per_tenant = static_cast<std::uint32_t>(number(1, 16384));
    } else if (arg == "--max-parked-per-tenant") {
      o.max_parked_per_tenant = static_cast<std::uint32_t>(number(1, 16384));
    } else if (arg == "--max-connections-per-uid") {
      o.max_connections_per_uid = static_cast<std::uint32_t>(number(1, 65536));
    } else if (arg == "--max-unauthenticated") {
      o.max_unauthenticated = static_cast<std::uint32_t>(number(1, 65536));
    } else if (arg == "--max-unauthenticated-per-uid") {
      o.max_unauthenticated_per_uid = static_cast<std::uint32_t>(number(1, 65536));
    } else if (arg == "--hello-timeout-ms") {
      o.hello_timeout = std::chrono::milliseconds(number(10, 600000));
    } else if (arg == "--guard-event-rate") {
      o.guard_event_rate = static_cast<std::uint32_t>(number(1, 10000));
    } else if (arg == "--guard-event-burst") {
      o.guard_event_burst = static_cast<std::uint32_t>(number(1, 10000));
    } else if (arg == "--state-group") {
      nonempty(value);
      bool digits = value.size() <= 9;
      for (char c : value) digits = digits && std::isdigit(static_cast<unsigned char>(c)) != 0;
      if (digits) {
        o.state_gid = std::stol(value);
      } else {
        const group* g = ::getgrnam(value.c_str());
        if (g == nullptr) throw OptionsError("--state-group: no group named '" + value + "'");
        o.state_gid = static_cast<long>(g->gr_gid);
      }
    }
  }
  if (o.socket.size() >= 108) throw OptionsError("--socket path is too long for a Unix socket (max 107)");
  return o;
}

}  // namespace vlake::pool
