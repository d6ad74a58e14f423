#include "harness.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "pool_client.hpp"

extern char** environ;

namespace vlake::pooltest {

namespace st = vlake::state;

std::string unique_name(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "pt" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + tag;
}

std::vector<std::string> child_env(const std::string& node, int devices) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("VLAKE_SIM_", 0) == 0) continue;
    env.push_back(kv);
  }
  env.push_back("VLAKE_SIM_NODE=" + node);
  env.push_back("VLAKE_SIM_DEVICE_MEMORY=1GiB");
  env.push_back("VLAKE_SIM_DEVICE_COUNT=" + std::to_string(devices));
  return env;
}

namespace {

pid_t spawn_process(const std::vector<std::string>& args, const std::vector<std::string>& env,
                    posix_spawn_file_actions_t* actions) {
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> e = env;
  std::vector<char*> envp;
  for (auto& s : e) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], actions, nullptr, argv.data(), envp.data());
  if (rc != 0) throw std::system_error(rc, std::generic_category(), "posix_spawn " + args[0]);
  return pid;
}

int wait_pid(pid_t pid, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int rm_entry(const char* path, const struct stat*, int, FTW*) { return ::remove(path); }

}  // namespace

DaemonProcess::DaemonProcess(const std::string& tag, const std::string& config_yaml) {
  node = unique_name(tag);
  // The simulator creates its node file with mode 0660 minus the umask: keep it group-
  // writable so helpers that drop to another uid (gid 0) can use the simulated GPU too.
  ::umask(0002);
  char tmpl[] = "/tmp/vlake-pooltest-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  dir = tmpl;
  ::chmod(dir.c_str(), 0755);         // helpers running as other uids reach the socket
  socket = dir + "/run/vlaked.sock";  // run/ does not exist: the daemon creates it
  state = node + "-state";
  log_path = dir + "/vlaked.log";
  config = dir + "/vlake.yaml";
  if (!config_yaml.empty()) {
    std::ofstream out(config);
    out << config_yaml;
  }
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    wait_pid(pid_, 5000);
  }
  ::nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  ::unlink(st::segment_path(state).c_str());
  ::unlink(("/dev/shm/vlake-sim-" + node).c_str());
}

pid_t DaemonProcess::spawn(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      VLAKED_PATH, "--driver",          VLAKE_SIM_LIB, "--socket", socket, "--state",
      state,       "--config",          config,        "--nvml",   "none", "--sample-interval-ms",
      "50",        "--metrics-address", "none"};
  // The warm stock (off by default) builds handles in the background: tests run without it
  // whatever the default, since many check the pool's exact figures; a test of the stock passes
  // --warm-stock (the last value given wins).
  args.insert(args.end(), {"--warm-stock", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  const pid_t pid = spawn_process(args, child_env(node, devices), &fa);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

bool DaemonProcess::start(const std::vector<std::string>& extra) {
  last_extra_ = extra;
  pid_ = spawn(extra);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    try {
      PoolClient probe(socket);  // connects; the daemon sees it close before Hello
      return true;
    } catch (const std::system_error&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int DaemonProcess::run_second() {
  const pid_t p = spawn(last_extra_);
  const int status = wait_pid(p, 10000);
  if (status < 0) ::kill(p, SIGKILL), wait_pid(p, 5000);
  return status;
}

void DaemonProcess::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int DaemonProcess::wait_exit(int timeout_ms) {
  if (pid_ <= 0) return -1;
  const int status = wait_pid(pid_, timeout_ms);
  if (status >= 0) pid_ = -1;
  return status;
}

std::string DaemonProcess::log() const {
  std::ifstream in(log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Helper::Helper(const std::string& node, long uid, long gid) {
  int to_child[2];
  int from_child[2];
  REQUIRE(::pipe2(to_child, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(from_child, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  std::vector<std::string> args = {VLAKE_POOL_CLIENT_PATH, "--driver", VLAKE_SIM_LIB};
  if (uid >= 0) args.insert(args.end(), {"--uid", std::to_string(uid)});
  if (gid >= 0) args.insert(args.end(), {"--gid", std::to_string(gid)});
  pid_ = spawn_process(args, child_env(node), &fa);
  posix_spawn_file_actions_destroy(&fa);
  ::close(to_child[0]);
  ::close(from_child[1]);
  in_ = to_child[1];
  out_ = from_child[0];
  const std::string ready = cmd("");  // the banner line: "ok ready pid=N"
  REQUIRE(ready.rfind("ok ready", 0) == 0);
}

Helper::~Helper() {
  if (in_ >= 0) ::close(in_);
  if (pid_ > 0 && wait_pid(pid_, 5000) < 0) {
    ::kill(pid_, SIGKILL);
    wait_pid(pid_, 5000);
  }
  if (out_ >= 0) ::close(out_);
}

std::string Helper::cmd(const std::string& line, std::chrono::seconds timeout) {
  if (!line.empty()) {
    const std::string l = line + "\n";
    if (::write(in_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) {
      throw std::runtime_error("helper: write failed");
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string out = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return out;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error("helper: no answer to '" + line + "'");
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char b[4096];
    const ssize_t n = ::read(out_, b, sizeof b);
    if (n <= 0) throw std::runtime_error("helper: exited during '" + line + "'");
    buf_.append(b, static_cast<std::size_t>(n));
  }
}

std::map<std::string, std::string> reply_fields(const std::string& reply) {
  std::map<std::string, std::string> kv;
  std::istringstream in(reply.rfind("ok", 0) == 0 ? reply.substr(2) : reply);
  std::string tok;
  while (in >> tok) {
    const auto eq = tok.find('=');
    if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return kv;
}

std::map<std::string, std::string> Helper::ok(const std::string& line) {
  const std::string r = cmd(line);
  INFO("command: " << line << " -> " << r);
  REQUIRE(r.rfind("ok", 0) == 0);
  return reply_fields(r);
}

void Helper::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  wait_pid(pid_, 5000);
  pid_ = -1;
}

std::uint64_t num(const std::map<std::string, std::string>& kv, const std::string& key) {
  const auto it = kv.find(key);
  if (it == kv.end()) throw std::runtime_error("no '" + key + "' in the reply");
  return std::stoull(it->second);
}

std::unique_ptr<st::State> snapshot(const std::string& state_name) {
  st::StateReader r(state_name);
  return r.snapshot();
}

const st::TenantRecord* tenant(const st::State& s, const std::string& name) {
  for (const auto& t : s.tenants) {
    if (t.in_use != 0 && name == std::string(t.name, strnlen(t.name, sizeof t.name))) return &t;
  }
  return nullptr;
}

std::string tenant_name(const st::State& s, std::uint32_t id) {
  for (const auto& t : s.tenants) {
    if (t.in_use != 0 && t.id == id) return std::string(t.name, strnlen(t.name, sizeof t.name));
  }
  return "?";
}

std::size_t live_sessions(const st::State& s) {
  std::size_t n = 0;
  for (const auto& x : s.sessions) n += x.state != st::kSessionFree ? 1 : 0;
  return n;
}

std::size_t live_grants(const st::State& s) {
  std::size_t n = 0;
  for (const auto& x : s.grants) n += x.state != st::kGrantFree ? 1 : 0;
  return n;
}

std::uint64_t sim_used(const std::string& node) {
  Helper h(node);
  return num(h.ok("meminfo"), "used");
}

}  // namespace vlake::pooltest
