#include "support.hpp"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "vlake/contracts/allocation.hpp"

namespace vlake::schedtest {

std::string make_temp_dir() {
  char tmpl[] = "/tmp/vlake-sched-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
  ::chmod(tmpl, 0755);
  return tmpl;
}

void remove_dir(const std::string& dir) { (void)alloc::remove_tree(dir); }

int listen_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  ::unlink(path.c_str());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 4) != 0) {
    throw std::runtime_error("bind " + path);
  }
  return fd;
}

bool wait_for(const std::function<bool()>& cond, int timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) {
  struct stat sb {};
  return ::lstat(path.c_str(), &sb) == 0;
}

RunningPlugin::RunningPlugin(const scheduler::PluginOptions& o, const std::string& sim_node, int devices) {
  ::setenv("VLAKE_SIM_NODE", sim_node.c_str(), 1);
  ::setenv("VLAKE_SIM_DEVICE_MEMORY", "1GiB", 1);
  ::setenv("VLAKE_SIM_DEVICE_COUNT", std::to_string(devices).c_str(), 1);
  plugin_ = std::make_unique<scheduler::Plugin>(o, std::make_unique<scheduler::DriverInventory>(VLAKE_SIM_LIB), log_);
  thread_ = std::thread([this] { plugin_->run(); });
}

RunningPlugin::~RunningPlugin() {
  plugin_->stop();
  thread_.join();
}

}  // namespace vlake::schedtest
