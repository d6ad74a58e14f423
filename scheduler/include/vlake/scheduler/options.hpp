// vlake::scheduler::PluginOptions — vlake-device-plugin's command line (docs/device-plugin.md).
//
// Contract: parse() returns the options or throws OptionsError with a one-line message naming
// the offending option; `--help` sets `help`. Every option takes one value, as `--opt VALUE`
// or `--opt=VALUE`. Pure; thread-safe.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include "vlake/common/log.hpp"
#include "vlake/common/strong_types.hpp"

namespace vlake::scheduler {

class OptionsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class GpuVisibility { env, cdi, both };
using vlake::LogLevel;  // vlake's one logger (vlake/common/log.hpp)

struct PluginOptions {
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string endpoint = "vlake.sock";
  std::string resource = "vlake.io/gpu-memory";
  Bytes unit{1ull << 30};
  std::string alloc_root = "/run/vlake/alloc";
  std::string hook_path = "/usr/lib/vlake/libvlake-hook.so";            // on the host
  std::string hook_container_path = "/usr/lib/vlake/libvlake-hook.so";  // where containers see it
  bool preload = true;
  GpuVisibility gpu_visibility = GpuVisibility::both;
  std::string cdi_kind = "nvidia.com/gpu";
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::chrono::milliseconds attribution_interval{2000};
  std::chrono::milliseconds gc_grace{30000};
  std::string driver = "libcuda.so.1";
  std::string vlaked_socket = "/run/vlake/vlaked.sock";  // "" (--vlaked-socket none): not checked
  std::string state = "vlake-state";
  std::chrono::milliseconds health_interval{5000};
  LogLevel log_level = LogLevel::info;
  bool help = false;

  static PluginOptions parse(int argc, const char* const* argv);
  static std::string usage();
  [[nodiscard]] std::string kubelet_socket() const { return kubelet_dir + "/kubelet.sock"; }
  [[nodiscard]] std::string plugin_socket() const { return kubelet_dir + "/" + endpoint; }
};

// A positive duration of vlake's one grammar (vlake/common/duration.hpp), at most 24h: "500ms",
// "2.5s", "1m"; a bare number such as "1500" is refused. Throws vlake::DurationError (a
// std::invalid_argument) naming the text and what to write. Used for every DUR flag of the plugin
// and of vlake-events (events.hpp).
std::chrono::milliseconds parse_duration(const std::string& text);

}  // namespace vlake::scheduler
