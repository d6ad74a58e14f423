#include "vlake/scheduler/options.hpp"
#include "vlake/common/cli.hpp"
#include "vlake/common/duration.hpp"
#include "vlake/common/size.hpp"

#include <string_view>

namespace vlake::scheduler {

std::chrono::milliseconds parse_duration(const std::string& text) {
  return vlake::parse_duration(text, std::chrono::milliseconds(1), std::chrono::hours(24));
}

std::string PluginOptions::usage() {
  return "usage: vlake-device-plugin [options]\n"
         "  --kubelet-dir DIR               kubelet device-plugin directory (default /var/lib/kubelet/device-plugins)\n"
         "  --endpoint NAME                 our socket's file name there (default vlake.sock)\n"
         "  --resource NAME                 extended resource (default vlake.io/gpu-memory)\n"
         "  --unit SIZE                     memory per device id (default 1GiB)\n"
         "  --alloc-root DIR                allocation directories, shared with vlaked (default /run/vlake/alloc)\n"
         "  --hook-path PATH                hook library on the host (default /usr/lib/vlake/libvlake-hook.so)\n"
         "  --hook-container-path PATH      where containers see it, read-only (default "
         "/usr/lib/vlake/libvlake-hook.so)\n"
         "  --preload BOOL                  mount ld.so.preload into containers (default true)\n"
         "  --gpu-visibility MODE           env, cdi or both (default both)\n"
         "  --cdi-kind KIND                 CDI kind for cdi naming (default nvidia.com/gpu)\n"
         "  --pod-resources-socket PATH     kubelet PodResources API (default "
         "/var/lib/kubelet/pod-resources/kubelet.sock)\n"
         "  --attribution-interval DUR      PodResources polling period (default 2s)\n"
         "  --gc-grace DUR                  how long an allocation may be unlisted before removal (default 30s)\n"
         "  --driver LIB                    CUDA driver used to enumerate GPUs (default libcuda.so.1)\n"
         "  --vlaked-socket PATH            vlaked's socket, checked for health; 'none' disables (default "
         "/run/vlake/vlaked.sock)\n"
         "  --state NAME|PATH               vlaked's state segment: a name in $VLAKE_STATE_DIR (default\n"
         "                                  /run/vlake/state) or an absolute path (default vlake-state)\n"
         "  --health-interval DUR           health check period (default 5s)\n"
         "  --log-level LEVEL               debug, info, warn or error (default info)\n"
         "  --help                          this text\n"
         "A SIZE needs a unit (B, KiB, MiB, GiB, TiB; or Ki, Mi, Gi, Ti) and a DUR one of ms, s, m, h\n"
         "(e.g. 500ms, 2.5s, 1m; more than 0, at most 24h); a bare number is refused.\n";
}

PluginOptions PluginOptions::parse(int argc, const char* const* argv) {
  PluginOptions o;
  for (int i = 1; i < argc; ++i) {
    static constexpr std::string_view kKnown[] = {"--kubelet-dir",
                                                  "--endpoint",
                                                  "--resource",
                                                  "--unit",
                                                  "--alloc-root",
                                                  "--hook-path",
                                                  "--hook-container-path",
                                                  "--preload",
                                                  "--gpu-visibility",
                                                  "--cdi-kind",
                                                  "--pod-resources-socket",
                                                  "--attribution-interval",
                                                  "--gc-grace",
                                                  "--driver",
                                                  "--vlaked-socket",
                                                  "--state",
                                                  "--health-interval",
                                                  "--log-level"};
    const cli::Option opt = cli::read_option<OptionsError>(argc, argv, i, kKnown);
    if (opt.help) {
      o.help = true;
      continue;
    }
    const std::string& arg = opt.name;
    const std::string& value = opt.value;
    if (value.empty()) throw OptionsError("option " + arg + " needs a non-empty value");
    auto duration = [&]() {
      try {
        return parse_duration(value);
      } catch (const std::invalid_argument& e) {
        throw OptionsError(arg + ": " + e.what());
      }
    };
    if (arg == "--kubelet-dir") o.kubelet_dir = value;
    else if (arg == "--endpoint") {
      if (value.find('/') != std::string::npos)
        throw OptionsError("--endpoint must be a file name, got '" + value + "'");
      o.endpoint = value;
    } else if (arg == "--resource") {
      if (value.find('/') == std::string::npos)
        throw OptionsError("--resource must be <domain>/<name>, got '" + value + "'");
      o.resource = value;
    } else if (arg == "--unit") {
      try {
        o.unit = parse_size(value, Bytes{1}, Bytes{~std::uint64_t{0}});
      } catch (const SizeError& e) {
        throw OptionsError(std::string("--unit: ") + e.what());
      }
    } else if (arg == "--alloc-root") o.alloc_root = value;
    else if (arg == "--hook-path") o.hook_path = value;
    else if (arg == "--hook-container-path") {
      if (value.front() != '/') throw OptionsError("--hook-container-path must be absolute, got '" + value + "'");
      o.hook_container_path = value;
    } else if (arg == "--preload") {
      if (value == "true" || value == "1" || value == "yes") o.preload = true;
      else if (value == "false" || value == "0" || value == "no") o.preload = false;
      else throw OptionsError("--preload must be true or false, got '" + value + "'");
    } else if (arg == "--gpu-visibility") {
      if (value == "env") o.gpu_visibility = GpuVisibility::env;
      else if (value == "cdi") o.gpu_visibility = GpuVisibility::cdi;
      else if (value == "both") o.gpu_visibility = GpuVisibility::both;
      else throw OptionsError("--gpu-visibility must be env, cdi or both, got '" + value + "'");
    } else if (arg == "--cdi-kind") o.cdi_kind = value;
    else if (arg == "--pod-resources-socket") o.pod_resources_socket = value;
    else if (arg == "--attribution-interval") o.attribution_interval = duration();
    else if (arg == "--gc-grace") o.gc_grace = duration();
    else if (arg == "--health-interval") o.health_interval = duration();
    else if (arg == "--driver") o.driver = value;
    else if (arg == "--vlaked-socket") o.vlaked_socket = value == "none" ? std::string() : value;
    else if (arg == "--state") o.state = value;
    else if (arg == "--log-level") {
      try {
        o.log_level = parse_log_level(value);
      } catch (const std::invalid_argument& e) {
        throw OptionsError(std::string("--log-level: ") + e.what());
      }
    }
  }
  while (o.kubelet_dir.size() > 1 && o.kubelet_dir.back() == '/') o.kubelet_dir.pop_back();
  while (o.alloc_root.size() > 1 && o.alloc_root.back() == '/') o.alloc_root.pop_back();
  if (o.plugin_socket().size() >= 108) throw OptionsError("--kubelet-dir/--endpoint: socket path too long (max 107)");
  // <alloc-root>/<16 hex>/vlaked.sock must fit a Unix socket address.
  if (o.alloc_root.size() + 1 + 16 + 1 + 11 >= 108)
    throw OptionsError("--alloc-root is too long for socket paths in it");
  return o;
}

}  // namespace vlake::scheduler
