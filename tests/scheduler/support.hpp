// Shared pieces of the device-plugin tests: a temp directory tree, a dummy listening Unix
// socket (vlaked's, for the health check), a plugin running on its own thread over the
// simulated driver, and small waits.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "fake_kubelet.hpp"
#include "vlake/scheduler/plugin.hpp"

namespace vlake::schedtest {

std::string make_temp_dir();
void remove_dir(const std::string& dir);
// Binds a listening SOCK_STREAM socket at `path`; returns its fd.
int listen_unix(const std::string& path);
bool wait_for(const std::function<bool()>& cond, int timeout_ms = 10000);
std::string read_file(const std::string& path);
bool exists(const std::string& path);

class RunningPlugin {
 public:
  RunningPlugin(const scheduler::PluginOptions& o, const std::string& sim_node, int devices);
  ~RunningPlugin();
  scheduler::Plugin& operator*() { return *plugin_; }
  scheduler::Plugin* operator->() { return plugin_.get(); }

 private:
  Logger log_{LogLevel::debug};
  std::unique_ptr<scheduler::Plugin> plugin_;
  std::thread thread_;
};

}  // namespace vlake::schedtest
